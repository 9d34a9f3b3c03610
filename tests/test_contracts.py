"""Contracts that a redesign of losses.py / critic.py / train.py's logging must keep (issue 16: tests that
would catch a broken redesign). Run from the repo root: python -m pytest -q tests/test_contracts.py

  1. the KL penalty, the entropy bonus and TIS enter the loss with the variant's OWN aggregation
     (VARIANTS[...]["norm"]), with the step's global num_tokens / num_seqs / max_new_tokens, for all variants
  2. ppo and vapo: exact gradients with per-token (B, T) advantages, off-policy, on both sides of the clip
  3. critic.value_loss: micro-batch shares with the global token count add up to the one-pass loss
  4. critic.critic_advantages: whitening over every rank's tokens (a fake reduce_sum adds the other rank's)
  5. every metric plot.py plots is one that train.py logs

As in test_losses.py, every expected number is written out by hand, never taken from the code path under test.
Each test names in a comment the mutation of the code it catches; each was seen to fail with that mutation
applied to a copy of the module. Sign convention: policy_loss returns -J, so d loss/d logp = -dJ/d logp.
"""
import ast
import json
import math
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import critic  # noqa: E402
import plot  # noqa: E402
from losses import LOSS_TYPES, VARIANTS, policy_loss  # noqa: E402

D = torch.float64


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), torch.as_tensor(expected, dtype=D), rtol=tol, atol=tol)


def to_tensor(rows, T, pad):
    """Ragged rows (python lists) -> (B, T) float64, padding holding `pad` (garbage the loss must
    ignore)."""
    return torch.tensor([row + [pad] * (T - len(row)) for row in rows], dtype=D)


# -----------------------------------------------------------------------------
# 1. KL, entropy and TIS are aggregated like the variant's policy term Three answers of 3, 2 and 4
# tokens (T = 4); off-policy ratios on both sides of 1, per-token advantages. The global counts of
# the step are NOT this micro-batch's (9 tokens, 3 answers, T = 4), as in train.py's gradient
# accumulation: a term that used the local counts, or another variant's, would be off.

RHO1 = [[1.25, 0.7, 1.1], [0.6, 1.4], [1.05, 0.9, 1.3, 0.85]]
ADV1 = [[1.0, -0.5, 2.0], [-1.0, 1.5], [0.5, 0.5, -1.0, -2.0]]
OLD1 = [[math.log(0.1 + 0.2 * t + 0.05 * i) for t in range(len(row))] for i, row in enumerate(RHO1)]
# log pi_ref = log pi_old + shift
REF_SHIFT = [[0.3, -0.2, 0.1], [0.5, 0.0], [-0.4, 0.2, 0.3, -0.1]]
ENT1 = [[1.0, 2.0, 3.0], [0.5, 1.5], [2.5, 0.25, 1.0, 4.0]]
W_RAW = [[0.5, 3.0, 1.5], [1.2, 0.8], [2.5, 1.0, 0.9, 1.6]]           # pi_old / pi_rollout
NUM_TOKENS, NUM_SEQS, MAX_NEW = 23, 6, 5
T1 = 4


def batch1():
    """logp (leaf), old_logp, (B, T) advantages, mask, ref_logp, entropy, rollout_logp; padding
    holds garbage."""
    old = to_tensor(OLD1, T1, 3.0)
    logp = to_tensor([[o + math.log(r) for o, r in zip(orow, rrow)] for orow, rrow in zip(OLD1, RHO1)], T1, 3.0)
    mask = to_tensor([[1.0] * len(row) for row in RHO1], T1, 0.0)
    ref = to_tensor([[o + s for o, s in zip(orow, srow)] for orow, srow in zip(OLD1, REF_SHIFT)], T1, -9.0)
    rollout = to_tensor([[o - math.log(w) for o, w in zip(orow, wrow)] for orow, wrow in zip(OLD1, W_RAW)], T1, 9.0)
    return (logp.requires_grad_(True), old, to_tensor(ADV1, T1, 7.0), mask, ref,
            to_tensor(ENT1, T1, 50.0), rollout)


def hand_aggregate(rows, norm):
    """The variant's normalisation of ragged per-token rows, with the global counts above:
      token_mean  sum_i sum_t x_it / NUM_TOKENS                 (DAPO: every token of the step weighs the same)
      seq_mean    sum_i (sum_t x_it / |o_i|) / NUM_SEQS         (GRPO: mean inside each answer, then over answers)
      const_len   sum_i sum_t x_it / (NUM_SEQS * MAX_NEW)       (Dr. GRPO: the constant G * L_max)"""
    if norm == "token_mean":
        return sum(sum(row) for row in rows) / NUM_TOKENS
    if norm == "seq_mean":
        return sum(sum(row) / len(row) for row in rows) / NUM_SEQS
    assert norm == "const_len", norm
    return sum(sum(row) for row in rows) / (NUM_SEQS * MAX_NEW)


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def hand_objective(loss_type):
    """Each variant's per-token objective J_t on batch 1, from its paper's equation (kl_cov with
    kl_cov_coef=0: its unclipped surrogate; its penalty is tested in test_losses.py)."""
    el, eh = VARIANTS[loss_type]["eps"]
    out = []
    for rhos, advs, olds in zip(RHO1, ADV1, OLD1):
        logps = [o + math.log(r) for o, r in zip(olds, rhos)]
        if loss_type in ("grpo", "dr_grpo", "dapo", "ppo", "vapo", "clip_cov"):
            # min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A); clip_cov's detach changes no value
            out.append([min(r * a, clip(r, 1 - el, 1 + eh) * a) for r, a in zip(rhos, advs)])
        elif loss_type == "kl_cov":
            out.append([r * a for r, a in zip(rhos, advs)])
        elif loss_type in ("gspo", "gspo_token"):
            # s_i = geometric mean of the answer's ratios; gspo: the answer's mean advantage,
            # gspo_token: A_t
            s = math.exp(sum(math.log(r) for r in rhos) / len(rhos))
            a_seq = sum(advs) / len(advs)
            out.append([min(s * a, clip(s, 1 - el, 1 + eh) * a)
                        for a in (advs if loss_type == "gspo_token" else [a_seq] * len(advs))])
        elif loss_type == "cispo":
            # sg(min(rho, 1 + 4)) A log pi  (no lower bound by default)
            out.append([min(r, 5.0) * a * lp for r, a, lp in zip(rhos, advs, logps)])
        else:
            assert loss_type == "sapo", loss_type
            # sigmoid(tau (rho - 1)) * 4 / tau * A, tau = 1 for A > 0, 1.05 for A < 0
            taus = [1.0 if a > 0 else 1.05 for a in advs]
            out.append([4 / tau / (1 + math.exp(-tau * (r - 1))) * a for r, a, tau in zip(rhos, advs, taus)])
    return out


def loss1(loss_type, **kw):
    logp, old, adv, mask, ref, ent, rollout = batch1()
    inputs = dict(ref_logp=ref, entropy=ent, rollout_logp=rollout)
    loss, _ = policy_loss(loss_type, logp, old, adv, mask, num_tokens=NUM_TOKENS, num_seqs=NUM_SEQS,
                          max_new_tokens=MAX_NEW, kl_cov_coef=0.0, lm_coef=0.0,
                          **{k: inputs[v] if isinstance(v, str) and v in inputs else v for k, v in kw.items()})
    return loss


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_term_uses_the_variants_aggregation(loss_type):
    # catches: aggregate's seq_mean dividing by the micro-batch's own number of answers
    # (per_token.shape[0]) instead of num_seqs, or a variant dispatched to another variant's
    # objective
    close(loss1(loss_type), -hand_aggregate(hand_objective(loss_type), VARIANTS[loss_type]["norm"]))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_kl_term_uses_the_variants_aggregation(loss_type):
    # catches: the KL term aggregated as a token mean whatever the variant (loss + beta *
    # masked_mean(kl, mask)), or with this micro-batch's counts instead of the global ones. ppo /
    # vapo: train.py passes beta=0 for them (their KL is a per-token reward, critic_advantages), but
    # policy_loss itself supports beta, with the same aggregation as every other variant. k3 =
    # exp(ref - logp) - (ref - logp) - 1, with ref - logp = shift - log rho
    k3 = [[math.exp(s - math.log(r)) - (s - math.log(r)) - 1 for r, s in zip(rrow, srow)]
          for rrow, srow in zip(RHO1, REF_SHIFT)]
    diff = loss1(loss_type, beta=0.1, ref_logp="ref_logp") - loss1(loss_type)
    close(diff, 0.1 * hand_aggregate(k3, VARIANTS[loss_type]["norm"]))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_entropy_bonus_uses_the_variants_aggregation(loss_type):
    # catches: the entropy bonus aggregated as a token mean whatever the variant (aggregate(ent,
    # mask, "token_mean", num_tokens)), or its sign flipped. The padding's 50.0 must not count.
    diff = loss1(loss_type, entropy="entropy", entropy_coef=0.05) - loss1(loss_type)
    close(diff, -0.05 * hand_aggregate(ENT1, VARIANTS[loss_type]["norm"]))
    # entropy given with entropy_coef = 0 (train.py always passes it): logged, not in the loss
    close(loss1(loss_type, entropy="entropy"), loss1(loss_type))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_tis_weights_the_policy_term_in_the_variants_aggregation(loss_type):
    # catches: the TIS correction added as its own token-mean term (-aggregate(obj * (w - 1), mask,
    # "token_mean", num_tokens)) instead of weighting each token's policy term inside the variant's
    # aggregation token_truncate: w_t = min(pi_old / pi_rollout, cap = 2), per token; J_t -> w_t J_t
    w = [[min(x, 2.0) for x in row] for row in W_RAW]
    weighted = [[wt * j for wt, j in zip(wrow, jrow)] for wrow, jrow in zip(w, hand_objective(loss_type))]
    loss = loss1(loss_type, tis_mode="token_truncate", rollout_logp="rollout_logp")
    close(loss, -hand_aggregate(weighted, VARIANTS[loss_type]["norm"]))


# -----------------------------------------------------------------------------
# 2. ppo and vapo: exact gradients with per-token advantages (GAE gives one A per token) answer 0:
# rho (1.25, 0.7, 1.3, 0.75), A_t (1, 2, 0.5, -1); answer 1: rho (1.5, 0.5, 1.1), A_t (-2, -1, 0),
# one padding position. Global token count 10 (7 here). The clipped surrogate min(rho A, clip(rho)
# A) has dJ/dlogp = rho A / 10 where the unclipped branch is the min, 0 where the clip is active: A
# > 0 clipped where rho > 1 + eps_high; A < 0 clipped where rho < 1 - eps_low.

RHO2 = [[1.25, 0.7, 1.3, 0.75], [1.5, 0.5, 1.1]]
ADV2 = [[1.0, 2.0, 0.5, -1.0], [-2.0, -1.0, 0.0]]


def grad2(loss_type):
    old = to_tensor([[math.log(0.2 + 0.1 * t) for t in range(len(row))] for row in RHO2], 4, 0.0)
    logp = (old + to_tensor([[math.log(r) for r in row] for row in RHO2], 4, 5.0)).requires_grad_(True)
    mask = to_tensor([[1.0] * len(row) for row in RHO2], 4, 0.0)
    loss, stats = policy_loss(loss_type, logp, old, to_tensor(ADV2, 4, 9.0), mask, num_tokens=10,
                              lm_coef=0.0)
    (g,) = torch.autograd.grad(loss, logp)
    return loss, -g, stats


def test_grad_ppo_per_token_advantages():
    # catches: per-token advantages collapsed to one per answer (adv[:, :1] or the row mean), ppo
    # given another norm than the token mean, or ppo's eps row changed from (0.2, 0.2)
    loss, g, st = grad2("ppo")
    # eps 0.2 / 0.2: (1.25, +1) and (1.3, +0.5) clipped high; (0.75, -1) and (0.5, -1) clipped low;
    # (0.7, +2) and (1.5, -2) are on the unclipped side of the min; (1.1, 0) has A = 0
    close(g, [[0, 0.7 * 2 / 10, 0, 0], [1.5 * -2 / 10, 0, 0, 0]])
    # J = (1.2*1 + 0.7*2 + 1.2*0.5 + 0.8*-1 + 1.5*-2 + 0.8*-1 + 0) / 10
    close(loss, -(1.2 + 1.4 + 0.6 - 0.8 - 3.0 - 0.8) / 10)
    # the stats are means over this micro-batch's 7 tokens
    close([st["clip_frac_high"], st["clip_frac_low"], st["zero_grad_frac"]], [2 / 7, 2 / 7, 5 / 7])


def test_grad_vapo_per_token_advantages_clip_higher():
    # catches: vapo losing DAPO's clip-higher (VARIANTS eps (0.2, 0.28) -> (0.2, 0.2)), per-token
    # advantages collapsed to one per answer, or vapo given another norm than the token mean
    loss, g, st = grad2("vapo")
    # eps 0.2 / 0.28: rho = 1.25 with A = +1 now passes (1.25 < 1.28); 1.3 is still clipped; the low
    # side as ppo
    close(g, [[1.25 * 1 / 10, 0.7 * 2 / 10, 0, 0], [1.5 * -2 / 10, 0, 0, 0]])
    # J = (1.25*1 + 0.7*2 + 1.28*0.5 + 0.8*-1 + 1.5*-2 + 0.8*-1 + 0) / 10
    close(loss, -(1.25 + 1.4 + 0.64 - 0.8 - 3.0 - 0.8) / 10)
    close([st["clip_frac_high"], st["clip_frac_low"], st["zero_grad_frac"]], [1 / 7, 2 / 7, 4 / 7])


# -----------------------------------------------------------------------------
# 3. the critic's value loss: micro-batch shares with the global count add up to the one-pass loss

def test_value_loss_micro_batches_sum_to_one_pass():
    # catches: value_loss ignoring num_tokens (aggregate(..., "token_mean") with the micro-batch's
    # own count)
    pad = 7.0
    values = to_tensor([[0.5, 1.2, 0.0], [0.3, -0.4], [0.9]], 3, pad).requires_grad_(True)
    old = to_tensor([[0.4, 0.5, 0.2], [0.3, 0.0], [0.1]], 3, pad)
    ret = to_tensor([[1.0, 1.0, 1.0], [0.0, 0.0], [1.0]], 3, pad)
    mask = to_tensor([[1.0] * 3, [1.0] * 2, [1.0]], 3, 0.0)
    # by hand, vf_clip 0.5: V_clip = V_old + clip(V - V_old, -0.5, 0.5); per token 0.5 max((V-R)^2,
    # (V_clip-R)^2) (0.5, 0.4, 1): V_clip = V           -> 0.25        (1.2, 0.5, 1): V_clip = 1.0
    # -> max(0.04, 0) = 0.04 (0.0, 0.2, 1): V_clip = V           -> 1.0         (0.3, 0.3, 0): 0.09
    # (-0.4, 0, 0): 0.16 (0.9, 0.1, 1): V_clip = 0.6 -> max(0.01, 0.16) = 0.16, the clipped
    # (constant) branch: no gradient
    whole, _ = critic.value_loss(values, old, ret, mask)
    (g_whole,) = torch.autograd.grad(whole, values)
    close(whole, 0.5 * (0.25 + 0.04 + 1.0 + 0.09 + 0.16 + 0.16) / 6)
    close(g_whole, [[(0.5 - 1) / 6, (1.2 - 1) / 6, (0.0 - 1) / 6], [0.3 / 6, -0.4 / 6, 0], [0, 0, 0]])
    # two micro-batches (rows 0-1: 5 tokens, row 2: 1 token), each with the step's global count 6
    shares = [critic.value_loss(values[sl], old[sl], ret[sl], mask[sl], num_tokens=6)[0]
              for sl in (slice(0, 2), slice(2, 3))]
    (g_split,) = torch.autograd.grad(sum(shares), values)
    close(sum(shares), whole)
    close(g_split, g_whole)
    # with each micro-batch's local count (5 and 1) the shares would not add up: / 5 and / 1 instead
    # of / 6
    local = [critic.value_loss(values[sl], old[sl], ret[sl], mask[sl])[0] for sl in (slice(0, 2), slice(2, 3))]
    close(sum(local), 0.5 * (0.25 + 0.04 + 1.0 + 0.09 + 0.16) / 5 + 0.5 * 0.16 / 1)
    assert abs(sum(local).item() - whole.item()) > 1e-2


# -----------------------------------------------------------------------------
# 4. the critic's advantages are whitened over every rank's tokens

def critic_mbs():
    """Two micro-batches of different widths (train.py cuts each to its longest answer): rows of 4,
    2 tokens and of 3, 1, 2 tokens; outcome rewards; V_old before each token (garbage on
    padding)."""
    a = {'completion_mask': to_tensor([[1.0] * 4, [1.0] * 2], 4, 0.0), 'rewards': torch.tensor([1.0, 0.0], dtype=D),
         'old_values': to_tensor([[0.2, 0.4, 0.5, 0.9], [0.6, 0.3]], 4, 5.0)}
    b = {'completion_mask': to_tensor([[1.0] * 3, [1.0], [1.0] * 2], 3, 0.0),
         'rewards': torch.tensor([0.0, 1.0, 1.0], dtype=D),
         'old_values': to_tensor([[0.7, 0.1, -0.2], [0.5], [0.0, 0.8]], 3, -5.0)}
    return a, b


@pytest.mark.parametrize("loss_type", ["ppo", "vapo"])
def test_critic_advantages_are_whitened_over_every_ranks_tokens(loss_type):
    # catches: the sums reduced twice (sums = reduce_sum(reduce_sum({...}))): a global count summed
    # over ranks again, which one process (identity reduce_sum) cannot see but two ranks do; also
    # whitening with this rank's own statistics (no reduce_sum)
    hp = dict(mode=VARIANTS[loss_type]['critic'], gae_lambda=0.9, lam_alpha=0.5)
    whole = list(critic_mbs())
    critic.critic_advantages(whole, **hp)              # one rank, both micro-batches
    # whitening by hand: over the 12 valid tokens of the step, mean 0 and (population) variance 1
    adv = torch.cat([mb['advantages'][mb['completion_mask'] > 0] for mb in whole])
    assert adv.numel() == 12
    close(adv.sum() / 12, 0.0)
    close((adv ** 2).sum() / 12, 1.0, 1e-6)

    def rank_sums(mb):                                  # what this rank hands to reduce_sum
        seen = {}
        critic.critic_advantages([mb], **hp, reduce_sum=lambda d: seen.update(d) or d)
        return seen

    for i in (0, 1):
        mine, other = critic_mbs()[i], critic_mbs()[1 - i]
        o = rank_sums(other)
        critic.critic_advantages([mine], **hp, reduce_sum=lambda d: {k: v + o[k] for k, v in d.items()})
        close(mine['advantages'], whole[i]['advantages'])
        close(mine['returns'], whole[i]['returns'])     # the critic's targets: not whitened
        local = critic_mbs()[i]                         # this rank's statistics alone: not the same
        critic.critic_advantages([local], **hp)
        assert (local['advantages'] - mine['advantages']).abs().max() > 1e-3


# -----------------------------------------------------------------------------
# 5. plot.py plots only what train.py logs

def train_logged_keys():
    """The keys of the records train.py writes, read from its source and report.py's (which builds
    them):
      - string keys of the dicts assigned to `record` / `per_sample` (whose means the record holds) or
        passed to log({...}), of record['key'] = ... and record.update(key=... or {...}) (or
        per_sample's), and of the dict
        report.rank_numbers returns (this rank's own numbers, spread into the record)
      - '<stage>_seconds' of every `with timed('<stage>')` (spread into the record as **seconds)
      - 'loss/' + every stat policy_loss returns (all variants, every switch on), if policy_update logs
        f'loss/{k}' and step_record keeps the 'loss/' sums
      - critic.critic_record's keys, if step_record calls it
      - 'eval/' + the keys rewards.eval_sums sums (not 'n', 'problems'), if report.eval_record names
        them f'eval/{k}'"""
    import rewards
    sources = [open(os.path.join(REPO, f)).read() for f in ("train.py", "report.py")]
    tree = ast.Module(body=[n for src in sources for n in ast.parse(src).body], type_ignores=[])
    funcs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

    def str_keys(d):
        return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}

    def fstring_prefixes(node):
        return {f.values[0].value for f in ast.walk(node) if isinstance(f, ast.JoinedStr)
                and f.values and isinstance(f.values[0], ast.Constant)}

    def calls(node, name):
        return [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                and c.func.id == name]

    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in ("record", "per_sample") and isinstance(node.value, ast.Dict):
                    keys |= str_keys(node.value)
                if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                        and t.value.id in ("record", "per_sample") and isinstance(t.slice, ast.Constant)):
                    keys.add(t.slice.value)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "log" and node.args and isinstance(node.args[0], ast.Dict):
                keys |= str_keys(node.args[0])
            if (isinstance(f, ast.Attribute) and f.attr == "update" and isinstance(f.value, ast.Name)
                    and f.value.id in ("record", "per_sample")):
                keys |= {kw.arg for kw in node.keywords if kw.arg}
                keys |= set().union(*(str_keys(a) for a in node.args if isinstance(a, ast.Dict)))
    keys |= {f"{c.args[0].value}_seconds" for c in calls(tree, "timed")}
    keys |= set().union(*(str_keys(r.value) for r in ast.walk(funcs["rank_numbers"])
                          if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict)))

    if "loss/" in fstring_prefixes(funcs["policy_update"]) and any(
            isinstance(c, ast.Constant) and c.value == "loss/" for c in ast.walk(funcs["step_record"])):
        logp, old, adv, mask, ref, ent, rollout = batch1()
        for loss_type in LOSS_TYPES:
            _, stats = policy_loss(loss_type, logp, old, adv, mask, max_new_tokens=MAX_NEW, beta=0.1,
                                   ref_logp=ref, entropy=ent, entropy_coef=0.01, rollout_logp=rollout,
                                   tis_mode="token_truncate", correct=torch.ones(adv.shape[0]))
            keys |= {f"loss/{k}" for k in stats if k != "n_tokens"}   # policy_update pops n_tokens

    if calls(funcs["step_record"], "critic_record"):
        mb = {'completion_mask': torch.ones(1, 2, dtype=D), 'returns': torch.ones(1, 2, dtype=D),
              'old_values': torch.zeros(1, 2, dtype=D), 'rewards': torch.ones(1, dtype=D)}
        _, vstats = critic.value_loss(mb['old_values'], mb['old_values'], mb['returns'], mb['completion_mask'])
        totals = {}
        critic.add_value_sums(totals, mb, vstats)
        keys |= set(critic.critic_record(totals, 2.0, 1.0, 0.5))

    if "eval/" in fstring_prefixes(funcs["eval_record"]):
        samples = {"correct": [1.0, 0.0], "completions": ["1", "2"], "completion_ids": [[1], [2]],
                   "truncated": [False, True]}
        summed = rewards.eval_sums(samples, 2, lambda completion: completion)
        keys |= {f"eval/{k}" for k in summed if k not in ("n", "problems")}
    return keys


def test_every_plotted_key_is_logged(tmp_path):
    # catches: plot.py plotting a key nobody logs (a figure or summary column renamed or added on
    # one side only, e.g. 'value/explained_var' -> 'value/explained_variance' in FIGURES), or
    # train.py / policy_loss renaming a logged key (e.g. record['rollout_mismatch'] ->
    # record['mismatch'], stats 'cov_logp_adv' -> 'cov')
    logged = train_logged_keys()
    # a record holding every logged key, read back the way plot.py reads it (read_log derives
    # step_seconds from the logged rollout / train / sync seconds)
    os.makedirs(tmp_path / "run")
    with open(tmp_path / "run" / "log.jsonl", "w") as f:
        f.write(json.dumps({**{k: 1.0 for k in logged}, "step": 1}) + "\n")
    (record,) = plot.read_log(str(tmp_path / "run"))
    plotted = {k for keys in plot.FIGURES.values() for k in keys} | set(plot.SUMMARY)
    unlogged = sorted(plotted - set(record))
    assert plotted and not unlogged, f"plot.py plots keys train.py never logs: {unlogged}"


# -----------------------------------------------------------------------------
# FSDP's filler micro-batch (model.even_micro_batches): a row whose completion_mask is 0

@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_row_with_no_completion_token_adds_nothing(loss_type):
    """Every variant, with the KL, the entropy bonus and TIS on: the loss is exactly 0, its gradient
    exactly 0 (finite: no 0 / 0 anywhere) and every statistic 0, whatever the padding holds. A
    rank with fewer micro-batches than another runs such fillers under FSDP, so that the ranks'
    collectives match without changing the step."""
    logp, old, adv, mask, ref, ent, rollout = batch1()
    mask = torch.zeros_like(mask)
    loss, stats = policy_loss(loss_type, logp, old, adv, mask, num_tokens=NUM_TOKENS,
                              num_seqs=NUM_SEQS, max_new_tokens=MAX_NEW, ref_logp=ref, entropy=ent,
                              rollout_logp=rollout, beta=0.1, entropy_coef=0.05,
                              correct=torch.ones(adv.shape[0]),
                              tis_mode="token_truncate", clip_cov_ratio=0.5, kl_cov_ratio=0.5)
    loss.backward()
    assert loss.item() == 0 and torch.equal(logp.grad, torch.zeros_like(logp))
    assert stats.pop("n_tokens") == 0 and all(v == 0 for v in stats.values()), stats


def test_the_rooms_stand_below_train_py():
    """train.py imports the rooms of the trainer; no room imports train.py, and the rooms' imports
    of each other form no circle (configurator.py runs inside train.py's globals)."""
    rooms = ["rollout", "losses", "rewards", "model", "critic", "report", "checkpoint", "lora",
             "curriculum", "configurator", "tools"]
    def imports(name):
        tree = ast.parse(open(os.path.join(REPO, f"{name}.py")).read())
        found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
        found |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module}
        return found & set(rooms + ["train"])
    graph = {room: imports(room) for room in rooms}
    assert not [room for room, deps in graph.items() if "train" in deps]
    assert set(rooms) - {"configurator", "tools"} <= imports("train")  # tools: rollout's room
    done = set()
    while len(done) < len(rooms):  # peel off the rooms whose imports are all peeled: a DAG empties
        ready = {room for room, deps in graph.items() if room not in done and deps <= done}
        assert ready, f"an import circle among {set(rooms) - done}"
        done |= ready
