# DAPO, the full recipe (Yu et al., "DAPO: an Open-Source LLM RL System at Scale", ByteDance Seed + Tsinghua
# AIR, Mar 2025; seed 000 "DAPO: четыре приёма"). Headline: torchrun --nproc_per_node=4 train.py config/dapo.py
# All four tricks, no KL, on DAPO-Math-17K (python data/dapo_math/prepare.py), eval avg@32 on AIME 2024
# (python data/aime24/prepare.py). Sized down from the paper's Qwen2.5-32B / 128 GPUs to a 1.5B math model
# on 4 GPUs: the paper's numbers are kept where they are ratios, scaled where they are sizes.
exec(open('config/gpu_base.py').read())
out_dir = 'out/dapo'
init_from = 'Qwen/Qwen2.5-Math-1.5B'   # a small Qwen2.5 math base model (the paper: Qwen2.5-32B base)
data_dir = 'data/dapo_math'
eval_data_dir = 'data/aime24'
reward_fn = 'dapo_math'                # "Answer: X" on the last line, integer answers
reward_wrong = -1.0                    # paper: +1 right, -1 wrong
loss_type = 'dapo'                     # token-level loss: sum over all tokens / their number
eps_low, eps_high = 0.2, 0.28          # Clip-Higher, paper Sec. 3.1
dynamic_sampling = True                # paper Sec. 3.2: drop groups with accuracy 0 or 1, resample
oversample = 1.5
max_gen_batches = 10                   # verl's DAPO recipe bounds the rounds the same way
mask_truncated = False                 # overlong *filtering* was the paper's first step; shaping replaces it
max_new_tokens = 3072                  # paper: L_max = 20,480 (model context here: 4,096 with the prompt)
overlong_buffer = 614                  # paper: L_cache = 4,096 = 20 % of L_max (Sec. 3.4), kept as a ratio
beta = 0.0                             # paper: no KL penalty (long reasoning must move far from the start)
temperature = 1.0                      # paper: T = 1.0, top_p = 1.0
group_size = 16                        # paper: 16 responses per prompt
prompts_per_step = 64                  # paper: 512 prompts per step on 128 GPUs; 64 on 4
learning_rate = 1e-6                   # paper: constant 1e-6 after a 10-step linear warmup
warmup_iters = 10
num_iterations = 2                     # the paper makes 16 mini-batch updates per rollout (off-policy by then);
                                       # here the whole batch twice, so the ratio leaves 1 and clipping acts
eval_samples = 32                      # avg@32, as the paper's AIME table
eval_problems = 30
eval_interval = 10
micro_batch_size = 8
