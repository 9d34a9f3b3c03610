# Dr. GRPO (Sea AI Lab, "Understanding R1-Zero-Like Training", Mar 2025; seed 000): divide the token sum by
# the constant G * L_max instead of |o_i|, and do not divide the advantage by the group std.
exec(open('config/gpu_base.py').read())
out_dir = 'out/dr_grpo'
loss_type = 'dr_grpo'
eps_low, eps_high = 0.2, 0.2
learning_rate = 4e-6               # its per-token weights are smaller (seed 000: "compensated by the learning rate")
