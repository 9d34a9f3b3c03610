# DAPO at 7B with LoRA: config/dapo_7b.py's run, rank-32 adapters on every projection of a frozen
# bf16 base instead of full fine-tuning, on plain DDP (LoRA under FSDP is not supported yet).
#     torchrun --nproc_per_node=8 train.py config/dapo_lora_7b.py
# Per GPU, computed from docs/distributed.md's memory plan, not run: the frozen base 17.4 GB (bf16
# projections, fp32 embedding and head) and the adapters with their AdamW state 1.3 GB, instead of
# full fine-tuning's 121.8 GB under DDP; ~25 GB in the update with gradient checkpointing, ~51 GB
# during rollout with the engine's 32 GB: it fits one 80 GB GPU, so any number of GPUs works.
# Not yet run on GPUs (none was available).
exec(open('config/dapo_7b.py').read())
out_dir = 'out/dapo_lora_7b'
parallel = 'ddp'                       # every rank holds the whole (frozen, bf16) base
lora_rank = 32
lora_alpha = 32.0
lora_targets = 'all-linear'
learning_rate = 1e-5                   # LoRA without regret: ~10x full fine-tuning's 1e-6
