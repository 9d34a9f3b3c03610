# GRPO (DeepSeekMath; seed 003 J_GRPO): token ratio, symmetric clip 0.2, 1/|o_i| inside each answer, std-scaled A.
exec(open('config/gpu_base.py').read())
out_dir = 'out/grpo'
loss_type = 'grpo'
eps_low, eps_high = 0.2, 0.2
