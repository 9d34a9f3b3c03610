# VAPO (ByteDance Seed, "VAPO: Efficient and Reliable RL for Advanced Reasoning Tasks", Apr 2025; seed 000):
# PPO with a value model whose known diseases are fixed; 60.4 on AIME 2024 with Qwen2.5-32B. Each switch below
# is a section of the paper, on top of config/ppo.py's PPO.
exec(open('config/gpu_base.py').read())
out_dir = 'out/vapo'
loss_type = 'vapo'
value_warmup_steps = 50            # sec. 3.1 value pre-training: the critic fits the initial policy's returns first
lam_alpha = 0.05                   # sec. 3.2 length-adaptive GAE: lambda_policy = 1 - 1/(0.05 |y|); critic lambda = 1
eps_low, eps_high = 0.2, 0.28      # sec. 3.3 clip-higher, from DAPO (token-level loss: the vapo default)
lm_coef = 0.1                      # sec. 3.4 positive-example LM loss weight mu
critic_lr = 2e-6                   # actor 1e-6 (gpu_base), critic 2e-6, as the paper
vf_clip = 0.5
group_size = 16                    # sec. 3.4 group sampling: fewer prompts, more answers each (paper: 512 x 16)
