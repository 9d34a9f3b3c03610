"""
LoRA (Hu et al. 2021) for RL: small trainable adapters on a frozen base. A GRPO reader may skip it;
train.py calls it when lora_rank > 0.

    W x  ->  (W + (alpha / r) B A) x,   A (r, in) random, B (out, r) = 0 at the start

so step 0 is the base model exactly, and only A and B learn (gradients, clipping, AdamW state: the
adapters alone). "LoRA without regret" (Thinking Machines, 2025) found rank-1 adapters on every
linear layer track full fine-tuning's GRPO curve at ~10x its learning rate: RL's updates carry few
bits a step.

Why the merged form, (W + s B A) x, and not W x + s B (A x): the sampler gets the merged weight,
rounded to its dtype (bf16 where the hardware has it), which loses the part of the delta below
half a bf16 step; a trainer computing W x + s B (A x) keeps it, and its log-probs sit further from
the sampler's (docs/lora.md: +0.002 to +0.007 nats a token in 3 steps, measured). Here the
trainer's forward builds the same merged weight (merged_weight, in fp32, outside autocast) and
autocast rounds it as the sync does, so both compute the same numbers. The cost: one (out, in)
merged weight per layer in each forward, as full fine-tuning's autocast makes a bf16 copy of each
weight.

With beta > 0 the KL reference is the same network with the adapters switched off (adapters_off):
no second model in memory (train.py's score runs the policy's own pass inside it).
"""
import contextlib
import json
import math
import os

import torch
import torch.nn.functional as F

# the linear layers of attention and MLP (Llama, Qwen, Mistral names): the LoRA-without-regret
# study's recommendation
ALL_LINEAR = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')


class LoRALinear(torch.nn.Module):
    """A frozen nn.Linear's weight and bias (their names unchanged: weight, bias), plus the
    adapters lora_A (r, in) and lora_B (out, r), fp32."""

    def __init__(self, base, rank, alpha, base_dtype, generator):
        super().__init__()
        self.weight = torch.nn.Parameter(base.weight.detach().to(base_dtype), requires_grad=False)
        self.bias = base.bias.requires_grad_(False) if base.bias is not None else None
        self.rank, self.alpha, self.scale, self.enabled = rank, alpha, alpha / rank, True
        # PEFT's init: A as nn.Linear's default (kaiming uniform, a = sqrt(5)), B = 0
        bound = 1 / math.sqrt(base.in_features)
        self.lora_A = torch.nn.Parameter(
            torch.empty(rank, base.in_features).uniform_(-bound, bound, generator=generator)
            .to(base.weight.device))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank,
                                                     device=base.weight.device))

    def merged_weight(self):
        """W + (alpha / r) B A in fp32 (outside autocast: the trainer and the sync round it alike)."""
        with torch.autocast(self.weight.device.type, enabled=False):
            return self.weight.float() + self.scale * (self.lora_B @ self.lora_A)

    def forward(self, x):
        # off (pi_ref): the base alone, in fp32 as the merged weight (autocast rounds both alike)
        return F.linear(x, self.merged_weight() if self.enabled else self.weight.float(), self.bias)


def add_lora(model, rank, alpha, targets='all-linear', base_dtype=torch.float32, seed=0):
    """Replace every target nn.Linear of the decoder by a LoRALinear (in place); freeze everything
    else. targets: 'all-linear' (ALL_LINEAR) or a comma-separated string or a tuple of projection
    names. base_dtype: how the frozen weights are stored (the body's autocast dtype: its bf16
    images are what the forward used anyway). A is drawn from its own generator (seed): the same on
    every rank. ValueError: a target no layer has, a rank above a layer's width."""
    if isinstance(targets, str):
        targets = ALL_LINEAR if targets == 'all-linear' else tuple(
            t.strip() for t in targets.split(',') if t.strip())
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    found = set()
    for name, module in list(model.get_decoder().named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in targets and isinstance(child, torch.nn.Linear):
                if rank > min(child.in_features, child.out_features):
                    raise ValueError(f"lora_rank={rank} is above the width of {name}.{child_name} "
                                     f"({child.in_features} -> {child.out_features})")
                setattr(module, child_name, LoRALinear(child, rank, alpha, base_dtype, generator))
                found.add(child_name)
    if missing := [t for t in targets if t not in found]:
        raise ValueError(f"lora_targets: no linear layer named {', '.join(missing)} in the "
                         f"decoder (e.g. {', '.join(ALL_LINEAR)})")
    return model


def lora_layers(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


@contextlib.contextmanager
def adapters_off(model):
    """The base model: every adapter switched off in the block (the KL reference pi_ref)."""
    layers = [m for _, m in lora_layers(model)]
    for m in layers:
        m.enabled = False
    try:
        yield
    finally:
        for m in layers:
            m.enabled = True


def merged_weights(model, changed_only=False):
    """(name, tensor) of the model as a plain HF checkpoint: each LoRA layer's weight merged,
    W + (alpha / r) B A, under the HF name; the adapters themselves left out. changed_only: the
    projections' weights alone (the weight sync streams only these: the rest is frozen). Every
    projection, also one without adapters: vLLM loads q/k/v and gate/up into one fused layer each,
    so each fused layer gets all of its parts."""
    merged = {f'{name}.weight': m for name, m in lora_layers(model)}
    for name, tensor in model.state_dict().items():
        if name in merged:
            yield name, merged[name].merged_weight().detach()
        elif '.lora_' not in name and (not changed_only or name.split('.')[-2] in ALL_LINEAR):
            yield name, tensor


# -----------------------------------------------------------------------------
# the adapter in PEFT's file format: adapter_config.json, adapter_model.safetensors

def peft_key(name):
    return f'base_model.model.{name}'.replace('.lora_A', '.lora_A.weight').replace(
        '.lora_B', '.lora_B.weight')


def save_adapter(path, model, base_model, tensors=None):
    """Write the adapters as PEFT does (peft.PeftModel.from_pretrained(base, path) loads them);
    base_model: the model they adapt (its folder or hub id); tensors: the adapters by name, whole
    (default: the model's own, unsharded)."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    layers = lora_layers(model)
    rank, alpha = layers[0][1].rank, layers[0][1].alpha
    targets = sorted({name.split('.')[-1] for name, _ in layers})
    if tensors is None:
        tensors = {k: v for k, v in model.state_dict().items() if '.lora_' in k}
    tensors = {peft_key(k): v.detach().cpu().contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(path, 'adapter_model.safetensors'))
    config = {'peft_type': 'LORA', 'task_type': 'CAUSAL_LM', 'base_model_name_or_path': base_model,
              'r': rank, 'lora_alpha': alpha, 'target_modules': targets,
              'lora_dropout': 0.0, 'bias': 'none', 'fan_in_fan_out': False,
              'inference_mode': True, 'use_rslora': False, 'init_lora_weights': True}
    json.dump(config, open(os.path.join(path, 'adapter_config.json'), 'w'), indent=1)


def load_adapter(path, model):
    """The adapters saved by save_adapter into a model that add_lora prepared (resume)."""
    from safetensors.torch import load_file
    saved = load_file(os.path.join(path, 'adapter_model.safetensors'))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if '.lora_' in name:
                p.copy_(saved[peft_key(name)])
