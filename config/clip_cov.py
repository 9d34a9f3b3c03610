# Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", May 2025): detach a random 2e-4 of
# the tokens whose cov(logp, A) lies in [1, 5]; the paper's and verl's defaults.
exec(open('config/gpu_base.py').read())
out_dir = 'out/clip_cov'
loss_type = 'clip_cov'
clip_cov_ratio, clip_cov_lb, clip_cov_ub = 2e-4, 1.0, 5.0
