# The best recipe found on the 2-digit addition task (docs/lab.md, "A 90 % recipe"; lab.py's
# cpu_hard study): the demo's GRPO with DAPO's dynamic sampling behind a screen (2 answers a
# prompt first, the rest only where those 2 disagree), trimmed to 8 live groups a step, two passes
# over each batch in one micro-batch with Clip-Higher, a higher rate decayed over 80 steps.
#   python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
#       --out_dir=data/arithmetic_2digit
#   python train.py config/cpu_hard.py
# Held out (avg@4, 200 problems), seeds 0-6 on a 2-core Zen 5 EPYC (AVX512-BF16, bf16),
# 2026-12-05: 0.898 +- 0.020 at step 60, 0.925 +- 0.009 at step 80, in 17.6-18.6 min; 90 % at both
# in 4 of 7 seeds. Plain GRPO (config/cpu_2digit.py) 0.748 +- 0.024 at step 80. In fp32 (a Zen 2
# EPYC, AVX2 only, 2026-12-06) seeds 0-2 held 0.883 +- 0.025 / 0.928 +- 0.021 at steps 60 / 80 in
# 59-65 min (90 % at both in 1 of 3): the 20 minutes are a bf16 CPU's. Every run and probe (the
# rate, the decay, the curriculum, three passes, a Xeon with AMX): docs/lab.md, "What cpu_hard
# shows" on. The stop at the newline (2026-12-07, a Xeon with AMX): the answers no longer run on
# past the sum; seeds 0-2 0.904 +- 0.020 / 0.939 +- 0.010 at steps 60 / 80, 90 % at both in 2 of 3
# (without it, the same CPU: 0.891 / 0.918, in 0 of 3), docs/lab.md "A stop at the newline".
exec(open('config/cpu_2digit.py').read())
out_dir = 'out/cpu_hard'
dynamic_sampling = True       # groups that all agree are dropped and refilled (DAPO)
screen_size = 2               # 2 answers a prompt first, the other 6 only where those 2 disagree
oversample = 12               # ~1 screened prompt in 8 gets through late: 12x the missing groups
trim_surplus = True           # train on 8 live groups, no more: the update costs the same each step
num_iterations = 2            # two passes a batch: the second is off the sampling policy
eps_high = 0.28               # so DAPO's Clip-Higher binds there
micro_batch_size = 64         # the whole batch in one micro-batch: one forward and backward a pass
learning_rate = 4e-5          # 3e-5 until 2026-12-05 (90 % at both last evals: 1 seed of 3 on Zen 5)
decay_lr = True               # cosine from learning_rate down to min_lr over max_iters
min_lr = 3e-6
stop_string = '\n'            # an answer is one line: it ends at its first newline, no run-on
max_iters = 80
eval_interval = 20            # evals at steps 0, 20, 40, 60 and 80
