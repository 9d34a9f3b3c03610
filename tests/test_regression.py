"""A lasting regression test for refactors of the update: one step on fixed samples in fp32, through
the functions train.py calls (group_advantages, model.completion_logprobs, losses.policy_loss,
critic.py), compared with values stored when they were last checked. fp32 on a tiny model is
deterministic to ~1e-7 relative on any x86 CPU (unlike a stored trajectory: bf16 kernels differ per
CPU and one flipped sample changes a run), so the tolerance is 1e-5 relative: far above round-off,
far below any change of a formula. After a deliberate change of the numbers, print the new values
with `python tests/test_regression.py`."""
import math
import os
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from critic import critic_advantages, value_loss  # noqa: E402
from losses import group_advantages, policy_loss  # noqa: E402
from model import completion_logprobs, completion_values  # noqa: E402

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, num_labels=1)
CASES = {  # name: (loss_type, policy_loss keyword arguments)
    "grpo": ("grpo", {}),
    "dapo_kl_entropy": ("dapo", {"beta": 0.05, "entropy_coef": 0.01}),
    "dr_grpo": ("dr_grpo", {"max_new_tokens": 7}),
    "gspo": ("gspo", {"eps_low": 0.15, "eps_high": 0.15}),
    "cispo": ("cispo", {"cispo_eps_high": 0.1}),
    "sapo": ("sapo", {}),
    "ppo": ("ppo", {}),
}


def one_step(loss_type, hp):
    """A tiny Llama, 2 groups of 4 fixed answers, one SGD step to move pi off pi_old, then the loss
    of the second pass: loss, its statistics and the gradient norm."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(CFG)
    g = torch.Generator().manual_seed(1)
    B, P, C = 8, 5, 7
    prompt_ids, prompt_mask = torch.randint(1, 64, (B, P), generator=g), torch.ones(B, P, dtype=torch.long)
    completion_ids = torch.randint(1, 64, (B, C), generator=g)
    mask = (torch.arange(C)[None] < torch.tensor([7, 2, 5, 3, 6, 1, 4, 7])[:, None]).float()
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.3, 1.0, 0.7])
    # temperature 0.9, fp32 body
    args = (prompt_ids, prompt_mask, completion_ids, mask, 0.9, None)
    with torch.no_grad():
        old_logp = completion_logprobs(model, *args)[0]
    advantages = group_advantages(rewards, 4)
    if loss_type == "ppo":
        torch.manual_seed(2)
        critic = LlamaForTokenClassification(CFG)
        mb = {"completion_mask": mask, "rewards": rewards, "old_values": completion_values(critic, *args[:4]).detach()}
        critic_advantages([mb], "gae", 0.95, 0.05)
        advantages = mb["advantages"]
        values = completion_values(critic, *args[:4])
        vloss, _ = value_loss(values, mb["old_values"] + 0.1, mb["returns"], mask, 0.5)
    hp = {**hp, "ref_logp": old_logp - 0.05} if hp.get("beta") else hp
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):   # pass 1 moves the policy; pass 2 is measured off-policy
        optimizer.zero_grad()
        logp, entropy = completion_logprobs(model, *args)
        loss, stats = policy_loss(loss_type, logp, old_logp, advantages, mask, entropy=entropy, **hp)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
        optimizer.step()
    out = {"loss": loss.item(), "grad_norm": grad_norm, **{k: stats[k] for k in sorted(stats)}}
    if loss_type == "ppo":
        out["value_loss"] = vloss.item()
    return out


STORED = {  # measured 2026-11-30 (AMD EPYC, torch 2.13 CPU); regenerate only on purpose
    'grpo': {
        'loss': -0.16974502801895142, 'grad_norm': 0.7265229821205139,
        'clip_frac': 0.4571428596973419, 'clip_frac_high': 0.22857142984867096,
        'clip_frac_low': 0.22857142984867096, 'cov_logp_adv': 0.23505167663097382,
        'entropy': 4.1464715003967285, 'log_ratio_abs_mean': 0.21807460486888885, 'n_tokens': 35.0,
        'ratio_mean': 1.0297210216522217, 'zero_grad_frac': 0.4571428596973419,
    },
    'dapo_kl_entropy': {
        'loss': -0.3440209627151489, 'grad_norm': 1.0955506563186646,
        'clip_frac': 0.37142857909202576, 'clip_frac_high': 0.17142857611179352,
        'clip_frac_low': 0.20000000298023224, 'cov_logp_adv': 0.24251820147037506,
        'entropy': 4.14661979675293, 'kl': 0.02980518713593483,
        'log_ratio_abs_mean': 0.22443288564682007, 'n_tokens': 35.0,
        'ratio_mean': 1.0527570247650146, 'zero_grad_frac': 0.37142857909202576,
    },
    'dr_grpo': {
        'loss': -0.15317031741142273, 'grad_norm': 0.8060594797134399,
        'clip_frac': 0.17142857611179352, 'clip_frac_high': 0.08571428805589676,
        'clip_frac_low': 0.08571428805589676, 'cov_logp_adv': 0.164792999625206,
        'entropy': 4.147398948669434, 'log_ratio_abs_mean': 0.14721541106700897, 'n_tokens': 35.0,
        'ratio_mean': 1.026369571685791, 'zero_grad_frac': 0.17142857611179352,
    },
    'gspo': {
        'loss': -0.14181718230247498, 'grad_norm': 0.5541752576828003,
        'clip_frac': 0.6000000238418579, 'clip_frac_high': 0.20000000298023224,
        'clip_frac_low': 0.4000000059604645, 'cov_logp_adv': 0.23505164682865143,
        'entropy': 4.1464715003967285, 'log_ratio_abs_mean': 0.21807460486888885, 'n_tokens': 35.0,
        'ratio_mean': 1.0275834798812866, 'zero_grad_frac': 0.6000000238418579,
    },
    'cispo': {
        'loss': 0.8160831332206726, 'grad_norm': 1.349929690361023,
        'clip_frac': 0.5714285969734192, 'clip_frac_high': 0.5714285969734192,
        'clip_frac_low': 0.0, 'cov_logp_adv': 0.2425406277179718, 'entropy': 4.146615028381348,
        'log_ratio_abs_mean': 0.22455428540706635, 'n_tokens': 35.0,
        'ratio_mean': 1.0533002614974976, 'zero_grad_frac': 0.0,
    },
    'sapo': {
        'loss': -0.2970181703567505, 'grad_norm': 1.406697154045105, 'clip_frac': 0.0,
        'clip_frac_high': 0.0, 'clip_frac_low': 0.0, 'cov_logp_adv': 0.23505167663097382,
        'entropy': 4.1464715003967285, 'log_ratio_abs_mean': 0.21807460486888885, 'n_tokens': 35.0,
        'ratio_mean': 1.0297210216522217, 'zero_grad_frac': 0.0,
    },
    'ppo': {
        'loss': -0.166334867477417, 'grad_norm': 0.8097580671310425,
        'clip_frac': 0.48571428656578064, 'clip_frac_high': 0.22857142984867096,
        'clip_frac_low': 0.2571428716182709, 'cov_logp_adv': 0.22619569301605225,
        'entropy': 4.146852493286133, 'log_ratio_abs_mean': 0.20376063883304596, 'n_tokens': 35.0,
        'ratio_mean': 1.0212860107421875, 'zero_grad_frac': 0.48571428656578064,
        'value_loss': 0.20822322368621826,
    },
}


@pytest.mark.parametrize("name", CASES)
def test_one_fp32_update_matches_the_stored_values(name):
    got = one_step(*CASES[name])
    expected = STORED[name]
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert math.isclose(got[k], v, rel_tol=1e-5, abs_tol=1e-7), (name, k, got[k], v)


if __name__ == "__main__":
    print("STORED = {")
    for name in CASES:
        print(f"    {name!r}: {one_step(*CASES[name])!r},")
    print("}")
