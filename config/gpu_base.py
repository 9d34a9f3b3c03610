# Shared base of the GPU recipes (config/grpo.py, dapo.py, ...): each recipe execs this file, then changes
# only what its paper changes. The seed's 4-GPU exercise: Qwen2.5-0.5B-Instruct, num_iterations=2 so that
# the ratio moves off 1 and the clipping rules differ, the same seed and data for every variant.
init_from = 'Qwen/Qwen2.5-0.5B-Instruct'
data_dir = 'data/arithmetic'       # run `python data/arithmetic/prepare.py --max_operand=999` for a harder task
reward_fn = 'arithmetic'
rollout_engine = 'vllm'
vllm_gpu_memory_utilization = 0.3
prompts_per_step = 32
group_size = 8
max_new_tokens = 256
temperature = 1.0
num_iterations = 2                 # seed 000: "without it rho = 1 and clipping does nothing"
learning_rate = 1e-6
max_iters = 300
micro_batch_size = 32
eval_interval = 25
eval_samples = 8
eval_problems = 200
ckpt_interval = 50
