"""The critic side (ppo, vapo): GAE against hand computations, the REINFORCE and perfect-critic
limits, the clipped value loss, value pre-training on a fixed batch, and train.py end to end with a
critic."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import SMALL_MODEL_DIR, train_log
from critic import gae, length_adaptive_lambda, value_loss
from model import completion_values, load_critic, save_critic

# one answer of 3 tokens, outcome reward 1 on the last token; V = 0.5, 0.6, 0.8 before each token
REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.6, 0.8]])
MASK = torch.ones(1, 3)


@pytest.mark.parametrize("lam, expected", [
    # delta = r_t + V_t+1 - V_t = (0.1, 0.2, 0.2); A_t = delta_t + lam A_t+1
    (0.0, [0.1, 0.2, 0.2]),                       # TD(0): A = delta
    (0.5, [0.1 + 0.5 * 0.3, 0.2 + 0.5 * 0.2, 0.2]),  # (0.25, 0.3, 0.2)
    (1.0, [0.5, 0.4, 0.2]),                       # Monte Carlo: A = R - V_t = 1 - V_t
])
def test_gae_by_hand(lam, expected):
    adv, ret = gae(REWARDS, VALUES, MASK, lam)
    assert torch.allclose(adv, torch.tensor([expected]), atol=1e-6)
    assert torch.allclose(ret, adv + VALUES, atol=1e-6)          # the critic's target: A + V


def test_gae_padding_and_per_row_lambda():
    """Right padding is skipped (V after the last real token is 0), and a (B,) lambda acts row by
    row."""
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    # 9.0: garbage on padding
    values = torch.tensor([[0.5, 0.6, 0.8, 9.0], [1.0, 1.5, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, torch.tensor([0.5, 1.0]))
    assert torch.allclose(adv[0], torch.tensor([0.25, 0.3, 0.2, 0.0]), atol=1e-6)
    assert torch.allclose(adv[1], torch.tensor([2.0 - 1.0, 2.0 - 1.5, 0.0, 0.0]), atol=1e-6)
    assert (ret * (1 - mask) == 0).all()


def test_length_adaptive_lambda():
    """VAPO: lambda = 1 - 1/(alpha l), alpha = 0.05: l = 40 -> 0.5, l = 100 -> 0.8,
    l = 1000 -> 0.98, l <= 20 -> 0."""
    lam = length_adaptive_lambda(torch.tensor([40.0, 100.0, 1000.0, 20.0, 5.0]), alpha=0.05)
    assert torch.allclose(lam, torch.tensor([0.5, 0.8, 0.98, 0.0, 0.0]), atol=1e-6)
    # and GAE with it: the 40-token answer uses lambda 0.5 exactly like a scalar 0.5
    rewards = torch.zeros(1, 40)
    rewards[0, -1] = 1.0
    values = torch.linspace(0, 1, 40)[None]
    assert torch.allclose(gae(rewards, values, torch.ones(1, 40), lam[:1])[0],
                          gae(rewards, values, torch.ones(1, 40), 0.5)[0])


def test_reinforce_and_perfect_critic_limits():
    """lambda = 1 with V = 0: every token's advantage is the outcome reward (REINFORCE); with
    V_t = the true return (here R at every token: only the outcome pays), every advantage is 0."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.7], [0.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    R = torch.tensor([0.7, -1.0])
    adv, ret = gae(rewards, torch.zeros(2, 4), mask, 1.0)
    assert torch.equal(adv, R[:, None] * mask) and torch.equal(ret, adv)
    adv, _ = gae(rewards, R[:, None] * mask, mask, 1.0)
    assert torch.allclose(adv, torch.zeros(2, 4))
    # any lambda: a perfect critic leaves 0
    adv, _ = gae(rewards, R[:, None] * mask, mask, 0.3)
    assert torch.allclose(adv, torch.zeros(2, 4))


def test_clipped_value_loss_by_hand():
    """V_old = 0, V = 1, R = 2, vf_clip = 0.5: V_clip = 0.5, max((1-2)^2, (0.5-2)^2) = 2.25 ->
    0.5 * 2.25; second token V_old = V = 0.2, R = 0.3: 0.5 * 0.01. Token mean over 2 tokens."""
    values = torch.tensor([[1.0, 0.2]], requires_grad=True)
    loss, stats = value_loss(values, torch.tensor([[0.0, 0.2]]), torch.tensor([[2.0, 0.3]]),
                             torch.ones(1, 2), vf_clip=0.5)
    assert loss.item() == pytest.approx((0.5 * 2.25 + 0.5 * 0.01) / 2)
    assert stats["clip_frac"] == 0.5 and stats["loss"] == pytest.approx((0.5 * 1 + 0.5 * 0.01) / 2)
    loss.backward()
    # clipped: no gradient
    assert values.grad[0, 0] == 0 and values.grad[0, 1].item() == pytest.approx(0.5 * (0.2 - 0.3))


def test_value_pretraining_fits_a_fixed_batch(tmp_path):
    """VAPO sec. 3.1 in miniature: the critic alone, fitted to Monte-Carlo returns (lambda = 1) of a
    fixed batch; a fresh critic predicts 0 everywhere, its loss falls, and a saved critic keeps its
    head."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "policy")
    critic = load_critic(str(tmp_path / "policy"))
    g = torch.Generator().manual_seed(1)
    prompt_ids, prompt_mask = (torch.randint(1, 64, (8, 5), generator=g),
                               torch.ones(8, 5, dtype=torch.long))
    completion_ids = torch.randint(1, 64, (8, 6), generator=g)
    mask = (torch.arange(6)[None] < torch.tensor([6, 2, 5, 3, 6, 1, 4, 6])[:, None]).float()
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    last = (mask.sum(1).long() - 1)[:, None]
    rewards = torch.zeros_like(mask).scatter(1, last, outcome[:, None])
    args = (prompt_ids, prompt_mask, completion_ids, mask)
    assert torch.equal(completion_values(critic, *args), torch.zeros(8, 6))      # zero head: V = 0
    # MC returns: the outcome
    _, returns = gae(rewards, torch.zeros_like(mask), mask, 1.0)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        values = completion_values(critic, *args)
        loss, _ = value_loss(values, values.detach(), returns, mask, vf_clip=10.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(0.5 * (mask * returns ** 2).sum().item() / mask.sum().item())
    assert losses[-1] < 0.2 * losses[0], losses
    save_critic(str(tmp_path / "critic"), critic)
    again = load_critic(str(tmp_path / "critic"))
    assert torch.allclose(completion_values(again, *args), completion_values(critic, *args))


TINY = ["config/cpu_demo.py", "--rollout_engine=hf", "--prompts_per_step=2", "--group_size=4",
        "--max_new_tokens=8", "--eval_interval=0", "--micro_batch_size=4",
        f"--init_from={SMALL_MODEL_DIR}"]  # the 2-layer model: the critic's bookkeeping is the test


def train(*args):
    return train_log(*TINY, *args)


@pytest.mark.slow
def test_ppo_and_vapo_train_checkpoint_and_resume(tmp_path, small_model):
    """ppo with a KL reward and 2 iterations; vapo with 1 warm-up step (the policy waits), a
    checkpoint with the critic, and a resume that continues it."""
    log = train(f"--out_dir={tmp_path / 'ppo'}", "--ckpt_interval=-1", "--loss_type=ppo",
                "--max_iters=1", "--beta=0.05",
                "--num_iterations=2", "--reward_wrong=-1.0")
    r = log[-1]
    # first pass: V = V_old, nothing clipped
    assert r["policy_frozen"] == 0 and r["value/clip_frac"] == 0.0
    # a fresh critic says V = 0: with rewards +-1 its baseline error mean(R^2) is 1, never below
    # GRPO's group mean's
    assert r["value/v0"] == 0.0 and r["value/baseline_mse"] == pytest.approx(1.0)
    assert r["value/group_baseline_mse"] <= r["value/baseline_mse"]
    # KL is in the reward
    # V_old = 0 everywhere: the error R - V_old is R itself, so the explained variance is exactly 0
    assert r["value/loss"] > 0 and r["value/explained_var"] == pytest.approx(0.0, abs=1e-9)
    assert "loss/kl" not in r
    out = tmp_path / "vapo"
    train(f"--out_dir={out}", "--loss_type=vapo", "--max_iters=1", "--value_warmup_steps=1",
          "--reward_wrong=-1.0")
    # value pre-training: after the warm-up step the policy is still the initial model, the critic
    # is not
    from transformers import AutoModelForCausalLM
    initial, saved = (AutoModelForCausalLM.from_pretrained(d).state_dict()
                      for d in (small_model, out / "ckpt"))
    assert all(torch.equal(initial[k], saved[k]) for k in initial)
    assert load_critic(str(out / "ckpt" / "critic")).score.weight.abs().sum() > 0
    log = train(f"--out_dir={out}", "--loss_type=vapo", "--max_iters=3", "--value_warmup_steps=1",
                "--reward_wrong=-1.0", "--init_from=resume", "--ckpt_interval=-1")
    assert [x["step"] for x in log] == [1, 2, 3] and [x["policy_frozen"] for x in log] == [1, 0, 0]
    # the resumed critic is the trained one
    assert log[1]["value/v0"] != 0.0
