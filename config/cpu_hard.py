# The best recipe found on the 2-digit addition task (docs/lab.md, "A 90 % recipe"): the demo's GRPO
# with DAPO's Clip-Higher and dynamic sampling, 2 passes over each batch, and the rate decayed.
#   python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
#       --out_dir=data/arithmetic_2digit
#   python train.py config/cpu_hard.py
# Measured on a 2-core AVX2 CPU (fp32), 2026-12-03, 3 seeds (5 runs): held out 0.80-0.83 at step
# 30 and 0.86-0.91 at step 60 (53-64 min on 2 cores, not the 20 the lab aims at); seed 0 held
# 0.91-0.92 at steps 60-90, seed 2 0.911 / 0.946 at 75 / 90 (81 min).
# On a 2-core Xeon with AMX (bf16), 2026-12-03, seed 0: 0.840 / 0.876 at steps 45 / 60 (18.9 / 25.2
# min): 2.1x faster than fp32 on AVX2, still not 90 % within 20 minutes.
# Plain GRPO (config/cpu_2digit.py, 45 steps), seeds 0 and 1: 0.65-0.68 at step 45.
exec(open('config/cpu_2digit.py').read())
out_dir = 'out/cpu_hard'
eps_high = 0.28               # Clip-Higher: the upper clip at 1.28, the lower stays at 0.8
dynamic_sampling = True       # groups that all agree are dropped and refilled (DAPO)
num_iterations = 2            # 2 passes over each batch, the second one clipped
decay_lr = True               # cosine from learning_rate (2e-5) down to min_lr over max_iters
min_lr = 2e-6
max_iters = 90
eval_interval = 30
