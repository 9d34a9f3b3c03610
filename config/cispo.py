# CISPO (MiniMax-M1, Jun 2025; seed 000 J_CISPO): REINFORCE with the stop-gradient IS weight clipped at
# 1 + eps_high (no lower bound), token-level loss; cispo_eps_high=4 is TRL's recommended weight cap of 5.
exec(open('config/gpu_base.py').read())
out_dir = 'out/cispo'
loss_type = 'cispo'
cispo_eps_high = 4.0
