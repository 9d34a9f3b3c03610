"""DAPO dynamic sampling and batch merging, with a fake rollout (no model): the verdicts are
scripted."""
import torch

from rollout import concat_batches, dynamic_sample

G = 4


def fake_rollout(verdicts_by_prompt):
    """A rollout_fn whose prompt p gets the scripted verdicts; prompt and completion widths vary per
    call."""
    def rollout_fn(rows):
        B = len(rows) * G
        P, C = 3 + len(rows), 2 + len(rows) % 3
        correct = torch.tensor([v for r in rows for v in verdicts_by_prompt[r]])
        return {"prompt_ids": torch.full((B, P), 7),
                "prompt_mask": torch.ones(B, P, dtype=torch.long),
                "completion_ids": torch.tensor([[r] * C for r in rows for _ in range(G)]),
                "completion_mask": torch.ones(B, C), "rollout_logp": None,
                "truncated": torch.zeros(B, dtype=torch.bool),
                "completions": [f"prompt {r}" for r in rows for _ in range(G)], "correct": correct}
    return rollout_fn


def cursor(n_prompts):
    state = {"next": 0, "served": []}

    def next_rows(n):
        rows = [(state["next"] + j) % n_prompts for j in range(n)]
        state["next"] += n
        state["served"] += rows
        return rows
    return next_rows, state


def test_dynamic_sampling_fills_the_step_with_live_groups():
    # prompts 0..19: every third prompt is live (mixed verdicts), the others all-right or all-wrong
    verdicts = {p: ([1, 0, 0, 1] if p % 3 == 0 else [1] * G if p % 2 else [0] * G)
                for p in range(20)}
    next_rows, state = cursor(20)
    batch, stats = dynamic_sample(next_rows, fake_rollout(verdicts), prompts_per_step=4,
                                  group_size=G, oversample=1.5, max_rounds=0)
    groups = [batch["completions"][i] for i in range(0, len(batch["completions"]), G)]
    live_served = [p for p in state["served"] if p % 3 == 0]
    assert stats["groups_live"] >= 4 and len(groups) == stats["groups_live"]
    # no live group lost, none degenerate kept
    assert groups == [f"prompt {p}" for p in live_served]
    assert stats["groups_sampled"] == len(state["served"])
    assert stats["groups_degenerate"] == len(state["served"]) - len(live_served)
    # the rows of a group stay together and in order, and every tensor was re-padded consistently
    assert batch["correct"].view(-1, G).tolist() == [[1, 0, 0, 1]] * len(groups)
    assert batch["completion_ids"][::G, 0].tolist() == live_served
    assert batch["prompt_ids"].shape[0] == batch["completion_mask"].shape[0] == len(groups) * G


def test_the_bound_on_rounds_holds_and_all_degenerate_gives_none():
    verdicts = {p: [1] * G for p in range(10)}
    next_rows, state = cursor(10)
    batch, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=1.0,
                                  max_rounds=3)
    assert batch is None and stats["gen_rounds"] == 3 and stats["groups_live"] == 0
    assert stats["groups_degenerate"] == stats["groups_sampled"] == 12
    assert stats["samples_correct"] == stats["samples"] == 12 * G


def test_partial_fill_after_the_bound_keeps_what_it_found():
    verdicts = {p: ([0, 1, 1, 1] if p == 2 else [0] * G) for p in range(50)}
    next_rows, _ = cursor(50)
    batch, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 8, G, oversample=2.0,
                                  max_rounds=2)
    assert stats["gen_rounds"] == 2 and stats["groups_live"] == 1
    assert batch["completions"] == ["prompt 2"] * G


def test_concat_batches_repads_prompts_left_and_completions_right():
    a = {"prompt_ids": torch.tensor([[5, 6]]), "prompt_mask": torch.tensor([[1, 1]]),
         "completion_ids": torch.tensor([[1, 2, 3]]),
         "completion_mask": torch.tensor([[1.0, 1.0, 1.0]]),
         "rollout_logp": torch.tensor([[-0.1, -0.2, -0.3]]), "completions": ["a"]}
    b = {"prompt_ids": torch.tensor([[4, 5, 6, 7]]), "prompt_mask": torch.tensor([[1, 1, 1, 1]]),
         "completion_ids": torch.tensor([[9]]), "completion_mask": torch.tensor([[1.0]]),
         "rollout_logp": torch.tensor([[-0.5]]), "completions": ["b"]}
    out = concat_batches([a, b], pad_id=0)
    assert out["prompt_ids"].tolist() == [[0, 0, 5, 6], [4, 5, 6, 7]]
    assert out["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert out["completion_ids"].tolist() == [[1, 2, 3], [9, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert torch.allclose(out["rollout_logp"], torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0, 0]]))
    assert out["completions"] == ["a", "b"]


def test_ranks_stay_in_lockstep_while_one_rank_has_no_live_group():
    """Two ranks simulated from rank 0's side: reduce_sum stands in for all_reduce and adds the
    other rank's values. Each round the loop sums (live groups, ranks without a live group); the
    other rank's prompts are all degenerate (0 live, 1 rank without), so rank 0 keeps generating
    with it, round for round, up to the bound, although it has enough live groups after the first
    round."""
    calls = []

    def reduce_sum(x):
        calls.append(x)
        # odd calls: live counts; even calls: ranks without one
        return x + (0 if len(calls) % 2 == 1 else 1)

    verdicts = {p: [1, 0, 1, 1] for p in range(100)}
    next_rows, state = cursor(100)
    batch, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=1.0,
                                  max_rounds=3, reduce_sum=reduce_sum, world_size=2)
    # the condition was evaluated 4 times
    assert stats["gen_rounds"] == 3 and len(calls) == 2 * 3 + 2
    # each round asks for ceil(missing * oversample / world_size) prompts, missing >= world_size:
    # 4 missing -> 2 prompts, then 4 - 2 = 2 -> 1, then max(4 - 3, 2) = 2 -> 1
    assert len(state["served"]) == 2 + 1 + 1 and stats["groups_live"] == 4
    assert batch["completions"][::G] == [f"prompt {p}" for p in state["served"]]
