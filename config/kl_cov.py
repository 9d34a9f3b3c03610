# KL-Cov (Cui et al., May 2025): a |logp - old_logp| penalty (coef 1.0) on the top 2e-3 of tokens by
# cov(logp, A); the paper's and verl's defaults.
exec(open('config/gpu_base.py').read())
out_dir = 'out/kl_cov'
loss_type = 'kl_cov'
kl_cov_ratio, kl_cov_coef = 2e-3, 1.0
