# The best curve measured on the 2-digit task so far (docs/lab.md, "A 90 % recipe"): the one-pass
# recipe, config/cpu_hard.py, with two passes a batch behind a screen of 2 answers a prompt, over
# 80 steps.
#   python train.py config/cpu_hard_screen.py      (the data folder: as config/cpu_hard.py says)
# Measured on a 2-core Intel Xeon with AMX (bf16), 2026-12-04, seeds 0 / 1 / 2: held out 0.906 /
# 0.922 / 0.896 at step 60 (14.5 / 15.8 / 15.1 min) and 0.917 / 0.927 / 0.906 at step 80 (19.9 /
# 20.8 / 20.2 min of stage and eval time; 20.4-21.3 min with start-up). Over 100 steps, evals
# every 25 (before model.keep_freed_memory): 0.924 +- 0.006 at step 75, 0.947 +- 0.018 at 100,
# in 28-29 min. It is not cpu_hard.py yet: the lab's study (GRPO, the random reward beside it) is
# to run.
exec(open('config/cpu_hard.py').read())
out_dir = 'out/cpu_hard_screen'
screen_size = 2               # 2 answers a prompt first, the other 6 only where those 2 disagree
oversample = 12               # ~1 screened prompt in 8 gets through: 12x the missing groups a round
num_iterations = 2            # two passes a batch: the second is off the sampling policy
eps_high = 0.28               # so DAPO's Clip-Higher binds there
max_iters = 80                # the rate decays over these 80 steps
eval_interval = 20            # evals at steps 0, 20, 40, 60 and 80
