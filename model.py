"""
The policy: loading, per-token log-probs with an FP32 LM head, the critic's value model.

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
import contextlib
import ctypes
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import AutoModelForCausalLM, AutoTokenizer


# -----------------------------------------------------------------------------
# loading


def native_bf16(device):
    """Whether bf16 matmuls run in hardware on device: a GPU of compute capability 8.0 or above (Ampere
    on; torch.cuda.is_bf16_supported() also counts the emulation of a V100 / T4, and vLLM refuses bf16
    below 8.0), or a CPU with AVX512-BF16 or AMX. Elsewhere oneDNN emulates bf16: measured ~60x slower
    than fp32 on an AMD EPYC with AVX2 only."""
    if str(device).startswith('cuda'):
        return torch.cuda.get_device_capability(device)[0] >= 8
    flags = open('/proc/cpuinfo').read() if os.path.exists('/proc/cpuinfo') else ''
    return ' avx512_bf16' in flags or ' amx_bf16' in flags


def keep_freed_memory():
    """CPU training: glibc keeps the memory the trainer frees for its next allocation instead of
    handing it back to the kernel (mallopt: no mmap'd blocks, no trimming). By default a block over
    32 MiB (logits, activations, gradients) is its own mmap, unmapped when freed, so each step
    faults its memory in anew, and in a VM that takes freed memory back (free page reporting, as
    these machines do) a fault is a trip to the host: 20 % of a step of config/cpu_hard.py
    (docs/performance.md). The process holds on to its peak instead. False where the C library is
    not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>; a trim threshold of -1: never trim
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, -1))


def load_model(path, autocast_dtype=None):
    """An HF causal LM from a local folder or a hub id, with fp32 master weights, and its tokenizer.
    autocast_dtype: the dtype the body will run in (bf16 autocast, or None); weights on its rounding
    ties are rounded once here when there are many (round_ties)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # training rebuilds the prompt's KV cache itself (completion_hidden)
    model.config.use_cache = False
    round_ties(model, autocast_dtype, name=path)
    return model, tokenizer


# A fp32 master weight that sits exactly half-way between two neighbouring bf16 values is a
# trap for a body run under autocast. The forward rounds it to nearest-even, but the first optimizer
# update of ANY size pushes it off the tie, and then it rounds the other way about half the time: a
# jump of one whole bf16 step (2**-8 to 2**-7 relative), all of them in the direction of the update.
# A tiny step (lr 1e-8) then moves log-probs by tenths of a nat, and a PPO ratio with num_iterations
# > 1 has a floor that no learning rate removes (issue #15). Weights trained in fp32 hold ~2**-16
# ties (random low bits); weights dequantized from a quantized file can hold millions (the Q4_1 GGUF
# of models/smollm2: 8.1 %).
# more ties than this fraction of the weights: round them (trained fp32: ~1.5e-5, Q4_1: 0.081)
MAX_TIE_FRAC = 0.01


def rounding_ties(w):
    """Bool mask of the entries of the fp32 tensor w that sit exactly half-way between two adjacent
    bf16 values, where rounding to nearest (what autocast does) breaks the tie to the even one.

    bf16 is fp32 without its low 16 bits: a tie has those bits 0x8000 (subnormals included; not
    nan, inf, or the tie above bf16's largest value, which rounds to inf). A bit test: 10x faster
    than rounding and comparing (a 134M-parameter model in about a second on 2 cores).
    tests/test_precision.py checks it against the definition (w is a tie iff 2w - round(w) is a
    bf16 value too). (fp16, the other autocast dtype, is refused by the config: no gradient
    scaler.)"""
    bits = w.detach().view(torch.int32)
    # below the tie that rounds to inf
    return ((bits & 0xFFFF) == 0x8000) & ((bits & 0x7FFFFFFF) < 0x7F7F8000)


@torch.no_grad()
def round_ties(model, dtype, max_frac=MAX_TIE_FRAC, name='model', chunk=2**22):
    """Count the fp32 weights on bf16's rounding ties (dtype: the autocast dtype of the body; None
    or fp32: nothing to do); above max_frac of all, move each of them to the value
    autocast rounds it to, and print one line. Returns the count.

    Fix, not refuse: on the tied entries this is what the bf16 forward already computes (the
    linear layers see the same weights before and after); only the layers autocast leaves in fp32,
    the embedding lookup (and with tied embeddings the fp32 LM head) and the RMSNorm scales, see a
    change of half a bf16 step on those entries: below the model's quantization error, while
    the jump it prevents is a full step in the direction of the update. Weights off the ties are left
    bit for bit. Measured on the old demo model (bf16): rounding the linear layers' 10.2M ties leaves
    the bf16 log-probs identical bit for bit; rounding the embedding's 0.7M moves them by 0.05 nats
    on average (max 0.29), once, at load: the size of bf16's own noise (bf16 vs fp32 forward of the
    same weights: 0.037), and not along any gradient."""
    if dtype != torch.bfloat16:
        return 0
    # tied weights appear once
    params = [p for p in model.parameters() if p.dtype == torch.float32]
    # scratch memory: a chunk at a time
    ties = lambda p: [rounding_ties(c) for c in p.view(-1).split(chunk)]
    count = sum(int(t.sum()) for p in params for t in ties(p))
    total = sum(p.numel() for p in params)
    if count > max_frac * total:
        for p in params:
            for c, t in zip(p.view(-1).split(chunk), ties(p)):
                c.copy_(torch.where(t, c.to(dtype).float(), c))
        print(f"{name}: {count:,} of {total:,} weights ({count / total:.1%}) sat exactly on a "
              f"bfloat16 rounding tie; rounded them to nearest-even (a first update of any "
              f"size would flip half of them a whole step)")
    return count


# -----------------------------------------------------------------------------
# per-token log-probs and entropy of the completion tokens

def completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                        temperature=1.0, autocast_dtype=None, chunk_elements=2**24, keep_elements=2**28,
                        completion_attention=None):
    """log pi(token) and the entropy of pi at every completion position, both (B, C), in fp32.

    The batch layout (rollout.py): prompts left-padded to P tokens, completions right-padded to C
    tokens, so every row's completion starts at column P and the hidden state at column P-1+t
    predicts completion token t. The head sees only real completion tokens, chunk_elements logits at a
    time (HeadLogprobs; 2**24 fp32 logits = 64 MB); padding positions get log-prob and entropy 0. Backward
    recomputes the logits unless all of them fit in keep_elements (2**28 = 1 GiB): then they are kept.
    completion_attention (tool rollouts): the tokens attended to, the tool's too; the head and the
    log-probs are still the completion_mask's (the model's) only."""
    # valid: (B, C)
    head, valid = model.get_output_embeddings(), completion_mask.bool()
    attention = completion_mask if completion_attention is None else completion_attention
    hidden = completion_hidden(model.get_decoder(), prompt_ids, prompt_mask, completion_ids, attention,
                               # (N, H): only the N real completion tokens
                               autocast_dtype)[valid]
    # MiniMax-M1: the LM head in FP32, hidden state and weight both cast up before the matmul
    with torch.autocast(hidden.device.type, enabled=False):
        logp, entropy = HeadLogprobs.apply(hidden.float(), head.weight.float(), completion_ids[valid], temperature,
                                           max(1, chunk_elements // head.weight.shape[0]),
                                           torch.is_grad_enabled() and len(hidden) * len(head.weight) <= keep_elements)
    zeros = torch.zeros(valid.shape, device=valid.device)
    # (B, C) each
    return zeros.masked_scatter(valid, logp), zeros.masked_scatter(valid, entropy)


def completion_hidden(body, prompt_ids, prompt_mask, completion_ids, completion_attention,
                      autocast_dtype=None):
    """The body's last hidden state at the C positions that predict the completion tokens: (B, C, H).

    Rows with the same prompt (a GRPO group's G answers) share one forward of it: each distinct prompt goes
    through the body once, and its keys and values serve every answer to it as a KV cache. Backward sums the
    answers' gradients into the one prompt pass, so loss and gradients are those of separate forwards (to
    round-off) at the cost of one prompt instead of G. (Not under HF's gradient checkpointing: it drops caches.)
    FSDP: every rank must call the body as many times (each call gathers every layer), so a sharded body
    always takes the two calls, also when no prompt is shared."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)                     # (B, P+C)
    attention_mask = torch.cat([prompt_mask, completion_attention.long()], dim=1)  # (B, P+C)
    # left padding must not shift positions
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    P = prompt_ids.shape[1]
    # (U, 2P), (B,)
    prompts, row_prompt = torch.cat([prompt_ids, prompt_mask], 1).unique(dim=0, return_inverse=True)
    device_type, enabled = input_ids.device.type, autocast_dtype is not None
    # CPU: SDPA's math backend, which computes bf16 q, k, v in fp32 like the flash kernel and runs
    # backward ~2x faster at these short rows (bench.py --only=attention); not under gradient
    # checkpointing, whose recomputation in backward runs outside this block
    math = device_type == 'cpu' and not body.is_gradient_checkpointing
    math_attention = sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext()
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=enabled), math_attention:
        # one pass over prompt + answer
        sharded = isinstance(body.layers[0], FSDPModule)
        if (len(prompts) == len(prompt_ids) and not sharded) or body.is_gradient_checkpointing:
            return body(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids).last_hidden_state[:, P - 1:-1]
        prompt = body(input_ids=prompts[:, :P], attention_mask=prompts[:, P:], use_cache=True,
                      # (U, P, H) and its KV cache
                      position_ids=(prompts[:, P:].cumsum(1) - 1).clamp(min=0))
        # each answer gets its prompt's keys and values (and, below, its last hidden state)
        for layer in prompt.past_key_values.layers:
            layer.keys, layer.values = rows_of(layer.keys, row_prompt), rows_of(layer.values, row_prompt)
        answers = body(input_ids=completion_ids, attention_mask=attention_mask, position_ids=position_ids[:, P:],
                       # (B, C, H)
                       past_key_values=prompt.past_key_values, use_cache=True).last_hidden_state
    return torch.cat([rows_of(prompt.last_hidden_state[:, -1:], row_prompt), answers[:, :-1]], dim=1)


def rows_of(x, rows):
    """x[rows] (rows along dim 0, repeats allowed), its backward adding the repeats' gradients in a
    fixed order, so that a run repeats itself. On CPU by index_select: indexing's backward there
    (index_put_ with accumulate, fp32, 2+ threads) adds them with atomics from every thread, in a
    varying order. On CUDA by indexing: there index_select's backward is the one with atomics (both
    in torch.use_deterministic_algorithms' list)."""
    return x.index_select(0, rows) if x.device.type == 'cpu' else x[rows]


class HeadLogprobs(torch.autograd.Function):
    """log pi(target) and the entropy of pi = softmax(hidden @ weight.T / T), chunk tokens at a time.

    The naive path materialises (N, V) fp32 logits, and autograd keeps several (N, V) tensors alive for
    backward: at Qwen's V = 151,936 and 8,192 tokens that is 5 GB each. Here only one chunk's logits
    exist at a time, and backward recomputes them (one extra head matmul) instead of storing them; when all of
    them are small enough (keep=True) it keeps them instead, which saves that matmul and a log-softmax."""

    @staticmethod
    def log_softmax(h, weight, temperature):
        """log softmax(h @ weight.T / T): one chunk's (n, V) log-probs over the vocabulary, fp32."""
        z = h @ weight.T
        return (z if temperature == 1 else z.div_(temperature)).log_softmax(-1)

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, keep):   # (N, H), (V, H), (N,)
        logp, entropy, kept = [], [], []
        for h, t in zip(hidden.split(chunk), targets.split(chunk)):
            logp_all = HeadLogprobs.log_softmax(h, weight, temperature)           # (n, V)
            logp.append(logp_all.gather(1, t[:, None]).squeeze(1))
            entropy.append(-logp_all.exp().mul_(logp_all).sum(-1))
            kept += [logp_all] if keep else []
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk, ctx.kept = temperature, chunk, kept
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        return torch.cat(logp), torch.cat(entropy)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):                                   # (N,), (N,)
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden, grad_weight = torch.zeros_like(hidden), torch.zeros_like(weight)
        for k, i in enumerate(range(0, hidden.shape[0], ctx.chunk)):
            h, t, s = hidden[i:i + ctx.chunk], targets[i:i + ctx.chunk], slice(i, i + ctx.chunk)
            # (n, V)
            logp_all = ctx.kept[k] if ctx.kept else HeadLogprobs.log_softmax(h, weight, ctx.temperature)
            p = logp_all.exp()
            if grad_entropy is not None:  # dH / dz_j = -p_j (log p_j + H), z = logits / T
                H = -(p * logp_all).sum(-1, keepdim=True)
                # in place, (n, V)
                entropy_part = logp_all.add_(H).mul_(p).mul_(-grad_entropy[s, None])
            # dLoss / dz, (n, V), in place of p: d log pi(t) / dz = onehot(t) - p
            if grad_logp is None:
                g = p.zero_()
            else:
                g = p.mul_(-grad_logp[s, None]).scatter_add_(1, t[:, None], grad_logp[s, None])
            if grad_entropy is not None:
                g.add_(entropy_part)
            if ctx.temperature != 1:
                g.div_(ctx.temperature)
            grad_hidden[s] = g @ weight
            if ctx.needs_input_grad[1]:
                grad_weight.addmm_(g.T, h)
        ctx.kept = None  # used up in place
        return grad_hidden, grad_weight if ctx.needs_input_grad[1] else None, None, None, None, None


def clip_grad_norm(params, max_norm):
    """torch's clip_grad_norm_ (max_norm 0: no clipping), the norm as a float. FSDP's sharded
    gradients give a DTensor norm: made whole first."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


class Scorer(torch.nn.Module):
    """completion_logprobs (or completion_values) of a micro-batch as a module's forward,
    scorer(mb), with the function's own keywords (temperature, autocast_dtype) fixed once.
    DistributedDataParallel syncs gradients through hooks it sets up in forward, so under torchrun
    the trainer wraps this, not the HF model (whose own forward would make the full bf16 logits we
    avoid)."""

    def __init__(self, model, fn=None, **kwargs):
        super().__init__()
        self.model, self.fn, self.kwargs = model, fn or completion_logprobs, kwargs

    def forward(self, mb):
        return self.fn(self.model, mb['prompt_ids'], mb['prompt_mask'], mb['completion_ids'],
                       mb['completion_mask'], completion_attention=mb.get('completion_attention'),
                       **self.kwargs)


def wrap(scorer, mode, local_rank=0):
    """A Scorer made ready for torchrun (mode None, plain python: as is). 'ddp': DDP averages the
    gradients over ranks in the last micro-batch's backward. 'fsdp' (FSDP2): fully_shard on each
    decoder layer, then on the whole (the root: embeddings, final norm and head, gathered for the
    whole forward; tied weights stay tied); a layer's weights are gathered for its forward and
    backward, its gradients reduce-scattered to their shards. Weights stay fp32 (autocast casts the
    body as without sharding); the optimizer is built after, on this rank's shards."""
    if mode == 'fsdp':
        from torch.distributed.fsdp import fully_shard
        for layer in scorer.model.base_model.layers:
            fully_shard(layer)
        return fully_shard(scorer)
    if mode == 'ddp' and any(p.requires_grad for p in scorer.parameters()):
        # the gradients are views into DDP's reduction buckets: no second copy of them
        return DDP(scorer, device_ids=[local_rank] if torch.cuda.is_available() else None,
                   gradient_as_bucket_view=True)
    return scorer


def all_reduce_sum(x, device):
    """x summed over the ranks of the default process group: a number, a CPU tensor, or a dict of
    numbers with the same keys on every rank (one float64 all-reduce for a number or a dict)."""
    if torch.is_tensor(x):
        summed = x.to(device)  # (NCCL reduces GPU tensors only)
        dist.all_reduce(summed)
        return summed.cpu()
    keys = sorted(x) if isinstance(x, dict) else None
    values = [float(x[k]) for k in keys] if keys else [float(x)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist())) if keys else t.item()


def close_process_group():
    """The default process group destroyed (vLLM 0.32's shutdown has destroyed it already, 0.33's
    has not), then 50 ms with the GIL released. A gloo worker thread frees the last collective's
    tensors just after the caller has moved on, and that takes the GIL; had the interpreter begun
    to shut down by then, the thread would be stopped inside a destructor and the rank would abort
    ("terminate called without an active exception", SIGABRT) after its work was done. The group
    outlives destroy_process_group while FSDP2 still refers to it. Measured on 2 cores: 5 of 40
    torchrun runs aborted without the wait in a script that keeps the group alive, 0 of 60 with it;
    tests/ddp_update.py under FSDP with LoRA aborted 3 times in 233 runs."""
    if dist.is_initialized():
        dist.destroy_process_group()
    time.sleep(0.05)


def backward_pass(net, mbs, loss_of, world_size=1):
    """One pass of gradient accumulation over the micro-batches (the policy's and the critic's):
    loss_of(mb) -> (loss, extra), the micro-batch's share of the step's loss; its backward, times
    world_size (DDP averages over ranks, our shares are meant to be summed), all-reduces the
    gradients only in the last micro-batch (DDP's no_sync before). Yields (mb, loss, extra) after
    each backward, the loss as a float."""
    for i, mb in enumerate(mbs):
        last = i == len(mbs) - 1
        with net.no_sync() if isinstance(net, DDP) and not last else contextlib.nullcontext():
            loss, extra = loss_of(mb)
            (loss * world_size).backward()
        yield mb, loss.item(), extra


def micro_batches(batch, G, micro_batch_size, max_tokens_per_micro, device, even=False):
    """Token-budget micro-batches: rows packed greedily while a micro-batch has at most
    micro_batch_size rows and max_tokens_per_micro tokens through the body, padding included, each
    distinct prompt counted once (completion_hidden shares it among the rows that answer it); each
    is cut to its own longest prompt and completion. Rows go in by length (completion, then prompt:
    the least padding) or group by group (each prompt once per micro-batch), whichever puts fewer
    tokens through the body.
    Rows i // G share a prompt (G: the group size; 1 where no prompt is shared). even (FSDP): as
    many micro-batches as on the rank with the most (even_micro_batches). Returns them (on device),
    the number of real tokens they put through the body and the fraction of their tokens that is
    padding."""
    prompt_len = batch['prompt_mask'].sum(1).tolist()
    # the tokens through the body: with a tool, the tool's too (completion_attention)
    completion_len = batch.get('completion_attention', batch['completion_mask']).sum(1).long().tolist()
    P = batch['prompt_ids'].shape[1]

    def tokens(rows):
        prompts = len({i // G for i in rows}) * max(prompt_len[i] for i in rows)
        return prompts + len(rows) * max(1, max(completion_len[i] for i in rows))

    def pack(order):
        packs = [[]]
        for i in order:
            rows = packs[-1] + [i]
            if len(rows) > 1 and (len(rows) > micro_batch_size or tokens(rows) > max_tokens_per_micro):
                packs.append([i])
            else:
                packs[-1] = rows
        return packs

    rows = range(len(prompt_len))
    group_len = lambda i: max(completion_len[i // G * G:(i // G + 1) * G])  # its group's longest
    by_length = sorted(rows, key=lambda i: (-completion_len[i], -prompt_len[i], i))
    # a group's rows side by side: its prompt runs once per micro-batch, not once per row
    by_group = sorted(rows, key=lambda i: (-group_len(i), i // G, -completion_len[i], i))
    # the packing with fewer tokens through the body (long shared prompts: by group)
    packs = min(pack(by_length), pack(by_group), key=lambda packs: sum(map(tokens, packs)))
    mbs = []
    for rows in packs:
        p, c = max(prompt_len[i] for i in rows), max(1, max(completion_len[i] for i in rows))
        # prompts keep their last p columns (left padding), completions their first c
        def cut(k, v):
            return v[:, P - p:] if k.startswith('prompt') else v[:, :c] if v.dim() == 2 else v
        mbs.append({k: cut(k, v[rows]).to(device) for k, v in batch.items() if torch.is_tensor(v)})
    real_prompts = sum(prompt_len[g * G] for rows in packs for g in {i // G for i in rows})
    real = real_prompts + sum(completion_len)
    return even_micro_batches(mbs) if even else mbs, real, 1 - real / sum(map(tokens, packs))


def even_micro_batches(mbs):
    """FSDP: as many micro-batches on this rank as on the rank with the most, padded with one-row
    micro-batches whose completion_mask is 0 (no loss, no statistic, zero gradient). Every FSDP
    forward all-gathers and every backward reduce-scatters: a rank with fewer micro-batches (its
    answers shorter, fewer live groups, a smaller dynamic-sampling surplus) would reach the next
    collective while another still gathers, and hang (NCCL) or fail (gloo). verl does the same
    (rearrange_micro_batches: the count all-reduced with MAX)."""
    n = torch.tensor(len(mbs))
    torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)
    filler = {k: v[:1].clone() for k, v in mbs[-1].items()}
    filler["completion_mask"] = torch.zeros_like(filler["completion_mask"])
    return mbs + [filler] * (int(n) - len(mbs))


# -----------------------------------------------------------------------------
# the critic of ppo / vapo: the policy's base network with a scalar head, V(s_t) at every position

def load_critic(path):
    """A value model from a causal-LM folder (a fresh head, zero: V = 0 until trained) or from a
    saved critic."""
    from transformers import AutoModelForTokenClassification
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    if not os.path.exists(os.path.join(path, "critic.json")):
        torch.nn.init.zeros_(critic.score.weight)
        if critic.score.bias is not None:
            torch.nn.init.zeros_(critic.score.bias)
    return critic


def completion_values(critic, prompt_ids, prompt_mask, completion_ids, completion_mask,
                      autocast_dtype=None, completion_attention=None):
    """V(s_t) before each completion token, (B, C) in fp32, 0 on padding and on a tool's tokens (the
    value head in fp32, as the LM head)."""
    attention = completion_mask if completion_attention is None else completion_attention
    hidden = completion_hidden(critic.base_model, prompt_ids, prompt_mask, completion_ids,
                               attention, autocast_dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        values = F.linear(hidden.float(), critic.score.weight.float(), critic.score.bias).squeeze(-1)
    return values * completion_mask


def save_critic(path, critic, state_dict=None):
    critic.save_pretrained(path, state_dict=state_dict)
    # a saved head is kept on load
    json.dump({"trained": True}, open(os.path.join(path, "critic.json"), "w"))
