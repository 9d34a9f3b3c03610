# The 2-digit addition task (10..99 + 10..99) with the demo's GRPO, where GRPO plateaus and swings:
# the task of lab.py's studies (config/cpu_hard.py is the best recipe found on it).
#   python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
#       --out_dir=data/arithmetic_2digit
#   python train.py config/cpu_2digit.py
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_2digit'
data_dir = 'data/arithmetic_2digit'
eval_problems = 200           # 200 problems x 4 samples: about +-0.02 from the samples alone
max_iters = 40
