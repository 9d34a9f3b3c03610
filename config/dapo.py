# DAPO (ByteDance Seed + Tsinghua AIR, Mar 2025; seed 000 J_DAPO): Clip-Higher (eps_low 0.2, eps_high 0.28)
# and the token-level loss. Dynamic sampling and overlong shaping live in rollout.py / rewards.py (next issue).
exec(open('config/gpu_base.py').read())
out_dir = 'out/dapo'
loss_type = 'dapo'
eps_low, eps_high = 0.2, 0.28
