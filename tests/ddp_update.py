"""Run under torchrun by tests/test_ddp.py: one step on fixed samples, split over the ranks the way
train.py splits a step, versus the same step in one process on the whole batch. It calls the
functions train.py calls: group_advantages (with reduce_sum: adv_scale='batch' needs every rank's
rewards), and for ppo / vapo the critic's GAE and whitening over all ranks' tokens
(critic.critic_advantages), the policy's loss with VAPO's NLL term, and the critic's update
(critic.critic_update); global token / sequence counts are all-reduced once, micro-batches run
under no_sync, and each loss is multiplied by world_size for DDP's averaging.

With PARALLEL='fsdp' the split step runs under FSDP2 instead of DDP, sharded as model.wrap
shards (fully_shard on each decoder layer, then on the Scorer), with no no_sync: every micro-batch's
gradients are reduce-scattered into the shards.

The ranks' shares differ as train.py's do: rank 0 one group, rank 1 two (a dynamic-sampling
surplus), packed into 1 and 4 micro-batches (the single process: 6), one group's rows sharing
their prompt (model.completion_hidden's shared-prompt path) and the others not; under FSDP
model.even_micro_batches pads rank 0 to 4 (without it the ranks' collectives would not match).
Variants without a critic add a KL penalty to a reference model (beta > 0: its no-grad pass, and
FSDP's root resharded after it, as train.py's score does).

The split step's optimizer state is then saved by every rank (model.save_optimizers: DCP, each
FSDP rank its shards) and loaded into unsharded optimizers (model.load_optimizers): it must equal
the state of the single-process step, as a resume on another world size or layout needs.

With LORA='lora' the policy is the tiny model with rank-4 adapters on every projection (lora.py;
the frozen base stored in bf16, the adapters fp32, B not zero so that A learns too) and the KL
reference is the same network with its adapters off: only the adapters move, and DDP / FSDP2
(a frozen and a trained parameter in each layer, of two dtypes) must make the single process's
step.

Several cases run in one torchrun, one after the other (the processes start once):

    torchrun --nproc_per_node=2 tests/ddp_update.py OUT_DIR LOSS_TYPE:ADV_SCALE:PARALLEL:LORA ...

each case's result in OUT_DIR/<case>.pt (LORA: 'lora' or empty)."""
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checkpoint import load_optimizers, save_optimizers  # noqa: E402
from critic import critic_advantages, critic_update  # noqa: E402
from lora import ALL_LINEAR, adapters_off, add_lora  # noqa: E402
from losses import CRITIC_LOSS_TYPES, VARIANTS, group_advantages, policy_loss  # noqa: E402
from model import (Scorer, all_reduce_sum, backward_pass, close_process_group,  # noqa: E402
                   completion_values, even_micro_batches, wrap)

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # a mismatch fails fast
rank, world = dist.get_rank(), dist.get_world_size()
CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=True, num_labels=1)


def tiny(cls, seed):
    torch.manual_seed(seed)
    return cls(CFG)


def policy():
    model = tiny(LlamaForCausalLM, 0)
    if lora:
        add_lora(model, 4, 8.0, ALL_LINEAR, torch.bfloat16, seed=0)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith('lora_B'):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def trained(module):
    return [p for p in module.parameters() if p.requires_grad]


# fixed samples: 12 completions (3 groups of 4) of different lengths, prompts of 5 tokens; group
# 0's answers share one prompt (as a real group's do), groups 1 and 2 have one prompt per row;
# three of them hold a tool's tokens (multi-turn rollouts: context, no loss, no action for GAE)
g = torch.Generator().manual_seed(1)
B, P, C, G = 12, 5, 7, 4
prompt_ids = torch.randint(1, 64, (B, P), generator=g)
prompt_ids[:G] = prompt_ids[0]
attention = (torch.arange(C)[None] < torch.tensor([7, 2, 5, 3, 6, 1, 4, 7, 3, 5, 2, 6])[:, None]).long()
tool = torch.zeros(B, C)
tool[[0, 4, 7], 2:4] = 1  # three answers with a tool's result at positions 2-3 (tools.py)
batch = {'prompt_ids': prompt_ids,
         'prompt_mask': torch.ones(B, P, dtype=torch.long),
         'completion_ids': torch.randint(1, 64, (B, C), generator=g),
         # the model's tokens (the loss's); every real token is attended to, the tool's too
         'completion_mask': attention.float() * (1 - tool), 'completion_attention': attention,
         'rewards': torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.3, 1.0, 0.7, 0.2, 0.0, 1.0, 0.5])}
batch['correct'] = (batch['rewards'] > 0.5).float()


def flat(params):  # FSDP's shards gathered whole
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().float().flatten()
                      for p in params])


def one_step(rows, ddp, micro):
    def reduce_sum(x):  # train.py's
        return all_reduce_sum(x, 'cpu') if ddp else x

    model = policy()
    scorer = wrap(Scorer(model), parallel if ddp else None)
    # the update is the gradient itself; so is the momentum buffer (the optimizer state saved)
    optimizer = torch.optim.SGD(trained(model), lr=1.0, momentum=0.5)
    mine = {k: v[rows] for k, v in batch.items()}
    mine['advantages'] = group_advantages(mine['rewards'], G, scale=adv_scale,
                                          reduce_sum=reduce_sum)
    counts = reduce_sum({'tokens': mine['completion_mask'].sum().item(), 'seqs': len(rows),
                         'positive': (mine['completion_mask']
                                      * mine['correct'][:, None]).sum().item()})
    mbs = [{k: v[i:i + micro] for k, v in mine.items()} for i in range(0, len(rows), micro)]
    if ddp and parallel == 'fsdp':
        mbs = even_micro_batches(mbs)
    if BETA > 0 and lora:  # the reference: the same (wrapped) network, its adapters off
        with torch.no_grad(), adapters_off(model):
            for mb in mbs:
                mb['ref_logp'] = (scorer.module if isinstance(scorer, DDP) else scorer)(mb)[0]
        if ddp and parallel == 'fsdp':
            scorer.reshard()
    elif BETA > 0:  # the reference model's no-grad pass
        ref = wrap(Scorer(tiny(LlamaForCausalLM, 2)), parallel if ddp else None)
        with torch.no_grad():
            for mb in mbs:
                mb['ref_logp'] = (ref.module if isinstance(ref, DDP) else ref)(mb)[0]
        if ddp and parallel == 'fsdp':
            embed = ref.model.model.embed_tokens
            assert not isinstance(embed.weight, DTensor)  # FSDP2 keeps the root gathered ...
            ref.reshard()
            assert isinstance(embed.weight, DTensor)      # ... until train.py's score reshards it
    critic = None
    if loss_type in CRITIC_LOSS_TYPES:
        critic = tiny(LlamaForTokenClassification, 1)
        critic_scorer = wrap(Scorer(critic, completion_values), parallel if ddp else None)
        critic_optimizer = torch.optim.SGD(critic.parameters(), lr=1.0, momentum=0.5)
        no_hooks = critic_scorer.module if isinstance(critic_scorer, DDP) else critic_scorer
        with torch.no_grad():
            for mb in mbs:
                mb['old_values'] = no_hooks(mb)
        # alpha 0.5: lambda > 0 here
        critic_advantages(mbs, VARIANTS[loss_type]['critic'], 0.95, 0.5, reduce_sum=reduce_sum)
    def loss_of(mb):  # train.py's micro_batch_loss (vapo: its NLL term, lm_coef 0.1)
        logp, _ = scorer(mb)
        return policy_loss(loss_type, logp, logp.detach(), mb['advantages'], mb['completion_mask'],
                           num_tokens=counts['tokens'], num_seqs=counts['seqs'], max_new_tokens=C,
                           ref_logp=mb.get('ref_logp'), beta=BETA, correct=mb['correct'],
                           num_positive_tokens=counts['positive'], lm_coef=0.1)
    for _ in backward_pass(scorer, mbs, loss_of, world if ddp else 1):
        pass
    optimizer.step()
    params = [flat(model.parameters())]
    optimizers = {'policy': (model, optimizer)}
    if critic is not None:
        critic_update(critic_scorer, critic_optimizer, mbs, 1, 0.5, counts['tokens'], 0.0,
                      world if ddp else 1)
        params.append(flat(critic.parameters()))
        optimizers['critic'] = (critic, critic_optimizer)
    return torch.cat(params), optimizers


def fresh_optimizers():
    """Unsharded models and optimizers that have not stepped, as a resume builds them."""
    optimizers = {'policy': policy()}
    if loss_type in CRITIC_LOSS_TYPES:
        optimizers['critic'] = tiny(LlamaForTokenClassification, 1)
    return {k: (m, torch.optim.SGD(trained(m), lr=1.0, momentum=0.5))
            for k, m in optimizers.items()}


def momentum(optimizers):
    return torch.cat([opt.state[p]['momentum_buffer'].flatten()
                      for module, opt in optimizers.values() for p in trained(module)])


def start():
    params = [torch.cat([p.detach().float().flatten() for p in policy().parameters()])]
    if loss_type in CRITIC_LOSS_TYPES:
        params.append(torch.cat([p.detach().flatten()
                                 for p in tiny(LlamaForTokenClassification, 1).parameters()]))
    return torch.cat(params)


# rank 0: group 0 in one micro-batch, rank 1: groups 1 and 2 in four (whole groups, as train.py's
# sharding of prompts gives them)
assert world == 2
shard = list(range(G)) if rank == 0 else list(range(G, B))
out_dir = sys.argv[1]
for case in sys.argv[2:]:  # the functions above read these globals
    loss_type, adv_scale, parallel, lora = case.split(':')
    lora = lora == 'lora'
    BETA = 0.0 if loss_type in CRITIC_LOSS_TYPES else 0.05  # the critic's KL is a reward instead
    out_path = os.path.join(out_dir, case.replace(':', '-') + '.pt')
    split, split_optimizers = one_step(shard, ddp=True, micro=G if rank == 0 else 2)
    # the split step's optimizer state, saved by every rank (its shards under FSDP), loaded into
    # unsharded optimizers on every rank: it must be the state of the whole-batch step in one
    # process
    save_optimizers(out_path + '.optimizer', split_optimizers)
    whole, whole_optimizers = one_step(list(range(B)), ddp=False, micro=2)
    loaded = fresh_optimizers()
    load_optimizers(out_path + '.optimizer', loaded)
    if rank == 0:
        torch.save({"split": split, "whole": whole, "start": start(), "whole_state":
                    momentum(whole_optimizers), "loaded_state": momentum(loaded)}, out_path)
    dist.barrier()
close_process_group()
