"""
The three experiments of the "Practice" section of the lesson "DAPO, GSPO, CISPO" (seeds/000), run
with losses.py's own functions: `python practice.py` prints the lesson's tables, number for number
(tests/test_losses.py asserts every one).

    1. the gradient weight of a token under GRPO, DAPO and Dr. GRPO (the length bias)
    2. a rare token whose probability doubled: which losses still push it (CISPO) and which clip it
    3. the entropy after one exact policy-gradient step that rewards a common or a rare token
"""
import math

import torch

from losses import entropy_from_logits, group_advantages, policy_loss

def practice_token_weights():
    """1. On-policy (rho = 1) weight dJ/dlogp of the first token of answers of length 4, 12, 4,
    12."""
    rewards, lengths, L_max, T = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([4, 12, 4, 12]), 16, 12
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()                # (4, 12)
    rows = {}
    for label, loss_type, scale in [("GRPO", "grpo", "group"), ("DAPO", "dapo", "group"),
                                    ("Dr. GRPO", "dr_grpo", "none")]:
        # values do not matter: we read the gradient
        logp = torch.zeros(4, T, requires_grad=True)
        adv = group_advantages(rewards, group_size=4, scale=scale)
        loss, _ = policy_loss(loss_type, logp, logp.detach(), adv, mask, max_new_tokens=L_max)
        loss.backward()
        # loss = -J; "0.0 -" also turns -0.0 into +0.0
        rows[label] = (0.0 - logp.grad[:, 0]).tolist()
    return rows


def practice_rare_token(n_tokens=10):
    """2. A rare token went from pi_old = 0.01 to pi = 0.02 (rho = 2), the others stay at 0.5; A =
    +1."""
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
    """3. Entropy before/after one exact policy-gradient ascent step on J = sum_a softmax(z)_a *
    adv_a."""
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
