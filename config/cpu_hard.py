# The best recipe found on the 2-digit addition task (docs/lab.md, "A 90 % recipe"; lab.py's
# screen_recipe study): the demo's GRPO with DAPO's dynamic sampling behind a screen (2 answers a
# prompt first, the rest only where those 2 disagree), trimmed to 8 live groups a step, two passes
# over each batch in one micro-batch with Clip-Higher, a higher rate decayed over 80 steps.
#   python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
#       --out_dir=data/arithmetic_2digit
#   python train.py config/cpu_hard.py
# Measured on a 2-core Intel Xeon with AMX (bf16), 2026-12-04, seeds 0 / 1 / 2: held out 0.906 /
# 0.922 / 0.896 at step 60 (14.5 / 15.8 / 15.1 min) and 0.917 / 0.927 / 0.906 at step 80 (19.9 /
# 20.8 / 20.2 min of stage and eval time; 20.4-21.3 min with start-up). The one-pass recipe before
# it (no screen, num_iterations=1, 100 steps: lab.py's hard_recipe) held 0.892-0.907 at step 100
# in 18.7-20.6 min; plain GRPO (config/cpu_2digit.py) 0.761-0.776 over the same 100 steps.
# On a 2-core AMD EPYC with AVX512-BF16 and no AMX (lab.py's screen_recipe, 2026-12-04): 0.871 /
# 0.863 / 0.891 at step 60 and 0.916 / 0.919 / 0.927 at step 80, in 38-40 min (~28 s a late step).
# With SDPA's math backend in the trainer since (2026-12-05, seed 0): 0.925 / 0.921, 30.4 min.
# On a 2-core AMD EPYC of CPU family 26 (Zen 5: bf16 matmuls at 640 GFLOP/s against that EPYC's
# 376), SDPA's math backend, 2026-12-05, seeds 0 / 1 / 2: 0.873 / 0.885 / 0.902 at step 60 and
# 0.915 / 0.906 / 0.926 at step 80, in 18.8 / 18.3 / 17.3 min of stage and eval time.
exec(open('config/cpu_2digit.py').read())
out_dir = 'out/cpu_hard'
dynamic_sampling = True       # groups that all agree are dropped and refilled (DAPO)
screen_size = 2               # 2 answers a prompt first, the other 6 only where those 2 disagree
oversample = 12               # ~1 screened prompt in 8 gets through late: 12x the missing groups
trim_surplus = True           # train on 8 live groups, no more: the update costs the same each step
num_iterations = 2            # two passes a batch: the second is off the sampling policy
eps_high = 0.28               # so DAPO's Clip-Higher binds there
micro_batch_size = 64         # the whole batch in one micro-batch: one forward and backward a pass
learning_rate = 3e-5
decay_lr = True               # cosine from learning_rate down to min_lr over max_iters
min_lr = 3e-6
max_iters = 80
eval_interval = 20            # evals at steps 0, 20, 40, 60 and 80
