# Countdown (TinyZero's task: reach the target with + - * / using each given number once) with plain GRPO,
# the seed's 4-GPU exercise (Qwen2.5-0.5B-Instruct). Its pair is config/countdown_dapo.py; prepare the data
# with python data/countdown/prepare.py.
exec(open('config/gpu_base.py').read())
out_dir = 'out/countdown_grpo'
data_dir = 'data/countdown'
reward_fn = 'countdown'
format_coef = 0.1                      # TinyZero gives a small reward for a well-formed <answer> block
max_new_tokens = 512
loss_type = 'grpo'
eps_low, eps_high = 0.2, 0.2
