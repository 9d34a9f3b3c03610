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

Sources: the lesson "DAPO, GSPO, CISPO" (seeds/000) and the notes "From GRPO to DAPO and GSPO" (seeds/003).
`python losses.py` re-runs the three experiments of the lesson's "Practice" section with this file's functions
and prints the lesson's tables, number for number. Conventions: B sequences, T completion positions;
mask is 1 on real completion tokens, 0 on padding; the loss returned is the NEGATED objective (to minimise).
"""

import math
import torch

# -----------------------------------------------------------------------------
# names

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "sapo", "clip_cov", "kl_cov", "ppo", "vapo")
CRITIC_LOSS_TYPES = ("ppo", "vapo")  # these train a value model beside the policy
TIS_MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
KL_ESTIMATORS = ("k1", "k2", "k3")
MAX_LOG_RATIO = 20.0  # overflow guard for exp(log pi - log pi_old), as in verl

# how each variant turns per-token terms into one number (the KL penalty and entropy bonus follow the same rule)
NORMALISATION = {
    "grpo": "seq_mean", "gspo": "seq_mean", "gspo_token": "seq_mean", "sapo": "seq_mean",
    "dr_grpo": "const_len",
    "dapo": "token_mean", "cispo": "token_mean", "clip_cov": "token_mean", "kl_cov": "token_mean",
    "ppo": "token_mean", "vapo": "token_mean",
}


def _check(name, value, valid):
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")

# -----------------------------------------------------------------------------
# advantages: the group is the baseline (no critic)

def group_advantages(rewards, group_size, scale="group", eps=1e-6, reduce_sum=lambda x: x):
    """rewards (B,), consecutive blocks of group_size are answers to one prompt -> advantages (B,).
    reduce_sum sums a dict of numbers over ranks (train.py's): scale="batch" needs the std of every rank's
    rewards, so that the result does not depend on the world size."""
    _check("scale", scale, ("group", "batch", "none"))
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be 1-D with a length divisible by group_size={group_size}, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)                # (n_prompts, G)
    centred = r - r.mean(dim=1, keepdim=True)                # r_i - mean(r) over the answers to the same prompt
    # A group whose rewards are all equal has nothing to compare: A = 0 exactly. Decided by the rewards, not by
    # round-off: mean(0.1, ..., 0.1) - 0.1 is ~1e-9, which / (std + eps) would be a uniform same-sign advantage.
    centred = centred.masked_fill((r == r[:, :1]).all(dim=1, keepdim=True), 0.0)
    if scale == "none":
        # Dr. GRPO: A_i = r_i - mean(r); no division by std (it over-weights too-easy / too-hard prompts)
        return centred.view(-1)
    # GRPO (seed 003): A_i = (r_i - mean(r)) / std(r). Population std (correction=0, as the lesson's script),
    # and eps is added to the std so that a group with equal rewards gets A = 0 instead of 0/0.
    if scale == "group":
        std = r.std(dim=1, keepdim=True, correction=0)
    else:
        # scale="batch": the mean is still per group, but the std is the whole batch's, over all ranks
        sums = reduce_sum({"n": r.numel(), "s": r.sum().item(), "sq": (r ** 2).sum().item()})
        std = max(sums["sq"] / sums["n"] - (sums["s"] / sums["n"]) ** 2, 0.0) ** 0.5
    return (centred / (std + eps)).view(-1)

# -----------------------------------------------------------------------------
# small helpers the trainer can reuse

def masked_mean(x, mask):
    """mean of x over the positions where mask is 1 (0 if there are none)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def entropy_from_logits(logits):
    """logits (..., V) -> entropy (...). H = -sum_a p(a) log p(a), in fp32 (probabilities deserve the precision)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl_penalty(logp, ref_logp, estimator="k3"):
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi: Schulman's k1, k2, k3 estimators."""
    _check("kl_estimator", estimator, KL_ESTIMATORS)
    log_ratio = logp - ref_logp.detach()                     # (B, T) log pi/pi_ref
    if estimator == "k1":
        return log_ratio                                     # k1 = log(pi/pi_ref): unbiased, noisy, can be < 0
    if estimator == "k2":
        return 0.5 * log_ratio ** 2                          # k2 = 0.5 (log pi/pi_ref)^2: biased, low variance, >= 0
    d = (-log_ratio).clamp(max=MAX_LOG_RATIO)                # ref - logp (with the exp overflow guard)
    return torch.exp(d) - d - 1                              # k3 = exp(ref - logp) - (ref - logp) - 1: unbiased, >= 0


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
    log_w = torch.where(valid, old_logp - rollout_logp, 0.0).detach()     # (B, T) log(pi_old / pi_rollout)
    if mode.startswith("sequence"):
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)               # (B, T) log of the sequence ratio
    clipped = (log_w > math.log(cap)) & valid                # compare in log space: a sequence ratio can overflow
    if mode.endswith("truncate"):
        weight = torch.exp(log_w.clamp(max=math.log(cap)))
    else:
        weight = (~clipped).to(old_logp.dtype)
    return weight * valid, clipped


def aggregate(per_token, mask, normalisation, num_tokens=None, num_seqs=None, max_new_tokens=None):
    """(B, T) per-token terms -> one number. num_tokens / num_seqs are the GLOBAL counts of the whole step:
    the trainer sums the micro-batch losses (no division by the number of micro-batches), and with global
    denominators that sum equals the one-pass loss. Defaults: this micro-batch's counts."""
    masked = per_token * mask                                # (B, T)
    if normalisation == "token_mean":
        # DAPO's token-level loss, J_DAPO (seeds 000, 003): one sum over all valid tokens / sum_i |o_i|
        return masked.sum() / (mask.sum().clamp(min=1) if num_tokens is None else num_tokens)
    num_seqs = per_token.shape[0] if num_seqs is None else num_seqs
    if normalisation == "seq_mean":
        # GRPO's J_GRPO (seed 003): (1/G) sum_i (1/|o_i|) sum_t ... ; mean inside each answer, then over answers
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    # "const_len", Dr. GRPO (seed 000): sum over tokens / the constant G * L_max, here num_seqs * max_new_tokens
    return masked.sum() / (num_seqs * max_new_tokens)

# -----------------------------------------------------------------------------
# the policy loss

def policy_loss(loss_type, logp, old_logp, advantages, mask, *,
                eps_low=None, eps_high=None, max_new_tokens=None, tau_pos=1.0, tau_neg=1.05,
                cispo_eps_high=4.0, cispo_eps_low=None, clip_cov_ratio=2e-4, clip_cov_lb=1.0, clip_cov_ub=5.0,
                kl_cov_ratio=2e-3, kl_cov_coef=1.0, num_tokens=None, num_seqs=None,
                ref_logp=None, beta=0.0, kl_estimator="k3", entropy=None, entropy_coef=0.0,
                rollout_logp=None, tis_mode="none", tis_cap=2.0):
    """logp (with grad), old_logp, mask: (B, T); advantages: (B,) or (B, T). Returns (loss, stats): the loss is
    -J for this micro-batch (minimise it), stats a dict of python floats. eps_low / eps_high default to
    0.2 / 0.2, 0.2 / 0.28 for dapo and vapo (Clip-Higher), 3e-4 / 4e-4 for gspo and gspo_token.
    num_tokens / num_seqs: global counts for gradient accumulation (see aggregate). ref_logp + beta: KL penalty; entropy + entropy_coef: entropy bonus; rollout_logp + tis_mode:
    truncated importance sampling. All three are off by default."""
    _check("loss_type", loss_type, LOSS_TYPES)
    _check("tis_mode", tis_mode, TIS_MODES)
    _check("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if loss_type == "dr_grpo" and max_new_tokens is None:
        raise ValueError("dr_grpo divides by the constant num_seqs * max_new_tokens: pass max_new_tokens")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the frozen reference model's log-probs)")
    if tis_mode != "none" and rollout_logp is None:
        raise ValueError(f"tis_mode={tis_mode!r} needs rollout_logp (the rollout engine's log-probs)")
    if old_logp.shape != logp.shape or mask.shape != logp.shape or advantages.shape[0] != logp.shape[0]:
        raise ValueError("logp, old_logp, mask must be (B, T) and advantages (B,) or (B, T)")
    gspo_like = loss_type in ("gspo", "gspo_token")
    eps_low = (3e-4 if gspo_like else 0.2) if eps_low is None else eps_low      # GSPO paper: 3e-4 / 4e-4
    # DAPO sec. 3.1 Clip-Higher: eps_high = 0.28 > eps_low = 0.2 (VAPO sec. 3.3 takes the same)
    eps_high = (4e-4 if gspo_like else 0.28 if loss_type in ("dapo", "vapo") else 0.2) if eps_high is None else eps_high
    B, T = logp.shape

    # Padding must contribute neither value nor gradient, whatever garbage it holds. torch.where (not a multiply):
    # its backward sends exactly 0 to the branch it did not pick, so not even inf/nan can leak from padding.
    # Losses are computed in at least fp32 (bf16 cannot even count tokens past 256 exactly).
    dtype = torch.promote_types(logp.dtype, torch.float32)
    valid = mask > 0                                                        # (B, T) bool
    mask = valid.to(dtype)                                                  # (B, T) 0/1
    logp = torch.where(valid, logp.to(dtype), 0.0)                          # (B, T) with grad
    old_logp = torch.where(valid, old_logp.detach().to(dtype), 0.0)         # (B, T)
    adv = advantages.detach().to(dtype)
    adv = adv[:, None].expand(B, T) if adv.dim() == 1 else adv
    adv = torch.where(valid, adv, 0.0)                                      # (B, T)
    seq_len = mask.sum(-1).clamp(min=1)                                     # (B,) |o_i|
    n_valid = int(mask.sum().item())

    # PPO's importance ratio (seed 003): rho_t = pi_theta / pi_old = exp(logp - old_logp).
    # With one optimiser step per batch (num_iterations=1) rho == 1: the clip does nothing, only its gradient
    # d rho / d logp = rho = 1 remains, and every clipped loss below is the plain policy gradient.
    # (exp is capped at e^20 ~ 5e8, far outside any clip range: e^89 is inf in fp32, and inf * 0 = nan in backward)
    log_ratio = logp - old_logp                                             # (B, T)
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))                   # (B, T)

    # Cui et al. 2025: entropy change ~ -Cov(log pi, A). Per token, the centred product below; its mean over
    # valid tokens is the covariance (means over the micro-batch's valid tokens, no gradient).
    logp_d = logp.detach()
    cov = (adv - masked_mean(adv, mask)) * (logp_d - masked_mean(logp_d, mask))   # (B, T)

    ratio_seen = ratio.detach()                     # the ratio the variant clips (GSPO: s_i on every token)
    clip_low = torch.zeros_like(valid)              # (B, T) bool: a lower hard clip is active here
    clip_high = torch.zeros_like(valid)             # (B, T) bool: an upper hard clip is active here
    selected = torch.zeros_like(valid)              # (B, T) bool: tokens picked by clip_cov / kl_cov
    dead = adv == 0                                 # (B, T) bool: policy term has exactly zero gradient here

    if loss_type in ("grpo", "dr_grpo", "dapo", "clip_cov", "ppo", "vapo"):
        # PPO / GRPO clipped surrogate (seed 003 J_PPO, J_GRPO), with DAPO's decoupled Clip-Higher bounds:
        # min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A). The clipped branch is a constant: no gradient.
        obj = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
        clip_low, clip_high = (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0)
        if loss_type == "clip_cov":
            # Clip-Cov (Cui et al. 2025): among tokens with clip_cov_lb <= cov <= clip_cov_ub (not already
            # clipped by PPO, as in verl), detach a random clip_cov_ratio fraction (at least one). torch's RNG.
            candidates = (valid & (cov >= clip_cov_lb) & (cov <= clip_cov_ub) & ~(clip_low | clip_high)).flatten()
            idx = candidates.nonzero().squeeze(1)
            if idx.numel() > 0:
                n_pick = min(idx.numel(), max(1, int(clip_cov_ratio * n_valid)))
                pick = idx[torch.randperm(idx.numel(), device=idx.device)[:n_pick]]
                selected = selected.flatten().index_fill(0, pick, True)
                selected = selected.view(B, T)
            obj = torch.where(selected, obj.detach(), obj)
        dead = dead | clip_low | clip_high | selected
    elif gspo_like:
        # GSPO (seeds 000, 003): s_i = exp((1/|y_i|) sum_t log(pi_theta / pi_old)), the geometric mean ratio
        log_s = (log_ratio * mask).sum(-1, keepdim=True) / seq_len[:, None]        # (B, 1)
        if loss_type == "gspo":
            # one advantage per answer; given (B, T) advantages, we use their mean over the answer's tokens
            a = (adv * mask).sum(-1, keepdim=True) / seq_len[:, None]             # (B, 1)
            s = torch.exp(log_s.clamp(max=MAX_LOG_RATIO))                         # (B, 1)
        else:
            # GSPO-token: s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]: value s_i, gradient of one token
            a = adv                                                               # (B, T)
            s = torch.exp(log_s.detach().clamp(max=MAX_LOG_RATIO) + logp - logp_d)  # (B, T)
        # J_GSPO: min(s_i A_i, clip(s_i, 1 - eps, 1 + eps) A_i), one term per answer: broadcast over its tokens,
        # the "seq_mean" normalisation then averages a constant over the answer = the answer's term, / num_seqs
        obj = torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a).expand(B, T)
        ratio_seen = s.detach().expand(B, T)
        clip_low = ((ratio_seen < 1 - eps_low) & (a < 0)).expand(B, T)
        clip_high = ((ratio_seen > 1 + eps_high) & (a > 0)).expand(B, T)
        dead = (a == 0).expand(B, T) | clip_low | clip_high
    elif loss_type == "cispo":
        # CISPO (MiniMax-M1; seed 000 J_CISPO): sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi.
        # The weight is clipped, not the update: a clipped token still gets gradient weight * A.
        # No lower bound by default (MiniMax tuned only the upper one). cispo_eps_high=4 -> weight <= 5;
        # TRL writes the same as an absolute cap (epsilon_high=5.0), verl as 1 + clip_ratio_high around 1.
        low = None if cispo_eps_low is None else 1 - cispo_eps_low
        obj = ratio_seen.clamp(low, 1 + cispo_eps_high) * adv * logp
        clip_high = ratio_seen > 1 + cispo_eps_high          # weight truncated (token still learns), any sign of A
        clip_low = ratio_seen < low if low is not None else clip_low
    elif loss_type == "sapo":
        # SAPO (Qwen, Nov 2025): soft gate f(rho) A, f(rho) = sigmoid(tau (rho - 1)) * 4 / tau, with
        # tau = tau_pos for A > 0 and tau_neg for A < 0. f'(1) = 4 * 1/4 = 1: on-policy it is the plain policy
        # gradient; off-policy the gradient fades smoothly instead of being cut. No hard clip: clip_frac = 0.
        # Normalisation as in the SAPO paper, TRL and verl: the mean inside each answer, then over answers
        # (GRPO's seq_mean), so the gate is the only difference from grpo.
        tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), tau_neg)  # (B, T), in adv's dtype
        obj = torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    else:  # kl_cov
        # KL-Cov (Cui et al. 2025): the top kl_cov_ratio fraction of valid tokens by cov (at least one) get
        # kl_cov_coef * |logp - old_logp| added to their loss; all tokens use the UNCLIPPED surrogate rho A
        # (as verl's kl_cov does): the penalty replaces the clip.
        n_pick = min(n_valid, max(1, int(kl_cov_ratio * n_valid))) if kl_cov_ratio > 0 else 0
        top = cov.masked_fill(~valid, -math.inf).flatten().topk(n_pick).indices
        selected = selected.flatten().index_fill(0, top, True).view(B, T)
        obj = ratio * adv - kl_cov_coef * log_ratio.abs() * selected
        dead = dead & ~(selected & (log_ratio != 0))

    # TIS: multiply each token's policy term by the detached rollout-correction weight
    tis_w, tis_clipped = None, None
    if tis_mode != "none":
        tis_w, tis_clipped = tis_weights(old_logp, torch.where(valid, rollout_logp, 0.0), mask, tis_mode, tis_cap)
        obj = obj * tis_w
        dead = dead | (tis_w == 0)

    def agg(per_token):
        return aggregate(per_token, mask, NORMALISATION[loss_type], num_tokens, num_seqs, max_new_tokens)

    loss = -agg(obj)                                          # minimise -J
    kl = ent = None
    if beta > 0:
        # GRPO's -beta D_KL term (seed 003): + beta * KL in the loss, normalised like the policy term
        kl = kl_penalty(logp, torch.where(valid, ref_logp, 0.0), kl_estimator)
        loss = loss + beta * agg(kl)
    if entropy is not None:
        # entropy bonus (the lesson's entropy_coef): - entropy_coef * H in the loss, normalised like the policy term
        ent = torch.where(valid, entropy, 0.0)
        if entropy_coef != 0:
            loss = loss - entropy_coef * agg(ent)

    # stats: means over this micro-batch's valid tokens; n_tokens lets callers token-weight them across micro-batches
    with torch.no_grad():
        named = {"clip_frac_low": clip_low, "clip_frac_high": clip_high, "clip_frac": clip_low | clip_high,
                 "zero_grad_frac": dead, "ratio_mean": ratio_seen, "log_ratio_abs_mean": log_ratio.abs(),
                 "cov_logp_adv": cov}
        if loss_type in ("clip_cov", "kl_cov"):
            named["cov_selected_frac"] = selected
        if tis_w is not None:
            named["tis_weight_mean"], named["tis_clipped_frac"] = tis_w, tis_clipped
        if kl is not None:
            named["kl"] = kl
        if ent is not None:
            named["entropy"] = ent
        values = torch.stack([masked_mean(x.to(mask.dtype), mask) for x in named.values()]).tolist()
    stats = dict(zip(named, values), n_tokens=float(n_valid))
    return loss, stats

# -----------------------------------------------------------------------------
# the oracle: the three experiments of the lesson's "Practice" section (seed 000), with the functions above

def practice_token_weights():
    """1. On-policy (rho = 1) weight dJ/dlogp of the first token of answers of length 4, 12, 4, 12."""
    rewards, lengths, L_max, T = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([4, 12, 4, 12]), 16, 12
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()                # (4, 12)
    rows = {}
    for label, loss_type, scale in [("GRPO", "grpo", "group"), ("DAPO", "dapo", "group"),
                                    ("Dr. GRPO", "dr_grpo", "none")]:
        logp = torch.zeros(4, T, requires_grad=True)         # values do not matter: we read the gradient
        adv = group_advantages(rewards, group_size=4, scale=scale)
        loss, _ = policy_loss(loss_type, logp, logp.detach(), adv, mask, max_new_tokens=L_max)
        loss.backward()
        rows[label] = (0.0 - logp.grad[:, 0]).tolist()       # loss = -J; "0.0 -" also turns -0.0 into +0.0
    return rows


def practice_rare_token(n_tokens=10):
    """2. A rare token went from pi_old = 0.01 to pi = 0.02 (rho = 2), the others stay at 0.5; A = +1."""
    old_logp = torch.full((1, n_tokens), math.log(0.5))
    old_logp[0, 0] = math.log(0.01)
    rows = {}
    for label, loss_type, hp in [("GRPO, eps=0.2", "grpo", {}), ("DAPO, eps_high=0.28", "dapo", {"eps_high": 0.28}),
                                 ("CISPO, weight <= 5", "cispo", {"cispo_eps_high": 4.0}), ("GSPO", "gspo", {})]:
        logp = old_logp.clone()
        logp[0, 0] = math.log(0.02)
        logp.requires_grad_(True)
        loss, _ = policy_loss(loss_type, logp, old_logp, torch.tensor([1.0]), torch.ones(1, n_tokens), **hp)
        loss.backward()
        grad = 0.0 - logp.grad[0]                            # dJ/dlogp
        rows[label] = (grad[0].item(), grad[1].item())       # (rare token, a common token)
    return rows


def practice_entropy(adv, probs=(0.7, 0.2, 0.05, 0.05), lr=1.0):
    """3. Entropy before/after one exact policy-gradient ascent step on J = sum_a softmax(z)_a * adv_a."""
    z = torch.log(torch.tensor(probs)).requires_grad_(True)  # logits with softmax(z) = probs
    (torch.softmax(z, -1) * torch.tensor(adv)).sum().backward()
    z_new = z.detach() + lr * z.grad                         # ascent: J is maximised
    return entropy_from_logits(z.detach()).item(), entropy_from_logits(z_new).item()


ENTROPY_CASES = {"reward the common token": [1.0, -1.0, -1.0, -1.0], "reward the rare token": [-1.0, -1.0, 1.0, -1.0]}

if __name__ == "__main__":
    print("token weight (dJ/d log pi):  right.4  right.12  wrong.4  wrong.12")
    for label, weights in practice_token_weights().items():
        print(f"{label:9s}", "  ".join(f"{w:+.4f}" for w in weights))
    print()
    for label, (rare, common) in practice_rare_token().items():
        print(f"{label:20s} rare token grad {rare:+.3f}, common {common:+.3f}")
    for name, adv in ENTROPY_CASES.items():
        h_before, h_after = practice_entropy(adv)
        print(f"{name}: H = {h_before:.3f} -> {h_after:.3f}")
