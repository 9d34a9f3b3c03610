"""
The policy: loading, per-token log-probs with an FP32 LM head, checkpoints.

Two facts this file teaches:
1. The LM head runs in FP32. MiniMax-M1 (seed 000, "the silent killer of RL") found that the sampler's
   and the trainer's probabilities of the same tokens drifted apart until reward stopped growing; the
   culprit was the output head, with its large activations, in low precision. The body of the network
   may run in bf16 (autocast); the last hidden state and the head weight are cast to fp32 before the
   logits, and log-softmax, entropy and the losses all stay in fp32. vLLM gets the same treatment with
   hf_overrides={"head_dtype": "float32"} (rollout.py).
2. Log-probs are taken at the sampling temperature T: the sampler drew from softmax(logits / T), so
   pi_old and pi_theta in the importance ratio must both be softmax(logits / T). Scoring at T = 1 after
   sampling at T = 0.7 biases every ratio (TRL issues #4159, #6789).
"""
import json
import os
import shutil

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer


# -----------------------------------------------------------------------------
# loading

def load_model(path):
    """An HF causal LM from a local folder or a hub id, with fp32 master weights, and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False  # training never reuses the KV cache
    return model, tokenizer


# -----------------------------------------------------------------------------
# per-token log-probs and entropy of the completion tokens

def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                        temperature=1.0, autocast_dtype=None):
    """log pi(token) and the entropy of pi at every completion position, both (B, C), in fp32.

    The batch layout (rollout.py): prompts left-padded to P tokens, completions right-padded to C
    tokens, so every row's completion starts at column P and the hidden state at column P-1+t
    predicts completion token t."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)                     # (B, P+C)
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)       # (B, P+C)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # left padding must not shift positions
    body, head = model.get_decoder(), model.get_output_embeddings()
    device_type = input_ids.device.type
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        hidden = body(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids).last_hidden_state                 # (B, P+C, H)
    P = prompt_ids.shape[1]
    hidden = hidden[:, P - 1:-1]                                                   # (B, C, H)
    # MiniMax-M1: the LM head in FP32, hidden state and weight both cast up before the matmul
    with torch.autocast(device_type, enabled=False):
        logits = F.linear(hidden.float(), head.weight.float()) / temperature      # (B, C, V)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)       # (B, C)
        entropy = -(logp_all.exp() * logp_all).sum(-1)                             # (B, C)
    return logp, entropy


class Scorer(torch.nn.Module):
    """completion_logprobs as a module's forward. DistributedDataParallel syncs gradients through hooks it sets
    up in forward, so under torchrun the trainer wraps this, not the HF model (whose own forward would make
    the full bf16 logits we avoid)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return completion_logprobs(self.model, *args)


# -----------------------------------------------------------------------------
# checkpoints: an HF folder (loadable by transformers and vLLM) plus the trainer's state

def save_checkpoint(ckpt_dir, model, tokenizer, trainer_state):
    """Write to ckpt_dir + '.tmp' and rename into place: a crash mid-write keeps the previous one."""
    tmp, old = ckpt_dir + ".tmp", ckpt_dir + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
    meta = {k: trainer_state[k] for k in ("step", "model_source", "config", "world") if k in trainer_state}
    json.dump(meta, open(os.path.join(tmp, "meta.json"), "w"), indent=1, default=str)  # readable without torch
    if os.path.exists(ckpt_dir):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt_dir, old)
    os.replace(tmp, ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def read_checkpoint_meta(ckpt_dir):
    """step, model_source and config of the checkpoint in ckpt_dir, or None if there is none."""
    path = os.path.join(ckpt_dir, "meta.json")
    return json.load(open(path)) if os.path.exists(path) else None


def load_trainer_state(ckpt_dir):
    return torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=False)
