# GSPO (Qwen, Jul 2025; seeds 000, 003): one geometric-mean ratio s_i and one clip per answer; the paper's
# clip range is 3e-4 / 4e-4 (GRPO's is 0.2 / 0.27), and it clips ~15 % of tokens against GRPO's 0.13 %.
exec(open('config/gpu_base.py').read())
out_dir = 'out/gspo'
loss_type = 'gspo'
eps_low, eps_high = 3e-4, 4e-4
