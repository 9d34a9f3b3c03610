"""
The RL loop, top to bottom. One step is this pipeline; the loop at the bottom reads in its order:

    sample  prompts -> rollout (G samples each) -> rewards -> group advantages -> masking
    score   no-grad passes for what the loss needs: pi_old, pi_ref, the critic's V_old (ppo / vapo)
    update  num_iterations passes of micro-batched loss / backward -> grad clip -> AdamW
    sync    the new weights into the sampler
    log     one record per step (log.jsonl, the console line), and the guards' warnings
    eval    held-out avg@k, pass@k, maj@k (before step 1, every eval_interval steps, the end)
    save    a checkpoint when due

    python train.py                                   # the offline CPU demo's defaults
    python train.py config/cpu_demo.py --loss_type=dapo
    torchrun --nproc_per_node=4 train.py config/dapo.py   # one process and one vLLM engine per GPU

Config is the module-level globals below, overridden by config files and --key=value
(configurator.py). The helpers of each stage are defined above the loop, in the loop's order; the
losses live in losses.py, the critic of ppo / vapo in critic.py.
"""
import contextlib
import json
import math
import os
import random
import resource
import shutil
import signal
import sys
import time

import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from critic import critic_advantages, critic_record, critic_update, vapo_nll
from losses import (KL_ESTIMATORS, LOSS_TYPES, TIS_MODES, VARIANTS, group_advantages, policy_loss,
                    token_weight_sums)
from model import (Scorer, clip_grad_norm, completion_values, even_micro_batches, full_state,
                   load_critic, load_model, load_optimizers, load_trainer_state, native_bf16,
                   read_checkpoint_meta, round_ties, save_checkpoint, save_optimizers)
from rewards import (ANSWERS, FORMATS, REWARDS, kimi_length_reward, majority_correct,
                     overlong_penalty, pass_at_k, safe_score)
from rollout import (dynamic_sample, encode_prompts, generate, init_engine, shutdown, sleep,
                     sync_weights)

# -----------------------------------------------------------------------------
# config: the defaults are the offline CPU demo (config/cpu_demo.py restates and explains them)
# I/O
out_dir = 'out'               # log.jsonl and the checkpoint go here
init_from = 'models/smollm2/hf'  # an HF folder or hub id, or 'resume' to continue from out_dir/ckpt
seed = 0
# data and reward
data_dir = 'data/arithmetic'  # train.jsonl and test.jsonl: {"prompt": [messages], "answer": ...}
# held-out set of another task folder (e.g. 'data/aime24'); '' = data_dir
eval_data_dir = ''
reward_fn = 'arithmetic'      # a key of rewards.REWARDS: the task's verifier (1 right, 0 wrong)
reward_wrong = 0.0            # task reward of a wrong answer (DAPO: -1.0); a right one scores 1.0
format_coef = 0.0             # weight of the format reward (the answer where the prompt asked)
overlong_buffer = 0           # DAPO soft overlong punishment: L_cache tokens (0: off)
length_reward_coef = 0.0      # Kimi k1.5 length reward, within each group (0: off)
# steps before the length reward starts (Kimi: it slows early learning)
length_reward_warmup = 0
max_bad_rows = 100            # malformed data rows are reported and skipped; more than this aborts
max_prompt_len = 1024         # prompts longer than this (in tokens) are skipped at load time
reward_timeout = 5.0          # seconds one reward call may take; a timeout or an exception scores 0
# rollout
rollout_engine = 'vllm'       # 'vllm' (colocated engine) or 'hf' (plain generate, the fallback)
prompts_per_step = 8          # distinct prompts per step
group_size = 8                # G: samples per prompt
max_new_tokens = 16           # L_max: completions are cut here (and marked truncated)
temperature = 1.0             # sampling temperature; log-probs are scored at the same T
top_p = 1.0                   # keep 1.0 and top_k 0 unless you mean it: both bias the IS ratio
top_k = 0
dynamic_sampling = False      # DAPO: drop groups whose answers all agree, sample more
oversample = 1.5              # dynamic sampling: each round samples this x the missing groups
max_gen_batches = 10          # dynamic sampling: at most this many rounds per step (0: unlimited)
mask_truncated = False        # DAPO overlong filtering: no loss on completions cut at the limit
vllm_gpu_memory_utilization = 0.3  # GPU memory for vLLM (CPU: VLLM_CPU_KVCACHE_SPACE GiB)
vllm_fp32_head = True         # MiniMax-M1: the sampler's LM head in FP32 as well
vllm_sleep = True             # GPU only: vLLM frees its KV cache while the trainer runs
vllm_enforce_eager: bool = None  # no CUDA graphs; None: True on CPU, False (graphs) on GPU
# loss (losses.py; the per-variant defaults are its VARIANTS table)
loss_type = 'grpo'            # one of losses.LOSS_TYPES
# what A is divided by: 'group' (its std) | 'batch' | 'none' (Dr. GRPO); None = the variant's (VARIANTS)
adv_scale: str = None
num_iterations = 1            # mu: optimizer passes over each rollout batch (1: on-policy)
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
beta = 0.0                    # KL penalty to the frozen initial model (0: no reference model)
kl_estimator = 'k3'           # k1 | k2 | k3
entropy_coef = 0.0            # entropy bonus
tis_mode = 'none'             # truncated IS against the sampler: none | token_truncate | ...
tis_cap = 2.0
# critic (loss_type 'ppo' / 'vapo' only, critic.py): a value model beside the policy, GAE per token
critic_lr = 5e-5              # the critic's own AdamW learning rate
vf_clip = 0.5                 # PPO clipped value loss: V moves at most this far from V_old per step
gae_lambda = 0.95             # ppo: GAE lambda of the policy's advantages and the targets
value_warmup_steps: int = None  # critic-only steps first; None: the variant's (vapo: 50)
lam_alpha = 0.05              # vapo: lambda_policy = 1 - 1/(alpha |y|) (VAPO sec. 3.2)
lm_coef = 0.1                 # vapo: weight mu of the NLL loss on correct answers (VAPO sec. 3.4)
# under torchrun: 'ddp' (every rank holds the whole model, its gradients and AdamW state: 16 bytes
# a parameter) or 'fsdp' (PyTorch FSDP2: each rank holds 1/world_size of them, gathered a layer at
# a time; for a model that outgrows one GPU)
parallel = 'ddp'
# optimization
learning_rate = 2e-5
weight_decay = 0.0
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0               # max global grad norm (0: off)
warmup_iters = 0              # linear learning-rate warmup
max_iters = 30                # optimizer steps (x num_iterations passes each)
micro_batch_size = 16         # at most this many sequences per forward/backward
max_tokens_per_micro = 2048   # ... and this many tokens, padding included (rows sorted)
# autocast dtype of the transformer body: 'auto' is bfloat16 where the hardware has bf16 matmuls
# (model.native_bf16), else float32; 'float32' | 'bfloat16' (not fp16: it would need a gradient
# scaler). The LM head is always fp32.
dtype = 'auto'
gradient_checkpointing = False  # recompute activations in backward: less memory, more compute
# pi_old when num_iterations > 1: 'policy' (a no-grad pass) | 'rollout' (vLLM's log-probs, no pass:
# verl's "bypass" mode; the clip absorbs the mismatch)
old_logp_source = 'policy'
# A group whose answers all scored the same (advantages all 0) skips the update: it has no
# gradient in losses whose every term is proportional to A (VARIANTS' skip_zero_adv; never
# with beta or entropy_coef)
skip_zero_adv = True
# eval and checkpoints
eval_interval = 10            # held-out eval every this many steps, at 0 and at the end (0: never)
eval_samples = 4              # k: samples per held-out problem at the training T (avg@k, pass@k...)
eval_problems = 100           # held-out problems used
ckpt_interval = 0             # checkpoint every this many steps (0: only at the end, -1: never)
# abort after this many steps in a row with a non-finite loss or grad norm
max_bad_steps = 5
# guards: a run going wrong in a way the log shows is said in words, once, naming the knob (and
# logged as guard/<name> = 1 at every step it holds)
warn_truncated = 0.5          # more than this fraction of a step's answers cut at max_new_tokens
warn_degenerate_steps = 5     # every group's answers agreed (no gradient) this many steps in a row
warn_mismatch = 3.0           # rollout_mismatch above this x the run's first step's (0: off)
# stop (with a checkpoint) when rollout_mismatch is above this x the first step's: the sampler no
# longer follows the trainer, as when the weight sync stopped working (0: never)
stop_mismatch = 10.0
# logging
verbose = False               # vLLM's INFO logging, transformers' progress bars (rollout.quiet_vllm)
wandb_log = False
wandb_project = 'nanogrpo'
wandb_run_name = 'run'
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
config = {k: globals()[k] for k in config_keys}
variant = VARIANTS[loss_type] if loss_type in VARIANTS else None  # checked below

# -----------------------------------------------------------------------------
# checks that fail fast with a clear message, before any model is loaded
def config_error(msg):
    print(f"config error: {msg}", file=sys.stderr)
    sys.exit(2)

if dtype == 'float16':  # fp16's range: small gradients underflow to 0 without torch.amp.GradScaler
    config_error("dtype='float16' trains without a gradient scaler (small gradients underflow to 0): "
                 "use 'bfloat16' where the hardware has it, else 'float32'")
for key, valid in [('loss_type', LOSS_TYPES), ('reward_fn', tuple(REWARDS)),
                   ('adv_scale', (None, 'group', 'batch', 'none')),
                   ('rollout_engine', ('vllm', 'hf')),
                   ('dtype', ('auto', 'float32', 'bfloat16')), ('tis_mode', TIS_MODES),
                   ('kl_estimator', KL_ESTIMATORS), ('old_logp_source', ('policy', 'rollout')),
                   ('parallel', ('ddp', 'fsdp'))]:
    if globals()[key] not in valid:
        config_error(f"{key}={globals()[key]!r}; valid: {', '.join(v for v in valid if v)}")
if adv_scale is None:  # the variant's: Dr. GRPO does not divide by the std
    adv_scale = variant['adv']
# every number's valid range, keys grouped by it (a None default may stay None). The comparisons
# are written so that a NaN (a config file's float('nan')) fails them too.
for valid, in_range, keys in [
        ('>= 0', lambda v: v >= 0,
         ['format_coef', 'length_reward_coef', 'length_reward_warmup', 'max_bad_rows', 'top_k',
          'max_gen_batches', 'eps_high', 'cispo_eps_high', 'kl_cov_coef', 'beta', 'critic_lr',
          'value_warmup_steps', 'lm_coef', 'learning_rate', 'weight_decay', 'grad_clip',
          'warmup_iters', 'max_iters', 'eval_interval', 'warn_degenerate_steps', 'warn_mismatch',
          'stop_mismatch']),
        # oversample < 1 could never fill a step in one round
        ('>= 1', lambda v: v >= 1,
         ['max_prompt_len', 'prompts_per_step', 'max_new_tokens', 'oversample', 'num_iterations',
          'micro_batch_size', 'max_tokens_per_micro', 'max_bad_steps']
         + (['eval_samples', 'eval_problems'] if eval_interval else [])),
        ('> 0', lambda v: v > 0,
         ['reward_timeout', 'temperature', 'tau_pos', 'tau_neg', 'tis_cap', 'vf_clip', 'lam_alpha']),
        ('in (0, 1]', lambda v: 0 < v <= 1, ['top_p', 'vllm_gpu_memory_utilization']),
        ('in [0, 1]', lambda v: 0 <= v <= 1,
         ['clip_cov_ratio', 'kl_cov_ratio', 'gae_lambda', 'warn_truncated']),
        ('in [0, 1)', lambda v: 0 <= v < 1, ['eps_low', 'beta1', 'beta2']),
        ('>= 2 (a group advantage needs 2 samples per prompt)', lambda v: v >= 2, ['group_size']),
        ('<= 1 (a right answer scores 1.0)', lambda v: v <= 1, ['reward_wrong']),
        ('>= -1 (-1: never)', lambda v: v >= -1, ['ckpt_interval']),
        (f'in [0, max_new_tokens={max_new_tokens}]', lambda v: 0 <= v <= max_new_tokens,
         ['overlong_buffer']),
        (f'<= clip_cov_ub={clip_cov_ub}', lambda v: v <= clip_cov_ub, ['clip_cov_lb']),
        # either sign: < 0 minimises the entropy, which is a method of its own
        ('finite', math.isfinite, ['entropy_coef'])]:
    for key in keys:
        if globals()[key] is not None and not in_range(globals()[key]):
            config_error(f"{key}={globals()[key]!r} must be {valid}")
# init_from: 'resume', a folder or a hub id. A mistyped folder would otherwise end, after the long
# imports, in the hub's OSError about a repo id.
if init_from != 'resume' and not os.path.isdir(init_from):
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    try:
        validate_repo_id(init_from)  # 'name' or 'owner/name', in the hub's characters
        cached = isinstance(try_to_load_from_cache(init_from, 'config.json'), str)
    except HFValidationError:
        config_error(f"init_from={init_from!r} is not a folder (and not a hub id 'owner/name')")
    if constants.HF_HUB_OFFLINE and not cached:  # offline, a hub id loads from the cache only
        config_error(f"init_from={init_from!r} is not a folder, and the hub is offline "
                     f"(HF_HUB_OFFLINE=1) with no cached copy of it")
if tis_mode != 'none' and rollout_engine != 'vllm':
    config_error(f"tis_mode={tis_mode!r} corrects for the sampler's log-probs: it needs "
                 f"rollout_engine='vllm' (the 'hf' engine samples with the trainer's own model)")
if parallel == 'fsdp' and rollout_engine != 'vllm':
    config_error("parallel='fsdp' needs rollout_engine='vllm': HF generate runs the model's own "
                 "forward, which does not gather the sharded weights")
if old_logp_source == 'rollout' and (rollout_engine != 'vllm' or tis_mode != 'none'):
    config_error("old_logp_source='rollout' needs rollout_engine='vllm' (its log-probs) and "
                 "tis_mode='none' (the sampler is pi_old then: no mismatch is left to correct)")

# -----------------------------------------------------------------------------
# data: every task's rows share one format (data/*/prepare.py)
def row_problem(row):
    """What is wrong with a data row, or None.
    Rows: {"prompt": [{"role": ..., "content": ...}, ...], "answer": ...}."""
    if not isinstance(row, dict):
        return "not a JSON object"
    prompt = row.get('prompt')
    def is_message(m):
        return isinstance(m, dict) and all(isinstance(m.get(k), str) for k in ('role', 'content'))
    if not isinstance(prompt, list) or not prompt or not all(is_message(m) for m in prompt):
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
# setup: one process per GPU (or per CPU share) under torchrun, as nanoGPT does; plain python: 1
# rank
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    dist.init_process_group(backend='nccl' if torch.cuda.is_available() else 'gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ['LOCAL_RANK'])
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0  # logs, evaluates the sums and writes checkpoints
fsdp = ddp and parallel == 'fsdp'  # sharded (train.wrap); plain python has nothing to shard
device = f'cuda:{local_rank}' if torch.cuda.is_available() else 'cpu'
if device.startswith('cuda'):
    torch.cuda.set_device(device)
if prompts_per_step % world_size:
    config_error(f"prompts_per_step={prompts_per_step} must be divisible by the {world_size} ranks")
if dtype == 'auto':  # bf16 without bf16 instructions is emulated: far slower than fp32
    dtype = 'bfloat16' if native_bf16(device) else 'float32'
    if master:
        print(f"dtype='auto': the body runs in {dtype} (bf16 matmuls in hardware: {dtype == 'bfloat16'})")
autocast_dtype = {'float32': None, 'bfloat16': torch.bfloat16}[dtype]
if not verbose:  # the console: the trainer's lines and its own progress bar
    transformers.logging.disable_progress_bar()
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
# the world may change (another number of ranks, DDP <-> FSDP): the data position is global and the
# optimizer state is resharded on load (model.load_optimizers)
# (max_prompt_len decides which rows are kept before the shuffle)
position_keys = ('data_dir', 'seed', 'prompts_per_step', 'group_size', 'max_prompt_len')
saved_config = ckpt_meta['config'] if resume else {}
if changed := [k for k in position_keys if k in saved_config and saved_config[k] != globals()[k]]:
    config_error(f"cannot resume {ckpt_dir} with a different {', '.join(changed)} "
                 f"(the data position would not mean the same)")
if resume and not os.path.isdir(os.path.join(ckpt_dir, 'optimizer')):
    config_error(f"{ckpt_dir} has no optimizer/ folder (it predates the DCP optimizer state): resume "
                 f"it with the revision that wrote it, or start from its weights: --init_from={ckpt_dir}")
model_source = ckpt_meta['model_source'] if resume else init_from  # the model this run started from
model_path = ckpt_dir if resume else init_from
# bf16 / fp16 body: fp32 weights on that dtype's rounding ties are rounded once (model.round_ties)
model, tokenizer = load_model(model_path, autocast_dtype)
model.to(device).train()
if gradient_checkpointing:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})

def wrap(module):
    """A Scorer made ready for torchrun (plain python: as is). DDP averages the gradients over ranks
    in the last micro-batch's backward. FSDP2: fully_shard on each decoder layer, then on the whole
    (the root: embeddings, final norm and head, gathered for the whole forward; tied weights stay
    tied); a layer's weights are gathered for its forward and backward, its gradients reduce-scattered
    to their shards. Weights stay fp32 (autocast casts the body as without sharding); the optimizer
    is built after, on this rank's shards."""
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for layer in module.model.base_model.layers:
            fully_shard(layer)
        return fully_shard(module)
    if ddp and any(p.requires_grad for p in module.parameters()):
        # the gradients are views into DDP's reduction buckets: no second copy of them
        return DDP(module, device_ids=[local_rank] if device.startswith('cuda') else None,
                   gradient_as_bucket_view=True)
    return module

def unwrapped(scorer):
    """For the no-grad passes: DDP's hooks off (FSDP's stay: they gather the shards)."""
    return scorer.module if isinstance(scorer, DDP) else scorer

# the trainer's forward for the loss (Scorer: DDP's hooks on completion_logprobs, not the HF
# forward)
scorer = wrap(Scorer(model))
# fused: one kernel over all parameters (CPU and GPU): 0.04 s, not 0.3 s, here
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2),
                              weight_decay=weight_decay, fused=True)
optimizers = {'policy': (model, optimizer)}  # saved and loaded by name (model.save_optimizers)
ref_scorer = None
if beta > 0:  # the frozen initial model, for the KL penalty
    ref_model = load_model(model_source, autocast_dtype)[0].to(device).eval().requires_grad_(False)
    ref_scorer = wrap(Scorer(ref_model))
critic = critic_scorer = None
# PPO / VAPO: the value model (the base network, a scalar head), its own AdamW
if variant['critic']:
    critic = load_critic(os.path.join(ckpt_dir, 'critic') if resume else model_source)
    critic.to(device).train()
    round_ties(critic, autocast_dtype, name='critic')  # the same bf16 trap as the policy's
    if gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
    critic_scorer = wrap(Scorer(critic, completion_values))
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=critic_lr, betas=(beta1, beta2),
                                         weight_decay=weight_decay, fused=True)
    optimizers['critic'] = (critic, critic_optimizer)
state = load_trainer_state(ckpt_dir) if resume else None
if resume:
    load_optimizers(os.path.join(ckpt_dir, 'optimizer'), optimizers)
if value_warmup_steps is None:
    value_warmup_steps = variant['value_warmup']
engine = init_engine(rollout_engine, model_path, seed=seed + rank, fp32_head=vllm_fp32_head,
                     distributed=ddp, gpu_memory_utilization=vllm_gpu_memory_utilization,
                     sleep_mode=vllm_sleep and device.startswith('cuda'), verbose=verbose,
                     dtype=dtype,  # the trainer's body dtype: the sampler is the policy trained
                     enforce_eager=vllm_enforce_eager if vllm_enforce_eager is not None
                     else not device.startswith('cuda'))

def reduce_sum(x):
    """x summed over ranks (a number or a dict of numbers with the same keys on every rank)."""
    if not ddp:
        return x
    keys = sorted(x) if isinstance(x, dict) else None
    values = [float(x[k]) for k in keys] if keys else [float(x)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist())) if keys else t.item()

def peak_memory():
    """This rank's peak memory in bytes: CUDA's allocated peak (CPU: the resident set)."""
    if device.startswith('cuda'):
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

seconds = {}  # the step's wall time per stage: seconds['rollout_seconds'], ...

@contextlib.contextmanager
def timed(stage):
    """Time a stage of the step; it is also a named range in a torch.profiler trace (bench.py)."""
    t0 = time.time()
    with torch.profiler.record_function(stage):
        yield
    seconds[f'{stage}_seconds'] = time.time() - t0

def accumulate(sums, new):
    """sums[k] += new[k]: the step's statistics are sums (over micro-batches, then ranks), means at
    the end."""
    for k, v in new.items():
        sums[k] = sums.get(k, 0.0) + v

# -----------------------------------------------------------------------------
# sample: prompts in a fixed shuffled order, G completions each, verified and shaped into rewards
# over-long prompts: skipped and counted
for name, rows in [('train', train_rows), ('test', test_rows)]:
    kept = [r for r in rows if len(encode_prompts(tokenizer, [r['prompt']])[0]) <= max_prompt_len]
    if len(kept) < len(rows):
        print(f"{name}: {len(rows) - len(kept)} prompts longer than "
              f"max_prompt_len={max_prompt_len} tokens skipped")
    rows[:] = kept
if max_iters > 0 and not train_rows:
    config_error(f"no training prompt fits in max_prompt_len={max_prompt_len} tokens")
train_order = list(range(len(train_rows)))
random.Random(seed).shuffle(train_order)  # one fixed order; data_cursor is the position in it
# prompts consumed so far (saved in checkpoints)
data_cursor = state['data_cursor'] if resume else 0
# completions whose verifier raised or timed out (each scored 0), of all completions verified
reward_errors, verified = 0, 0

def next_rows(n):
    """n rows for this rank: its share of the next n * world_size rows of the global order."""
    global data_cursor
    positions = [data_cursor + j * world_size + rank for j in range(n)]
    data_cursor += n * world_size
    return [train_rows[train_order[p % len(train_rows)]] for p in positions]

def verify(completion, answer):
    global reward_errors, verified
    verified += 1
    score, error = safe_score(REWARDS[reward_fn], completion, answer, reward_timeout)
    if error is not None:
        reward_errors += 1
        if reward_errors <= 3:
            tqdm.write(f"reward_fn {reward_fn!r} failed on a completion "
                       f"({type(error).__name__}: {error}); scored 0")
    return score

def rollout(rows, G):
    """Sample G completions per row; 'correct' is the task verifier's verdict (1.0 right, 0.0
    wrong)."""
    prompt_ids = encode_prompts(tokenizer, [r['prompt'] for r in rows])
    batch = generate(engine, tokenizer, prompt_ids, G, max_new_tokens, temperature,
                     model=model, top_p=top_p, top_k=top_k, autocast_dtype=autocast_dtype)
    answers = [rows[i // G]['answer'] for i in range(len(batch['completions']))]
    batch['correct'] = torch.tensor([verify(c, a) for c, a in zip(batch['completions'], answers)])
    return batch

def sample(step):
    """This rank's share of the step's prompts, G samples each (DAPO's dynamic sampling: only groups
    whose answers disagree, sampled until there are prompts_per_step of them). Returns the batch
    (None: this or another rank has no live group, every rank skips the update) and the sampling
    record."""
    if dynamic_sampling:
        batch, counts = dynamic_sample(next_rows, lambda rows: rollout(rows, group_size),
                                       prompts_per_step, group_size, oversample, max_gen_batches,
                                       tokenizer.pad_token_id, reduce_sum, world_size)
    else:
        batch = rollout(next_rows(prompts_per_step // world_size), group_size)
        # a group whose answers all agree teaches nothing
        correct = batch['correct'].view(-1, group_size)
        counts = {'samples': len(batch['completions']),
                  'samples_correct': batch['correct'].sum().item(), 'groups_sampled': len(correct),
                  'groups_degenerate': (correct == correct[:, :1]).all(1).sum().item()}
    counts = reduce_sum(counts)
    # over every sample
    record = {'samples': counts['samples'],
              'accuracy': counts['samples_correct'] / max(counts['samples'], 1),
              'degenerate_frac': counts['groups_degenerate'] / max(counts['groups_sampled'], 1)}
    if dynamic_sampling:
        record.update(gen_rounds=counts['gen_rounds'] / world_size,
                      prompts_consumed=counts['groups_sampled'], live_groups=counts['groups_live'])
        if counts['groups_live'] < prompts_per_step and master:
            tqdm.write(f"step {step + 1}: only {counts['groups_live']:.0f} live groups after "
                       f"{counts['gen_rounds']:.0f} rounds (max_gen_batches={max_gen_batches}); "
                       f"training on those")
    if reduce_sum(int(batch is None)):
        batch = None
    return batch, record

def shaped_rewards(batch, step):
    """The reward each sample trains on: task reward plus the enabled shaping terms, each also
    returned alone so that it is logged on its own; (B,) tensors."""
    lengths = batch['completion_mask'].sum(1)
    parts = {'task': torch.where(batch['correct'] > 0, 1.0, reward_wrong)}
    if format_coef:
        formats = [FORMATS[reward_fn](c) for c in batch['completions']]
        parts['format'] = format_coef * torch.tensor(formats)
    if overlong_buffer:  # DAPO soft overlong punishment
        parts['overlong'] = torch.tensor([overlong_penalty(int(n), max_new_tokens, overlong_buffer)
                                          for n in lengths])
    if length_reward_coef and step >= length_reward_warmup:  # Kimi k1.5 length reward
        parts['length'] = length_reward_coef * torch.tensor(
            kimi_length_reward(lengths.tolist(), batch['correct'].tolist(), group_size))
    return sum(parts.values()), parts

def trained_rows(batch):
    """(B,) bool: the rows that go through the update. All of them, or (skip_zero_adv, for the
    variants whose every loss term is proportional to A) the groups with a non-zero advantage; the
    skipped groups' tokens still count in the loss's denominators, as their zero terms would."""
    trained = torch.ones(len(batch['completions']), dtype=torch.bool)
    if skip_zero_adv and variant['skip_zero_adv'] and beta == 0 and entropy_coef == 0:
        live_groups = (batch['advantages'] != 0).view(-1, group_size).any(1)
        trained = live_groups.repeat_interleave(group_size)
        # no live group: one (zero gradient) still runs, so that DDP's all-reduce is matched
        trained[:group_size] |= not trained.any()
    return trained

def parsed_answer(completion):
    """The verifier's reading of the answer (for maj@k), None when it has none or fails on it."""
    try:
        return ANSWERS[reward_fn](completion)
    except Exception:  # noqa: BLE001 -- as in verify: one bad completion costs one vote
        return None

def evaluate():
    """Held-out metrics from k = eval_samples samples per test problem at the training temperature:
    avg@k (eval/accuracy, the mean correctness), pass@1, pass@k (the unbiased estimator) and maj@k
    (the majority answer). Each rank takes every world_size-th problem; the sums are reduced."""
    k = eval_samples
    # a rank may have no problem (fewer problems than ranks): an empty batch, zeros in the sums
    batch = rollout(test_rows[rank::world_size], k)
    correct = batch['correct'].view(-1, k)  # (problems, k)
    answers = [parsed_answer(c) for c in batch['completions']]
    n_correct = correct.sum(1).long().tolist()
    sums = reduce_sum({
        'n': len(batch['completions']), 'problems': len(correct),
        'accuracy': batch['correct'].sum().item(),
        'completion_len': batch['completion_mask'].sum().item(),
        'truncated': batch['truncated'].float().sum().item(),
        'pass@1': sum(pass_at_k(k, c, 1) for c in n_correct),
        f'pass@{k}': sum(pass_at_k(k, c, k) for c in n_correct),
        f'maj@{k}': sum(majority_correct(answers[i * k:(i + 1) * k], correct[i].tolist())
                        for i in range(len(correct)))})
    n, problems = sums.pop('n'), sums.pop('problems')
    # per sample: accuracy, length, truncation; per problem: pass@ and maj@
    return {f'eval/{key}': v / (problems if '@' in key else n) for key, v in sums.items()}

# -----------------------------------------------------------------------------
# score and update: micro-batches, the no-grad passes, the policy's optimizer passes
def micro_batches(batch):
    """Token-budget micro-batches: rows sorted by length (completion, then prompt) and packed
    greedily while a micro-batch has at most micro_batch_size rows and max_tokens_per_micro tokens
    through the body, padding included, each distinct prompt counted once (model.completion_hidden
    shares it among the rows that answer it); each is cut to its own longest prompt and completion.
    Returns them (on device), the number of real tokens they put through the body and the fraction
    of their tokens that is padding."""
    prompt_len = batch['prompt_mask'].sum(1).tolist()
    completion_len = batch['completion_mask'].sum(1).long().tolist()
    P = batch['prompt_ids'].shape[1]
    G = 1 if gradient_checkpointing else group_size  # rows i // G share a prompt

    def tokens(rows):
        prompts = len({i // G for i in rows}) * max(prompt_len[i] for i in rows)
        return prompts + len(rows) * max(1, max(completion_len[i] for i in rows))

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
        # prompts keep their last p columns (left padding), completions their first c
        def cut(k, v):
            return v[:, P - p:] if k.startswith('prompt') else v[:, :c] if v.dim() == 2 else v
        mbs.append({k: cut(k, v[rows]).to(device) for k, v in batch.items() if torch.is_tensor(v)})
    if fsdp:  # every rank as many forwards and backwards: FSDP gathers and reduce-scatters in each
        mbs = even_micro_batches(mbs)
    real_prompts = sum(prompt_len[g * G] for rows in packs for g in {i // G for i in rows})
    real = real_prompts + sum(completion_len)
    return mbs, real, 1 - real / sum(tokens(rows) for rows in packs)

def score_args(mb):
    ids_and_masks = mb['prompt_ids'], mb['prompt_mask'], mb['completion_ids'], mb['completion_mask']
    return (*ids_and_masks, temperature, autocast_dtype)

@torch.no_grad()
def score(mbs):
    """The no-grad passes the loss needs, one each, into every micro-batch: pi_old (when
    num_iterations > 1, or for ppo's KL reward; with num_iterations == 1 the batch is used once,
    on-policy, so pi_old = pi_theta and the detached current log-probs serve), pi_ref (beta > 0) and
    the critic's V_old (ppo / vapo)."""
    need_old = num_iterations > 1 or (critic is not None and beta > 0)
    need_old = need_old and 'old_logp' not in mbs[0]
    for key, net in [('old_logp', scorer if need_old else None), ('ref_logp', ref_scorer),
                     ('old_values', critic_scorer)]:
        for mb in mbs if net is not None else []:
            out = unwrapped(net)(*score_args(mb))
            mb[key] = out if key == 'old_values' else out[0]
        if fsdp and net is not None:  # FSDP2 keeps a root gathered after a forward until its
            net.reshard()             # backward: the reference's would stay whole all run

loss_hp = dict(eps_low=eps_low, eps_high=eps_high, max_new_tokens=max_new_tokens, tau_pos=tau_pos,
               tau_neg=tau_neg, cispo_eps_high=cispo_eps_high, clip_cov_ratio=clip_cov_ratio,
               clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub, kl_cov_ratio=kl_cov_ratio,
               kl_cov_coef=kl_cov_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
               tis_mode=tis_mode, tis_cap=tis_cap,
               # ppo / vapo: the KL is a per-token reward instead
               beta=0.0 if critic is not None else beta)

def micro_batch_loss(mb, counts):
    """One micro-batch's share of the step's loss (global denominators: the shares add up, over
    micro-batches and ranks, to the batch loss), with the current log-probs, entropies and the loss
    statistics."""
    logp, entropy = scorer(*score_args(mb))
    old_logp = mb['old_logp'] if 'old_logp' in mb else logp.detach()
    loss, stats = policy_loss(loss_type, logp, old_logp, mb['advantages'], mb['completion_mask'],
                              num_tokens=counts['tokens'], num_seqs=counts['seqs'],
                              ref_logp=mb.get('ref_logp'), entropy=entropy,
                              rollout_logp=mb.get('rollout_logp'), **loss_hp)
    # VAPO sec. 3.4: + mu * NLL of the correct answers' tokens
    if loss_type == 'vapo' and lm_coef > 0:
        loss = loss + lm_coef * vapo_nll(logp, mb, counts['positive_tokens'])
    return loss, logp, entropy, stats

def batch_stats(mb, logp, entropy, n_tokens, median_len):
    """Trainer-side statistics of the batch as sampled (first pass): entropy, the sampler's
    mismatch, and seed 000's experiment 1 in a real step (losses.token_weight_sums: grpo weighs
    short answers' tokens up)."""
    mask = mb['completion_mask']
    sums = {'n_tokens': n_tokens, 'entropy': (entropy.detach() * mask).sum().item()}
    if 'rollout_logp' in mb:  # |log pi_trainer - log pi_sampler| over the sampled tokens
        sums['rollout_mismatch'] = ((logp.detach() - mb['rollout_logp']).abs() * mask).sum().item()
    return {**sums, **token_weight_sums(logp.grad, mb['advantages'], mask, median_len)}

def policy_update(mbs, counts, step, median_len):
    """num_iterations optimizer passes over the micro-batches, gradients accumulated over them. A
    pass with a non-finite loss or gradient ends the step's updates. Returns the statistics' sums
    (this rank's) and what the log reports of the update."""
    sums, out = {}, {'nonfinite': False, 'updates_applied': 0}
    for it in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        pass_loss = 0.0  # this pass's loss: the sum of its micro-batch losses (over ranks, below)
        for i, mb in enumerate(mbs):
            # DDP: all-reduce the gradients only in the last micro-batch's backward
            with scorer.no_sync() if isinstance(scorer, DDP) and i < len(mbs) - 1 else \
                    contextlib.nullcontext():
                loss, logp, entropy, stats = micro_batch_loss(mb, counts)
                logp.retain_grad()
                # DDP averages over ranks; our shares are meant to be summed
                (loss * world_size).backward()
            pass_loss += loss.item()
            # the loss statistics (clip fractions, ...): means over all passes
            n = stats.pop('n_tokens')
            accumulate(sums, {f'loss/{k}': v * n / num_iterations for k, v in stats.items()})
            if it == 0:
                accumulate(sums, batch_stats(mb, logp, entropy, n, median_len))
        pass_loss = reduce_sum(pass_loss)
        out['grad_norm'] = clip_grad_norm(model.parameters(), grad_clip)
        warmup = min(1.0, (step + 1) / warmup_iters) if warmup_iters else 1.0  # linear warm-up
        out['lr'] = learning_rate * warmup
        for group in optimizer.param_groups:
            group['lr'] = out['lr']
        if it == 0:
            out['loss'] = pass_loss
        # the same on every rank after the reduce: a non-finite loss or gradient would poison the
        # weights
        if not (math.isfinite(pass_loss) and math.isfinite(out['grad_norm'])):
            out['nonfinite'] = True
            break
        # VAPO sec. 3.1: the policy waits for the critic
        if critic is None or step >= value_warmup_steps:
            optimizer.step()
            out['updates_applied'] += 1
    return sums, out

# -----------------------------------------------------------------------------
# log: one record per step, every number already summed over ranks
def step_record(step, batch, reward_parts, lengths, trained, sums, update, mbs, body_tokens,
                pad_frac, sample_record):
    """The step's log record: sums over ranks, then means (per sample, or per token of the trained
    rows)."""
    correct, mask = batch['correct'] > 0, batch['completion_mask']
    # (B,) each, logged as their means over the step's samples
    per_sample = {'reward': batch['rewards'], 'completion_len': lengths,
                  'truncated': batch['truncated'].float(), 'trained_frac': trained.float(),
                  **{f'reward/{k}': v for k, v in reward_parts.items()}}
    totals = reduce_sum({**sums, **{k: v.sum().item() for k, v in per_sample.items()},
                         'seqs': len(lengths), 'n_correct': correct.sum().item(),
                         'len_correct': lengths[correct].sum().item(), 'body_tokens': body_tokens,
                         'head_tokens': sum(mb['completion_mask'].sum().item() for mb in mbs)})
    n_tokens = max(totals.pop('n_tokens', 0), 1e-9)
    seqs, n_correct = totals['seqs'], totals['n_correct']
    len_wrong = totals['completion_len'] - totals['len_correct']
    # the padding of this rank's rows at the batch's full width, before micro_batches packs them
    full_width = len(lengths) * (batch['prompt_ids'].shape[1] + mask.shape[1])
    real_tokens = mask.sum().item() + batch['prompt_mask'].sum().item()
    record = {
        'step': step + 1,
        **{k: totals[k] / seqs for k in per_sample},
        **sample_record,
        'completion_len_correct': totals['len_correct'] / n_correct if n_correct else None,
        'completion_len_wrong': len_wrong / (seqs - n_correct) if n_correct < seqs else None,
        # over the trained rows' tokens, as the loss/ statistics
        'entropy': totals['entropy'] / n_tokens,
        'loss': update['loss'],
        'grad_norm': update['grad_norm'],
        'lr': update['lr'],
        'nonfinite_skipped': int(update['nonfinite']),
        # optimizer steps of the policy (of num_iterations)
        'updates_applied': update['updates_applied'],
        'reward_errors': reduce_sum(reward_errors),
        **seconds,
        # real tokens through the body (a shared prompt once) and through the LM head, all passes
        'train_tokens': totals['body_tokens'] * num_iterations,
        'train_completion_tokens': totals['head_tokens'] * num_iterations,
        # completion tokens through the update (the trained rows, after masking), all passes
        'tokens_per_second': totals['head_tokens'] * num_iterations / seconds['train_seconds'],
        'peak_memory_gib': peak_memory() / 2**30,
        'pad_frac': pad_frac,
        'pad_frac_unpacked': 1 - real_tokens / full_width,
        **{k: v / n_tokens for k, v in totals.items() if k.startswith('loss/')},
    }
    if 'rollout_mismatch' in totals:
        record['rollout_mismatch'] = totals['rollout_mismatch'] / n_tokens
    if totals['n_short'] and totals['n_long']:  # grpo: > 1, dapo: 1 (losses.token_weight_sums)
        short = totals['weight_short'] / totals['n_short']
        record['token_weight_short_long'] = short / (totals['weight_long'] / totals['n_long'])
    # the critic as a baseline: explained variance, V(s_0) vs GRPO's group mean
    if critic is not None:
        group_mean = batch['rewards'].view(-1, group_size).mean(1).repeat_interleave(group_size)
        group_sq_err = reduce_sum(((batch['rewards'] - group_mean) ** 2).sum().item())
        record.update(critic_record(totals, n_tokens, seqs, group_sq_err))
        record['policy_frozen'] = int(step < value_warmup_steps)
    return record

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

def log_eval(step):
    """Held-out eval at step 0, every eval_interval steps and at the end (before that step's
    checkpoint, so that a resumed run never evaluates the same step twice)."""
    if not eval_interval or (step % eval_interval and step != max_iters):
        return
    t0 = time.time()
    # on an RNG stream of its own (HF engine): an eval, such as the one that ends a run stopped
    # early, leaves the training samples as they were, so that a resume is exact
    with torch.random.fork_rng(devices=[device] if device.startswith('cuda') else []):
        torch.manual_seed(seed + rank + 1_000_003 * (step + 1))
        record = {'step': step, **evaluate(), 'eval/seconds': time.time() - t0}
    log(record)
    k = eval_samples
    if master:
        tqdm.write(f"step {step}: eval accuracy {record['eval/accuracy']:.3f} (avg@{k}) "
                   f"pass@{k} {record[f'eval/pass@{k}']:.3f} maj@{k} {record[f'eval/maj@{k}']:.3f} "
                   f"({len(test_rows)} problems, {record['eval/seconds']:.0f}s)")

# guards: what the log shows going wrong, said once in words with the knob that changes it
guards_said, degenerate_steps, first_mismatch = set(), 0, None

def guard_warnings(record):
    """The names and messages of the guards that this step's record trips (every number in it is
    already reduced over ranks, so every rank comes to the same verdict)."""
    global degenerate_steps, first_mismatch
    degenerate_steps = degenerate_steps + 1 if record.get('degenerate_frac', 0) == 1 else 0
    mismatch = record.get('rollout_mismatch', 0.0)  # (vLLM only)
    if 'rollout_mismatch' in record and first_mismatch is None:
        first_mismatch = max(mismatch, 0.01)  # the engine was loaded with these weights: in sync
    ratio = mismatch / first_mismatch if first_mismatch else 0.0
    return [
        ('truncated', record.get('truncated', 0) > warn_truncated,
         f"{record.get('truncated', 0):.0%} of the answers were cut at "
         f"max_new_tokens={max_new_tokens}: raise it (or mask_truncated=True)"),
        ('degenerate', degenerate_steps >= warn_degenerate_steps > 0,
         f"every group's answers agreed for {degenerate_steps} steps: no gradient; the task is "
         f"too easy or too hard for the model (or try dynamic_sampling=True)"),
        ('reward_errors', record.get('reward_errors', 0) > max(3, 0.01 * reduce_sum(verified)),
         f"{record.get('reward_errors', 0):.0f} completions' verifier raised or timed out (each "
         f"scored 0): check reward_fn={reward_fn!r} and reward_timeout={reward_timeout}"),
        ('mismatch', ratio > warn_mismatch > 0,
         f"rollout_mismatch {mismatch:.3f} is {ratio:.1f}x the first step's: the sampler drifts "
         f"from the trainer (tis_mode='token_truncate' corrects for it)"),
        ('sync', ratio > stop_mismatch > 0,
         f"rollout_mismatch {mismatch:.3f} is {ratio:.1f}x the first step's (stop_mismatch="
         f"{stop_mismatch}): the sampler no longer follows the trainer; is the weight sync "
         f"(rollout.sync_weights) working?"),
    ]

def log_step(record):
    """Log the step's record with its guards, print its line and each guard's message the first
    time it trips; a tripped sync guard requests a stop (checkpoint, then exit with the message).
    max_bad_steps non-finite steps in a row abort the run."""
    global stop_requested, abort_message, bad_steps
    for name, tripped, message in guard_warnings(record):
        if not tripped:
            continue
        record[f'guard/{name}'] = 1
        if name == 'sync':
            stop_requested, abort_message = True, f"stopping: {message}"
        elif name not in guards_said and master:
            tqdm.write(f"warning, step {record['step']}: {message}")
        guards_said.add(name)
    log(record)
    if master and 'skipped' in record:
        tqdm.write(f"step {record['step']}: no live group, update skipped")
    elif master:
        tqdm.write(f"step {record['step']}: reward {record['reward']:.3f} "
                   f"len {record['completion_len']:.1f} entropy {record['entropy']:.3f} "
                   f"clip {record.get('loss/clip_frac', 0):.4f} gnorm {record['grad_norm']:.3f} "
                   f"| rollout {record['rollout_seconds']:.1f}s train {record['train_seconds']:.1f}s "
                   f"sync {record['sync_seconds']:.2f}s")
    if 'skipped' in record:
        return
    bad_steps = bad_steps + 1 if record['nonfinite_skipped'] else 0
    if bad_steps and master:
        tqdm.write(f"step {record['step']}: non-finite loss or grad norm, optimizer step skipped "
                   f"({bad_steps} in a row; {record['updates_applied']} of {num_iterations} "
                   f"updates applied before it)")
    if bad_steps >= max_bad_steps:
        raise SystemExit(f"aborting: {bad_steps} steps in a row with a non-finite loss or grad "
                         f"norm (max_bad_steps={max_bad_steps}); the last checkpoint holds the last "
                         f"good weights")

def summary():
    """What a user wants at the end: held-out numbers at the first and last eval of the run (from
    the log, so a resumed run counts from its start), where the checkpoint is, what comes next."""
    evals = [r for r in map(json.loads, open(os.path.join(out_dir, 'log.jsonl')))
             if 'eval/accuracy' in r]
    k = eval_samples
    for key in ['eval/accuracy', f'eval/pass@{k}', f'eval/maj@{k}'] if evals else []:
        print(f"{key}: {evals[0].get(key, float('nan')):.3f} at step {evals[0]['step']} -> "
              f"{evals[-1].get(key, float('nan')):.3f} at step {evals[-1]['step']}")
    args = [a for a in sys.argv[1:] if not a.startswith(('--init_from=', '--max_iters='))]
    per_node = int(os.environ.get('LOCAL_WORLD_SIZE', world_size))
    launcher = f"torchrun --nproc_per_node={per_node}" if ddp else "python"
    if world_size > per_node:  # several nodes: each launches its share, with its rendezvous flags
        launcher += f" --nnodes={world_size // per_node} --node_rank=... --rdzv_endpoint=..."
    # this run's checkpoint (not one an earlier run left in out_dir); a stopped run continues to
    # max_iters, a finished one beyond it
    if saved_step is not None:
        more = max_iters if saved_step < max_iters else 2 * max_iters
        print(f"checkpoint (step {saved_step}): {ckpt_dir}\ncontinue: {launcher} train.py "
              f"{' '.join(args)} --init_from=resume --max_iters={more}")
    print(f"plot: python plot.py {out_dir}")

# -----------------------------------------------------------------------------
# save: checkpoints, and SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C): finish the step, save,
# exit
stop_requested, abort_message = False, None
saved_step = None  # the step of this run's latest checkpoint (summary)

def request_stop(signum, frame):
    global stop_requested
    stop_requested = True
    tqdm.write(f"{signal.Signals(signum).name}: finishing this step, then checkpoint and exit")

signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)

def rng_state():
    return {'python': random.getstate(), 'torch': torch.get_rng_state(),
            # this rank's GPU only: a resume may see fewer GPUs (get_rng_state_all: one per GPU)
            'cuda': torch.cuda.get_rng_state(device) if device.startswith('cuda') else None}

def checkpoint_and_maybe_stop(steps_done):
    """Checkpoint when due (every ckpt_interval steps, at the end, on a stop request on any rank);
    rank 0 writes it, with every rank's RNG state. True means stop (all ranks decide together)."""
    global saved_step
    stop = reduce_sum(int(stop_requested)) > 0
    due = (ckpt_interval > 0 and steps_done % ckpt_interval == 0) or steps_done == max_iters or stop
    if due and ckpt_interval != -1:
        rngs = [None] * world_size
        if ddp:
            dist.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        # every rank writes its part of the optimizer state (DCP) into a folder that rank 0 moves
        # into the checkpoint; FSDP: the weights gathered whole to rank 0 (every rank takes part)
        optimizer_dir = ckpt_dir + '.optimizer'
        if master:
            shutil.rmtree(optimizer_dir, ignore_errors=True)
        if ddp:
            dist.barrier()
        save_optimizers(optimizer_dir, optimizers)
        weights = {'model': full_state(model), 'critic': full_state(critic) if critic else None}
        if master:
            save_checkpoint(ckpt_dir, model, tokenizer, {
                'step': steps_done, 'model_source': model_source, 'config': config,
                'world': {'world_size': world_size, 'fsdp': fsdp}, 'data_cursor': data_cursor,
                'rng': rngs}, critic=critic, state_dict=weights['model'],
                critic_state_dict=weights['critic'], optimizer_dir=optimizer_dir)
        saved_step = steps_done
        if ddp:
            dist.barrier()
    if stop and master:
        tqdm.write(f"stopped after step {steps_done}" + ("; continue with --init_from=resume"
                                                         if ckpt_interval != -1 else ""))
    return stop

# the RNG states go back last, after everything that may draw from them while loading
start_step, bad_steps = 0, 0  # bad_steps: non-finite steps in a row (log_step)
if resume:
    start_step = saved_step = state['step']
    # on more ranks than saved, a new rank keeps its own fresh stream (seed + rank)
    if rank < len(state['rng']):
        random.setstate(state['rng'][rank]['python'])
        torch.set_rng_state(state['rng'][rank]['torch'])
        if device.startswith('cuda') and state['rng'][rank]['cuda'] is not None:
            torch.cuda.set_rng_state(state['rng'][rank]['cuda'], device)
    if master:
        print(f"resumed from {ckpt_dir} at step {start_step}"
              + (f" (saved by {len(state['rng'])} ranks, now {world_size})"
                 if len(state['rng']) != world_size else ""))

# -----------------------------------------------------------------------------
# the loop
if start_step == 0:
    log_eval(0)  # the held-out numbers before any update
for step in tqdm(range(start_step, max_iters), initial=start_step, total=max_iters, desc='steps',
                 disable=not master):
    # --- sample: each rank samples its own share of the step's prompts, G completions each
    with timed('rollout'):
        batch, sample_record = sample(step)
    if batch is None:  # some rank has no live group (dynamic sampling): every rank skips the update
        log_step({'step': step + 1, **sample_record, 'rollout_seconds': seconds['rollout_seconds'],
                  'skipped': 1})
        log_eval(step + 1)
        if checkpoint_and_maybe_stop(step + 1):
            break
        continue
    batch['rewards'], reward_parts = shaped_rewards(batch, step)
    lengths = batch['completion_mask'].sum(1)  # (B,) before any masking
    # GRPO eq.: A_i = (r_i - mean(r_group)) / std(r_group), one advantage per completion
    batch['advantages'] = group_advantages(batch['rewards'], group_size, adv_scale, eps=1e-6,
                                           reduce_sum=reduce_sum)
    # DAPO overlong filtering: truncated answers get no loss and leave the token count
    if mask_truncated:
        batch['completion_mask'] = batch['completion_mask'] * ~batch['truncated'][:, None]
    trained = trained_rows(batch)
    if batch['rollout_logp'] is None:
        del batch['rollout_logp']
    if old_logp_source == 'rollout':  # verl's bypass: the sampler's log-probs are pi_old
        batch['old_logp'] = batch['rollout_logp']
    # global denominators, counted after masking and summed over ranks once per step: each
    # micro-batch's loss is its share of the whole step's loss, so the shares add up (over
    # micro-batches and ranks)
    mask = batch['completion_mask']
    positive = mask * (batch['correct'] > 0)[:, None]  # the correct answers' tokens (VAPO's NLL)
    counts = reduce_sum({'tokens': mask.sum().item(), 'seqs': len(batch['completions']),
                         'positive_tokens': positive.sum().item()})
    counts['tokens'] = max(counts['tokens'], 1)

    # --- score: pi_old / pi_ref / V_old, one no-grad pass each when needed; the critic's advantages
    sleep(engine)  # GPU: the KV cache makes room for the update until the next rollout
    with timed('score'):
        model.train()
        trained_batch = {k: v[trained] for k, v in batch.items() if torch.is_tensor(v)}
        mbs, body_tokens, pad_frac = micro_batches(trained_batch)
        score(mbs)
        # PPO / VAPO: per-token advantages from the critic (GAE), whitened (critic.py)
        if critic is not None:
            critic_advantages(mbs, loss_type, gae_lambda, lam_alpha, beta, reduce_sum)

    # --- update: num_iterations passes of micro-batched loss / backward, grad clip, AdamW
    with timed('train'):
        sums, update = policy_update(mbs, counts, step, lengths.median())
        # the critic: num_iterations passes of PPO's clipped value loss, its own AdamW
        if critic is not None:
            sums.update(critic_update(critic_scorer, critic_optimizer, mbs, score_args,
                                      num_iterations, vf_clip, counts['tokens'], grad_clip,
                                      world_size, isinstance(critic_scorer, DDP)))

    # --- sync the new weights into the sampler
    with timed('sync'):
        sync_weights(engine, model)

    # --- log: sums over ranks, then means; the guards; a run of non-finite steps aborts
    record = step_record(step, batch, reward_parts, lengths, trained, sums, update, mbs,
                         body_tokens, pad_frac, sample_record)
    log_step(record)

    # --- eval: held-out avg@k, pass@k, maj@k every eval_interval steps and at the end
    log_eval(step + 1)

    # --- save (step + 1 optimizer steps are done; the data position and RNGs resume from here)
    if checkpoint_and_maybe_stop(step + 1):
        break

shutdown(engine)  # vLLM first: its process groups hang off the default one
if ddp and dist.is_initialized():  # vLLM 0.32's shutdown destroys it, 0.33's does not
    dist.destroy_process_group()
if abort_message:
    raise SystemExit(abort_message)
if master:
    summary()
