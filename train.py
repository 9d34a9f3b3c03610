"""
The RL loop, top to bottom. One step is this pipeline; the loop at the bottom reads in its order:

    sample  prompts -> rollout (G samples each) -> rewards -> group advantages -> masking
    score   no-grad passes for what the loss needs: pi_old, pi_ref, the critic's V_old (ppo / vapo)
    update  num_iterations passes of micro-batched loss / backward -> grad clip -> AdamW
    sync    the new weights into the sampler
    log     one record per step (log.jsonl, a few completions in samples.jsonl, the console line),
            and the guards' warnings
    eval    held-out avg@k, pass@k, maj@k (before step 1, every eval_interval steps, the end)
    save    a checkpoint when due

    python train.py                                   # the offline CPU demo's defaults
    python train.py config/cpu_demo.py --loss_type=dapo
    torchrun --nproc_per_node=4 train.py config/dapo.py   # one process and one vLLM engine per GPU

Config is the module-level globals below, overridden by config files and --key=value and checked
(configurator.py). The helpers of each stage are defined above the loop, in the loop's order. The
rooms below this file: the losses in losses.py, the rollout in rollout.py, the tasks in rewards.py,
log-probs in model.py, the critic of ppo / vapo in critic.py, the record, guards and console lines
in report.py, checkpoints and resume in checkpoint.py.
"""
import contextlib
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from checkpoint import (disk_problem, load_optimizers, load_trainer_state, read_checkpoint_meta,
                        restore_rng, resume_problem, save_run, stop_on_signals)
from critic import critic_advantages, critic_update
from curriculum import Curriculum
from lora import adapters_off, add_lora, load_adapter, merged_weights
from losses import LOSS_HP, VARIANTS, group_advantages, policy_loss
from model import (Scorer, all_reduce_sum, backward_pass, clip_grad_norm, close_process_group,
                   completion_values, keep_freed_memory, load_critic, load_model, micro_batches,
                   native_bf16, round_ties, wrap)
from report import (Guards, RunLog, abort_line, bad_step_line, batch_stats, eval_lines, eval_record,
                    rank_numbers, sampling_record, step_line, step_record, step_sums, summary)
from rewards import (TASKS, control_verdicts, eval_sums, kimi_length_reward, load_rows,
                     overlong_penalty, safe_score)
from rollout import (dynamic_sample, encode_prompts, fitting_prompts, generate, init_engine,
                     make_batch, round_counts, shutdown, sleep, sync_weights)

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
reward_fn = 'arithmetic'      # a key of rewards.TASKS: the task's verifier, format check, answer
reward_wrong = 0.0            # task reward of a wrong answer (DAPO: -1.0); a right one scores 1.0
format_coef = 0.0             # weight of the format reward (the answer where the prompt asked)
overlong_buffer = 0           # DAPO soft overlong punishment: L_cache tokens (0: off)
length_reward_coef = 0.0      # Kimi k1.5 length reward, within each group (0: off)
# steps before the length reward starts (Kimi: it slows early learning)
length_reward_warmup = 0
max_bad_rows = 100            # malformed data rows are reported and skipped; more than this aborts
max_prompt_len = 1024         # prompts longer than this (in tokens) are skipped at load time
reward_timeout = 5.0          # seconds one reward call may take; a timeout or an exception scores 0
# the reward-integrity control, an arm a real gain must beat (spurious rewards, Shao et al. 2025):
# 'random' (each answer's verdict a coin with its samples' true success rate: the same advantage
# statistics, no signal) | 'shuffled' (each prompt scored against another prompt's answer) | 'none'
reward_control = 'none'
# rollout
rollout_engine = 'vllm'       # 'vllm' (colocated engine) or 'hf' (plain generate, the fallback)
prompts_per_step = 8          # distinct prompts per step
group_size = 8                # G: samples per prompt
max_new_tokens = 16           # L_max: completions are cut here (and marked truncated)
stop_string = ''              # also end an answer right after this string ('\n': one-line answers)
temperature = 1.0             # sampling temperature; log-probs are scored at the same T
top_p = 1.0                   # keep 1.0 and top_k 0 unless you mean it: both bias the IS ratio
top_k = 0
dynamic_sampling = False      # DAPO: drop groups whose answers all agree, sample more
oversample = 1.5              # dynamic sampling: each round samples this x the missing groups
max_gen_batches = 10          # dynamic sampling: at most this many rounds per step (0: unlimited)
trim_surplus = False          # dynamic sampling: train on prompts_per_step live groups, no more (DAPO)
screen_size = 0               # dynamic sampling: this many answers a prompt first, the rest of its G
                              # only if they disagree (rollout.screened_round; 0: all G at once)
mask_truncated = False        # DAPO overlong filtering: no loss on completions cut at the limit
# pass-rate curriculum (curriculum.py): a prompt whose groups were all right (or all wrong) in this
# many of its steps in a row is passed over for curriculum_cooldown steps (0: off)
curriculum_window = 0
curriculum_cooldown = 50
# a tool the model calls mid-answer (tools.py): multi-turn rollouts; max_new_tokens counts the
# model's tokens and the tool's results
tool = ''                     # a key of tools.TOOLS ('calc': the calculator); '': single-turn
max_tool_calls = 4            # calls answered per answer; a later call is only text
tool_timeout = 5.0            # seconds a call may take (a user's tool: its worker is killed)
vllm_gpu_memory_utilization = 0.3  # GPU memory for vLLM (CPU: VLLM_CPU_KVCACHE_SPACE GiB)
vllm_fp32_head = True         # MiniMax-M1: the sampler's LM head in FP32 as well
vllm_sleep = True             # GPU only: vLLM frees its KV cache while the trainer runs
vllm_enforce_eager: bool = None  # no torch.compile / CUDA graphs; None: True on CPU, False on GPU
# loss (losses.py; the per-variant defaults are its VARIANTS table, these knobs its LOSS_HP)
loss_type = 'grpo'            # one of losses.LOSS_TYPES
# what A is divided by: 'group' (its std) | 'batch' | 'none' (Dr. GRPO); None = the variant's (VARIANTS)
adv_scale: str = None
num_iterations = 1            # mu: optimizer passes over each rollout batch (1: on-policy)
eps_low: float = None         # clip range 1-eps_low .. 1+eps_high; None = the variant's default
eps_high: float = None
tau_pos = 1.0                 # SAPO gate temperatures
tau_neg = 1.05
cispo_eps_high = 4.0          # CISPO: IS weight <= 1 + cispo_eps_high
cispo_eps_low: float = None   # ... and >= 1 - cispo_eps_low (None: no lower bound, as MiniMax)
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
decay_lr = False              # then cosine decay to min_lr (nanoGPT's); False: constant
min_lr = 0.0                  # the learning rate at the decay's end, with decay_lr
lr_decay_iters: int = None    # the cosine reaches min_lr here and stays there; None: max_iters
max_iters = 30                # optimizer steps (x num_iterations passes each)
micro_batch_size = 16         # at most this many sequences per forward/backward
max_tokens_per_micro = 2048   # ... and this many tokens, padding included (rows sorted)
# autocast dtype of the transformer body: 'auto' is bfloat16 where the hardware has bf16 matmuls
# (model.native_bf16), else float32; 'float32' | 'bfloat16' (not fp16: it would need a gradient
# scaler). The LM head is always fp32.
dtype = 'auto'
gradient_checkpointing = False  # recompute activations in backward: less memory, more compute
# LoRA (lora.py): train adapters W + (alpha / r) B A on a frozen base; 0: off (full fine-tuning).
# LoRA without regret: rank 1-32 on every linear layer, at ~10x full fine-tuning's learning rate
lora_rank = 0
lora_alpha: float = None      # the scale is alpha / lora_rank; None: 32 (LoRA without regret's)
lora_targets = 'all-linear'   # the decoder's projections, or a comma-separated list of their names
# pi_old when num_iterations > 1: 'policy' (the first pass's own log-probs) | 'rollout' (vLLM's
# log-probs: verl's "bypass" mode; the clip absorbs the mismatch)
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
# reward hacking, checked at each eval over the steps since the last one: the task reward rose by
# more than this while the held-out accuracy did not rise (0: off) ...
warn_reward_gap = 0.1
warn_length_rise = 0.5        # ... lengths grew by more than this fraction while it did not (0: off)
# stop (with a checkpoint) when rollout_mismatch is above this x the first step's: the sampler no
# longer follows the trainer, as when the weight sync stopped working (0: never)
stop_mismatch = 10.0
# logging
samples_per_step = 4          # completions of each step written to samples.jsonl (0: none)
verbose = False               # vLLM's INFO logging, transformers' progress bars (rollout.quiet_vllm)
wandb_log = False
wandb_project = 'nanogrpo'
wandb_run_name = 'run'
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))]

def config_error(msg):
    """A bad config (or data, or checkpoint) for this run: one line, exit code 2."""
    print(f"config error: {msg}", file=sys.stderr)
    sys.exit(2)

exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configurator.py')).read())
config = {k: globals()[k] for k in config_keys}
variant, task = VARIANTS[loss_type], TASKS[reward_fn]  # (after the config: a file may patch TASKS)
adv_scale = variant['adv'] if adv_scale is None else adv_scale  # Dr. GRPO does not divide by std
value_warmup_steps = variant['value_warmup'] if value_warmup_steps is None else value_warmup_steps
lora_alpha = 32.0 if lora_alpha is None else lora_alpha

# -----------------------------------------------------------------------------
# data: every task's rows share one format (rewards.load_rows, data/*/prepare.py)
try:
    train_rows = load_rows(data_dir, 'train', max_bad_rows) if max_iters > 0 else []
    test_rows = load_rows(eval_data_dir or data_dir, 'test', max_bad_rows) if eval_interval else []
except ValueError as e:
    config_error(e)
test_rows = test_rows[:eval_problems]

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
fsdp = ddp and parallel == 'fsdp'  # sharded (model.wrap); plain python has nothing to shard
mode = parallel if ddp else None  # how the nets are wrapped for torchrun (model.wrap)
device = f'cuda:{local_rank}' if torch.cuda.is_available() else 'cpu'
if device.startswith('cuda'):
    torch.cuda.set_device(device)
else:  # the memory a step frees stays for the next step's (model.keep_freed_memory)
    keep_freed_memory()
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
if problem := resume_problem(ckpt_dir, ckpt_meta, init_from, config):
    config_error(problem)
model_source = ckpt_meta['model_source'] if resume else init_from  # the model this run started from
model_path = ckpt_dir if resume else init_from

def trainable(net, lr, fn=None, **kwargs):
    """The policy's or the critic's setup: on device, in train mode, wrapped for torchrun (its
    forward for the loss: a Scorer of fn with kwargs, so that DDP's hooks are on
    completion_logprobs, not the HF forward), and its own AdamW over what it trains (fused: one
    kernel over all parameters, 0.04 s, not 0.3 s, here)."""
    net.to(device).train()
    if gradient_checkpointing:  # recompute activations in backward
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
    # wrapped first: FSDP's optimizer holds the shards
    wrapped = wrap(Scorer(net, fn, autocast_dtype=autocast_dtype, **kwargs), mode, local_rank)
    trained_params = [p for p in net.parameters() if p.requires_grad]  # LoRA: the adapters
    return wrapped, torch.optim.AdamW(trained_params, lr=lr, betas=(beta1, beta2),
                                      weight_decay=weight_decay, fused=True)

# bf16 body: fp32 weights on that dtype's rounding ties are rounded once (model.round_ties)
model, tokenizer = load_model(model_source if lora_rank else model_path, autocast_dtype)
if lora_rank:  # adapters on the frozen base (stored in the body's dtype); a resume loads its own
    try:
        add_lora(model, lora_rank, lora_alpha, lora_targets, autocast_dtype or torch.float32, seed)
    except ValueError as e:
        config_error(e)
    if resume:
        load_adapter(os.path.join(ckpt_dir, 'adapter'), model)
scorer, optimizer = trainable(model, learning_rate, temperature=temperature)
optimizers = {'policy': (model, optimizer)}  # saved and loaded by name (checkpoint.save_optimizers)
ref_scorer = None
if beta > 0 and lora_rank:  # LoRA: pi_ref is the base, the policy's pass with its adapters off
    ref_scorer = scorer
elif beta > 0:  # the frozen initial model, for the KL penalty
    ref_model = load_model(model_source, autocast_dtype)[0].to(device).eval().requires_grad_(False)
    ref_scorer = wrap(Scorer(ref_model, temperature=temperature, autocast_dtype=autocast_dtype),
                      mode, local_rank)
critic = critic_scorer = None
if variant['critic']:  # PPO / VAPO: the value model (the base network, a scalar head), its AdamW
    critic = load_critic(os.path.join(ckpt_dir, 'critic') if resume else model_source)
    round_ties(critic, autocast_dtype, name='critic')  # the same bf16 trap as the policy's
    critic_scorer, critic_optimizer = trainable(critic, critic_lr, completion_values)
    optimizers['critic'] = (critic, critic_optimizer)
if problem := disk_problem(ckpt_dir, [model, critic], ckpt_interval, max_iters):
    config_error(problem)  # now, not when the last step's weights are to be saved
state = load_trainer_state(ckpt_dir) if resume else None
if resume:
    load_optimizers(os.path.join(ckpt_dir, 'optimizer'), optimizers)
engine = init_engine(rollout_engine, model_path, seed=seed + rank, fp32_head=vllm_fp32_head,
                     distributed=ddp, gpu_memory_utilization=vllm_gpu_memory_utilization,
                     sleep_mode=vllm_sleep, verbose=verbose, enforce_eager=vllm_enforce_eager,
                     dtype=dtype)  # the trainer's body dtype: the sampler is the policy trained

def reduce_sum(x):
    """x summed over ranks (model.all_reduce_sum: a number, a CPU tensor, or a dict of numbers with
    the same keys on every rank); plain python: x."""
    return all_reduce_sum(x, device) if ddp else x

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
train_rows = fitting_prompts(tokenizer, train_rows, max_prompt_len, 'train')
test_rows = fitting_prompts(tokenizer, test_rows, max_prompt_len, 'test')
if max_iters > 0 and not train_rows:
    config_error(f"no training prompt fits in max_prompt_len={max_prompt_len} tokens")
for i, row in enumerate(train_rows):
    row['index'] = i  # the curriculum's and the shuffled control's handle on a row
train_order = list(range(len(train_rows)))
random.Random(seed).shuffle(train_order)  # one fixed order; data_cursor is the position in it
# prompts consumed so far (saved in checkpoints)
data_cursor = state['data_cursor'] if resume else 0
curriculum = None
if curriculum_window:  # the same state on every rank; a resume continues it
    curriculum = Curriculum(train_rows, curriculum_window, curriculum_cooldown)
    if resume and state.get('curriculum'):
        try:
            curriculum.load_state_dict(state['curriculum'])
        except ValueError as e:  # the data folder changed under the checkpoint
            config_error(e)
# this rank's completions verified, and of them those whose verifier raised or timed out (scored 0)
verified = {'completions': 0, 'errors': 0}

def next_rows(n):
    """n rows for this rank: its share of the next n * world_size rows of the global order, less
    those the curriculum passes over (every rank walks the same order with the same state)."""
    global data_cursor
    if curriculum:
        indices, data_cursor = curriculum.walk(train_order, data_cursor, n * world_size)
    else:
        indices = [train_order[(data_cursor + j) % len(train_rows)] for j in range(n * world_size)]
        data_cursor += n * world_size
    return [train_rows[i] for i in indices[rank::world_size]]

def verify(completion, answer):
    """The task verifier's score of one completion (rewards.safe_score: an exception or a timeout
    scores 0, is counted, and the first three are said)."""
    score, error = safe_score(task.score, completion, answer, reward_timeout)
    verified['completions'] += 1
    if error is not None:
        verified['errors'] += 1
        if verified['errors'] <= 3:
            tqdm.write(f"reward_fn {reward_fn!r} failed on a completion "
                       f"({type(error).__name__}: {error}); scored 0")
    return score

def rollout(rows, G, tool_calls=max_tool_calls):
    """G samples per row (rollout.generate's per-sample lists, unpadded), with the task verifier's
    verdict 'correct' (1.0 right, 0.0 wrong) and each sample's prompt (its last message) and
    reference answer (for samples.jsonl and the eval's examples). With a tool, multi-turn samples
    of at most tool_calls calls each."""
    prompt_ids = encode_prompts(tokenizer, [r['prompt'] for r in rows])
    tool_kw = tool and {'name': tool, 'max_tool_calls': tool_calls, 'timeout': tool_timeout}
    samples = generate(engine, tokenizer, prompt_ids, G, max_new_tokens, temperature,
                       model=model, top_p=top_p, top_k=top_k, autocast_dtype=autocast_dtype,
                       tool=tool_kw, stop=stop_string)
    samples['prompt'] = [rows[i // G]['prompt'][-1]['content'] for i in range(len(rows) * G)]
    samples['answer'] = [rows[i // G]['answer'] for i in range(len(rows) * G)]
    samples['correct'] = [verify(c, a) for c, a in zip(samples['completions'], samples['answer'])]
    return samples

def train_rollout(rows, n=group_size):
    """rollout() of training rows, n samples each. With reward_control, the verdicts the trainer
    rewards are the control's (the verifier's are kept as 'true_correct', for the log); the
    curriculum records each group's verdicts."""
    samples = rollout(rows, n)
    if reward_control != 'none':  # 'shuffled': the answer of the next row of the data
        others = [train_rows[(row['index'] + 1) % len(train_rows)]['answer'] for row in rows]
        coin = random.Random(seed * 1_000_003 + data_cursor * world_size + rank)  # ('random')
        verdicts = control_verdicts(reward_control, samples, others, n, verify, coin)
        samples['true_correct'], samples['correct'] = samples['correct'], verdicts
    if curriculum:
        curriculum.observe([row['index'] for row in rows], samples['correct'], n)
    return samples

def sample(step):
    """This rank's share of the step's prompts, G samples each (DAPO's dynamic sampling: only groups
    whose answers disagree, sampled until there are prompts_per_step of them), padded once into the
    batch. Returns the batch (None: this or another rank has no live group, every rank skips the
    update) and the sampling record."""
    if dynamic_sampling:
        samples, counts = dynamic_sample(next_rows, train_rollout, prompts_per_step, group_size,
                                         oversample, max_gen_batches, reduce_sum, world_size,
                                         trim_surplus, screen_size)
    else:
        samples = train_rollout(next_rows(prompts_per_step // world_size))
        counts = round_counts(samples['correct'], group_size)[0]  # degenerate: teaches nothing
    counts = reduce_sum(counts)
    if dynamic_sampling and counts['groups_live'] < prompts_per_step and master:
        tqdm.write(f"step {step + 1}: only {counts['groups_live']:.0f} live groups after "
                   f"{counts['gen_rounds']:.0f} rounds (max_gen_batches={max_gen_batches}); "
                   f"training on those")
    record = sampling_record(counts, world_size)
    if curriculum:  # every rank's groups into the state, then its numbers
        curriculum.end_step(reduce_sum)
        record.update(curriculum.stats())
    if reduce_sum(int(samples is None)):
        return None, record
    return make_batch(samples, tokenizer.pad_token_id), record

def shaped_rewards(batch, step):
    """The reward each sample trains on: task reward plus the enabled shaping terms, each also
    returned alone so that it is logged on its own; (B,) tensors."""
    lengths = batch['completion_mask'].sum(1)
    parts = {'task': torch.where(batch['correct'] > 0, 1.0, reward_wrong)}
    if format_coef:
        parts['format'] = format_coef * torch.tensor([task.format(c) for c in batch['completions']])
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

# -----------------------------------------------------------------------------
# score and update: micro-batches, the no-grad passes, the policy's optimizer passes
@torch.no_grad()
def score(mbs):
    """The no-grad passes the loss needs, one each, into every micro-batch: pi_old for ppo's KL
    reward (the update's first pass takes its own detached log-probs as pi_old: the weights have
    not moved yet), pi_ref (beta > 0) and the critic's V_old (ppo / vapo)."""
    need_old = critic is not None and beta > 0 and 'old_logp' not in mbs[0]
    for key, net in [('old_logp', scorer if need_old else None), ('ref_logp', ref_scorer),
                     ('old_values', critic_scorer)]:
        # LoRA's pi_ref: the base model, the policy with its adapters off (lora.adapters_off)
        base = adapters_off(model) if key == 'ref_logp' and lora_rank else contextlib.nullcontext()
        with base:
            for mb in mbs if net is not None else []:
                # DDP's hooks off for a no-grad pass (FSDP's stay: they gather the shards)
                out = (net.module if isinstance(net, DDP) else net)(mb)
                mb[key] = out if key == 'old_values' else out[0]
        if fsdp and net is not None:  # FSDP2 keeps a root gathered after a forward until its
            net.reshard()             # backward: the reference's would stay whole all run

# the loss knobs, one dict from the config (ppo / vapo: the KL is a per-token reward instead)
loss_hp = {**{k: config[k] for k in LOSS_HP}, 'beta': 0.0 if critic is not None else beta}

def loss_counts(batch):
    """The step's global denominators, counted after masking and summed over ranks once per step:
    each micro-batch's loss is its share of the whole step's loss, so the shares add up (over
    micro-batches and ranks). Tokens, answers, and the correct answers' tokens (VAPO's NLL)."""
    mask = batch['completion_mask']
    positive = mask * (batch['correct'] > 0)[:, None]
    counts = reduce_sum({'tokens': mask.sum().item(), 'seqs': len(batch['completions']),
                         'positive_tokens': positive.sum().item()})
    return {**counts, 'tokens': max(counts['tokens'], 1)}

def micro_batch_loss(mb, counts):
    """One micro-batch's share of the step's loss (global denominators: the shares add up, over
    micro-batches and ranks, to the batch loss), with the current log-probs, entropies and the loss
    statistics."""
    logp, entropy = scorer(mb)
    if 'old_logp' not in mb:  # the first pass: pi_old = pi_theta, kept for the passes after it
        mb['old_logp'] = logp.detach()
    old_logp = mb['old_logp']
    loss, stats = policy_loss(loss_type, logp, old_logp, mb['advantages'], mb['completion_mask'],
                              num_tokens=counts['tokens'], num_seqs=counts['seqs'],
                              ref_logp=mb.get('ref_logp'), entropy=entropy,
                              rollout_logp=mb.get('rollout_logp'), correct=mb['correct'],
                              num_positive_tokens=counts['positive_tokens'], **loss_hp)
    logp.retain_grad()  # for batch_stats' token weights
    return loss, (logp, entropy, stats)

def lr_at(step):
    """The learning rate of step (0-based): linear warm-up, then constant or cosine down to min_lr."""
    if step < warmup_iters:
        return learning_rate * ((step + 1) / warmup_iters)
    if not decay_lr:
        return learning_rate
    decay_iters = max_iters if lr_decay_iters is None else lr_decay_iters
    progress = min(1.0, (step - warmup_iters) / max(1, decay_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (learning_rate - min_lr)

def policy_update(mbs, counts, step, median_len):
    """num_iterations optimizer passes over the micro-batches, gradients accumulated over them. A
    pass with a non-finite loss or gradient ends the step's updates. Returns the statistics' sums
    (this rank's) and what the log reports of the update."""
    sums, out = {}, {'nonfinite_skipped': 0, 'updates_applied': 0}
    for it in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        pass_loss = 0.0  # this pass's loss: the sum of its micro-batch losses (over ranks, below)
        for mb, loss, (logp, entropy, stats) in backward_pass(
                scorer, mbs, lambda mb: micro_batch_loss(mb, counts), world_size):
            pass_loss += loss
            # the loss statistics (clip fractions, ...): means over all passes
            n = stats.pop('n_tokens')
            accumulate(sums, {f'loss/{k}': v * n / num_iterations for k, v in stats.items()})
            if it == 0:
                accumulate(sums, batch_stats(mb, logp, entropy, n, median_len))
        pass_loss = reduce_sum(pass_loss)
        out['grad_norm'] = clip_grad_norm(model.parameters(), grad_clip)
        out['lr'] = lr_at(step)
        for group in optimizer.param_groups:
            group['lr'] = out['lr']
        if it == 0:
            out['loss'] = pass_loss
        # the same on every rank after the reduce: a non-finite loss or gradient would poison the
        # weights
        if not (math.isfinite(pass_loss) and math.isfinite(out['grad_norm'])):
            out['nonfinite_skipped'] = 1
            break
        # VAPO sec. 3.1: the policy waits for the critic
        if critic is None or step >= value_warmup_steps:
            optimizer.step()
            out['updates_applied'] += 1
    if critic is not None:
        out['policy_frozen'] = int(step < value_warmup_steps)
    return sums, out

# -----------------------------------------------------------------------------
# log, eval and save: the calls into report.py and checkpoint.py
run_log = RunLog(out_dir, master, resume, config if wandb_log else None, wandb_project,
                 wandb_run_name)
guards = Guards({**config, 'master': master})

def log_step(record, totals):
    """Log the step's record with its guards (a message the first time one trips) and print its
    line. Returns the guards it trips, {name: message}."""
    tripped = guards.check(record, verified=totals.get('verified', 0))
    run_log.record(record)
    if master:
        tqdm.write(step_line(record))
    return tripped

def log_eval(step):
    """Held-out eval at step 0, every eval_interval steps and at the end (before that step's
    checkpoint, so that a resumed run never evaluates the same step twice): k = eval_samples
    samples per test problem at the training temperature, each rank every world_size-th problem
    (a rank may have none: zeros in the sums); avg@k, pass@k, maj@k (rewards.eval_sums)."""
    if not eval_interval or (step % eval_interval and step != max_iters):
        return
    t0 = time.time()
    # on an RNG stream of its own (HF engine): an eval, such as the one that ends a run stopped
    # early, leaves the training samples as they were, so that a resume is exact
    with torch.random.fork_rng(devices=[device] if device.startswith('cuda') else []):
        torch.manual_seed(seed + rank + 1_000_003 * (step + 1))
        samples = rollout(test_rows[rank::world_size], eval_samples)
        # with a tool, also the same problems with its calls unanswered: the model alone
        alone = rollout(test_rows[rank::world_size], eval_samples, tool_calls=0) if tool else None
    sums = reduce_sum(eval_sums(samples, eval_samples, task.answer))
    record = {'step': step, **eval_record(sums), 'eval/seconds': time.time() - t0}
    if alone is not None:
        record['eval/accuracy_no_tool'] = eval_record(reduce_sum(
            eval_sums(alone, eval_samples, task.answer)))['eval/accuracy']
    guards.check_eval(record)  # the reward-hacking guards: the training means against this eval
    run_log.record(record)
    if master:
        tqdm.write('\n'.join(eval_lines(record, eval_samples, len(test_rows), samples)))

def save(steps_done):
    """Every rank: a checkpoint after steps_done optimizer steps (checkpoint.save_run)."""
    save_run(ckpt_dir, model, tokenizer, optimizers, {
        'step': steps_done, 'model_source': model_source, 'config': config,
        'world': {'world_size': world_size, 'fsdp': fsdp}, 'data_cursor': data_cursor,
        'curriculum': curriculum.state_dict() if curriculum else None},
        device, critic=critic, lora_base=model_source if lora_rank else None)

stop_signal = stop_on_signals()  # SIGTERM / SIGINT (preemption, Ctrl-C): finish the step, save, exit
# the RNG states go back last, after everything that may draw from them while loading
start_step = state['step'] if resume else 0
saved_step = start_step if resume else None  # the step of this run's latest checkpoint (summary)
if resume:
    restore_rng(state['rng'], rank, device)
    if master:
        print(f"resumed from {ckpt_dir} at step {start_step}"
              + (f" (saved by {len(state['rng'])} ranks, now {world_size})"
                 if len(state['rng']) != world_size else ""))
bad_steps, abort_message = 0, None  # non-finite steps in a row; why the run stopped early

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
        record, totals = {'step': step + 1, **sample_record, 'skipped': 1,
                          'rollout_seconds': seconds['rollout_seconds']}, {}
    else:
        batch['rewards'], reward_parts = shaped_rewards(batch, step)
        lengths = batch['completion_mask'].sum(1)  # (B,) before any masking
        # GRPO eq.: A_i = (r_i - mean(r_group)) / std(r_group), one advantage per completion
        batch['advantages'] = group_advantages(batch['rewards'], group_size, adv_scale, eps=1e-6,
                                               reduce_sum=reduce_sum)
        run_log.step_samples(step, batch, reward_parts, samples_per_step)
        # DAPO overlong filtering: truncated answers get no loss and leave the token count
        if mask_truncated:
            batch['completion_mask'] = batch['completion_mask'] * ~batch['truncated'][:, None]
        trained = trained_rows(batch)
        if old_logp_source == 'rollout':  # verl's bypass: the sampler's log-probs are pi_old
            batch['old_logp'] = batch['rollout_logp']
        counts = loss_counts(batch)  # the loss's global denominators, after masking

        # --- score: pi_old / pi_ref / V_old, one no-grad pass each when needed; the critic's A
        sleep(engine)  # GPU: the KV cache makes room for the update until the next rollout
        with timed('score'):
            model.train()
            trained_batch = {k: v[trained] for k, v in batch.items() if torch.is_tensor(v)}
            shared = 1 if gradient_checkpointing else group_size  # rows sharing a prompt's pass
            mbs, body_tokens, pad_frac = micro_batches(trained_batch, shared, micro_batch_size,
                                                       max_tokens_per_micro, device, even=fsdp)
            score(mbs)
            # PPO / VAPO: per-token advantages from the critic (GAE), whitened (critic.py)
            if critic is not None:
                critic_advantages(mbs, variant['critic'], gae_lambda, lam_alpha, beta, reduce_sum)

        # --- update: num_iterations passes of micro-batched loss / backward, grad clip, AdamW
        with timed('train'):
            sums, update = policy_update(mbs, counts, step, lengths.median())
            # the critic: num_iterations passes of PPO's clipped value loss, its own AdamW
            if critic is not None:
                sums.update(critic_update(critic_scorer, critic_optimizer, mbs, num_iterations,
                                          vf_clip, counts['tokens'], grad_clip, world_size))

        # --- sync the new weights into the sampler
        with timed('sync'):
            # LoRA: only the merged weights move (W + (alpha / r) B A): only they are streamed
            moved = merged_weights(model, changed_only=True) if lora_rank else None
            sync_weights(engine, model, moved)
        # every sum of the step over ranks, in one reduction, and the record of their means
        sums.update(step_sums(batch, reward_parts, lengths, trained, mbs, body_tokens, verified,
                              group_size, critic=critic is not None))
        totals = reduce_sum(sums)
        record = step_record(step, totals, update, sample_record, num_iterations,
                             rank_numbers(batch, seconds, pad_frac, device))

    # --- log: the record, its guards, the console line; non-finite steps in a row abort
    tripped = log_step(record, totals)
    if 'skipped' not in record:
        bad_steps = bad_steps + 1 if record['nonfinite_skipped'] else 0
        if bad_steps and master:
            tqdm.write(bad_step_line(record, bad_steps, num_iterations))
        if bad_steps >= max_bad_steps:
            raise SystemExit(abort_line(bad_steps, max_bad_steps))

    # --- eval: held-out avg@k, pass@k, maj@k every eval_interval steps and at the end
    log_eval(step + 1)

    # --- save: when due; a stop (SIGTERM / SIGINT on any rank, the sync guard) saves and ends here
    if 'sync' in tripped:
        abort_message = f"stopping: {tripped['sync']}"
    stop = reduce_sum(int(stop_signal.is_set() or 'sync' in tripped)) > 0
    due = ckpt_interval > 0 and (step + 1) % ckpt_interval == 0 or step + 1 == max_iters or stop
    if due and ckpt_interval != -1:
        save(step + 1)
        saved_step = step + 1
    if stop:
        if master:
            tqdm.write(f"stopped after step {step + 1}"
                       + ("; continue with --init_from=resume" if ckpt_interval != -1 else ""))
        break

shutdown(engine)  # vLLM first: its process groups hang off the default one
if ddp:
    close_process_group()
if abort_message:
    raise SystemExit(abort_message)
if master:
    summary(out_dir, eval_samples, saved_step, ckpt_dir, max_iters, world_size if ddp else 0)
