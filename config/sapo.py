# SAPO (Qwen, Nov 2025; named in seed 000 as the 2026 direction): a sigmoid gate instead of the hard clip,
# temperatures tau_pos = 1.0 (A > 0) and tau_neg = 1.05 (A < 0) as in the paper and TRL.
exec(open('config/gpu_base.py').read())
out_dir = 'out/sapo'
loss_type = 'sapo'
tau_pos, tau_neg = 1.0, 1.05
