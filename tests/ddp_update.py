"""Run under torchrun by tests/test_ddp.py: one optimizer step on fixed samples, split over the ranks the way
train.py splits a step (global token/sequence counts all-reduced once, micro-batches under no_sync, the loss
times world_size for DDP's averaging), versus the same step in one process on the whole batch."""
import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from losses import group_advantages, policy_loss  # noqa: E402
from model import Scorer  # noqa: E402

loss_type, out_path = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def tiny_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


# fixed samples: 8 completions (2 groups of 4) of different lengths, prompts of 5 tokens
g = torch.Generator().manual_seed(1)
B, P, C, G = 8, 5, 7, 4
prompt_ids = torch.randint(1, 64, (B, P), generator=g)
prompt_mask = torch.ones(B, P, dtype=torch.long)
completion_ids = torch.randint(1, 64, (B, C), generator=g)
lengths = torch.tensor([7, 2, 5, 3, 6, 1, 4, 7])
completion_mask = (torch.arange(C)[None] < lengths[:, None]).float()
rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
advantages = group_advantages(rewards, G)


def one_step(rows, ddp, micro=2):
    model = tiny_model()
    scorer = DDP(Scorer(model)) if ddp else Scorer(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the gradient itself
    counts = torch.tensor([completion_mask[rows].sum(), float(len(rows))], dtype=torch.float64)
    if ddp:
        dist.all_reduce(counts)
    num_tokens, num_seqs = counts.tolist()
    chunks = [rows[i:i + micro] for i in range(0, len(rows), micro)]
    for i, mb in enumerate(chunks):
        sync = (not ddp) or i == len(chunks) - 1
        with contextlib.nullcontext() if sync else scorer.no_sync():
            logp, _ = scorer(prompt_ids[mb], prompt_mask[mb], completion_ids[mb], completion_mask[mb], 1.0, None)
            loss, _ = policy_loss(loss_type, logp, logp.detach(), advantages[mb], completion_mask[mb],
                                  num_tokens=num_tokens, num_seqs=num_seqs, max_new_tokens=C)
            (loss * (world if ddp else 1)).backward()
    optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


shard = list(range(rank * B // world, (rank + 1) * B // world))  # rank r: half the batch (both its groups' rows)
split = one_step(shard, ddp=True)
if rank == 0:
    whole = one_step(list(range(B)), ddp=False)
    torch.save({"split": split, "whole": whole,
                "start": torch.cat([p.detach().flatten() for p in tiny_model().parameters()])}, out_path)
dist.barrier()
dist.destroy_process_group()
