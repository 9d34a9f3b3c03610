"""
The critic of ppo and vapo, in one file: everything that exists only because these two learn a value model.
A GRPO reader can skip it; train.py meets it in a few `if critic is not None` lines.

GRPO's baseline is the group mean of the rewards; PPO (seed 003) learns one instead, V(s_t) before every
completion token, and turns the outcome reward into per-token advantages with GAE. VAPO (ByteDance Seed,
2025) keeps PPO and fixes the critic's own diseases: value pre-training before the policy moves (sec. 3.1),
decoupled GAE with a length-adaptive lambda for the policy (sec. 3.2), and an NLL loss on correct answers
(sec. 3.4, a term of the policy loss: losses.vapo_nll). The value model is the policy's base network
with a scalar head (model.load_critic).
"""
import math

import torch

from losses import aggregate, masked_mean, mean_std
from model import backward_pass, clip_grad_norm

# -----------------------------------------------------------------------------
# advantages with a critic: GAE over the completion tokens

def gae(token_rewards, values, mask, lam, gamma=1.0):
    """Generalized advantage estimation (seed 003, PPO). token_rewards, values, mask: (B, T),
    right-padded; lam: a number or (B,) (VAPO's length-adaptive lambda). Returns (advantages,
    returns), (B, T), 0 on padding."""
    B, T = values.shape
    lam = torch.as_tensor(lam, dtype=values.dtype, device=values.device).expand(B)
    advantages = torch.zeros_like(values)
    # V and A after the last token: 0
    next_value, next_adv = values.new_zeros(B), values.new_zeros(B)
    for t in reversed(range(T)):
        valid = mask[:, t] > 0
        # GAE: delta_t = r_t + gamma V(s_t+1) - V(s_t),  A_t = delta_t + gamma lambda A_t+1
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(valid, adv, 0.0)
        next_value, next_adv = torch.where(valid, values[:, t], next_value), torch.where(valid, adv, next_adv)
    # the critic's target: R_t = A_t + V(s_t) (lambda-return)
    return advantages, advantages + values * mask


def length_adaptive_lambda(lengths, alpha=0.05):
    """VAPO sec. 3.2 (length-adaptive GAE): lambda_policy = 1 - 1 / (alpha * |y|), so that the sum
    of the TD weights, 1 / (1 - lambda), grows with the answer's length. Answers shorter than
    1/alpha tokens would get lambda < 0: clamped to 0 (pure TD(0))."""
    return (1 - 1 / (alpha * lengths.clamp(min=1))).clamp(min=0.0)


def value_loss(values, old_values, returns, mask, vf_clip=0.5, num_tokens=None):
    """PPO's clipped value loss (seed 003): 0.5 max((V - R)^2, (V_clip - R)^2), V_clip = V_old +
    clip(V - V_old, -vf_clip, vf_clip), token-level mean (num_tokens: the step's global count). (B,
    T) in; returns (loss, stats): the clipped fraction is where the clipped branch is the larger."""
    v_clip = old_values + (values - old_values).clamp(-vf_clip, vf_clip)
    unclipped, clipped = (values - returns) ** 2, (v_clip - returns) ** 2
    loss = aggregate(0.5 * torch.maximum(unclipped, clipped), mask, "token_mean", num_tokens)
    with torch.no_grad():
        stats = {"loss": masked_mean(unclipped, mask).item() / 2,
                 "clip_frac": masked_mean((clipped > unclipped).float(), mask).item()}
    return loss, stats


# -----------------------------------------------------------------------------
# the step's critic side: advantages before the policy's passes, the critic's own passes after them

def critic_advantages(mbs, mode, gae_lambda, lam_alpha, beta=0.0, reduce_sum=lambda x: x):
    """Per-token advantages and the critic's targets of every micro-batch (in place:
    mb['advantages'], mb['returns'], (B, T)), from the outcome reward mb['rewards'] and the critic's
    mb['old_values']; with beta > 0 also mb['old_logp'] and mb['ref_logp']. mode: the variant's
    GAE (losses.VARIANTS' critic column), 'gae' or 'decoupled'. The advantages are whitened over
    every token of the step, all ranks' (reduce_sum sums a dict over ranks)."""
    for mb in mbs:
        mask, lengths = mb['completion_mask'], mb['completion_mask'].sum(1)
        # each answer's last token of the model's (a tool's tokens are 0 in the mask, and carry no
        # action: gae passes over them)
        last = (mask.shape[1] - 1 - mask.flip(1).argmax(1))[:, None]
        # the outcome reward on each answer's last token, 0 elsewhere
        token_rewards = torch.zeros_like(mask).scatter(1, last, mb['rewards'][:, None]) * mask
        # PPO's KL reward: -beta log(pi_old / pi_ref) on every token (instead of a KL loss)
        if beta > 0:
            token_rewards = token_rewards - beta * (mb['old_logp'] - mb['ref_logp']) * mask
        # VAPO sec. 3.2, decoupled GAE: the critic's targets with lambda = 1 (Monte-Carlo:
        # unbiased), the policy's advantages with the length-adaptive lambda; ppo uses gae_lambda
        # for both
        decoupled = mode == 'decoupled'
        lam_policy = length_adaptive_lambda(lengths, lam_alpha) if decoupled else gae_lambda
        lam_critic = 1.0 if decoupled else gae_lambda
        mb['advantages'] = gae(token_rewards, mb['old_values'], mask, lam_policy)[0]
        mb['returns'] = gae(token_rewards, mb['old_values'], mask, lam_critic)[1]
    # PPO: advantages whitened over the batch's tokens (zero mean, unit variance). The counts are
    # this rank's, summed over ranks here once (a global count summed again would be world_size
    # times too large).
    sums = reduce_sum({'n': sum(mb['completion_mask'].sum().item() for mb in mbs),
                       's': sum(mb['advantages'].sum().item() for mb in mbs),
                       'sq': sum((mb['advantages'] ** 2).sum().item() for mb in mbs)})
    mean, std = mean_std(sums)
    for mb in mbs:
        mb['advantages'] = (mb['advantages'] - mean) / (std + 1e-8) * mb['completion_mask']


def critic_update(scorer, optimizer, mbs, num_iterations, vf_clip, num_tokens, grad_clip,
                  world_size=1):
    """num_iterations passes of PPO's clipped value loss over the micro-batches, each one AdamW step
    of the critic's own optimizer. scorer(mb) -> V (B, T). Returns the first pass's sums
    of statistics."""
    def loss_of(mb):
        return value_loss(scorer(mb), mb['old_values'], mb['returns'],
                          mb['completion_mask'], vf_clip, num_tokens)
    sums = {}
    for it in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        for mb, _, vstats in backward_pass(scorer, mbs, loss_of, world_size):
            if it == 0:
                add_value_sums(sums, mb, vstats)
        norm = clip_grad_norm([p for group in optimizer.param_groups for p in group['params']],
                              grad_clip)
        if math.isfinite(norm):
            optimizer.step()
    return sums


def add_value_sums(sums, mb, vstats):
    """This micro-batch's share of the critic's statistics (sums; critic_record turns them into
    means)."""
    m, n = mb['completion_mask'], mb['completion_mask'].sum().item()
    # how far V_old was from its target
    error = (mb['returns'] - mb['old_values']) * m
    first = torch.where(m[:, 0] > 0, mb['rewards'] - mb['old_values'][:, 0], 0.0)
    new = {'value/loss': vstats['loss'] * n, 'value/clip_frac': vstats['clip_frac'] * n,
           'ret': mb['returns'].sum().item(), 'ret_sq': (mb['returns'] ** 2).sum().item(),
           'err': error.sum().item(), 'err_sq': (error ** 2).sum().item(),
           'v0': mb['old_values'][:, 0].sum().item(), 'v0_sq_err': (first ** 2).sum().item()}
    for k, v in new.items():
        sums[k] = sums.get(k, 0.0) + v


def critic_record(totals, n_tokens, seqs, group_baseline_sq_err):
    """The critic as a baseline: explained variance of its targets, V(s_0) vs GRPO's group mean."""
    def var(s, sq):
        return sq / n_tokens - (s / n_tokens) ** 2
    explained = 1 - var(totals['err'], totals['err_sq']) / max(var(totals['ret'], totals['ret_sq']), 1e-12)
    return {'value/loss': totals['value/loss'] / n_tokens,
            'value/clip_frac': totals['value/clip_frac'] / n_tokens,
            'value/explained_var': explained,
            'value/v0': totals['v0'] / seqs,
            'value/baseline_mse': totals['v0_sq_err'] / seqs,
            'value/group_baseline_mse': group_baseline_sq_err / seqs}
