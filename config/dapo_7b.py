# DAPO at 7B on one 8-GPU node (80 GB each): config/dapo.py with Qwen2.5-Math-7B, sharded by FSDP2.
#     torchrun --nproc_per_node=8 train.py config/dapo_7b.py
# Sizes from the memory plan (docs/distributed.md, "Memory plan"): under DDP every rank would hold
# 16 bytes a parameter (122 GB); FSDP over 8 ranks holds 15 GB of weights, gradients and AdamW
# state per GPU.
# Not yet run on GPUs (none was available): `sh gpu_check.sh` first, then a few steps of this.
exec(open('config/dapo.py').read())
out_dir = 'out/dapo_7b'
init_from = 'Qwen/Qwen2.5-Math-7B'     # the DAPO paper's base family (Qwen2.5-32B), at 7B; 4,096 context
parallel = 'fsdp'                      # each rank holds 1/8 of the fp32 weights, gradients, AdamW state
gradient_checkpointing = True          # 4.4 GB of activations a 4,096-token micro-batch, not 32 GB
                                       # (and no bf16 copy of every weight kept for backward: 15 GB)
prompts_per_step = 128                 # 16 prompts x 16 answers per GPU, as dapo.py's 64 on 4 GPUs
micro_batch_size = 8
max_tokens_per_micro = 4096            # one answer of up to 3,072 tokens with its prompt, or several
                                       # shorter ones
vllm_gpu_memory_utilization = 0.4      # 32 GB: 15 GB of bf16 weights + ~290k tokens of KV cache
vllm_sleep = True                      # the engine frees its memory during the update
ckpt_interval = 25                     # a checkpoint: 30 GB of weights (rank 0 gathers them) and the
                                       # AdamW state (61 GB, each rank writes its shard)
