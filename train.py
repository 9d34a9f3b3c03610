"""
The RL loop, top to bottom. One step:

    prompts -> rollout (G samples each) -> rewards -> group advantages
            -> num_iterations passes of micro-batched loss/backward -> grad clip -> AdamW
            -> weight sync into the sampler -> log -> (eval) -> (checkpoint)

    python train.py                                   # the offline CPU demo's defaults
    python train.py config/cpu_demo.py --loss_type=dapo
    torchrun --nproc_per_node=4 train.py config/dapo.py   # one process and one vLLM engine per GPU

Config is the module-level globals below, overridden by config files and --key=value (configurator.py).
"""
import contextlib
import json
import math
import os
import random
import resource
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from critic import critic_advantages, critic_record, critic_update, vapo_nll
from losses import CRITIC_LOSS_TYPES, KL_ESTIMATORS, LOSS_TYPES, TIS_MODES, group_advantages, policy_loss
from model import (Scorer, completion_logprobs, completion_values, load_critic, load_model, load_trainer_state,
                   read_checkpoint_meta, save_checkpoint)
from rewards import FORMATS, REWARDS, kimi_length_reward, overlong_penalty, safe_score
from rollout import dynamic_sample, encode_prompts, generate, init_engine, sleep, sync_weights, wake

# -----------------------------------------------------------------------------
# config: the defaults are the offline CPU demo (config/cpu_demo.py restates and explains them)
# I/O
out_dir = 'out'               # log.jsonl and the checkpoint go here
init_from = 'models/smollm2/hf'  # an HF folder or hub id, or 'resume' to continue from out_dir/ckpt
seed = 0
# data and reward
data_dir = 'data/arithmetic'  # train.jsonl and test.jsonl, rows {"prompt": [messages], "answer": ...}
eval_data_dir = ''            # held-out set from another task folder (e.g. 'data/aime24'); '' = data_dir
reward_fn = 'arithmetic'      # a key of rewards.REWARDS: the task's verifier (1 right, 0 wrong)
reward_wrong = 0.0            # task reward of a wrong answer (DAPO: -1.0); a right one scores 1.0
format_coef = 0.0             # weight of the format reward (the answer in the place the prompt asked for)
overlong_buffer = 0           # DAPO soft overlong punishment: L_cache tokens before max_new_tokens (0: off)
length_reward_coef = 0.0      # Kimi k1.5 length reward, within each group (0: off)
length_reward_warmup = 0      # steps before the length reward switches on (Kimi: it slows early learning)
max_bad_rows = 100            # malformed data rows are reported and skipped; more than this aborts
max_prompt_len = 1024         # prompts longer than this (in tokens) are skipped at load time
reward_timeout = 5.0          # seconds one reward call may take; a timeout or an exception scores 0
# rollout
rollout_engine = 'vllm'       # 'vllm' (colocated engine) or 'hf' (plain generate, the fallback)
prompts_per_step = 8          # distinct prompts per step
group_size = 8                # G: samples per prompt
max_new_tokens = 16             # L_max: completions are cut here (and marked truncated)
temperature = 1.0             # sampling temperature; log-probs are scored at the same T
top_p = 1.0                   # keep 1.0 and top_k 0 unless you mean it: both bias the IS ratio
top_k = 0
dynamic_sampling = False      # DAPO: drop groups whose answers are all right or all wrong, sample more
oversample = 1.5              # dynamic sampling: each round samples this many times the groups still missing
max_gen_batches = 10          # dynamic sampling: at most this many rounds per step (0: unlimited)
mask_truncated = False        # DAPO overlong filtering: no loss on completions cut at max_new_tokens
vllm_gpu_memory_utilization = 0.3  # GPU: fraction of memory for vLLM (on CPU: VLLM_CPU_KVCACHE_SPACE GiB)
vllm_fp32_head = True         # MiniMax-M1: the sampler's LM head in FP32 as well
vllm_sleep = True             # GPU only: vLLM frees its KV cache while the trainer runs (sleep mode)
# loss (losses.py)
loss_type = 'grpo'            # one of losses.LOSS_TYPES
adv_scale = 'group'           # 'group' | 'batch' | 'none' (Dr. GRPO): what the advantage is divided by
num_iterations = 1            # mu: optimizer passes over each rollout batch (1 = strictly on-policy)
eps_low: float = None         # clip range 1-eps_low .. 1+eps_high; None = the variant's default
eps_high: float = None
tau_pos = 1.0                 # SAPO gate temperatures
tau_neg = 1.05
cispo_eps_high = 4.0          # CISPO: IS weight <= 1 + cispo_eps_high
clip_cov_ratio = 2e-4         # Clip-Cov / KL-Cov (Cui et al. 2025)
clip_cov_lb = 1.0
clip_cov_ub = 5.0
kl_cov_ratio = 2e-3
kl_cov_coef = 1.0
beta = 0.0                    # KL penalty to the frozen initial model (0: no reference model is loaded)
kl_estimator = 'k3'           # k1 | k2 | k3
entropy_coef = 0.0            # entropy bonus
tis_mode = 'none'             # truncated IS against the sampler's log-probs: none | token_truncate | ...
tis_cap = 2.0
# critic (loss_type 'ppo' / 'vapo' only): a value model beside the policy, GAE advantages per token
critic_lr = 5e-5              # the critic's own AdamW learning rate
vf_clip = 0.5                 # PPO clipped value loss: V may move at most this far from V_old per step
gae_lambda = 0.95             # ppo: GAE lambda of the policy's advantages and of the critic's targets
value_warmup_steps: int = None  # critic-only steps before the policy moves; None: 50 for vapo (VAPO 3.1), 0 for ppo
lam_alpha = 0.05              # vapo: lambda_policy = 1 - 1/(alpha |y|) (VAPO sec. 3.2); its critic uses lambda = 1
lm_coef = 0.1                 # vapo: weight mu of the NLL loss on correct answers (VAPO sec. 3.4)
# optimization
learning_rate = 2e-5
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0               # max global grad norm (0: off)
warmup_iters = 0              # linear learning-rate warmup
max_iters = 30                # optimizer steps (x num_iterations passes each)
micro_batch_size = 16         # at most this many sequences per forward/backward; gradients accumulate
max_tokens_per_micro = 2048   # ... and at most this many tokens, padding included (rows sorted by length)
dtype = 'bfloat16'            # autocast dtype of the transformer body; the LM head is always fp32
gradient_checkpointing = False  # recompute activations in backward: less memory, ~1/3 more compute (GPU)
old_logp_source = 'policy'    # pi_old when num_iterations > 1: 'policy' (a no-grad pass) | 'rollout' (vLLM's
                              # log-probs, no pass: verl's "bypass" mode; the clip absorbs the mismatch)
skip_zero_adv = True          # a group whose answers all scored the same (advantages all 0) skips the update: it has
                              # no gradient in losses whose every term is proportional to A (not so with beta > 0,
                              # entropy_coef, clip_cov / kl_cov, ppo / vapo: for those, nothing is skipped)
# eval and checkpoints
eval_interval = 10            # held-out eval every this many steps, at step 0 and at the end (0: never)
eval_samples = 4              # k of avg@k: samples per held-out problem, at the training temperature
eval_problems = 100           # held-out problems used
ckpt_interval = 0             # checkpoint every this many steps (0: only at the end)
max_bad_steps = 5             # abort after this many steps in a row with a non-finite loss or grad norm
# logging
wandb_log = False
wandb_project = 'nanogrpo'
wandb_run_name = 'run'
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
config = {k: globals()[k] for k in config_keys}

# -----------------------------------------------------------------------------
# checks that fail fast with a clear message, before any model is loaded
def config_error(msg):
    print(f"config error: {msg}", file=sys.stderr)
    sys.exit(2)

for key, valid in [('loss_type', LOSS_TYPES), ('reward_fn', tuple(REWARDS)), ('adv_scale', ('group', 'batch', 'none')),
                   ('rollout_engine', ('vllm', 'hf')), ('dtype', ('float32', 'bfloat16', 'float16')),
                   ('tis_mode', TIS_MODES), ('kl_estimator', KL_ESTIMATORS), ('old_logp_source', ('policy', 'rollout'))]:
    if globals()[key] not in valid:
        config_error(f"{key}={globals()[key]!r}; valid: {', '.join(valid)}")
if not 0 <= overlong_buffer <= max_new_tokens:
    config_error(f"overlong_buffer={overlong_buffer} must lie in 0..max_new_tokens={max_new_tokens}")
if group_size < 2:
    config_error(f"group_size={group_size}: a group advantage needs at least 2 samples per prompt")
if num_iterations < 1 or max_iters < 0 or prompts_per_step < 1 or micro_batch_size < 1 or max_tokens_per_micro < 1:
    config_error("num_iterations, prompts_per_step, micro_batch_size, max_tokens_per_micro must be >= 1, max_iters >= 0")
if value_warmup_steps is not None and (not isinstance(value_warmup_steps, int) or value_warmup_steps < 0):
    config_error(f"value_warmup_steps={value_warmup_steps!r} must be None or an int >= 0")
if tis_mode != 'none' and rollout_engine != 'vllm':
    config_error(f"tis_mode={tis_mode!r} corrects for the sampler's log-probs: it needs rollout_engine='vllm' "
                 f"(the 'hf' engine samples with the trainer's own model, there is nothing to correct)")
if old_logp_source == 'rollout' and (rollout_engine != 'vllm' or tis_mode != 'none'):
    config_error("old_logp_source='rollout' needs rollout_engine='vllm' (its log-probs) and tis_mode='none' "
                 "(the sampler is pi_old then: there is no mismatch left to correct)")

# -----------------------------------------------------------------------------
# data: every task's rows share one format (data/*/prepare.py)
def row_problem(row):
    """What is wrong with a data row, or None. Rows: {"prompt": [{"role", "content"}, ...], "answer": ...}."""
    if not isinstance(row, dict):
        return "not a JSON object"
    prompt = row.get('prompt')
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get('role'), str) and isinstance(m.get('content'), str) for m in prompt):
        return "'prompt' must be a non-empty list of {'role': str, 'content': str} messages"
    if row.get('answer') is None:
        return "missing 'answer'"
    return None

def load_rows(directory, split):
    """A task's jsonl split. Malformed rows are reported with file and line, skipped and counted."""
    path = os.path.join(directory, f'{split}.jsonl')
    if not os.path.exists(path):
        config_error(f"{path} not found: run `python {directory}/prepare.py` first")
    rows, bad = [], 0
    for lineno, line in enumerate(open(path), 1):
        try:
            row = json.loads(line)
            problem = row_problem(row)
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg})"
        if problem is None:
            rows.append(row)
            continue
        bad += 1
        if bad <= 5:
            print(f"{path}:{lineno}: {problem}; row skipped")
        if bad > max_bad_rows:
            config_error(f"{path}: more than max_bad_rows={max_bad_rows} malformed rows")
    if bad:
        print(f"{path}: {bad} malformed rows skipped, {len(rows)} kept")
    if not rows:
        config_error(f"{path}: no usable rows")
    return rows

train_rows = load_rows(data_dir, 'train') if max_iters > 0 else []
test_rows = load_rows(eval_data_dir or data_dir, 'test')[:eval_problems] if eval_interval else []

# -----------------------------------------------------------------------------
# setup: one process per GPU (or per CPU share) under torchrun, as nanoGPT does; plain python = world size 1
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    dist.init_process_group(backend='nccl' if torch.cuda.is_available() else 'gloo')
    rank, local_rank, world_size = dist.get_rank(), int(os.environ['LOCAL_RANK']), dist.get_world_size()
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0  # logs, evaluates the sums and writes checkpoints
device = f'cuda:{local_rank}' if torch.cuda.is_available() else 'cpu'
if device.startswith('cuda'):
    torch.cuda.set_device(device)
if prompts_per_step % world_size:
    config_error(f"prompts_per_step={prompts_per_step} must be divisible by the {world_size} ranks")
autocast_dtype = {'float32': None, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
random.seed(seed + rank)  # every rank samples its own completions
torch.manual_seed(seed + rank)
os.makedirs(out_dir, exist_ok=True)
ckpt_dir = os.path.join(out_dir, 'ckpt')
resume = init_from == 'resume'
ckpt_meta = read_checkpoint_meta(ckpt_dir)
# a checkpoint that does not fit this run is an error now, not after the model has loaded
if resume and ckpt_meta is None:
    config_error(f"init_from='resume' but {ckpt_dir} holds no checkpoint")
if not resume and ckpt_meta and ckpt_meta['model_source'] != init_from:
    config_error(f"{ckpt_dir} is a checkpoint of {ckpt_meta['model_source']!r}, not {init_from!r}: "
                 f"choose another out_dir, or --init_from=resume")
saved = {**ckpt_meta['config'], **ckpt_meta.get('world', {})} if resume else {}
if resume and (changed := [k for k in ('data_dir', 'seed', 'prompts_per_step', 'group_size', 'world_size')
                           if saved.get(k, 1) != globals()[k]]):
    config_error(f"cannot resume {ckpt_dir} with a different {', '.join(changed)} "
                 f"(the data position would not mean the same)")
model_source = ckpt_meta['model_source'] if resume else init_from  # the model this run started from
model_path = ckpt_dir if resume else init_from
model, tokenizer = load_model(model_path)
model.to(device).train()
if gradient_checkpointing:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2), weight_decay=weight_decay,
                              fused=True)  # one kernel over all parameters (CPU and GPU): 0.04 s, not 0.3 s, here
state = load_trainer_state(ckpt_dir) if resume else None
if resume:
    optimizer.load_state_dict(state['optimizer'])
ref_model = load_model(model_source)[0].to(device).eval().requires_grad_(False) if beta > 0 else None
critic = None
if loss_type in CRITIC_LOSS_TYPES:  # PPO / VAPO: the value model (the base network, a scalar head), its own AdamW
    critic = load_critic(os.path.join(ckpt_dir, 'critic') if resume else model_source).to(device).train()
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=critic_lr, betas=(beta1, beta2), weight_decay=weight_decay,
                                         fused=True)
    if resume:
        critic_optimizer.load_state_dict(state['critic_optimizer'])
    if gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
    critic_scorer = Scorer(critic, completion_values)
    critic_scorer = DDP(critic_scorer, device_ids=[local_rank] if device.startswith('cuda') else None) if ddp else critic_scorer
    if value_warmup_steps is None:
        value_warmup_steps = 50 if loss_type == 'vapo' else 0
# the trainer's forward for the loss; DDP averages the gradients over ranks in the last micro-batch's backward
scorer = DDP(Scorer(model), device_ids=[local_rank] if device.startswith('cuda') else None) if ddp else Scorer(model)
engine = init_engine(rollout_engine, model_path, seed=seed + rank, gpu_memory_utilization=vllm_gpu_memory_utilization,
                     fp32_head=vllm_fp32_head, distributed=ddp, sleep_mode=vllm_sleep and device.startswith('cuda'))

def reduce_sum(x):
    """x summed over ranks (a number or a dict of numbers with the same keys on every rank)."""
    if not ddp:
        return x
    keys = sorted(x) if isinstance(x, dict) else None
    t = torch.tensor([float(x[k]) for k in keys] if keys else [float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist())) if keys else t.item()

for name, rows in [('train', train_rows), ('test', test_rows)]:  # over-long prompts: skipped and counted here
    kept = [r for r in rows if len(encode_prompts(tokenizer, [r['prompt']])[0]) <= max_prompt_len]
    if len(kept) < len(rows):
        print(f"{name}: {len(rows) - len(kept)} prompts longer than max_prompt_len={max_prompt_len} tokens skipped")
    rows[:] = kept
if max_iters > 0 and not train_rows:
    config_error(f"no training prompt fits in max_prompt_len={max_prompt_len} tokens")
train_order = list(range(len(train_rows)))
random.Random(seed).shuffle(train_order)  # one fixed order; data_cursor is the position in it
data_cursor = state['data_cursor'] if resume else 0  # prompts consumed so far (saved in checkpoints)

def next_rows(n):
    """n rows for this rank: its share of the next n * world_size rows of the global order."""
    global data_cursor
    rows = [train_rows[train_order[(data_cursor + j * world_size + rank) % len(train_rows)]] for j in range(n)]
    data_cursor += n * world_size
    return rows

def rollout(rows, G):
    """Sample G completions per row; 'correct' is the task verifier's verdict (1.0 right, 0.0 wrong)."""
    prompt_ids = encode_prompts(tokenizer, [r['prompt'] for r in rows])
    batch = generate(engine, tokenizer, prompt_ids, G, max_new_tokens, temperature,
                     model=model, top_p=top_p, top_k=top_k, autocast_dtype=autocast_dtype)
    batch['correct'] = torch.tensor([verify(c, rows[i // G]['answer']) for i, c in enumerate(batch['completions'])])
    return batch

reward_errors = 0  # completions whose verifier raised or timed out (each scored 0)

def verify(completion, answer):
    global reward_errors
    score, error = safe_score(REWARDS[reward_fn], completion, answer, reward_timeout)
    if error is not None:
        reward_errors += 1
        if reward_errors <= 3:
            tqdm.write(f"reward_fn {reward_fn!r} failed on a completion ({type(error).__name__}: {error}); scored 0")
    return score

def shaped_rewards(batch, step):
    """The reward each sample trains on: task reward plus the enabled shaping terms, each also returned
    alone so that it is logged on its own (B,) tensors."""
    lengths = batch['completion_mask'].sum(1)
    parts = {'task': torch.where(batch['correct'] > 0, 1.0, reward_wrong)}
    if format_coef:
        parts['format'] = format_coef * torch.tensor([FORMATS[reward_fn](c) for c in batch['completions']])
    if overlong_buffer:
        parts['overlong'] = torch.tensor([overlong_penalty(int(n), max_new_tokens, overlong_buffer) for n in lengths])
    if length_reward_coef and step >= length_reward_warmup:
        parts['length'] = length_reward_coef * torch.tensor(
            kimi_length_reward(lengths.tolist(), batch['correct'].tolist(), group_size))
    return sum(parts.values()), parts

def evaluate():
    """Held-out avg@k: k samples per test problem at the training temperature, mean accuracy. Each rank
    takes every world_size-th problem; the sums are reduced over ranks."""
    batch = rollout(test_rows[rank::world_size], eval_samples)
    sums = reduce_sum({'n': len(batch['completions']), 'accuracy': batch['correct'].sum().item(),
                       'completion_len': batch['completion_mask'].sum().item(),
                       'truncated': batch['truncated'].float().sum().item()})
    return {f'eval/{k}': v / sums['n'] for k, v in sums.items() if k != 'n'}

def micro_batches(batch):
    """Token-budget micro-batches: rows sorted by length (completion, then prompt) and packed greedily while a
    micro-batch has at most micro_batch_size rows and max_tokens_per_micro tokens through the body, padding
    included, each distinct prompt counted once (model.completion_hidden shares it among the rows that answer
    it); each is cut to its own longest prompt and completion. Returns them (on device), the number of real
    tokens they put through the body and the fraction of their tokens that is padding."""
    prompt_len, completion_len = batch['prompt_mask'].sum(1).tolist(), batch['completion_mask'].sum(1).long().tolist()
    P, G = batch['prompt_ids'].shape[1], 1 if gradient_checkpointing else group_size  # rows i // G share a prompt
    tokens = lambda rows: (len({i // G for i in rows}) * max(prompt_len[i] for i in rows)
                           + len(rows) * max(1, max(completion_len[i] for i in rows)))
    packs = [[]]
    for i in sorted(range(len(prompt_len)), key=lambda i: (-completion_len[i], -prompt_len[i], i)):
        rows = packs[-1] + [i]
        if len(rows) > 1 and (len(rows) > micro_batch_size or tokens(rows) > max_tokens_per_micro):
            packs.append([i])
        else:
            packs[-1] = rows
    mbs = []
    for rows in packs:
        p, c = max(prompt_len[i] for i in rows), max(1, max(completion_len[i] for i in rows))
        cut = lambda k, v: v[:, P - p:] if k.startswith('prompt') else v[:, :c] if v.dim() == 2 else v
        mbs.append({k: cut(k, v[rows]).to(device) for k, v in batch.items() if torch.is_tensor(v)})
    real = sum(prompt_len[g * G] for rows in packs for g in {i // G for i in rows}) + sum(completion_len)
    return mbs, real, 1 - real / sum(tokens(rows) for rows in packs)

def masked_sum(x, mb):
    return (x.detach() * mb['completion_mask']).sum().item()

def score_args(mb):
    return mb['prompt_ids'], mb['prompt_mask'], mb['completion_ids'], mb['completion_mask'], temperature, autocast_dtype

loss_hp = dict(eps_low=eps_low, eps_high=eps_high, max_new_tokens=max_new_tokens, tau_pos=tau_pos, tau_neg=tau_neg,
               cispo_eps_high=cispo_eps_high, clip_cov_ratio=clip_cov_ratio, clip_cov_lb=clip_cov_lb,
               clip_cov_ub=clip_cov_ub, kl_cov_ratio=kl_cov_ratio, kl_cov_coef=kl_cov_coef,
               beta=0.0 if critic is not None else beta,  # ppo / vapo: the KL is a per-token reward instead
               kl_estimator=kl_estimator, entropy_coef=entropy_coef, tis_mode=tis_mode, tis_cap=tis_cap)
if wandb_log and master:
    import wandb
    wandb.init(project=wandb_project, name=wandb_run_name, config=config, resume='allow')
log_file = open(os.path.join(out_dir, 'log.jsonl'), 'a' if resume else 'w') if master else None

def log(record):  # records hold numbers already reduced over ranks: rank 0 writes them
    if master:
        log_file.write(json.dumps(record) + '\n')
        log_file.flush()
        if wandb_log:
            wandb.log(record, step=record['step'])

# SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C): finish the step, write a checkpoint, exit cleanly
stop_requested = False

def request_stop(signum, frame):
    global stop_requested
    stop_requested = True
    tqdm.write(f"{signal.Signals(signum).name}: finishing this step, then checkpoint and exit")

signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)

def rng_state():
    return {'python': random.getstate(), 'torch': torch.get_rng_state(),
            'cuda': torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}

def checkpoint_and_maybe_stop(steps_done):
    """Checkpoint when due (every ckpt_interval steps, at the end, on a stop request on any rank); rank 0
    writes it, with every rank's RNG state. True means stop (all ranks decide together)."""
    stop = reduce_sum(int(stop_requested)) > 0
    if (ckpt_interval and steps_done % ckpt_interval == 0) or steps_done == max_iters or stop:
        rngs = [None] * world_size
        if ddp:
            dist.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        if master:
            save_checkpoint(ckpt_dir, model, tokenizer, {
                'step': steps_done, 'model_source': model_source, 'config': config, 'world': {'world_size': world_size},
                'data_cursor': data_cursor, 'optimizer': optimizer.state_dict(), 'rng': rngs,
                'critic_optimizer': critic_optimizer.state_dict() if critic else None}, critic=critic)
        if ddp:
            dist.barrier()
    if stop and master:
        tqdm.write(f"stopped after step {steps_done}; continue with --init_from=resume")
    return stop

# the RNG states go back last, after everything that may draw from them while loading
start_step, bad_steps = 0, 0
if resume:
    start_step = state['step']
    random.setstate(state['rng'][rank]['python'])
    torch.set_rng_state(state['rng'][rank]['torch'])
    if torch.cuda.is_available() and state['rng'][rank]['cuda'] is not None:
        torch.cuda.set_rng_state_all(state['rng'][rank]['cuda'])
    if master:
        print(f"resumed from {ckpt_dir} at step {start_step}")

# -----------------------------------------------------------------------------
# the loop
for step in tqdm(range(start_step, max_iters + 1), initial=start_step, total=max_iters + 1, desc='steps',
                 disable=not master):
    if eval_interval and (step % eval_interval == 0 or step == max_iters):
        t0 = time.time()
        record = {'step': step, **evaluate(), 'eval/seconds': time.time() - t0}
        log(record)
        if master:
            tqdm.write(f"step {step}: eval accuracy {record['eval/accuracy']:.3f} (avg@{eval_samples}, "
                       f"{len(test_rows)} problems, {record['eval/seconds']:.0f}s)")
    if step == max_iters:
        break

    # --- rollout and rewards (each rank samples its own share of the step's prompts)
    t0 = time.time()
    if dynamic_sampling:
        batch, counts = dynamic_sample(next_rows, lambda rows: rollout(rows, group_size), prompts_per_step,
                                       group_size, oversample, max_gen_batches, tokenizer.pad_token_id,
                                       reduce_sum, world_size)
    else:
        batch = rollout(next_rows(prompts_per_step // world_size), group_size)
        correct = batch['correct'].view(-1, group_size)  # a group whose answers all score the same teaches nothing
        counts = {'samples': len(batch['completions']), 'samples_correct': batch['correct'].sum().item(),
                  'groups_sampled': len(correct), 'groups_degenerate': (correct == correct[:, :1]).all(1).sum().item()}
    counts = reduce_sum(counts)
    rollout_time = time.time() - t0
    sample_record = {'accuracy': counts['samples_correct'] / max(counts['samples'], 1),  # over every sample
                     'degenerate_frac': counts['groups_degenerate'] / max(counts['groups_sampled'], 1)}
    if dynamic_sampling:
        sample_record.update(gen_rounds=counts['gen_rounds'] / world_size, prompts_consumed=counts['groups_sampled'],
                             live_groups=counts['groups_live'])
        if counts['groups_live'] < prompts_per_step and master:
            tqdm.write(f"step {step + 1}: only {counts['groups_live']:.0f} live groups after {counts['gen_rounds']:.0f} "
                       f"rounds (max_gen_batches={max_gen_batches}); training on those")
    if reduce_sum(int(batch is None)):  # some rank has no live group: every rank skips the update together
        log({'step': step + 1, **sample_record, 'rollout_seconds': rollout_time, 'skipped': 1})
        if checkpoint_and_maybe_stop(step + 1):
            break
        continue
    batch['rewards'], reward_parts = shaped_rewards(batch, step)
    B, lengths = len(batch['completions']), batch['completion_mask'].sum(1)   # lengths before any masking
    # GRPO eq.: A_i = (r_i - mean(r_group)) / std(r_group), one advantage per completion
    batch['advantages'] = group_advantages(batch['rewards'], group_size, scale=adv_scale, reduce_sum=reduce_sum)
    if mask_truncated:  # DAPO overlong filtering: truncated answers get no loss and leave the token count
        batch['completion_mask'] = batch['completion_mask'] * ~batch['truncated'][:, None]
    mask = batch['completion_mask']                                            # (B, C)
    # rows that go through the update: all, or (skip_zero_adv) the groups with a non-zero advantage; the skipped
    # groups' tokens still count in the loss's denominators below, as their zero terms would
    trained = torch.ones(B, dtype=torch.bool)
    if skip_zero_adv and beta == 0 and entropy_coef == 0 and loss_type not in ('clip_cov', 'kl_cov', *CRITIC_LOSS_TYPES):
        trained = (batch['advantages'] != 0).view(-1, group_size).any(1).repeat_interleave(group_size)
        trained[:group_size] |= not trained.any()  # no live group: one (zero gradient) still runs, for DDP's all-reduce
    if batch['rollout_logp'] is None:
        del batch['rollout_logp']
    # global denominators, counted after masking and summed over ranks once per step: each micro-batch loss
    # is its share of the whole step's loss, so they add up (over micro-batches and ranks) to the batch loss
    global_counts = reduce_sum({'tokens': mask.sum().item(), 'seqs': B,
                                'positive_tokens': (mask * (batch['correct'] > 0)[:, None]).sum().item()})
    num_tokens, num_seqs = max(global_counts['tokens'], 1), global_counts['seqs']

    sleep(engine)  # GPU: the KV cache makes room for the update until the next rollout
    # --- old log-probs: with num_iterations == 1 the batch is used once, on-policy, so pi_old = pi_theta,
    # rho = 1 and the detached current log-probs serve as old_logp (clipping does nothing then); with
    # old_logp_source='rollout' the sampler's own log-probs serve. Otherwise one no-grad pass computes them.
    t0 = time.time()
    model.train()
    if old_logp_source == 'rollout':
        batch['old_logp'] = batch['rollout_logp']
    mbs, body_tokens, pad_frac = micro_batches({k: v[trained] for k, v in batch.items() if torch.is_tensor(v)})
    need_old = (num_iterations > 1 or (critic is not None and beta > 0)) and 'old_logp' not in batch
    with torch.no_grad():  # pi_old, pi_ref for the KL penalty, the critic's V_old: one pass each, no grad
        for key, net, fn in [('old_logp', model if need_old else None, completion_logprobs),
                             ('ref_logp', ref_model, completion_logprobs), ('old_values', critic, completion_values)]:
            for mb in mbs if net is not None else []:
                out = fn(net, *score_args(mb))
                mb[key] = out if key == 'old_values' else out[0]
    if critic is not None:  # PPO / VAPO: per-token advantages from the critic (GAE), whitened (critic.py)
        critic_advantages(mbs, loss_type, gae_lambda, lam_alpha, beta, reduce_sum)
    score_time, t0 = time.time() - t0, time.time()

    # --- num_iterations optimizer passes over the batch, micro-batched with gradient accumulation
    sums, nonfinite, updates_applied = {}, False, 0  # sums of this rank's token-level statistics
    for it in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0  # this pass's loss: the sum of its micro-batch losses (over ranks, below)
        for i, mb in enumerate(mbs):
            # DDP: all-reduce the gradients only in the last micro-batch's backward
            with scorer.no_sync() if ddp and i < len(mbs) - 1 else contextlib.nullcontext():
                logp, entropy = scorer(*score_args(mb))
                old_logp = mb['old_logp'] if 'old_logp' in mb else logp.detach()
                loss, stats = policy_loss(loss_type, logp, old_logp, mb['advantages'], mb['completion_mask'],
                                          num_tokens=num_tokens, num_seqs=num_seqs, ref_logp=mb.get('ref_logp'),
                                          entropy=entropy, rollout_logp=mb.get('rollout_logp'), **loss_hp)
                if loss_type == 'vapo' and lm_coef > 0:  # VAPO sec. 3.4: + mu * NLL of the correct answers' tokens
                    loss = loss + lm_coef * vapo_nll(logp, mb, global_counts['positive_tokens'])
                logp.retain_grad()
                (loss * world_size).backward()  # DDP averages over ranks; our shares are meant to be summed
            step_loss += loss.item()
            n = stats.pop('n_tokens')  # the loss statistics (clip fractions, ...): means over all passes
            for k, v in stats.items():
                sums[f'loss/{k}'] = sums.get(f'loss/{k}', 0.0) + v * n / num_iterations
            if it == 0:  # trainer-side statistics of the batch as sampled
                token_sums = {'n_tokens': n, 'entropy': masked_sum(entropy, mb)}
                if 'rollout_logp' in mb:  # |log pi_trainer - log pi_sampler| over the sampled tokens
                    token_sums['rollout_mismatch'] = masked_sum((logp - mb['rollout_logp']).abs(), mb)
                # seed 000 experiment 1 in a real step: the gradient weight of a token, |dLoss/dlogp| / |A|, averaged
                # in each answer, for answers shorter than the batch's median length / the others (grpo: short > long)
                m, rows_len = mb['completion_mask'], mb['completion_mask'].sum(1)
                adv = mb['advantages'] if mb['advantages'].dim() == 2 else mb['advantages'][:, None].expand_as(m)
                live = (adv != 0) * m
                row_weight = (logp.grad.abs() / adv.abs().clamp(min=1e-12) * live).sum(1) / live.sum(1).clamp(min=1)
                for name, rows in (('short', rows_len < lengths.median()), ('long', rows_len >= lengths.median())):
                    rows = rows & (live.sum(1) > 0)
                    token_sums[f'weight_{name}'], token_sums[f'n_{name}'] = row_weight[rows].sum().item(), rows.sum().item()
                for k, v in token_sums.items():
                    sums[k] = sums.get(k, 0.0) + v
        step_loss = reduce_sum(step_loss)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float('inf')).item()
        lr = learning_rate * min(1.0, (step + 1) / warmup_iters) if warmup_iters else learning_rate
        for group in optimizer.param_groups:
            group['lr'] = lr
        if it == 0:
            first_loss = step_loss
        if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):  # the same on every rank after the reduce
            nonfinite = True  # a non-finite loss or gradient would poison the weights: no more updates this step
            break
        if critic is None or step >= value_warmup_steps:  # VAPO sec. 3.1: the policy waits while the critic warms up
            optimizer.step()
            updates_applied += 1

    if critic is not None:  # the critic: num_iterations passes of PPO's clipped value loss, with its own AdamW
        sums.update(critic_update(critic_scorer, critic_optimizer, mbs, score_args, num_iterations, vf_clip,
                                  num_tokens, grad_clip, world_size, ddp))
    train_time = time.time() - t0
    bad_steps = bad_steps + 1 if nonfinite else 0
    if nonfinite and master:
        tqdm.write(f"step {step + 1}: non-finite loss or grad norm, optimizer step skipped ({bad_steps} in a row; "
                   f"{updates_applied} of {num_iterations} updates applied before it)")

    # --- sync the new weights into the sampler
    t0 = time.time()
    wake(engine)
    sync_weights(engine, model)
    sync_time = time.time() - t0

    # --- log: sums over ranks, then means
    correct = batch['correct'] > 0
    totals = reduce_sum({**sums, 'seqs': B, 'reward': batch['rewards'].sum().item(), 'len': lengths.sum().item(),
                         'trained': trained.sum().item(), 'body_tokens': body_tokens,
                         'head_tokens': sum(mb['completion_mask'].sum().item() for mb in mbs),
                         'truncated': batch['truncated'].float().sum().item(), 'n_correct': correct.sum().item(),
                         'len_correct': lengths[correct].sum().item(), 'len_wrong': lengths[~correct].sum().item(),
                         **{f'reward/{k}': v.sum().item() for k, v in reward_parts.items()}})
    n_tokens, seqs = max(totals.pop('n_tokens', 0), 1e-9), totals['seqs']
    record = {
        'step': step + 1,
        'reward': totals['reward'] / seqs,
        **{k: v / seqs for k, v in totals.items() if k.startswith('reward/')},
        **sample_record,
        'completion_len': totals['len'] / seqs,
        'completion_len_correct': totals['len_correct'] / totals['n_correct'] if totals['n_correct'] else None,
        'completion_len_wrong': totals['len_wrong'] / (seqs - totals['n_correct']) if seqs > totals['n_correct'] else None,
        'truncated': totals['truncated'] / seqs,
        'entropy': totals['entropy'] / n_tokens,  # over the trained rows' tokens, as the loss/ statistics
        'loss': first_loss,
        'grad_norm': grad_norm,
        'lr': lr,
        'nonfinite_skipped': int(nonfinite),
        'updates_applied': updates_applied,  # optimizer steps of the policy this step (of num_iterations)
        'reward_errors': reduce_sum(reward_errors),
        'rollout_seconds': rollout_time, 'score_seconds': score_time, 'train_seconds': train_time, 'sync_seconds': sync_time,
        'trained_frac': totals['trained'] / seqs,  # the rows that went through the update (skip_zero_adv)
        'train_tokens': totals['body_tokens'] * num_iterations,  # real tokens through the body (a shared prompt once), all passes
        'train_completion_tokens': totals['head_tokens'] * num_iterations,  # ... and through the LM head
        'tokens_per_second': num_tokens * num_iterations / max(train_time, 1e-9),
        'peak_memory_gib': (torch.cuda.max_memory_allocated() if device.startswith('cuda') else  # this rank's peak
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30,    # (CPU: resident set)
        'pad_frac': pad_frac,  # the micro-batches' padding; with every row at the batch's full width it would be:
        'pad_frac_unpacked': 1 - (mask.sum().item() + batch['prompt_mask'].sum().item()) / (B * (batch['prompt_ids'].shape[1] + mask.shape[1])),
        **{k: v / n_tokens for k, v in totals.items() if k.startswith('loss/')},
    }
    if 'rollout_mismatch' in totals:
        record['rollout_mismatch'] = totals['rollout_mismatch'] / n_tokens
    if totals['n_short'] and totals['n_long']:
        record['token_weight_short_long'] = (totals['weight_short'] / totals['n_short']) / (totals['weight_long'] / totals['n_long'])
    if critic is not None:  # the critic as a baseline: explained variance of its targets, V(s_0) vs GRPO's group mean
        group_mean = batch['rewards'].view(-1, group_size).mean(1).repeat_interleave(group_size)
        group_sq_err = reduce_sum(((batch['rewards'] - group_mean) ** 2).sum().item())
        record.update(critic_record(totals, n_tokens, seqs, group_sq_err), policy_frozen=int(step < value_warmup_steps))
    log(record)
    if master:
        tqdm.write(f"step {step + 1}: reward {record['reward']:.3f} len {record['completion_len']:.1f} "
                   f"entropy {record['entropy']:.3f} clip {record.get('loss/clip_frac', 0):.4f} gnorm {grad_norm:.3f} "
                   f"| rollout {rollout_time:.1f}s train {train_time:.1f}s sync {sync_time:.2f}s")

    if bad_steps >= max_bad_steps:
        raise SystemExit(f"aborting: {bad_steps} steps in a row with a non-finite loss or grad norm "
                         f"(max_bad_steps={max_bad_steps}); the last checkpoint holds the last good weights")

    # --- checkpoint (step + 1 optimizer steps are done; the data position and RNGs resume from here)
    if checkpoint_and_maybe_stop(step + 1):
        break

if ddp and rollout_engine != 'vllm':  # a vLLM engine tears the process groups down itself, at exit
    dist.destroy_process_group()
