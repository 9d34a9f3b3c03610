"""
Where an RL step's time goes, and how close each part runs to the hardware. Prints one table; every
number in it is measured by this run, on this machine (CUDA is detected and used the same way).

    python bench.py                  # everything (~15 min on 2 CPU cores)
    python bench.py --only=score     # one section: peak | rollout | score | step | profile | share
                                     #   | attention | memory | floor | lora

Sections
  peak     matmul GFLOP/s in fp32 and bf16: the ceiling the update is measured against
  rollout  tokens/s of vLLM and of HF generate on the same prompts (the standard workload below)
  score    log-prob + entropy of 8,192 tokens through a head of vocab V, forward and backward: the
           naive (N, V) fp32 logits path versus model.py's chunked HeadLogprobs, time and peak
           memory
  step     the standard workload (16 prompts x 8 samples x <= 64 new tokens, SmolLM2-135M) through
           train.py itself: rollout / scoring / update / sync seconds; "before" = the same code
           with fp32 compute, HF generate and the naive head. Update efficiency = model FLOPs /
           update time / the matmul peak of the body's dtype, with model FLOPs = 6 * (body params
           * body tokens + head params * completion tokens), of the trained rows.
  profile  where the update's seconds go: torch.profiler over step 2 of the same workload (its
           scoring and update stages), each op's self time by category (body matmuls, attention,
           the FP32 head, loss, statistics, optimizer, other ops, Python between ops), and the
           largest ops. The profiler adds a little to each op.
  share    the shared-prompt path of model.completion_hidden (4 prompts x 8 answers, each prompt
           through the body once) against the dense one (32 prompts), forward + backward, and the
           body's tokens per second once the head's time (measured alone) is taken out.
  attention  SDPA forward + backward on the CPU at config/cpu_hard.py's answer shape, bf16 inputs:
           the flash kernel against the math backend that model.completion_hidden runs on CPU,
           time and error against float64
  memory   what each of 2 ranks (torchrun, gloo/NCCL) holds of the policy's weights, gradients and
           AdamW state, with parallel='ddp' (all of it on each rank), 'fsdp' (its shards), and both
           with LoRA adapters of rank 8 (lora.py), and the process's resident-set peak
  floor    the ratio's floor (issue #15): one AdamW step at a tiny learning rate with
           num_iterations=2, then the second pass's mean |log pi - log pi_old| and clip fraction
           (eps 0.2), on 2 prompts x 4 answers (<= 16 tokens) sampled once from models/smollm2/hf;
           for the bf16-exact model, the old conversion (fp32, 8.1 % of the weights on bf16
           rounding ties; rebuilt by models/smollm2/prepare.py --keep_ties into
           models/smollm2/hf_ties, about a minute the first time), the same through
           model.round_ties, and the old one with an fp32 body. Seconds a cell on a CPU with bf16
           instructions; 2 minutes on one without (bf16 matmuls emulated: ~1 GFLOP/s).
  lora     how closely a vLLM engine follows a LoRA policy (lora.py, rank 8, demo model) as its
           adapters move (AdamW at lr 1e-3 on a signed log-likelihood of fixed samples): the
           mean |log pi_trainer - log pi_engine| of the engine's samples (16 answers, <= 16
           tokens) after each step, for the merged sync (train.py's) and vLLM's own LoRA
           (enable_lora, the adapter written in PEFT's format each step), against the trainer's
           merged forward (lora.py's) and the textbook W x + s B (A x). One step took 3.5 min on
           a busy 2-core Xeon (2026-12-01); the section runs 4.
Each measurement runs in its own process, so one that runs out of memory is reported as such.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import torch

device = 'cuda' if torch.cuda.is_available() else 'cpu'
MODEL = 'models/smollm2/hf'
# learning_rate=0: the step does all its work (the optimizer step included) but the policy stays the
# one both columns start from, so their answers (the work) have the same length distribution at
# every step
WORKLOAD = ['config/cpu_demo.py', '--prompts_per_step=16', '--group_size=8', '--max_new_tokens=64',
            '--learning_rate=0', '--eval_interval=0', '--max_iters=3', '--micro_batch_size=128',
            '--max_tokens_per_micro=2048']
BEFORE = ['--dtype=float32', '--rollout_engine=hf']  # plus the naive head (patched in below)


def sync():
    if device == 'cuda':
        torch.cuda.synchronize()


def measure(fn):
    """Seconds and peak memory in bytes above the start (CUDA: allocated; CPU: resident set, polled)
    of fn()."""
    if device == 'cuda':
        sync(), torch.cuda.reset_peak_memory_stats()
        base, t0 = torch.cuda.memory_allocated(), time.time()
        fn(), sync()
        return time.time() - t0, torch.cuda.max_memory_allocated() - base
    rss = lambda: int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    base, peak, done = rss(), [0], threading.Event()
    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)
    thread = threading.Thread(target=poll)
    thread.start()
    t0 = time.time()
    fn()
    seconds = time.time() - t0
    done.set(), thread.join()
    return seconds, max(peak[0], rss()) - base


def naive_head(hidden, weight, targets, temperature):
    """The textbook path (and model.py's before this benchmark): all (N, V) fp32 logits, autograd
    keeps them."""
    logp_all = torch.log_softmax(hidden @ weight.T / temperature, dim=-1)                 # (N, V)
    return logp_all.gather(1, targets[:, None]).squeeze(1), -(logp_all.exp() * logp_all).sum(-1)


# -----------------------------------------------------------------------------
# the measurements, one per child process (`python bench.py --child=NAME ARGS`)

def child_peak():
    n = 8192 if device == 'cuda' else 2048
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = (torch.randn(n, n, device=device, dtype=dtype),
                torch.randn(n, n, device=device, dtype=dtype))
        a @ b
        seconds, _ = measure(lambda: [a @ b for _ in range(5)])
        out[str(dtype).split('.')[1]] = 5 * 2 * n ** 3 / seconds / 1e9
    return out


def child_score(impl, vocab, tokens, hidden_size=576):
    from model import HeadLogprobs
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, device=device, generator=g).requires_grad_()
    weight = (0.02 * torch.randn(vocab, hidden_size, device=device, generator=g)).requires_grad_()
    targets = torch.randint(vocab, (tokens,), device=device, generator=g)
    advantages = torch.randn(tokens, device=device, generator=g)
    head = naive_head if impl == 'naive' else lambda *a: HeadLogprobs.apply(
        *a, max(1, 2 ** 24 // vocab), tokens * vocab <= 2 ** 28)
    # the default loss: a policy-gradient term on log pi; the entropy is computed, for the log
    def step():
        logp, entropy = head(hidden, weight, targets, 1.0)
        (-(advantages * logp).mean()).backward()
    seconds, peak = measure(step)
    return {'seconds': seconds, 'peak_bytes': peak}


def child_rollout():
    from model import load_model
    from rollout import encode_prompts, generate, init_engine, make_batch
    model, tokenizer = load_model(MODEL)
    rows = [json.loads(line) for line in open('data/arithmetic/train.jsonl')][:16]
    prompt_ids = encode_prompts(tokenizer, [r['prompt'] for r in rows])
    out = {}
    for kind in ('vllm', 'hf'):
        engine = init_engine(kind, MODEL, gpu_memory_utilization=0.3)
        # timed as the trainer rolls out: sampling, then padding into its batch
        run = lambda: make_batch(generate(engine, tokenizer, prompt_ids, 8, 64, 1.0,
                                          model=model.to(device), autocast_dtype=torch.bfloat16),
                                 tokenizer.pad_token_id)
        generate(engine, tokenizer, prompt_ids[:2], 2, 8, 1.0, model=model.to(device),
                 autocast_dtype=torch.bfloat16)
        t0 = time.time()
        batch = run()
        seconds = time.time() - t0
        out[kind] = {'tokens': batch['completion_mask'].sum().item(), 'seconds': seconds}
        del engine
    return out


def floor_batch(model, tokenizer, prompts=2, samples=4, max_new_tokens=16, seed=0):
    """`samples` answers to each of the first `prompts` training problems, drawn from model by HF
    generate at T = 1 in fp32 (seeded), in the trainer's batch layout (rollout.make_batch)."""
    from rollout import encode_prompts, generate, make_batch
    rows = [json.loads(line) for line in open('data/arithmetic/train.jsonl')][:prompts]
    torch.manual_seed(seed)
    return make_batch(generate({'kind': 'hf'}, tokenizer,
                               encode_prompts(tokenizer, [r['prompt'] for r in rows]), samples,
                               max_new_tokens, 1.0, model=model, autocast_dtype=None),
                      tokenizer.pad_token_id)


def ratio_floor(model, batch, lr, autocast_dtype=torch.bfloat16, eps=0.2):
    """One update as train.py makes it with num_iterations=2 (pi_old from a no-grad pass; the grpo
    loss with advantages +1 -1 +1 -1 ... in each group; grad clip 1.0; fused AdamW, betas (0.9,
    0.99), no weight decay), then the second pass's (mean |log ratio|, clip fraction), from
    policy_loss's statistics. Changes model's weights."""
    from losses import policy_loss
    from model import completion_logprobs
    args = (batch['prompt_ids'], batch['prompt_mask'], batch['completion_ids'],
            batch['completion_mask'], 1.0, autocast_dtype)
    model.train()
    with torch.no_grad():
        old_logp = completion_logprobs(model, *args)[0]
    advantages = torch.tensor([1.0, -1.0], device=old_logp.device).repeat(len(old_logp) // 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0,
                                  fused=True)
    for it in range(2):
        logp = completion_logprobs(model, *args)[0]
        loss, stats = policy_loss('grpo', logp, old_logp, advantages, batch['completion_mask'],
                                  eps_low=eps, eps_high=eps)
        if it == 0:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return stats['log_ratio_abs_mean'], stats['clip_frac']


FLOOR_LRS = (1e-8, 1e-6, 1e-5)


def child_floor():
    from model import load_model
    ties_dir = 'models/smollm2/hf_ties'
    subprocess.run([sys.executable, 'models/smollm2/prepare.py', f'--keep_ties={ties_dir}'],
                   check=True, stdout=subprocess.DEVNULL)
    model, tokenizer = load_model(MODEL)
    batch = {k: v.to(device) if torch.is_tensor(v) else v
             for k, v in floor_batch(model.to(device), tokenizer).items()}
    setups = {'bf16 body, bf16-exact weights (models/smollm2/hf)': (MODEL, torch.bfloat16, None),
              'bf16 body, old weights on ties': (ties_dir, torch.bfloat16, None),
              'bf16 body, old weights, ties rounded at load':
                  (ties_dir, torch.bfloat16, torch.bfloat16),
              'fp32 body, old weights on ties': (ties_dir, None, None)}
    out = {'tokens': batch['completion_mask'].sum().item()}
    for name, (path, autocast_dtype, guard) in setups.items():
        model = load_model(path, autocast_dtype=guard)[0].to(device)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        out[name] = []
        for lr in FLOOR_LRS:
            model.load_state_dict(start)
            out[name].append(ratio_floor(model, batch, lr, autocast_dtype))
    return out


def cpu_name():
    """The CPU's model name, family and its bf16 instructions (bf16 on a CPU without them is
    emulated, and rounds differently). The family tells these VMs' EPYCs apart, whose model name
    is "AMD EPYC" alone: family 26 (Zen 5) ran bf16 matmuls 1.7x as fast as another EPYC with
    AVX512-BF16 (docs/performance.md)."""
    info = open('/proc/cpuinfo').read() if os.path.exists('/proc/cpuinfo') else ''
    first_cpu = info.split('\n\n')[0].splitlines()
    fields = {k.strip(): v.strip() for k, v in (line.split(':', 1) for line in first_cpu if ':' in line)}
    name = fields.get('model name', 'CPU')
    if 'cpu family' in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    bf16 = [f for f in ('avx512_bf16', 'amx_bf16') if f' {f}' in info]
    return f"{name}, {os.cpu_count()} cores, bf16 instructions: {', '.join(bf16) or 'none'}"


def child_train(*args):
    """train.py as a script in this process, with the naive head patched in when asked
    ('--naive_head')."""
    import runpy
    import model
    if '--naive_head' in args:
        model.HeadLogprobs.apply = staticmethod(
            lambda h, w, t, temperature, chunk, keep: naive_head(h, w, t, temperature))
    sys.argv = ['train.py', *[a for a in args if a != '--naive_head']]
    runpy.run_path('train.py', run_name='__main__')


def child_share():
    """One forward + backward of model.completion_logprobs on 32 rows x (40 prompt + 40 completion)
    tokens, in the body dtype train.py's dtype='auto' picks here: 4 prompts x 8 answers (each prompt
    through the body once, a KV cache for its answers) versus 32 distinct prompts (the dense path),
    and the head alone on the same 1,280 completion tokens. Random token ids; the fastest of three
    repeats after a warm-up."""
    from model import HeadLogprobs, completion_logprobs, load_model, native_bf16
    model = load_model(MODEL)[0].to(device).train()
    autocast_dtype = torch.bfloat16 if native_bf16(device) else None
    rows, P, C, V = 32, 40, 40, model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    out = {'dtype': str(autocast_dtype or torch.float32).split('.')[1]}
    for name, prompts in (('shared', 4), ('dense', rows)):
        ids = torch.randint(100, V, (prompts, P), generator=g).repeat_interleave(rows // prompts, 0)
        args = [t.to(device) for t in (ids, torch.ones(rows, P, dtype=torch.long),
                                       torch.randint(100, V, (rows, C), generator=g),
                                       torch.ones(rows, C))]
        def step():
            model.zero_grad(set_to_none=True)
            completion_logprobs(model, *args, 1.0, autocast_dtype)[0].sum().backward()
        step()
        out[name] = {'seconds': min(measure(step)[0] for _ in range(3)),
                     'body_tokens': prompts * P + rows * C}
    hidden = torch.randn(rows * C, model.config.hidden_size, device=device).requires_grad_()
    weight = model.get_output_embeddings().weight.detach().float().requires_grad_()
    targets = torch.randint(V, (rows * C,), device=device)
    out['head_seconds'] = min(measure(lambda: HeadLogprobs.apply(
        hidden, weight, targets, 1.0, 2 ** 24 // V, True)[0].sum().backward())[0] for _ in range(3))
    return out



def child_attention():
    """SDPA forward + backward at the shape of config/cpu_hard.py's answers on the CPU (64 answers of
    16 tokens over 47-token prompts; SmolLM2's 9 query and 3 key / value heads of 64), bf16 inputs,
    for the flash and math backends: seconds (the fastest of 5 after a warm-up) and the largest of
    the output's and the three input gradients' mean relative errors against float64."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator().manual_seed(0)
    B, H, KV, Q, K, D = 64, 9, 3, 16, 63, 64
    # bf16 values, so that float64 sees the same inputs
    q, k, v, grad_out = (torch.randn(*shape, generator=g).bfloat16() for shape in (
        (B, H, Q, D), (B, KV, K, D), (B, KV, K, D), (B, H, Q, D)))
    causal = torch.ones(Q, K, dtype=torch.bool).tril(K - Q)  # each answer token sees its prompt
    def run(dtype):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=causal, enable_gqa=True)
        return [out, *torch.autograd.grad(out, leaves, grad_out.to(dtype))]
    exact, out = run(torch.float64), {}
    for name, backend in (('flash', SDPBackend.FLASH_ATTENTION), ('math', SDPBackend.MATH)):
        with sdpa_kernel(backend):
            got, seconds = run(torch.bfloat16), []
            for _ in range(5):
                t0 = time.perf_counter()
                run(torch.bfloat16)
                seconds.append(time.perf_counter() - t0)
        error = max(((a.double() - e).abs().mean() / e.abs().mean()).item() for a, e in zip(got, exact))
        out[name] = {'seconds': min(seconds), 'error': error}
    return out

# the update's time by category: torch.profiler over step 2's score and update stages (train.py's
# timed() ranges), every op's self time put in the first category that claims it
MATMULS = ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::matmul', 'aten::linear', 'aten::baddbmm')
CATEGORIES = {  # category: (names of enclosing ranges, op-name test), in order of precedence
    'FP32 LM head (HeadLogprobs)': ({'head'}, None),
    'optimizer (clip, AdamW, zero_grad)': ({'optimizer', 'Optimizer.step#AdamW.step',
                                            'Optimizer.zero_grad#AdamW.zero_grad'}, None),
    'statistics (token weights)': ({'statistics'}, None),
    'loss (policy_loss, elementwise)': ({'loss'}, None),
    'attention (SDPA, fwd + bwd)': (set(), lambda n: 'attention' in n or 'sdpa' in n),
    'body matmuls (fwd + bwd)': (set(), lambda n: n in MATMULS),
    'other ops (norms, elementwise, casts, copies)': (set(), lambda n: True),
}


def child_profile(*args):
    """train.py on the workload, torch.profiler on over step 2's score and update (from
    rollout.sleep to rollout.sync_weights). Returns {stage: {category: seconds}}; a stage's own
    self time (Python between ops) is 'python (between ops)'."""
    import runpy
    import losses
    import model
    import rollout
    from torch.profiler import ProfilerActivity, profile, record_function

    def marked(fn, name):
        def wrapper(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return wrapper
    model.HeadLogprobs.forward = staticmethod(marked(model.HeadLogprobs.forward, 'head'))
    model.HeadLogprobs.backward = staticmethod(marked(model.HeadLogprobs.backward, 'head'))
    torch.nn.utils.clip_grad_norm_ = marked(torch.nn.utils.clip_grad_norm_, 'optimizer')
    losses.token_weight_sums = marked(losses.token_weight_sums, 'statistics')
    losses.policy_loss = marked(losses.policy_loss, 'loss')
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    prof, steps = profile(activities=activities), [0]
    sleep, sync_weights = rollout.sleep, rollout.sync_weights

    def start(engine):  # called right before the score stage
        steps[0] += 1
        if steps[0] == 2:
            prof.__enter__()
        sleep(engine)

    def stop(engine, policy, *weights):  # called right after the update
        if steps[0] == 2:
            sync()
            prof.__exit__(None, None, None)
        sync_weights(engine, policy, *weights)
    rollout.sleep, rollout.sync_weights = start, stop
    sys.argv = ['train.py', *WORKLOAD, '--max_iters=2', '--ckpt_interval=-1',
                f'--out_dir={tempfile.mkdtemp(prefix="bench_")}', *args]
    runpy.run_path('train.py', run_name='__main__')
    out, ops = {}, {}
    for event in prof.events():
        ranges, parent = set(), event.cpu_parent
        while parent is not None:
            ranges.add(parent.name)
            parent = parent.cpu_parent
        stage = next((s for s in ('score', 'train') if s in ranges or s == event.name), None)
        if stage is None:
            continue
        if event.name == stage:
            category = 'python (between ops)'
        else:
            category = next(c for c, (names, test) in CATEGORIES.items()
                            if ranges & names or event.name in names or (test and test(event.name)))
        out.setdefault(stage, {}).setdefault(category, 0.0)
        out[stage][category] += event.self_cpu_time_total / 1e6
        if stage == 'train':
            key = f"{event.name} ({category.split(' (')[0]})"
            ops[key] = ops.get(key, 0.0) + event.self_cpu_time_total / 1e6
    out['top ops'] = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:16])
    return out


def local_bytes(tensors):
    """Bytes this rank holds of the tensors: a sharded (DTensor) one counts its local shard."""
    return sum((t.to_local() if hasattr(t, 'to_local') else t).nbytes for t in tensors)


def child_memory(out_path, *args):
    """Run under torchrun: one step of train.py (the policy of SmolLM2-135M, AdamW, a vLLM engine per
    rank), counting the bytes this rank holds of the policy's weights and gradients (at clipping,
    before zero_grad) and of AdamW's state (after its step), plus the process's resident-set peak.
    Writes them to out_path + the rank."""
    import resource
    import runpy
    import model
    counts = {}
    clip_grad_norm, adamw_step = model.clip_grad_norm, torch.optim.AdamW.step

    def counting_clip(params, max_norm):
        params = list(params)
        counts['weights'] = local_bytes(params)
        counts['gradients'] = local_bytes([p.grad for p in params if p.grad is not None])
        return clip_grad_norm(params, max_norm)

    def counting_step(self, *a, **k):
        out = adamw_step(self, *a, **k)
        counts['adamw'] = local_bytes([t for state in self.state.values() for t in state.values()
                                       if torch.is_tensor(t) and t.dim() > 0])  # not 'step'
        return out
    model.clip_grad_norm, torch.optim.AdamW.step = counting_clip, counting_step
    sys.argv = ['train.py', 'config/cpu_demo.py', '--prompts_per_step=2', '--group_size=4',
                '--max_new_tokens=8', '--max_iters=1', '--eval_interval=0', '--ckpt_interval=-1',
                f'--out_dir={tempfile.mkdtemp(prefix="bench_")}', *args]
    runpy.run_path('train.py', run_name='__main__')
    counts['peak_rss'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump(counts, open(f"{out_path}{os.environ['RANK']}", 'w'))


def child_lora(steps=4):
    """The mismatch table of the 'lora' section: one vLLM engine with enable_lora, which serves
    the merged weights (reloaded, no adapter) or the base with the adapter (a LoRARequest)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from lora import LoRALinear, add_lora, merged_weights, save_adapter
    from model import completion_logprobs, load_model, native_bf16
    from rollout import encode_prompts, make_batch, quiet_vllm
    quiet_vllm()
    dtype = 'bfloat16' if native_bf16('cpu') else 'float32'
    autocast = getattr(torch, dtype) if dtype == 'bfloat16' else None
    model, tokenizer = load_model(MODEL, autocast)
    add_lora(model, 8, 32.0, 'all-linear', autocast or torch.float32)
    llm = LLM(model=MODEL, dtype=dtype, enforce_eager=True, seed=0, gpu_memory_utilization=0.3,
              hf_overrides={'head_dtype': 'float32'}, logprobs_mode='processed_logprobs',
              block_size=32, enable_lora=True, max_lora_rank=8, max_loras=1)
    rows = [json.loads(line) for line in open('data/arithmetic/train.jsonl')][:8]
    prompts = encode_prompts(tokenizer, [r['prompt'] for r in rows])
    params = SamplingParams(n=2, max_tokens=16, temperature=1.0, logprobs=0, seed=2)

    def engine_samples(lora_request=None):  # the batch of the engine's samples and its log-probs
        out = llm.generate([{'prompt_token_ids': p} for p in prompts], params, use_tqdm=False,
                           lora_request=lora_request)
        samples = [(p, list(s.token_ids), [lp[t].logprob for lp, t in zip(s.logprobs, s.token_ids)])
                   for p, o in zip(prompts, out) for s in o.outputs]
        batch = make_batch({'prompt_ids': [p for p, _, _ in samples],
                            'completion_ids': [c for _, c, _ in samples],
                            'rollout_logp': [lp for _, _, lp in samples],
                            'truncated': [False] * len(samples), 'completions': []},
                           tokenizer.pad_token_id)
        return batch

    def unmerged(self, x):  # the textbook LoRA forward
        return (torch.nn.functional.linear(x, self.weight.float(), self.bias)
                + self.scale * torch.nn.functional.linear(torch.nn.functional.linear(
                    x, self.lora_A), self.lora_B))

    def mismatch(batch, forward):
        merged_forward = LoRALinear.forward
        LoRALinear.forward = forward
        with torch.no_grad():
            logp = completion_logprobs(model, batch['prompt_ids'], batch['prompt_mask'],
                                       batch['completion_ids'], batch['completion_mask'], 1.0,
                                       autocast)[0]
        LoRALinear.forward = merged_forward
        mask = batch['completion_mask']
        return ((logp - batch['rollout_logp']).abs() * mask).sum().item() / mask.sum().item()

    def reload(weights):
        llm.collective_rpc('reload_weights', kwargs={'weights_iterator': iter(weights)})
        llm.reset_prefix_cache()

    base = [(k, v.detach().to(getattr(torch, dtype)).clone())
            for k, v in merged_weights(model, changed_only=True)]
    fixed = engine_samples()  # the answers the policy learns to raise (even) and lower (odd)
    sign = torch.tensor([1.0, -1.0] * (len(fixed['completion_ids']) // 2))[:, None]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    table, adapter_dir = [], tempfile.mkdtemp(prefix='bench_lora_')
    for step in range(steps + 1):
        reload([(k, v.to(getattr(torch, dtype))) for k, v in merged_weights(model, True)])
        merged = engine_samples()
        reload(base)
        save_adapter(os.path.join(adapter_dir, str(step)), model, MODEL)
        adapter = engine_samples(LoRARequest(f'step{step}', step + 1,
                                             os.path.join(adapter_dir, str(step))))
        table.append({'merged sync, merged forward': mismatch(merged, LoRALinear.forward),
                      'merged sync, textbook forward': mismatch(merged, unmerged),
                      'vLLM LoRA, merged forward': mismatch(adapter, LoRALinear.forward),
                      'vLLM LoRA, textbook forward': mismatch(adapter, unmerged)})
        optimizer.zero_grad()
        logp = completion_logprobs(model, fixed['prompt_ids'], fixed['prompt_mask'],
                                   fixed['completion_ids'], fixed['completion_mask'], 1.0,
                                   autocast)[0]
        (-(logp * fixed['completion_mask'] * sign).sum() / fixed['completion_mask'].sum()).backward()
        optimizer.step()
    return {'dtype': dtype, 'steps': table}


def run_child(name, *args):
    """One measurement in a fresh process; its result is the JSON on its last stdout line, None if
    it died."""
    result = subprocess.run([sys.executable, __file__, f'--child={name}', *map(str, args)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  {name} {' '.join(map(str, args))}: exit {result.returncode} (out of memory?) "
              f"{result.stderr[-300:]}")
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def train_steps(*args):
    """Run the workload through train.py for 3 steps; the mean of steps 2 and 3 is the measurement
    (step 1 pays one-time warm-up)."""
    out_dir = tempfile.mkdtemp(prefix='bench_')
    result = subprocess.run([sys.executable, __file__, '--child=train', *WORKLOAD,
                             f'--out_dir={out_dir}', *args], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"  train {' '.join(args)}: exit {result.returncode} {result.stderr[-500:]}")
        return None
    steps = [json.loads(line) for line in open(os.path.join(out_dir, 'log.jsonl'))][1:]
    return {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]
            if isinstance(steps[0][k], (int, float))}


# -----------------------------------------------------------------------------
# the table

if __name__ == '__main__':
    argv = sys.argv[1:]
    if argv and argv[0].startswith('--child='):
        name, args = argv[0].split('=', 1)[1], argv[1:]
        result = {'peak': child_peak, 'score': child_score, 'rollout': child_rollout,
                  'train': child_train, 'floor': child_floor, 'profile': child_profile,
                  'share': child_share, 'memory': child_memory, 'lora': child_lora,
                  'attention': child_attention}[name](
            *[int(a) if a.isdigit() else a for a in args])
        if result is not None:
            print(json.dumps(result))
        sys.exit(0)
    only = next((a.split('=', 1)[1] for a in argv if a.startswith('--only=')), None)
    want = lambda section: only in (None, section)
    torch.set_num_threads(torch.get_num_threads())
    name = torch.cuda.get_device_name() if device == 'cuda' else cpu_name()
    rows = [('device', name, '')]

    peak = run_child('peak') if want('peak') or want('step') else None
    if peak:
        rows += [('matmul fp32', f"{peak['float32']:.0f} GFLOP/s", ''),
                 ('matmul bf16', f"{peak['bfloat16']:.0f} GFLOP/s",
                  'the ceiling of a bf16 body (emulated, far slower, without bf16 instructions)')]
    if want('rollout') and (r := run_child('rollout')):
        for kind in ('vllm', 'hf'):
            rows.append((f'rollout {kind}', f"{r[kind]['tokens'] / r[kind]['seconds']:.0f} tok/s",
                         f"{r[kind]['tokens']:.0f} tokens in {r[kind]['seconds']:.1f} s"))
    if want('score'):
        for vocab, tokens in ((49152, 8192), (151936, 8192), (151936, 4096)):
            res = {impl: run_child('score', impl, vocab, tokens) for impl in ('chunked', 'naive')}
            for impl, r in res.items():
                note = ''
                if impl == 'chunked' and r and res['naive']:
                    note = (f"{r['peak_bytes'] / res['naive']['peak_bytes']:.3f}x memory, "
                            f"{r['seconds'] / res['naive']['seconds']:.2f}x time of naive")
                rows.append((
                    f'score V={vocab} N={tokens} {impl}',
                    f"{r['seconds']:.2f} s, {r['peak_bytes'] / 2**30:.2f} GiB" if r else
                    "killed: more than the machine's "
                    f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB",
                    note))
    if want('step'):
        after, before = train_steps(), train_steps(*BEFORE, '--naive_head')
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(MODEL)
        head_params = cfg.vocab_size * cfg.hidden_size
        from transformers import AutoModelForCausalLM
        body_params = sum(p.numel() for n, p in
                          AutoModelForCausalLM.from_pretrained(MODEL).model.named_parameters()
                          if 'embed' not in n)
        from model import native_bf16
        # the ceiling of each column: the peak of the dtype its body ran in (dtype='auto' is fp32
        # on a CPU without bf16 instructions, where bf16 matmuls are emulated)
        body_dtype = {'after': 'bfloat16' if native_bf16(device) else 'float32',
                      'before': 'float32'}
        for label, r in (('after', after), ('before', before)):
            if r is None:
                continue
            parts = {k: r[f'{k}_seconds'] for k in ('rollout', 'score', 'train', 'sync')}
            total = sum(parts.values())
            rows.append((f'step {label}', f'{total:.1f} s',
                         ', '.join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)"
                                   for k, v in parts.items())))
            flops = 6 * (body_params * r['train_tokens']
                         + head_params * r['train_completion_tokens'])
            if peak:
                rows.append((
                    f'update {label}', f"{r['train_tokens'] / r['train_seconds']:.0f} tok/s",
                    f"{flops / r['train_seconds'] / 1e9:.0f} GFLOP/s = "
                    f"{100 * flops / r['train_seconds'] / 1e9 / peak[body_dtype[label]]:.0f}% "
                    f"of the {body_dtype[label]} peak (the body's dtype); "
                    f"padding {100 * r['pad_frac']:.0f}% (every row at full width: "
                    f"{100 * r.get('pad_frac_unpacked', float('nan')):.0f}%); "
                    f"{100 * r['trained_frac']:.0f}% of the rows trained (skip_zero_adv)"))
        # the two runs sample different answers (HF's and vLLM's RNGs): also per sampled token
        if after and before:
            step_time = lambda r: sum(r[f'{k}_seconds']
                                      for k in ('rollout', 'score', 'train', 'sync'))
            per_token = (step_time(before) / before['completion_len']
                         / (step_time(after) / after['completion_len']))
            rows.append(('step speed-up', f"{step_time(before) / step_time(after):.2f}x",
                         f"before / after; per sampled token: {per_token:.2f}x "
                         f"(mean answer {before['completion_len']:.1f} / "
                         f"{after['completion_len']:.1f} tokens)"))
    if want('share') and (r := run_child('share')):
        for name in ('shared', 'dense'):
            body = r[name]['seconds'] - r['head_seconds']
            rows.append((f"prompt {name} ({r['dtype']} body)", f"{r[name]['seconds']:.2f} s",
                         f"{r[name]['body_tokens']} body tokens; without the head's "
                         f"{r['head_seconds']:.2f} s: {r[name]['body_tokens'] / body:.0f} tok/s"))
    if want('attention') and (r := run_child('attention')):
        for name in ('flash', 'math'):
            rows.append((f'attention {name} (CPU, bf16)', f"{1e3 * r[name]['seconds']:.1f} ms",
                         f"SDPA forward + backward, 64 x 9 heads x 16 queries over 63 keys; error "
                         f"against float64 {r[name]['error']:.1e}"
                         + (" (the trainer's on CPU)" if name == 'math' else '')))
    if want('profile') and (r := run_child('profile')):
        for stage, label in (('train', 'update'), ('score', 'no-grad scoring')):
            total = sum(r.get(stage, {}).values())
            if total < 0.01:  # no scoring pass is needed at num_iterations=1
                continue
            rows.append((f'profile: {label}', f'{total:.2f} s',
                         'step 2 of the workload under torch.profiler, by category:'))
            for category, sec in sorted(r.get(stage, {}).items(), key=lambda kv: -kv[1]):
                rows.append((f'  {category}', f'{sec:.2f} s', f'{100 * sec / total:.0f}%'))
        rows.append(('profile: the largest ops of the update', '', 'self time'))
        rows += [(f'  {op}', f'{sec:.2f} s', '') for op, sec in r['top ops'].items()]
    if want('memory'):
        rows.append(('memory per rank, 2 ranks', 'weights + gradients + AdamW',
                     'bytes held of the policy (one step of cpu_demo under torchrun, vLLM '
                     'engines); the resident-set peak also holds the engine and the libraries'))
        # LoRA (rank 8 on every projection): the frozen base in the body's dtype, no gradient
        # and no AdamW state but the adapters'
        for label, parallel, extra in [('ddp', 'ddp', []), ('fsdp', 'fsdp', []),
                                       ('ddp, LoRA r8', 'ddp', ['--lora_rank=8']),
                                       ('fsdp, LoRA r8', 'fsdp', ['--lora_rank=8'])]:
            out_path = os.path.join(tempfile.mkdtemp(prefix='bench_'), 'memory')
            result = subprocess.run([sys.executable, '-m', 'torch.distributed.run',
                                     '--nproc_per_node=2', __file__, '--child=memory', out_path,
                                     f'--parallel={parallel}', *extra],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                print(f"  memory {label}: exit {result.returncode} {result.stderr[-500:]}")
                continue
            for rank in range(2):
                r, gib = json.load(open(f'{out_path}{rank}')), lambda b: f'{b / 2**30:.3f}'
                total = r['weights'] + r['gradients'] + r['adamw']
                rows.append((f'  {label} rank {rank}', f'{gib(total)} GiB',
                             f"weights {gib(r['weights'])}, gradients {gib(r['gradients'])}, "
                             f"AdamW {gib(r['adamw'])} GiB; resident-set peak "
                             f"{gib(r['peak_rss'])} GiB"))
    if want('lora') and (r := run_child('lora')):
        rows.append(('LoRA: engine vs trainer', 'mean abs log-prob difference',
                     f"rank 8, lr 1e-3, {r['dtype']} body and engine; after steps 0, 1, ..."))
        for pairing in r['steps'][0]:
            rows.append((f'  {pairing}', f"{r['steps'][-1][pairing]:.4f}",
                         ', '.join(f'{s[pairing]:.4f}' for s in r['steps'])))
    if want('floor') and (r := run_child('floor')):
        lrs = ', '.join(f'{lr:g}' for lr in FLOOR_LRS)
        rows.append(('ratio floor (lr 1e-8)', 'mean abs log ratio / clip fraction',
                     "second pass of num_iterations=2 after one AdamW step; "
                     f"{r.pop('tokens'):.0f} tokens; at lr {lrs}:"))
        for setup, cells in r.items():
            rows.append((f'  {setup}', f'{cells[0][0]:.4f} / {100 * cells[0][1]:.1f}%',
                         '; '.join(f'{a:.4f} / {100 * c:.1f}%' for a, c in cells)))

    width = max(len(r[0]) for r in rows)
    print(f"\n| {'what'.ljust(width)} | measured | notes |\n|{'-' * (width + 2)}|---|---|")
    for what, value, note in rows:
        print(f"| {what.ljust(width)} | {value} | {note} |")
