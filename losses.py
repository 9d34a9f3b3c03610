"""
The policy-gradient losses of GRPO and its 2025 descendants, in one flat file.

Every variant below is "GRPO with one thing changed", and this file teaches exactly what that thing is:
  grpo        PPO's clipped surrogate, 1/|o_i| inside each answer, then mean over answers
  dr_grpo     Dr. GRPO: no 1/|o_i|, divide by the constant G * L_max instead (and no std: scale="none")
  dapo        Clip-Higher (eps_high 0.28 > eps_low 0.2) + token-level loss (every token of the batch weighs the same)
  gspo        Qwen GSPO: one geometric-mean ratio s_i and one clip per answer, not per token
  gspo_token  GSPO-token: the same, but with per-token advantages allowed
  cispo       MiniMax-M1 CISPO: REINFORCE with a clipped, stop-gradient IS weight (no token loses its gradient)
  sapo        Qwen SAPO: a smooth sigmoid gate instead of the hard clip (per-answer mean, as grpo)
  clip_cov    Cui et al. 2025: detach a few random high-covariance tokens (they drive entropy collapse)
  kl_cov      Cui et al. 2025: put a |log pi - log pi_old| penalty on the top-covariance tokens
And the baseline GRPO removed, for contrast: a learned critic with GAE advantages (per token, not per answer):
  ppo         PPO (seed 003): clipped surrogate on GAE advantages, clipped value loss, token-level mean
  vapo        VAPO (ByteDance Seed, 2025): ppo + decoupled and length-adaptive GAE + DAPO's clip-higher
Plus three switches that work with every variant: a KL penalty to a reference model, an entropy bonus, and
truncated importance sampling (TIS) against the rollout engine's log-probs.

Top to bottom: the VARIANTS table (every per-variant fact: normalisation, default clip range, ...)
and the loss knobs (LOSS_HP), group advantages, small helpers, one small function per variant with
its paper's equation (its per-token objective), then policy_loss: the shared prologue, one dispatch
to the variant's function, then TIS, KL, entropy, VAPO's NLL and stats.

Sources: the lesson "DAPO, GSPO, CISPO" (seeds/000) and the notes "From GRPO to DAPO and GSPO"
(seeds/003). `python practice.py` re-runs the three experiments of the lesson's "Practice" section
with this file's functions and prints the lesson's tables, number for number. Conventions:
B sequences, T completion positions; mask is 1 on real completion tokens, 0 on padding; the loss
returned is the NEGATED objective (to minimise).
"""

import math
import torch

# -----------------------------------------------------------------------------
# the variants: every per-variant fact, in one table
#   norm           how per-token terms become one number (aggregate); the KL and entropy terms too
#   eps            default (eps_low, eps_high): the hard clip 1 - eps_low .. 1 + eps_high. Unused by
#                  cispo (its clip uses cispo_eps_low / cispo_eps_high instead), sapo (a soft gate)
#                  and kl_cov (the unclipped surrogate): they keep the 0.2 / 0.2 they always had
#   adv            default adv_scale: what group_advantages divides A by ('group': the group's std;
#                  'none': Dr. GRPO, no std, which over-weights too easy and too hard prompts)
#   skip_zero_adv  every loss term is proportional to A: a group with A = 0 everywhere has exactly
#                  zero gradient, and train.py may skip it (not clip_cov / kl_cov: their token picks
#                  and penalty depend on the whole batch; not ppo / vapo: the critic's A per token)
#   critic         the GAE of a value model trained beside the policy (critic.py): 'gae' (ppo: one
#                  lambda for the advantages and the targets), 'decoupled' (VAPO sec. 3.2: targets
#                  with lambda 1, advantages with a length-adaptive lambda); None: the group baseline
#   value_warmup   the default number of critic-only steps before the policy moves
#   nll            VAPO sec. 3.4: + lm_coef * the NLL of the correct answers' tokens (vapo_nll)
# DAPO sec. 3.1 Clip-Higher: eps_high = 0.28 > eps_low = 0.2 (VAPO sec. 3.3 takes the same).
# GSPO paper: 3e-4 / 4e-4 (its ratio is per answer). VAPO sec. 3.1: 50 steps of value pre-training.
VARIANTS = {name: dict(zip(("norm", "eps", "adv", "skip_zero_adv", "critic", "value_warmup", "nll"),
                          row))
            for name, *row in [  # one row per loss_type
    # name         norm          eps           adv      skip_zero_adv  critic       warmup  nll
    ("grpo",       "seq_mean",   (0.2, 0.2),   "group", True,          None,        0,      False),
    ("dr_grpo",    "const_len",  (0.2, 0.2),   "none",  True,          None,        0,      False),
    ("dapo",       "token_mean", (0.2, 0.28),  "group", True,          None,        0,      False),
    ("gspo",       "seq_mean",   (3e-4, 4e-4), "group", True,          None,        0,      False),
    ("gspo_token", "seq_mean",   (3e-4, 4e-4), "group", True,          None,        0,      False),
    ("cispo",      "token_mean", (0.2, 0.2),   "group", True,          None,        0,      False),
    ("sapo",       "seq_mean",   (0.2, 0.2),   "group", True,          None,        0,      False),
    ("clip_cov",   "token_mean", (0.2, 0.2),   "group", False,         None,        0,      False),
    ("kl_cov",     "token_mean", (0.2, 0.2),   "group", False,         None,        0,      False),
    ("ppo",        "token_mean", (0.2, 0.2),   "group", False,         "gae",       0,      False),
    ("vapo",       "token_mean", (0.2, 0.28),  "group", False,         "decoupled", 50,     True),
]}
LOSS_TYPES = tuple(VARIANTS)
CRITIC_LOSS_TYPES = tuple(name for name, v in VARIANTS.items() if v["critic"])
# the loss knobs, which policy_loss takes as one dict (train.py: its config keys of these names,
# the same defaults; a test checks they agree). A knob left out takes the default here; eps_low /
# eps_high None: the variant's (VARIANTS); beta, entropy_coef, tis_mode, lm_coef: the terms policy
# loss adds to every variant, off by default (lm_coef: only where VARIANTS' nll is set)
LOSS_HP = dict(eps_low=None, eps_high=None, max_new_tokens=None, tau_pos=1.0, tau_neg=1.05,
               cispo_eps_low=None, cispo_eps_high=4.0, clip_cov_ratio=2e-4, clip_cov_lb=1.0,
               clip_cov_ub=5.0, kl_cov_ratio=2e-3, kl_cov_coef=1.0, beta=0.0, kl_estimator="k3",
               entropy_coef=0.0, tis_mode="none", tis_cap=2.0, lm_coef=0.1)
TIS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
KL_ESTIMATORS = ("k1", "k2", "k3")
MAX_LOG_RATIO = 20.0  # overflow guard for exp(log pi - log pi_old), as in verl


def _check(name, value, valid):
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")

# -----------------------------------------------------------------------------
# advantages: the group is the baseline (no critic)

def group_advantages(rewards, group_size, scale="group", eps=1e-6, reduce_sum=lambda x: x):
    """rewards (B,), consecutive blocks of group_size are answers to one prompt -> advantages (B,).
    reduce_sum sums a dict of numbers over ranks (train.py's): scale="batch" needs the std of every
    rank's rewards, so that the result does not depend on the world size."""
    _check("scale", scale, ("group", "batch", "none"))
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)                # (n_prompts, G)
    # r_i - mean(r) over the answers to the same prompt
    centred = r - r.mean(dim=1, keepdim=True)
    # A group whose rewards are all equal has nothing to compare: A = 0 exactly. Decided by the
    # rewards, not by round-off: mean(0.1, ..., 0.1) - 0.1 is ~1e-9, which / (std + eps) would be a
    # uniform same-sign advantage.
    centred = centred.masked_fill((r == r[:, :1]).all(dim=1, keepdim=True), 0.0)
    if scale == "none":
        # Dr. GRPO: A_i = r_i - mean(r); no division by std (it over-weights too-easy / too-hard
        # prompts)
        return centred.view(-1)
    # GRPO (seed 003): A_i = (r_i - mean(r)) / std(r). Population std (correction=0, as the lesson's
    # script), and eps is added to the std so that a group with equal rewards gets A = 0 instead of
    # 0/0.
    if scale == "group":
        std = r.std(dim=1, keepdim=True, correction=0)
    else:
        # scale="batch": the mean is still per group, but the std is the whole batch's, over all
        # ranks
        std = mean_std(reduce_sum({"n": r.numel(), "s": r.sum().item(),
                                   "sq": (r ** 2).sum().item()}))[1]
    return (centred / (std + eps)).view(-1)

# -----------------------------------------------------------------------------
# small helpers the trainer can reuse

def mean_std(sums):
    """The mean and the population std of values from their sums over every rank: {'n': their
    count, 's': their sum, 'sq': the sum of their squares} (GRPO's batch scale, PPO's whitening)."""
    n = max(sums["n"], 1)
    mean = sums["s"] / n
    return mean, max(sums["sq"] / n - mean ** 2, 0.0) ** 0.5


def masked_mean(x, mask):
    """mean of x over the positions where mask is 1 (0 if there are none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def entropy_from_logits(logits):
    """logits (..., V) -> entropy (...). H = -sum_a p(a) log p(a), in fp32 (probabilities deserve
    the precision)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_penalty(logp, ref_logp, estimator="k3"):
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi: Schulman's k1, k2, k3
    estimators."""
    _check("kl_estimator", estimator, KL_ESTIMATORS)
    log_ratio = logp - ref_logp.detach()                     # (B, T) log pi/pi_ref
    if estimator == "k1":
        # k1 = log(pi/pi_ref): unbiased, noisy, can be < 0
        return log_ratio
    if estimator == "k2":
        # k2 = 0.5 (log pi/pi_ref)^2: biased, low variance, >= 0
        return 0.5 * log_ratio ** 2
    # ref - logp (with the exp overflow guard)
    d = (-log_ratio).clamp(max=MAX_LOG_RATIO)
    # k3 = exp(ref - logp) - (ref - logp) - 1: unbiased, >= 0
    return torch.exp(d) - d - 1


def tis_weights(old_logp, rollout_logp, mask, mode="token_truncate", cap=2.0):
    """Truncated importance sampling against the rollout engine (vLLM's log-probs differ from the trainer's:
    other kernels, other precision). Returns (weight, clipped), both (B, T), no gradient.
      token_truncate:    w_t = min(pi_old/pi_rollout, cap)                  (TIS: re-weight, bounded)
      token_mask:        w_t = 1 if pi_old/pi_rollout <= cap else 0         (rejection: drop the token)
      sequence_truncate: w_i = min(prod_t pi_old/pi_rollout, cap) on every token of answer i
      sequence_mask:     w_i = 1 if prod_t pi_old/pi_rollout <= cap else 0  (drop the whole answer)
    The *_mask modes follow verl's "mask" mode: they drop tokens whose ratio exceeds the cap and do not
    re-weight the ones they keep. Dropped tokens stay in the num_tokens / num_seqs denominators."""
    _check("tis_mode", mode, TIS_MODES)
    valid = mask > 0
    if mode == "none":
        return valid.to(old_logp.dtype), torch.zeros_like(valid)
    # (B, T) log(pi_old / pi_rollout)
    log_w = torch.where(valid, old_logp - rollout_logp, 0.0).detach()
    if mode.startswith("sequence"):
        # (B, T) log of the sequence ratio
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    # compare in log space: a sequence ratio can overflow
    clipped = (log_w > math.log(cap)) & valid
    if mode.endswith("truncate"):
        weight = torch.exp(log_w.clamp(max=math.log(cap)))
    else:
        weight = (~clipped).to(old_logp.dtype)
    return weight * valid, clipped


def aggregate(per_token, mask, normalisation, num_tokens=None, num_seqs=None, max_new_tokens=None):
    """(B, T) per-token terms -> one number. num_tokens / num_seqs are the GLOBAL counts of the
    whole step: the trainer sums the micro-batch losses (no division by the number of
    micro-batches), and with global denominators that sum equals the one-pass loss. Defaults: this
    micro-batch's counts."""
    masked = per_token * mask                                # (B, T)
    if normalisation == "token_mean":
        # DAPO's token-level loss, J_DAPO (seeds 000, 003): one sum over all valid tokens / sum_i
        # |o_i|
        return masked.sum() / (mask.sum().clamp(min=1) if num_tokens is None else num_tokens)
    num_seqs = per_token.shape[0] if num_seqs is None else num_seqs
    if normalisation == "seq_mean":
        # GRPO's J_GRPO (seed 003): (1/G) sum_i (1/|o_i|) sum_t ... ; mean inside each answer, then
        # over answers
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    # "const_len", Dr. GRPO (seed 000): sum over tokens / the constant G * L_max, here num_seqs *
    # max_new_tokens
    return masked.sum() / (num_seqs * max_new_tokens)


def token_weight_sums(logp_grad, advantages, mask, median_len):
    """Seed 000's experiment 1, measured in a real step. logp_grad (B, T): dLoss/dlogp after the
    backward; advantages (B,) or (B, T); mask (B, T); median_len: the batch's median answer length.
    The gradient weight of a token, |dLoss/dlogp| / |A|, is averaged over each answer's live tokens
    (A != 0 and mask), then summed over the answers shorter than median_len (short) and over the
    others (long), counting only answers with a live token. Returns python floats:
    dict(weight_short=, n_short=, weight_long=, n_long=).
    Theory (on-policy): grpo's seq_mean gives each token of answer i the weight 1 / (G |o_i|), so
    the tokens of short answers weigh more, right or wrong (the length bias: weight_short / n_short
    > weight_long / n_long); dapo's token mean gives every token 1 / sum_i |o_i| (dr_grpo's
    1 / (G L_max)): short and long weigh the same."""
    rows_len = mask.sum(1)
    adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(mask)
    live = (adv != 0) * mask
    weight = logp_grad.abs() / adv.abs().clamp(min=1e-12) * live       # (B, T) |dLoss/dlogp| / |A|
    row_weight = weight.sum(1) / live.sum(1).clamp(min=1)               # (B,) mean over live tokens
    sums = {}
    for name, rows in (("short", rows_len < median_len), ("long", rows_len >= median_len)):
        rows = rows & (live.sum(1) > 0)
        sums[f"weight_{name}"] = row_weight[rows].sum().item()
        sums[f"n_{name}"] = float(rows.sum().item())
    return sums

# -----------------------------------------------------------------------------
# one function per variant: its per-token objective J_t, which policy_loss aggregates and negates.
# Inputs are (B, T), masked already (padding holds 0), in fp32 or wider; ratio is rho = pi / pi_old.
# Each returns (obj, masks): obj (B, T), and a dict of only the (B, T) masks the variant changes;
# policy_loss defaults the others (its stats need them):
#   clip_low, clip_high  bool: a lower / upper hard clip is active here (default: nowhere)
#   selected             bool: the tokens clip_cov / kl_cov picked (default: none)
#   dead                 bool: the policy term has exactly zero gradient here (default: A == 0)
#   ratio_seen           float, no grad: the ratio the variant clips (default: rho; GSPO: s_i)
# Order: clipped surrogate, then one change each: tokens (*_cov), ratio (gspo), clip (cispo, sapo)

# PPO / GRPO / DAPO (and Dr. GRPO, ppo, vapo): the clipped surrogate
def clipped_surrogate(ratio, adv, eps_low, eps_high):
    """PPO / GRPO clipped surrogate (seed 003 J_PPO, J_GRPO), with DAPO's decoupled Clip-Higher
    bounds (seeds 000, 003 J_DAPO):
        J_t = min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
    The clipped branch is a constant: a clipped token gets no gradient. grpo, dr_grpo and dapo
    differ only in their VARIANTS row (norm, eps); ppo and vapo also in where A comes from (GAE)."""
    obj = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    clip_low = (ratio < 1 - eps_low) & (adv < 0)
    clip_high = (ratio > 1 + eps_high) & (adv > 0)
    return obj, dict(clip_low=clip_low, clip_high=clip_high, dead=(adv == 0) | clip_low | clip_high)


# Clip-Cov (Cui et al. 2025): the clipped surrogate, with a few high-covariance tokens detached
def clip_cov(ratio, adv, eps_low, eps_high, cov, valid, n_valid, frac, lb, ub):
    """Clip-Cov (Cui et al. 2025; seed 000: entropy change ~ -Cov(log pi, A)). cov (B, T) is the
    per-token centred product (A_t - mean A) (log pi_t - mean log pi). Among the tokens with
    lb <= cov_t <= ub (not already clipped by PPO, as in verl), a random fraction frac of the
    n_valid tokens (at least one) is detached; torch's RNG picks them:
        J_t = clipped_surrogate_t, and sg(J_t) on the picked tokens (no gradient)"""
    obj, masks = clipped_surrogate(ratio, adv, eps_low, eps_high)
    candidates = valid & (cov >= lb) & (cov <= ub) & ~(masks["clip_low"] | masks["clip_high"])
    idx = candidates.flatten().nonzero().squeeze(1)
    selected = torch.zeros_like(valid)
    if idx.numel() > 0:
        n_pick = min(idx.numel(), max(1, int(frac * n_valid)))
        pick = idx[torch.randperm(idx.numel(), device=idx.device)[:n_pick]]
        selected = selected.flatten().index_fill(0, pick, True).view(valid.shape)
    masks.update(selected=selected, dead=masks["dead"] | selected)
    return torch.where(selected, obj.detach(), obj), masks


# KL-Cov (Cui et al. 2025): no clip; a penalty on the top-covariance tokens instead
def kl_cov(ratio, adv, log_ratio, cov, valid, n_valid, frac, coef):
    """KL-Cov (Cui et al. 2025). The top fraction frac of the n_valid tokens by cov (at least one)
    get a |log pi - log pi_old| penalty, and every token uses the UNCLIPPED surrogate (as verl's
    kl_cov does): the penalty replaces the clip.
        J_t = rho_t A_t - coef |log rho_t| [t selected]"""
    n_pick = min(n_valid, max(1, int(frac * n_valid))) if frac > 0 else 0
    top = cov.masked_fill(~valid, -math.inf).flatten().topk(n_pick).indices
    selected = torch.zeros_like(valid).flatten().index_fill(0, top, True).view(valid.shape)
    obj = ratio * adv - coef * log_ratio.abs() * selected
    return obj, dict(selected=selected, dead=(adv == 0) & ~(selected & (log_ratio != 0)))


# GSPO (Qwen, 2025): the clipped surrogate on one sequence ratio s_i per answer
def gspo(log_ratio, logp, adv, mask, eps_low, eps_high, token=False):
    """GSPO (seeds 000, 003): one geometric-mean ratio and one clip per answer,
        s_i = exp((1/|y_i|) sum_t log(pi_theta(y_i,t) / pi_old(y_i,t)))
        J_GSPO = (1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
    One advantage per answer: given (B, T) advantages, their mean over the answer's tokens. The
    answer's term goes to each of its tokens; "seq_mean" averages that constant back to the term.
    token=True, GSPO-token: s_i,t = sg[s_i] pi_theta(y_t) / sg[pi_theta(y_t)] with per-token A_t:
    the value of s_i, the gradient of one token."""
    seq_len = mask.sum(-1, keepdim=True).clamp(min=1)                      # (B, 1) |y_i|
    log_s = (log_ratio * mask).sum(-1, keepdim=True) / seq_len              # (B, 1) log s_i
    if token:
        a = adv                                                             # (B, T)
        s = torch.exp(log_s.detach().clamp(max=MAX_LOG_RATIO) + logp - logp.detach())  # (B, T)
    else:
        a = (adv * mask).sum(-1, keepdim=True) / seq_len                    # (B, 1)
        s = torch.exp(log_s.clamp(max=MAX_LOG_RATIO))                       # (B, 1)
    obj, masks = clipped_surrogate(s, a, eps_low, eps_high)
    masks = {k: m.expand_as(mask) for k, m in masks.items()}
    return obj.expand_as(mask), dict(masks, ratio_seen=s.detach().expand_as(mask))


# CISPO (MiniMax-M1, 2025): REINFORCE, the clip moved from the update to a stop-gradient IS weight
def cispo(ratio, adv, logp, eps_low, eps_high):
    """CISPO (MiniMax-M1; seed 000 J_CISPO):
        J_t = sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) A_t log pi_theta(o_t)
    The weight is clipped, not the update: a clipped token still gets gradient weight * A.
    eps_low=None: no lower bound (the default: MiniMax tuned only the upper one). eps_high=4: weight
    <= 5; TRL writes the same as an absolute cap (epsilon_high=5.0), verl as 1 + clip_ratio_high
    around 1."""
    rho = ratio.detach()
    low = None if eps_low is None else 1 - eps_low
    obj = rho.clamp(low, 1 + eps_high) * adv * logp
    # clip_high: the weight is truncated (the token still learns), whatever the sign of A
    masks = dict(clip_high=rho > 1 + eps_high)
    if low is not None:
        masks["clip_low"] = rho < low
    return obj, masks


# SAPO (Qwen, Nov 2025): a smooth sigmoid gate instead of the hard clip
def sapo(ratio, adv, tau_pos, tau_neg):
    """SAPO (Qwen, Nov 2025): a soft gate instead of the clip,
        J_t = f(rho_t) A_t,  f(rho) = sigmoid(tau (rho - 1)) * 4 / tau,
        tau = tau_pos where A > 0, tau_neg where A < 0
    f'(1) = 4 * 1/4 = 1: on-policy it is the plain policy gradient; off-policy the gradient fades
    smoothly instead of being cut. No hard clip: clip_frac = 0. Normalisation as in the SAPO paper,
    TRL and verl: the mean inside each answer, then over answers (GRPO's seq_mean), so the gate is
    the only difference from grpo."""
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), tau_neg)     # (B, T), in adv's dtype
    return torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv, {}

# VAPO (ByteDance Seed, 2025): a language-model loss on the correct answers, beside the policy's
def vapo_nll(logp, positive_mask, num_positive_tokens=None):
    """VAPO sec. 3.4: the mean NLL of the correct answers' tokens (positive_mask (B, T): 1 there),
    over the step's num_positive_tokens (default: this micro-batch's)."""
    n = positive_mask.sum().item() if num_positive_tokens is None else num_positive_tokens
    return -(logp * positive_mask).sum() / max(n, 1)

# -----------------------------------------------------------------------------
# the policy loss

def policy_loss(loss_type, logp, old_logp, advantages, mask, *, num_tokens=None, num_seqs=None,
                ref_logp=None, entropy=None, rollout_logp=None, correct=None,
                num_positive_tokens=None, **hp):
    """logp (with grad), old_logp, mask: (B, T); advantages: (B,) or (B, T). Returns (loss, stats):
    the loss is -J for this micro-batch (minimise it), stats a dict of python floats. hp: the loss
    knobs (LOSS_HP; train.py passes its config's, one dict). num_tokens / num_seqs: global counts
    for gradient accumulation (see aggregate). ref_logp + beta: KL penalty; entropy + entropy_coef:
    entropy bonus; rollout_logp + tis_mode: truncated importance sampling; correct (B,) +
    num_positive_tokens: VAPO's NLL (the variant's nll)."""
    if unknown := set(hp) - set(LOSS_HP):
        raise ValueError(f"unknown loss knob {', '.join(sorted(unknown))}; valid: {', '.join(LOSS_HP)}")
    hp = {**LOSS_HP, **hp}
    beta, tis_mode, entropy_coef = hp["beta"], hp["tis_mode"], hp["entropy_coef"]
    _check("loss_type", loss_type, LOSS_TYPES)
    _check("tis_mode", tis_mode, TIS_MODES)
    _check("kl_estimator", hp["kl_estimator"], KL_ESTIMATORS)
    variant = VARIANTS[loss_type]
    if variant["norm"] == "const_len" and hp["max_new_tokens"] is None:
        raise ValueError("dr_grpo divides by the constant num_seqs * max_new_tokens: pass max_new_tokens")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the frozen reference model's log-probs)")
    if variant["nll"] and hp["lm_coef"] > 0 and correct is None:
        raise ValueError(f"{loss_type}'s NLL term needs correct (B,) (or lm_coef=0)")
    if tis_mode != "none" and rollout_logp is None:
        raise ValueError(f"tis_mode={tis_mode!r} needs rollout_logp (the rollout engine's log-probs)")
    if old_logp.shape != logp.shape or mask.shape != logp.shape or advantages.shape[0] != logp.shape[0]:
        raise ValueError("logp, old_logp, mask must be (B, T) and advantages (B,) or (B, T)")
    eps_low = variant["eps"][0] if hp["eps_low"] is None else hp["eps_low"]
    eps_high = variant["eps"][1] if hp["eps_high"] is None else hp["eps_high"]
    B, T = logp.shape

    # Padding must contribute neither value nor gradient, whatever garbage it holds. torch.where
    # (not a multiply): its backward sends exactly 0 to the branch it did not pick, so not even
    # inf/nan can leak from padding. Losses are computed in at least fp32 (bf16 cannot even count
    # tokens past 256 exactly).
    dtype = torch.promote_types(logp.dtype, torch.float32)
    valid = mask > 0                                                        # (B, T) bool
    mask = valid.to(dtype)                                                  # (B, T) 0/1
    logp = torch.where(valid, logp.to(dtype), 0.0)                          # (B, T) with grad
    old_logp = torch.where(valid, old_logp.detach().to(dtype), 0.0)         # (B, T)
    adv = advantages.detach().to(dtype)
    adv = adv[:, None].expand(B, T) if adv.dim() == 1 else adv
    adv = torch.where(valid, adv, 0.0)                                      # (B, T)
    n_valid = int(mask.sum().item())

    # PPO's importance ratio (seed 003): rho_t = pi_theta / pi_old = exp(logp - old_logp).
    # With one optimiser step per batch (num_iterations=1) rho == 1: the clip does nothing, only
    # its gradient d rho / d logp = rho = 1 remains, and every clipped loss is the plain policy
    # gradient.
    # (exp is capped at e^20 ~ 5e8, far outside any clip range: e^89 is inf in fp32, and inf * 0 is
    # nan in backward)
    log_ratio = logp - old_logp                                             # (B, T)
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))                   # (B, T)

    # Cui et al. 2025: entropy change ~ -Cov(log pi, A). Per token, the centred product below; its
    # mean over valid tokens is the covariance (means over the micro-batch's valid tokens, no grad).
    logp_d = logp.detach()
    cov = (adv - masked_mean(adv, mask)) * (logp_d - masked_mean(logp_d, mask))   # (B, T)

    # the variant: its per-token objective and the masks it changes (see "one function per variant")
    if loss_type in ("grpo", "dr_grpo", "dapo", "ppo", "vapo"):
        obj, masks = clipped_surrogate(ratio, adv, eps_low, eps_high)
    elif loss_type == "clip_cov":
        obj, masks = clip_cov(ratio, adv, eps_low, eps_high, cov, valid, n_valid,
                              hp["clip_cov_ratio"], hp["clip_cov_lb"], hp["clip_cov_ub"])
    elif loss_type == "kl_cov":
        obj, masks = kl_cov(ratio, adv, log_ratio, cov, valid, n_valid, hp["kl_cov_ratio"],
                            hp["kl_cov_coef"])
    elif loss_type in ("gspo", "gspo_token"):
        obj, masks = gspo(log_ratio, logp, adv, mask, eps_low, eps_high, loss_type == "gspo_token")
    elif loss_type == "cispo":
        obj, masks = cispo(ratio, adv, logp, hp["cispo_eps_low"], hp["cispo_eps_high"])
    else:  # "sapo"
        obj, masks = sapo(ratio, adv, hp["tau_pos"], hp["tau_neg"])
    none = torch.zeros_like(valid)
    masks = {"clip_low": none, "clip_high": none, "selected": none, "dead": adv == 0,
             "ratio_seen": ratio.detach(), **masks}
    dead = masks["dead"]

    # TIS: multiply each token's policy term by the detached rollout-correction weight
    tis_w, tis_clipped = None, None
    if tis_mode != "none":
        rollout_logp = torch.where(valid, rollout_logp, 0.0)
        tis_w, tis_clipped = tis_weights(old_logp, rollout_logp, mask, tis_mode, hp["tis_cap"])
        obj = obj * tis_w
        dead = dead | (tis_w == 0)

    def agg(per_token):
        return aggregate(per_token, mask, variant["norm"], num_tokens, num_seqs, hp["max_new_tokens"])

    loss = -agg(obj)                                          # minimise -J
    kl = ent = None
    if beta > 0:
        # GRPO's -beta D_KL term (seed 003): + beta * KL in the loss, normalised like the policy
        # term
        kl = kl_penalty(logp, torch.where(valid, ref_logp, 0.0), hp["kl_estimator"])
        loss = loss + beta * agg(kl)
    if entropy is not None:
        # entropy bonus (the lesson's entropy_coef): - entropy_coef * H in the loss, normalised like
        # the policy term
        ent = torch.where(valid, entropy, 0.0)
        if entropy_coef != 0:
            loss = loss - entropy_coef * agg(ent)
    if variant["nll"] and hp["lm_coef"] > 0:
        # VAPO sec. 3.4: + mu * the NLL of the correct answers' tokens
        loss = loss + hp["lm_coef"] * vapo_nll(logp, mask * (correct > 0)[:, None], num_positive_tokens)

    # stats: means over this micro-batch's valid tokens; n_tokens lets callers token-weight them
    # across micro-batches
    with torch.no_grad():
        clip_low, clip_high = masks["clip_low"], masks["clip_high"]
        named = {"clip_frac_low": clip_low, "clip_frac_high": clip_high, "clip_frac": clip_low | clip_high,
                 "zero_grad_frac": dead, "ratio_mean": masks["ratio_seen"],
                 "log_ratio_abs_mean": log_ratio.abs(), "cov_logp_adv": cov}
        if loss_type in ("clip_cov", "kl_cov"):
            named["cov_selected_frac"] = masks["selected"]
        if tis_w is not None:
            named["tis_weight_mean"], named["tis_clipped_frac"] = tis_w, tis_clipped
        if kl is not None:
            named["kl"] = kl
        if ent is not None:
            named["entropy"] = ent
        values = torch.stack([masked_mean(x.to(mask.dtype), mask) for x in named.values()]).tolist()
    stats = dict(zip(named, values), n_tokens=float(n_valid))
    return loss, stats
