# The CPU demo with DAPO's loss: Clip-Higher (eps_high 0.28 > eps_low 0.2) and the token-level mean
# (config/dapo.py is the full 4-GPU recipe). For the comparison runner:
#   python compare.py --variants=grpo,config/cpu_dapo.py
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_dapo'
loss_type = 'dapo'
eps_low, eps_high = 0.2, 0.28
