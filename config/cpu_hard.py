# The best recipe found on the 2-digit addition task (docs/lab.md, "A 90 % recipe"): the demo's GRPO
# with DAPO's dynamic sampling (trimmed to 8 live groups a step, as verl's DAPO recipe does), one
# pass over each batch in one micro-batch, a higher rate, decayed over 100 steps.
#   python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
#       --out_dir=data/arithmetic_2digit
#   python train.py config/cpu_hard.py
# Measured on a 2-core Intel Xeon with AMX (bf16), 2026-12-03, 3 seeds (lab.py's hard_recipe):
# held out 0.84-0.89 at step 75 and 0.892 / 0.902 / 0.907 at step 100 in 18.7-20.6 min; plain
# GRPO over the same steps and seeds 0.761-0.776. The 2-pass recipe before it (Clip-Higher,
# num_iterations=2, 4 micro-batches a pass, lr 2e-5) held 0.88-0.95 at steps 60-90 in fp32 (53-81
# min on an AVX2 EPYC); on that Xeon it took 25 min to step 60 (0.876).
exec(open('config/cpu_2digit.py').read())
out_dir = 'out/cpu_hard'
dynamic_sampling = True       # groups that all agree are dropped and refilled (DAPO)
oversample = 3                # each round samples 3x the missing groups: one round a step, mostly
trim_surplus = True           # train on 8 live groups, no more: the update costs the same each step
num_iterations = 1            # one pass a batch (on-policy: the ratio is 1, so no clip binds)
micro_batch_size = 64         # the whole batch in one micro-batch: one forward and backward a step
learning_rate = 3e-5
decay_lr = True               # cosine from learning_rate down to min_lr over max_iters
min_lr = 3e-6
max_iters = 100
eval_interval = 25
