# Countdown with DAPO's four tricks; the same task, model and budget as config/countdown_grpo.py.
exec(open('config/countdown_grpo.py').read())
out_dir = 'out/countdown_dapo'
loss_type = 'dapo'
eps_low, eps_high = 0.2, 0.28          # Clip-Higher
dynamic_sampling = True                # drop all-right / all-wrong groups, resample
overlong_buffer = 128                  # soft overlong punishment over the last 128 of 512 tokens
