# The CPU demo with the two cures that stopped its fall after the peak in fp32 (lab.py's demo_cures
# study; docs/lab.md, "What demo_cures shows"): DAPO's dynamic sampling behind config/cpu_hard.py's
# screen, and the learning rate decayed over the 30 steps. Neither alone did (demo_screen, demo_fall).
#   python train.py config/cpu_demo_cured.py
# Held out (avg@4, 100 problems), seeds 0-2 on a 2-core Zen 2 EPYC (AVX2 only, fp32), 2026-12-06:
# 0.873 / 0.880 / 0.895 at step 30, no eval more than 0.003 below an earlier one, in 16.9-17.3 min;
# the demo's GRPO 0.593 / 0.780 / 0.632 in 7.2-8.3 min. Seed 2 run to 60 steps (--max_iters=60):
# 0.940, no fall, 40.8 min. In bf16 (dtype 'auto' on a 2-core Xeon with AMX, 2026-12-07): 0.782 /
# 0.845 / 0.812 at step 30 in 7.8-9.0 min, the demo's GRPO 0.838 / 0.775 / 0.780 in 4.4-5.6 (its
# seed 1 fell from 0.828): level at step 30, ahead by step 10 (docs/lab.md, demo_cures_bf16).
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_demo_cured'
dynamic_sampling = True       # groups that all agree are dropped and refilled (DAPO)
screen_size = 2               # 2 answers a prompt first, the other 6 only where those 2 disagree
oversample = 12               # 7-9 % of screened prompts get through late: 12x the missing groups
trim_surplus = True           # train on 8 live groups, no more: the update costs the same each step
micro_batch_size = 64         # the whole batch in one micro-batch: one forward and backward
decay_lr = True               # cosine from learning_rate (2e-5) down to min_lr over max_iters
min_lr = 2e-6
