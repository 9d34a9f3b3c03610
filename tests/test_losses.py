"""Tests for losses.py. Run from the repo root: python -m pytest -q tests/test_losses.py

Every gradient below is checked against a hand derivation written out in the test (comment +
explicit formula), never against the same code path. Sign convention: policy_loss returns -J, so
d loss/d logp = -dJ/d logp.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import losses  # noqa: E402
import practice  # noqa: E402
from losses import LOSS_TYPES, group_advantages, kl_penalty, policy_loss, tis_weights  # noqa: E402

D = torch.float64


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), torch.as_tensor(expected, dtype=D),
                               rtol=tol, atol=tol)


def make(ratios, old=None, T=4, pad=0.0):
    """Rows of per-token ratios (variable length) -> leaf logp (B, T), old_logp, mask. Padding holds
    `pad`."""
    B = len(ratios)
    mask = torch.zeros(B, T, dtype=D)
    old_logp = torch.full((B, T), pad, dtype=D)
    logp = torch.full((B, T), pad, dtype=D)
    for i, row in enumerate(ratios):
        for t, rho in enumerate(row):
            o = math.log(0.1 + 0.2 * t + 0.05 * i) if old is None else old[i][t]
            mask[i, t], old_logp[i, t], logp[i, t] = 1.0, o, o + math.log(rho)
    return logp.requires_grad_(True), old_logp, mask


def grad_of(loss_type, logp, old_logp, adv, mask, **hp):
    """-dJ/dlogp flipped back to dJ/dlogp, plus the stats."""
    loss, stats = policy_loss(loss_type, logp, old_logp, adv, mask, **{"lm_coef": 0.0, **hp})
    (g,) = torch.autograd.grad(loss, logp)
    return -g, stats


# -----------------------------------------------------------------------------
# the oracle: the lesson's Practice section, number for number

EXPECTED_STDOUT = """\
token weight (dJ/d log pi):  right.4  right.12  wrong.4  wrong.12
GRPO      +0.0625  +0.0208  -0.0625  -0.0208
DAPO      +0.0312  +0.0312  -0.0312  -0.0312
Dr. GRPO  +0.0078  +0.0078  -0.0078  -0.0078

GRPO, eps=0.2        rare token grad +0.000, common +0.100
DAPO, eps_high=0.28  rare token grad +0.000, common +0.100
CISPO, weight <= 5   rare token grad +0.200, common +0.100
GSPO                 rare token grad +0.000, common +0.000
reward the common token: H = 0.871 -> 0.655
reward the rare token: H = 0.871 -> 0.903
"""


def test_oracle_experiment_1_token_weights():
    rows = practice.practice_token_weights()
    assert {k: [round(w, 4) for w in v] for k, v in rows.items()} == {
        "GRPO": [0.0625, 0.0208, -0.0625, -0.0208],
        "DAPO": [0.0312, 0.0312, -0.0312, -0.0312],
        "Dr. GRPO": [0.0078, 0.0078, -0.0078, -0.0078]}
    # and the lesson's hand check: A = +-1 (std 0.5, eps 1e-6), GRPO A/(G|o_i|), DAPO A/32;
    # Dr. GRPO A = +-0.5, divided by G * L_max = 64
    a = 0.5 / (0.5 + 1e-6)
    close(rows["GRPO"], [a / 16, a / 48, -a / 16, -a / 48], 1e-6)
    close(rows["DAPO"], [a / 32, a / 32, -a / 32, -a / 32], 1e-6)
    close(rows["Dr. GRPO"], [0.5 / 64, 0.5 / 64, -0.5 / 64, -0.5 / 64], 1e-6)


def test_oracle_experiment_2_rare_token():
    rows = {k: (round(r, 3), round(c, 3)) for k, (r, c) in practice.practice_rare_token().items()}
    assert rows == {"GRPO, eps=0.2": (0.0, 0.1), "DAPO, eps_high=0.28": (0.0, 0.1),
                    "CISPO, weight <= 5": (0.2, 0.1), "GSPO": (0.0, 0.0)}


def test_oracle_experiment_3_entropy():
    common = [round(h, 3) for h in
              practice.practice_entropy(practice.ENTROPY_CASES["reward the common token"])]
    rare = [round(h, 3) for h in
            practice.practice_entropy(practice.ENTROPY_CASES["reward the rare token"])]
    assert common == [0.871, 0.655] and rare == [0.871, 0.903]


def test_oracle_stdout_is_the_lessons_output():
    out = subprocess.run([sys.executable, os.path.join(REPO, "practice.py")], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout
    assert out == EXPECTED_STDOUT


# -----------------------------------------------------------------------------
# hand-derived gradients, off-policy so that clipping matters.
# Shared batch: answer 0 has 3 tokens with rho = (1.25, 0.7, 7.0), A_0 = +1; answer 1 has 2 tokens
# with rho = (1.1, 0.5), A_1 = -1; one or two padding positions each (T = 4). dJ/dlogp of
# rho*A is rho*A.

RHO = [[1.25, 0.7, 7.0], [1.1, 0.5]]
ADV = torch.tensor([1.0, -1.0], dtype=D)


def test_grad_grpo():
    logp, old, mask = make(RHO)
    g, st = grad_of("grpo", logp, old, ADV, mask)
    # eps 0.2: A>0 clipped where rho > 1.2 (1.25, 7.0); A<0 clipped where rho < 0.8 (0.5).
    # unclipped token: rho*A / (|o_i| * B), |o| = (3, 2), B = 2
    close(g, [[0, 0.7 / 6, 0, 0], [-1.1 / 4, 0, 0, 0]])
    close([st["clip_frac_high"], st["clip_frac_low"], st["clip_frac"]], [2 / 5, 1 / 5, 3 / 5])
    close(st["zero_grad_frac"], 3 / 5)
    close(st["ratio_mean"], (1.25 + 0.7 + 7.0 + 1.1 + 0.5) / 5)
    close(st["log_ratio_abs_mean"], sum(abs(math.log(r)) for row in RHO for r in row) / 5)
    assert st["n_tokens"] == 5.0


def test_grad_dapo_clip_higher_and_token_level():
    logp, old, mask = make(RHO)
    g, _ = grad_of("dapo", logp, old, ADV, mask, eps_high=0.28)
    # eps_high 0.28 lets rho = 1.25 through (it was clipped by GRPO); every token / 5 valid tokens
    close(g, [[1.25 / 5, 0.7 / 5, 0, 0], [-1.1 / 5, 0, 0, 0]])


def test_grad_dr_grpo():
    logp, old, mask = make(RHO)
    g, _ = grad_of("dr_grpo", logp, old, ADV, mask, max_new_tokens=16)
    # same clipping as GRPO (eps 0.2), divisor the constant B * L_max = 2 * 16
    close(g, [[0, 0.7 / 32, 0, 0], [-1.1 / 32, 0, 0, 0]])


def test_grad_gspo():
    logp, old, mask = make(RHO)
    # geometric-mean ratios: 1.83, 0.74
    s0, s1 = (1.25 * 0.7 * 7.0) ** (1 / 3), (1.1 * 0.5) ** (1 / 2)
    # wide eps: nothing clipped. J = (s0 A0 + s1 A1) / B, ds_i/dlogp_t = s_i/|o_i| -> every token
    # s_i A_i/(|o_i| B)
    g, st = grad_of("gspo", logp, old, ADV, mask, eps_low=0.9, eps_high=0.9)
    close(g, [[s0 / 6] * 3 + [0], [-s1 / 4] * 2 + [0, 0]])
    close(st["ratio_mean"], (3 * s0 + 2 * s1) / 5)
    # default eps 3e-4/4e-4: s0 > 1+4e-4 with A>0 and s1 < 1-3e-4 with A<0: both answers
    # clipped whole
    g, st = grad_of("gspo", logp, old, ADV, mask)
    close(g, torch.zeros(2, 4))
    close([st["clip_frac_high"], st["clip_frac_low"], st["zero_grad_frac"]], [3 / 5, 2 / 5, 1.0])
    # the default eps_low is 3e-4, not 0.2: s = 0.9 with A < 0 is clipped (0.9 < 1 - 3e-4),
    # with 0.2 it is not
    lp9, old9, mask9 = make([[0.9, 0.9]])
    g, _ = grad_of("gspo", lp9, old9, torch.tensor([-1.0], dtype=D), mask9)
    close(g, torch.zeros(1, 4))
    g, _ = grad_of("gspo", lp9, old9, torch.tensor([-1.0], dtype=D), mask9, eps_low=0.2)
    close(g, [[-0.9 / 2, -0.9 / 2, 0, 0]])
    # A=-1 on answer 0: s0 > 1 with A<0 is not clipped (min picks s0*A); answer 1 with A=+1:
    # s1 < 1 not clipped
    g, _ = grad_of("gspo", logp, old, -ADV, mask)
    close(g, [[-s0 / 6] * 3 + [0], [s1 / 4] * 2 + [0, 0]])


def test_grad_gspo_token_with_token_advantages():
    logp, old, mask = make(RHO)
    s0, s1 = (1.25 * 0.7 * 7.0) ** (1 / 3), (1.1 * 0.5) ** (1 / 2)
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.0], [-1.0, 0.5, 0.0, 0.0]], dtype=D)
    # s_it has value s_i and d s_it / d logp_t = s_i. Clip per token with A_t: s0 = 1.83 clips
    # where A_t > 0, s1 = 0.74 clips where A_t < 0. Unclipped: s_i A_t / (|o_i| B)
    g, _ = grad_of("gspo_token", logp, old, adv, mask)
    close(g, [[0, -s0 / 6, 0, 0], [0, s1 * 0.5 / 4, 0, 0]])


def test_gspo_token_equals_gspo_for_sequence_advantages():
    torch.manual_seed(0)
    for eps in [dict(), dict(eps_low=0.5, eps_high=0.5)]:
        logp, old, mask = make([[1.3, 0.9, 1.1], [0.6, 1.4], [1.0002, 0.9999, 1.0001]])
        adv = torch.tensor([0.7, -1.2, 0.4], dtype=D)
        g_seq, _ = grad_of("gspo", logp, old, adv, mask, **eps)
        g_tok, _ = grad_of("gspo_token", logp, old, adv, mask, **eps)
        close(g_tok, g_seq)
        assert g_seq.abs().sum() > 0


def test_gspo_token_advantages_are_averaged_per_answer():
    logp, old, mask = make(RHO)
    # 99 = padding garbage
    adv_tok = torch.tensor([[1.0, 3.0, 2.0, 99.0], [-1.0, -3.0, 99.0, 99.0]], dtype=D)
    g_tok, _ = grad_of("gspo", logp, old, adv_tok, mask, eps_low=0.9, eps_high=0.9)
    g_seq, _ = grad_of("gspo", logp, old, torch.tensor([2.0, -2.0], dtype=D), mask, eps_low=0.9,
                       eps_high=0.9)
    close(g_tok, g_seq)


def test_grad_cispo():
    logp, old, mask = make(RHO)
    # dJ/dlogp = sg(min(rho, 1 + 4)) * A / 5 tokens: no token loses its gradient, 7.0 is capped at 5
    g, st = grad_of("cispo", logp, old, ADV, mask)
    close(g, [[1.25 / 5, 0.7 / 5, 5.0 / 5, 0], [-1.1 / 5, -0.5 / 5, 0, 0]])
    close([st["clip_frac_high"], st["clip_frac_low"], st["zero_grad_frac"]], [1 / 5, 0, 0])
    # with a lower bound 1 - 0.4: the weight 0.5 becomes 0.6
    g, st = grad_of("cispo", logp, old, ADV, mask, cispo_eps_low=0.4)
    close(g, [[1.25 / 5, 0.7 / 5, 5.0 / 5, 0], [-1.1 / 5, -0.6 / 5, 0, 0]])
    close(st["clip_frac_low"], 1 / 5)


def test_grad_sapo():
    logp, old, mask = make(RHO)
    g, st = grad_of("sapo", logp, old, ADV, mask)

    # d/dlogp of sigmoid(tau (rho - 1)) * 4/tau = 4 sig (1 - sig) * rho
    def df(rho, tau):
        sig = 1 / (1 + math.exp(-tau * (rho - 1)))
        return 4 * sig * (1 - sig) * rho
    # tau_pos = 1 for A > 0, tau_neg = 1.05 for A < 0; the mean inside each answer, then over the
    # B = 2 answers (as the SAPO paper, TRL and verl): / (|o_i| * B) = / 6 and / 4
    close(g, [[df(1.25, 1.0) / 6, df(0.7, 1.0) / 6, df(7.0, 1.0) / 6, 0],
              [-df(1.1, 1.05) / 4, -df(0.5, 1.05) / 4, 0, 0]])
    assert st["zero_grad_frac"] == 0.0 and st["clip_frac"] == 0.0


def trl_sapo_loss(logp, old_logp, advantages, mask, tau_pos=1.0, tau_neg=1.05):
    """TRL 0.2x GRPOTrainer._compute_loss for loss_type='sapo', written out from its source: the
    gate sigmoid(tau (rho - 1)) * 4 / tau per token, times -A, then
    ((loss * mask).sum(-1) / mask.sum(-1)).mean()."""
    rho = torch.exp(logp - old_logp)
    adv = advantages[:, None].expand_as(rho)
    tau = torch.where(adv > 0, torch.full_like(rho, tau_pos), torch.full_like(rho, tau_neg))
    per_token = -(torch.sigmoid(tau * (rho - 1)) * 4 / tau) * adv
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sapo_matches_trls_loss_and_gradient(seed):
    """Random off-policy batches of answers of different lengths: our sapo's loss and gradient are
    TRL's."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = (old + torch.randn(B, T, generator=g, dtype=D) * 0.5).requires_grad_(True)
    adv = torch.randn(B, generator=g, dtype=D)
    ours, _ = policy_loss("sapo", logp, old, adv, mask)
    (g_ours,) = torch.autograd.grad(ours, logp)
    theirs = trl_sapo_loss(logp, old, adv, mask)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    close(ours, theirs)
    # TRL's padding gradient is 0 too, mask only makes it explicit
    close(g_ours, g_theirs * mask)


def test_dapo_defaults_to_clip_higher():
    """loss_type='dapo' alone is Clip-Higher (eps_high 0.28), as the name and the README's table
    say: rho = 1.25 with A > 0 passes (grpo's 0.2 clips it)."""
    logp, old, mask = make(RHO)
    g_default, _ = grad_of("dapo", logp, old, ADV, mask)
    g_028, _ = grad_of("dapo", logp, old, ADV, mask, eps_low=0.2, eps_high=0.28)
    close(g_default, g_028)
    assert g_default[0, 0] > 0


# -----------------------------------------------------------------------------
# on-policy identities (rho = 1)

def test_on_policy_is_plain_policy_gradient():
    torch.manual_seed(1)
    B, T = 4, 5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]],
                        dtype=D)
    adv = torch.randn(B, dtype=D)
    n, lens = mask.sum(), mask.sum(1, keepdim=True)
    expected = {  # dJ/dlogp = A * mask / normaliser
        "grpo": adv[:, None] * mask / (lens * B), "dapo": adv[:, None] * mask / n,
        "sapo": adv[:, None] * mask / (lens * B), "cispo": adv[:, None] * mask / n,
        "dr_grpo": adv[:, None] * mask / (B * 7), "gspo": adv[:, None] * mask / (lens * B),
        "gspo_token": adv[:, None] * mask / (lens * B)}
    for loss_type, exp in expected.items():
        logp = torch.randn(B, T, dtype=D, requires_grad=True)
        g, st = grad_of(loss_type, logp, logp.detach(), adv, mask, max_new_tokens=7)
        close(g, exp)
        assert st["ratio_mean"] == pytest.approx(1.0) and st["clip_frac"] == 0.0


# -----------------------------------------------------------------------------
# normalisation: micro-batches summed == one pass, given the global counts

@pytest.mark.parametrize("loss_type",
                         ["dapo", "cispo", "grpo", "dr_grpo", "gspo", "gspo_token", "sapo"])
def test_micro_batches_sum_to_one_pass(loss_type):
    torch.manual_seed(2)
    B, T = 6, 5
    lengths = torch.tensor([5, 2, 3, 1, 4, 5])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(D)
    old = torch.randn(B, T, dtype=D) - 2
    logp = (old + 0.3 * torch.randn(B, T, dtype=D)).requires_grad_(True)
    adv, ref, ent = (torch.randn(B, dtype=D), torch.randn(B, T, dtype=D) - 2,
                     torch.rand(B, T, dtype=D))
    hp = dict(max_new_tokens=5, eps_low=0.2, eps_high=0.28, beta=0.1, ref_logp=ref,
              entropy_coef=0.01)
    full, _ = policy_loss(loss_type, logp, old, adv, mask, entropy=ent, **hp)
    (g_full,) = torch.autograd.grad(full, logp)
    total, g_sum = 0.0, torch.zeros_like(g_full)
    for sl in [slice(0, 2), slice(2, 3), slice(3, 6)]:
        lp = logp.detach()[sl].clone().requires_grad_(True)
        part, _ = policy_loss(loss_type, lp, old[sl], adv[sl], mask[sl], entropy=ent[sl],
                              num_tokens=mask.sum(), num_seqs=B, **{**hp, "ref_logp": ref[sl]})
        part.backward()
        total, g_sum[sl] = total + part.item(), lp.grad
    close(total, full.item())
    close(g_sum, g_full)
    # without the global counts the micro-batches would be normalised differently (so the test can
    # fail)
    lp = logp.detach()[0:2].clone().requires_grad_(True)
    part, _ = policy_loss(loss_type, lp, old[0:2], adv[0:2], mask[0:2], entropy=ent[0:2],
                          **{**hp, "ref_logp": ref[0:2]})
    part.backward()
    assert not torch.allclose(lp.grad, g_full[0:2])


def test_dr_grpo_does_not_depend_on_lengths():
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=D)
    for lengths in ([1, 2, 3], [3, 3, 3], [2, 1, 1]):
        mask = (torch.arange(8)[None, :] < torch.tensor(lengths)[:, None]).to(D)
        logp = torch.randn(3, 8, dtype=D, requires_grad=True)
        g, _ = grad_of("dr_grpo", logp, logp.detach(), adv, mask, max_new_tokens=10)
        # every token A / (B L_max), whatever the lengths
        close(g, adv[:, None] * mask / (3 * 10))
    # whereas GRPO's token weight A / (|o_i| B) does depend on the length (lengths 2, 1, 1 here)
    g, _ = grad_of("grpo", logp, logp.detach(), adv, mask)
    close(g, adv[:, None] * mask / (mask.sum(1, keepdim=True) * 3))
    assert abs(g[0, 0]) != abs(g[1, 0])


def test_token_weight_sums_by_hand():
    """|dLoss/dlogp| / |A| averaged over each answer's live tokens (A != 0, mask), summed over the
    short (length < median) and the long answers; answers without a live token are not counted."""
    mask = (torch.arange(4)[None, :] < torch.tensor([1, 2, 3, 4])[:, None]).to(D)   # lengths 1..4
    grad = torch.tensor([[0.5, 9, 9, 9], [-0.2, 0.4, 9, 9], [1, 1, 1, 9], [0.1, 0.2, 0.3, 0.4]],
                        dtype=D)                                                # 9: padding
    adv = torch.tensor([2.0, -1.0, 0.0, 0.5], dtype=D)                          # answer 2: dead
    sums = losses.token_weight_sums(grad, adv, mask, median_len=2.5)
    # short: answer 0 0.5/2 = 0.25, answer 1 (0.2 + 0.4)/1 / 2 = 0.3
    # long: answer 3 (0.2 + 0.4 + 0.6 + 0.8) / 4 = 0.5; answer 2 has no live token
    assert all(isinstance(v, float) for v in sums.values())
    got = [sums["weight_short"], sums["n_short"], sums["weight_long"], sums["n_long"]]
    close(got, [0.55, 2, 0.5, 1])
    # per-token advantages: a zero-A token of answer 3 leaves its mean, answer 2 gets a live token
    adv_tok = adv[:, None].repeat(1, 4)
    adv_tok[3, 1], adv_tok[2, 0] = 0.0, 4.0
    sums = losses.token_weight_sums(grad, adv_tok, mask, median_len=2.5)
    # long: answer 2 1/4 = 0.25 (one live token), answer 3 (0.2 + 0.6 + 0.8) / 3
    close([sums["weight_long"], sums["n_long"], sums["n_short"]], [0.25 + 1.6 / 3, 2, 2])


@pytest.mark.parametrize("loss_type, short_over_long",
                         [("grpo", 3.0), ("dapo", 1.0), ("dr_grpo", 1.0)])
def test_token_weight_sums_measure_the_length_bias(loss_type, short_over_long):
    """The lesson's experiment 1 (lengths 4, 12, 4, 12): on-policy grpo gives a token of answer i
    the weight 1 / (G |o_i|), 1/16 short, 1/48 long; dapo 1/32, dr_grpo 1/(G L_max) for all."""
    mask = (torch.arange(12)[None, :] < torch.tensor([4, 12, 4, 12])[:, None]).to(D)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=D)
    logp = torch.zeros(4, 12, dtype=D, requires_grad=True)
    loss, _ = policy_loss(loss_type, logp, logp.detach(), adv, mask, max_new_tokens=16)
    loss.backward()
    sums = losses.token_weight_sums(logp.grad, adv, mask, median_len=8.0)
    assert sums["n_short"] == 2.0 and sums["n_long"] == 2.0
    expected_short = {"grpo": 2 / 16, "dapo": 2 / 32, "dr_grpo": 2 / 64}[loss_type]
    close(sums["weight_short"], expected_short)
    close(sums["weight_short"] / sums["weight_long"], short_over_long)


# -----------------------------------------------------------------------------
# padding never gets gradient, whatever garbage it holds

@pytest.mark.parametrize("tis_mode", ["none", "token_truncate", "sequence_mask"])
def test_padding_gets_no_gradient(tis_mode):
    torch.manual_seed(3)
    B, T = 4, 6
    # the last row: a tool's result at positions 1-2 (tools.py), 0 in the mask between the model's
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0],
                         [1, 0, 0, 1, 1, 0]], dtype=D)
    pad = mask == 0
    clean = dict(logp=torch.randn(B, T, dtype=D) - 1, old=torch.randn(B, T, dtype=D) - 1,
                 adv=torch.randn(B, T, dtype=D), ref=torch.randn(B, T, dtype=D) - 1,
                 roll=torch.randn(B, T, dtype=D) - 1, ent=torch.rand(B, T, dtype=D))
    extreme = {k: v.masked_fill(pad, val) for (k, v), val in
               zip(clean.items(), [1e4, -1e4, 1e6, -3e3, 2e4, 1e5])}
    # e.g. log 0 = -inf in padded slots
    non_finite = {k: v.masked_fill(pad, val) for (k, v), val in
                  zip(clean.items(),
                      [-math.inf, math.nan, math.inf, math.nan, -math.inf, math.nan])}
    for loss_type in LOSS_TYPES:
        results = []
        for data in (clean, extreme, non_finite):
            logp = data["logp"].clone().requires_grad_(True)
            ent = data["ent"].clone().requires_grad_(True)
            torch.manual_seed(0)                                   # clip_cov picks tokens at random
            loss, st = policy_loss(loss_type, logp, data["old"], data["adv"], mask,
                                   max_new_tokens=T, beta=0.05, ref_logp=data["ref"], entropy=ent,
                                   correct=torch.ones(data["adv"].shape[0]),
                                   entropy_coef=0.01, rollout_logp=data["roll"], tis_mode=tis_mode,
                                   clip_cov_ratio=0.3, clip_cov_lb=-9)
            loss.backward()
            assert (torch.isfinite(loss) and torch.isfinite(logp.grad).all()
                    and torch.isfinite(ent.grad).all())
            assert (logp.grad[pad] == 0).all() and (ent.grad[pad] == 0).all(), loss_type
            assert all(math.isfinite(v) for v in st.values())
            results.append((loss.item(), logp.grad, st))
        for garbage in results[1:]:                               # garbage changes nothing at all
            close(garbage[0], results[0][0])
            close(garbage[1], results[0][1])
            assert garbage[2] == results[0][2]


def test_extreme_ratios_and_bf16_inputs_stay_finite():
    # a valid token with log pi - log pi_old = 100 (e^100 is inf in fp32) for both signs of A, and
    # bf16 inputs
    for dtype in (torch.float32, torch.bfloat16):
        old = torch.full((2, 3), -2.0, dtype=dtype)
        logp = old.clone()
        logp[0, 1] = 98.0
        logp[1, 0] = -300.0
        logp.requires_grad_(True)
        mask = torch.ones(2, 3, dtype=dtype)
        for loss_type in LOSS_TYPES:
            for sign in (1.0, -1.0):
                adv = torch.tensor([sign, -sign], dtype=dtype)
                loss, st = policy_loss(loss_type, logp, old, adv, mask, max_new_tokens=3, beta=0.1,
                                       ref_logp=old, correct=(adv > 0).to(dtype))
                (g,) = torch.autograd.grad(loss, logp)
                assert (torch.isfinite(loss) and torch.isfinite(g).all()
                        and g.dtype == dtype), (loss_type, dtype)
                assert all(math.isfinite(v) for v in st.values())
    # bf16 cannot count past 256 exactly (301 -> 300 or 302): the loss counts in fp32
    logp = torch.zeros(1, 301, dtype=torch.bfloat16, requires_grad=True)
    loss, st = policy_loss("dapo", logp, logp.detach(), torch.ones(1, dtype=torch.bfloat16),
                           torch.ones(1, 301))
    assert st["n_tokens"] == 301.0 and loss.dtype == torch.float32


# -----------------------------------------------------------------------------
# group advantages

def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    # group 1: mean 0.25, population std sqrt(0.1875); group 2: all equal -> 0
    sd = math.sqrt(0.1875)
    close(group_advantages(r, 4), [0.75 / (sd + 1e-6), -0.25 / (sd + 1e-6), -0.25 / (sd + 1e-6),
                                   -0.25 / (sd + 1e-6), 0, 0, 0, 0], 1e-6)
    close(group_advantages(r, 4, scale="none"), [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0], 1e-6)
    sd_batch = r.double().std(correction=0).item()             # whole batch: mean 1.125
    close(group_advantages(r, 4, scale="batch", eps=0.0),
          [0.75 / sd_batch, -0.25 / sd_batch, -0.25 / sd_batch, -0.25 / sd_batch, 0, 0, 0, 0],
          1e-6)
    # population std = 1
    close(group_advantages(torch.tensor([1.0, 3.0]), 2, eps=0.0), [-1.0, 1.0], 1e-6)
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 4, scale="global")


@pytest.mark.parametrize("reward", [0.1, -0.9, 1.1, 0.3, 1e-7])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_group_of_equal_rewards_gets_exactly_zero(reward, scale):
    """A shared reward that is not exactly representable (0.1 = format_coef alone, -0.9, 1.1):
    mean - r is round-off, and / (std + eps) used to turn it into a uniform same-sign advantage
    (-0.0074 for 0.1, G = 8)."""
    for G in (8, 12, 16):
        # + one live group
        r = torch.cat([torch.full((G,), reward), torch.tensor([1.0, 0.0] * (G // 2))])
        adv = group_advantages(r, G, scale=scale)
        assert (adv[:G] == 0).all(), adv[:G]
        assert (adv[G:] != 0).all()


def test_batch_std_is_over_every_ranks_rewards():
    """adv_scale='batch' under DDP: each rank's share, with reduce_sum summing over ranks (here a
    fake that adds the other rank's sums), gives the advantages of the whole batch in one
    process."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 2.0, 2.0, 5.0,
                      1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 4.0, 2.0])
    whole = group_advantages(r, 4, scale="batch")
    shards = r[:8], r[8:]

    def sums(x):
        return {"n": x.numel(), "s": x.sum().item(), "sq": (x ** 2).sum().item()}

    for mine, other in (shards, shards[::-1]):
        fake_reduce = lambda d, o=sums(other): {k: v + o[k] for k, v in d.items()}  # noqa: E731
        split = group_advantages(mine, 4, scale="batch", reduce_sum=fake_reduce)
        close(split, whole[:8] if mine is shards[0] else whole[8:], 1e-6)
        local = group_advantages(mine, 4, scale="batch")    # each rank's own std: not the same
        assert (local - split).abs().max() > 1e-3


# -----------------------------------------------------------------------------
# KL penalty, entropy bonus, truncated importance sampling

def test_kl_estimators():
    logp, ref = torch.tensor([math.log(0.5)], dtype=D), torch.tensor([math.log(0.25)], dtype=D)
    close(kl_penalty(logp, ref, "k1"), [math.log(2)])               # log(pi/pi_ref)
    close(kl_penalty(logp, ref, "k2"), [0.5 * math.log(2) ** 2])    # 0.5 (log pi/pi_ref)^2
    close(kl_penalty(logp, ref, "k3"), [0.5 + math.log(2) - 1])     # exp(ref-logp) - (ref-logp) - 1
    close(kl_penalty(ref, logp, "k3"), [2.0 - math.log(2) - 1])
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logp, ref, "k4")


def test_kl_in_policy_loss():
    logp, old, mask = make(RHO)
    # log pi - log ref = log rho + 0.3
    ref = old - 0.3
    lr = [[math.log(r) + 0.3 for r in row] for row in RHO]
    k3 = [[math.exp(-x) + x - 1 for x in row] for row in lr]
    base, _ = policy_loss("dapo", logp, old, ADV, mask)
    with_kl, st = policy_loss("dapo", logp, old, ADV, mask, beta=0.1, ref_logp=ref)
    # + beta * token mean of k3
    close(with_kl - base, 0.1 * sum(map(sum, k3)) / 5)
    close(st["kl"], sum(map(sum, k3)) / 5)
    with_kl_g, _ = policy_loss("grpo", logp, old, ADV, mask, beta=0.1, ref_logp=ref,
                               kl_estimator="k1")
    base_g, _ = policy_loss("grpo", logp, old, ADV, mask)
    # grpo normalisation for the KL too
    close(with_kl_g - base_g, 0.1 * (sum(lr[0]) / 3 + sum(lr[1]) / 2) / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss("dapo", logp, old, ADV, mask, beta=0.1)


def test_entropy_bonus_sign():
    logp, old, mask = make(RHO)
    ent = torch.tensor([[1.0, 2.0, 3.0, 50.0], [0.5, 0.5, 9.0, 9.0]], dtype=D, requires_grad=True)
    base, _ = policy_loss("dapo", logp, old, ADV, mask)
    loss, st = policy_loss("dapo", logp, old, ADV, mask, entropy=ent, entropy_coef=0.1)
    # loss -= coef * token mean of H
    close(loss - base, -0.1 * 7.0 / 5)
    close(st["entropy"], 7.0 / 5)
    loss.backward()
    # minimising the loss raises H
    close(ent.grad, -0.1 * mask / 5)


def test_tis_weights_each_mode():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=D)
    w = torch.tensor([[0.5, 3.0, 1.5, 1.0], [1.2, 0.9, 1.0, 1.0]], dtype=D)   # pi_old / pi_rollout
    old = torch.full((2, 4), -1.0, dtype=D)
    roll = old - w.log()
    roll[0, 3] = 1e4                                                          # padding garbage
    expected = {
        "token_truncate": [[0.5, 2.0, 1.5, 0], [1.2, 0.9, 0, 0]],  # min(w, 2)
        "token_mask": [[1, 0, 1, 0], [1, 1, 0, 0]],                # 1 if w <= 2 else 0
        "sequence_truncate": [[2, 2, 2, 0], [1.08, 1.08, 0, 0]],   # min(prod w, 2): 2.25 -> 2, 1.08
        "sequence_mask": [[0, 0, 0, 0], [1, 1, 0, 0]]}             # 2.25 > 2 drops answer 0
    for mode, exp in expected.items():
        weight, clipped = tis_weights(old, roll, mask, mode, 2.0)
        close(weight, exp)
        # through the loss: on-policy dapo, dJ/dlogp = weight * A / 5 valid tokens
        logp = old.clone().requires_grad_(True)
        g, st = grad_of("dapo", logp, old, ADV, mask, rollout_logp=roll, tis_mode=mode, tis_cap=2.0)
        close(g, torch.tensor(exp, dtype=D) * ADV[:, None] / 5)
        close(st["tis_weight_mean"], sum(map(sum, exp)) / 5)
        n_clipped = {"token_truncate": 1, "token_mask": 1, "sequence_truncate": 3,
                     "sequence_mask": 3}[mode]
        close(st["tis_clipped_frac"], n_clipped / 5)
    with pytest.raises(ValueError, match="rollout_logp"):
        policy_loss("dapo", logp, old, ADV, mask, tis_mode="token_mask")


# -----------------------------------------------------------------------------
# Clip-Cov and KL-Cov

def _cov_batch():
    # on-policy (rho = 1) so the PPO clip is inactive and only the cov mechanism acts
    logp = torch.tensor([[-0.1, -0.2, -0.15, -2.5, 0.0], [-0.3, -4.0, -0.05, 0.0, 0.0],
                         [-1.0, -0.5, -2.0, -0.7, -0.2]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=D)
    adv = torch.tensor([2.0, -1.5, 0.3], dtype=D)
    a = adv[:, None].expand(3, 5)
    n = mask.sum()
    # Cui et al.
    cov = (a - (a * mask).sum() / n) * (logp.detach() - (logp.detach() * mask).sum() / n)
    return logp, mask, adv, cov, n


def test_clip_cov_detaches_random_candidates():
    logp, mask, adv, cov, n = _cov_batch()
    candidates = (mask > 0) & (cov >= 1.0) & (cov <= 5.0)
    assert candidates.sum() >= 3
    ratio = 0.2                                                  # int(0.2 * 12) = 2 tokens picked
    picks = []
    for seed in (0, 0, 1, 2, 3):
        torch.manual_seed(seed)
        g, st = grad_of("clip_cov", logp, logp.detach(), adv, mask, clip_cov_ratio=ratio)
        zero = (g == 0) & (mask > 0)
        assert zero.sum() == 2 and (zero <= candidates).all()   # exactly 2 tokens, both candidates
        close(g[~zero], (adv[:, None] * mask / n)[~zero])        # the rest: plain A / N
        close(st["cov_selected_frac"], 2 / n.item())
        close(st["zero_grad_frac"], 2 / n.item())
        close(st["cov_logp_adv"], (cov * mask).sum() / n)
        picks.append(zero.nonzero().tolist())
    assert picks[0] == picks[1]                                  # seeded: reproducible
    assert len({str(p) for p in picks}) > 1                      # but random


def test_kl_cov_penalises_top_cov_tokens():
    logp, mask, adv, cov, n = _cov_batch()
    old = logp.detach() - torch.tensor(
        [[0.4, -0.3, 0.2, 0.1, 0], [0.5, 0.2, -0.6, 0, 0], [0.1] * 5], dtype=D)
    rho = (logp.detach() - old).exp()
    # int(0.2 * 12) = 2 tokens
    top = cov.masked_fill(mask == 0, -1e9).flatten().topk(2).indices
    sel = torch.zeros(15, dtype=torch.bool)
    sel[top] = True
    sel = sel.view(3, 5)
    g, st = grad_of("kl_cov", logp, old, adv, mask, kl_cov_ratio=0.2, kl_cov_coef=0.7)
    # unclipped surrogate everywhere: rho*A/N (rho = e^0.4 etc. would be clipped by PPO: not here);
    # selected tokens also get -coef * sign(logp - old) / N from the |logp - old| penalty
    sign = (logp.detach() - old).sign()
    close(g, (rho * adv[:, None] - 0.7 * sign * sel) * mask / n)
    close(st["cov_selected_frac"], 2 / n.item())
    assert sel.sum() == 2 and (g[sel] != (rho * adv[:, None] * mask / n)[sel]).all()


# -----------------------------------------------------------------------------
# stats and errors

def test_zero_grad_frac_matches_autograd_for_every_variant():
    torch.manual_seed(4)
    B, T = 8, 6
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,))[:, None]).to(D)
    old = torch.randn(B, T, dtype=D) - 1
    logp = (old + 0.4 * torch.randn(B, T, dtype=D)).requires_grad_(True)
    adv = torch.randn(B, dtype=D)
    adv[2] = 0.0
    keys = {"clip_frac_low", "clip_frac_high", "clip_frac", "zero_grad_frac", "ratio_mean",
            "log_ratio_abs_mean", "cov_logp_adv", "n_tokens"}
    for loss_type in LOSS_TYPES:
        torch.manual_seed(0)
        g, st = grad_of(loss_type, logp, old, adv, mask, max_new_tokens=T, eps_low=0.2,
                        eps_high=0.2, clip_cov_ratio=0.1, clip_cov_lb=0.0, kl_cov_ratio=0.1)
        assert keys <= set(st) and all(isinstance(v, float) for v in st.values())
        autograd_zero = ((g == 0) & (mask > 0)).sum().item() / mask.sum().item()
        assert st["zero_grad_frac"] == pytest.approx(autograd_zero), loss_type
        assert st["clip_frac"] == pytest.approx(st["clip_frac_low"] + st["clip_frac_high"])
        assert st["n_tokens"] == mask.sum().item()


def test_errors_name_the_bad_value():
    logp, old, mask = make(RHO)
    with pytest.raises(ValueError, match="trpo.*grpo"):
        policy_loss("trpo", logp, old, ADV, mask)
    with pytest.raises(ValueError, match="token_clip.*token_truncate"):
        policy_loss("dapo", logp, old, ADV, mask, tis_mode="token_clip", rollout_logp=old)
    with pytest.raises(ValueError, match="k5.*k3"):
        policy_loss("dapo", logp, old, ADV, mask, kl_estimator="k5")
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy_loss("dr_grpo", logp, old, ADV, mask)
    assert set(LOSS_TYPES) == {"grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "sapo",
                               "clip_cov", "kl_cov", "ppo", "vapo"}


def test_readme_variant_table_names_functions_that_exist():
    """The README's table names the functions that implement each variant (by name: line numbers
    rot); each is a function of losses.py or critic.py, and a quoted branch name appears in that
    function."""
    import inspect
    import re
    import critic
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "README.md")).read()
    section = readme.split("\n## The variants", 1)[1].split("\n## ", 1)[0]  # other tables look alike
    rows = re.findall(r"^\| `(\w+)` \|.*\| (`\w+`[^|]*) \|$", section, re.M)
    assert sorted(name for name, _ in rows) == sorted(losses.LOSS_TYPES)
    for name, where in rows:
        for function, detail in re.findall(r"`(\w+)`( \([^)]*\))?", where):
            fn = getattr(losses, function, None) or getattr(critic, function)
            quoted = re.findall(r'"(\w+)"', detail)
            assert all(f'"{q}"' in inspect.getsource(fn) for q in quoted), (name, function, quoted)


def test_vapo_nll_is_a_term_of_vapos_loss_only():
    """VAPO sec. 3.4: vapo's loss is its policy term + lm_coef * the NLL of the correct answers'
    tokens, averaged over the step's num_positive_tokens: d loss / d logp gains -lm_coef / n on
    every token of a correct answer and nothing elsewhere (padding, wrong answers, other variants)."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=D)
    old = torch.randn(3, 4, dtype=D) - 1
    adv, correct = torch.tensor([1.0, -1.0, 0.5], dtype=D), torch.tensor([1.0, 0.0, 1.0])
    grads = {}
    for loss_type, lm_coef in [("vapo", 0.0), ("vapo", 0.1), ("ppo", 0.1)]:
        logp = old.clone().requires_grad_(True)
        loss, _ = policy_loss(loss_type, logp, old, adv, mask, num_tokens=6, lm_coef=lm_coef,
                              correct=correct, num_positive_tokens=10)
        grads[loss_type, lm_coef] = torch.autograd.grad(loss, logp)[0]
    positive = mask * correct[:, None]
    close(grads["vapo", 0.1] - grads["vapo", 0.0], -0.1 / 10 * positive, 1e-12)
    assert torch.equal(grads["ppo", 0.1], grads["vapo", 0.0])  # same clip, same norm at rho = 1
    with pytest.raises(ValueError, match="NLL"):
        policy_loss("vapo", old.clone().requires_grad_(True), old, adv, mask)
