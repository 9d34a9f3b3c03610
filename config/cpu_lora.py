# The CPU demo with LoRA (lora.py): rank-8 adapters on every linear layer of the frozen 135M model.
#     python train.py config/cpu_lora.py
# LoRA without regret (Thinking Machines, 2025): rank 1-32 adapters on all layers learn RL as well
# as full fine-tuning at ~10x its learning rate, so 2e-4 here for the demo's 2e-5. The scale is
# alpha / rank = 32 / 8 = 4.
exec(open('config/cpu_demo.py').read())
out_dir = 'out/cpu_lora'
lora_rank = 8
lora_alpha = 32.0
lora_targets = 'all-linear'
learning_rate = 2e-4
