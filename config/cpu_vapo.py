# The CPU demo with VAPO (config/vapo.py explains each switch): the critic warms up for 2 steps
# (the paper: 50 of thousands). For the comparison runner: python compare.py --variants=grpo,ppo,config/cpu_vapo.py
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_vapo'
loss_type = 'vapo'
value_warmup_steps = 2
