"""DAPO dynamic sampling and its screen, with a fake rollout (no model): the verdicts are
scripted; make_batch, which pads the merged samples once; fitting_prompts (the offline model's
tokenizer), which skips the prompts longer than max_prompt_len."""
import torch

from rollout import dynamic_sample, make_batch

G = 4


# widths that vary from group to group and from round to round; prompts p % 3 == 0 (the live ones
# of the first test) are 1 or 2 tokens long with answers of 1 .. G tokens, the others are wider
prompt_len = lambda p: 1 + (p // 3) % 2 + 3 * (p % 3 > 0)
answer_len = lambda p, g: 1 + g + p % 3


def fake_rollout(verdicts_by_prompt):
    """A rollout_fn whose prompt p gets the scripted verdicts, as samples (generate's per-sample
    lists, plus 'correct')."""
    def rollout_fn(rows, n):
        assert n == G
        return {"prompt_ids": [[7] * prompt_len(r) for r in rows for _ in range(G)],
                "completion_ids": [[r] * answer_len(r, g) for r in rows for g in range(G)],
                "rollout_logp": None, "truncated": [False] * (len(rows) * G),
                "completions": [f"prompt {r}" for r in rows for _ in range(G)],
                "correct": [float(v) for r in rows for v in verdicts_by_prompt[r]]}
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
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), prompts_per_step=4,
                                    group_size=G, oversample=1.5, max_rounds=0)
    assert stats["gen_rounds"] > 1  # the rows below come from several rounds
    groups = samples["completions"][::G]
    live_served = [p for p in state["served"] if p % 3 == 0]
    assert stats["groups_live"] >= 4 and len(groups) == stats["groups_live"]
    # no live group lost, none degenerate kept
    assert groups == [f"prompt {p}" for p in live_served]
    assert stats["groups_sampled"] == len(state["served"])
    assert stats["groups_degenerate"] == len(state["served"]) - len(live_served)
    # the rows of a group stay together and in order, in every list alike
    assert samples["correct"] == [1.0, 0.0, 0.0, 1.0] * len(groups)
    lengths = [answer_len(p, g) for p in live_served for g in range(G)]
    prompt_lengths = [prompt_len(p) for p in live_served for _ in range(G)]
    assert [len(c) for c in samples["completion_ids"]] == lengths
    assert samples["completion_ids"][::G] == [[p] for p in live_served]
    assert [len(p) for p in samples["prompt_ids"]] == prompt_lengths
    assert samples["rollout_logp"] is None and len(samples["truncated"]) == len(groups) * G
    # padded once, at the width of the rows kept (2 and G): no degenerate group's row widens it
    batch = make_batch(samples, pad_id=0)
    assert batch["prompt_ids"].shape == (len(groups) * G, 2)
    assert batch["completion_ids"].shape == (len(groups) * G, G)
    assert batch["prompt_mask"].sum(1).tolist() == prompt_lengths
    assert batch["completion_mask"].sum(1).tolist() == lengths
    assert batch["correct"].dtype == torch.float32
    assert batch["correct"].view(-1, G).tolist() == [[1, 0, 0, 1]] * len(groups)


def test_the_bound_on_rounds_holds_and_all_degenerate_gives_none():
    verdicts = {p: [1] * G for p in range(10)}
    next_rows, state = cursor(10)
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=1.0,
                                    max_rounds=3)
    assert samples is None and stats["gen_rounds"] == 3 and stats["groups_live"] == 0
    assert stats["groups_degenerate"] == stats["groups_sampled"] == 12
    assert stats["samples_correct"] == stats["samples"] == 12 * G


def test_partial_fill_after_the_bound_keeps_what_it_found():
    verdicts = {p: ([0, 1, 1, 1] if p == 2 else [0] * G) for p in range(50)}
    next_rows, _ = cursor(50)
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 8, G, oversample=2.0,
                                    max_rounds=2)
    assert stats["gen_rounds"] == 2 and stats["groups_live"] == 1
    assert samples["completions"] == ["prompt 2"] * G


def test_trim_trains_on_exactly_the_share_and_keeps_sampling_while_a_rank_lacks_one():
    """trim (DAPO in verl): one round of 16 prompts brings 6 live groups, the first 4 train. Under
    DDP (2 ranks, scripted): this rank has its share after round 1 but samples one more prompt per
    round while the other rank lacks its share, then trains on its first 2 groups all the same."""
    verdicts = {p: ([1, 0, 0, 1] if p % 3 == 0 else [1] * G) for p in range(20)}
    next_rows, state = cursor(20)
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=4.0,
                                    max_rounds=0, trim=True)
    assert len(state["served"]) == 16 and stats["gen_rounds"] == 1
    assert stats["groups_live"] == 4 and stats["groups_sampled"] == 16
    assert samples["completions"][::G] == ["prompt 0", "prompt 3", "prompt 6", "prompt 9"]
    assert len(samples["correct"]) == len(samples["completion_ids"]) == 4 * G
    calls = []

    def reduce_sum(x):  # the other rank lacks its share at the first two checks
        calls.append(x)
        return x + (1 if len(calls) <= 2 else 0)

    verdicts = {p: [1, 0, 1, 1] for p in range(100)}
    next_rows, state = cursor(100)
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=1.0,
                                    max_rounds=0, reduce_sum=reduce_sum, world_size=2, trim=True)
    # share 2: 2 prompts, then 1 (max(share - have, 1)); trimmed to the first 2
    assert calls == [1, 0, 0] and stats["gen_rounds"] == 2 and len(state["served"]) == 3
    assert stats["groups_live"] == 2 and samples["completions"][::G] == ["prompt 0", "prompt 1"]


def dealt_rollout(verdicts_by_prompt, calls):
    """A rollout_fn(rows, n) that deals each prompt its scripted verdicts in order, n at a time: a
    prompt asked twice (the screen, then the rest) gets its next n. Answer g of prompt p is 'p.g',
    its log-prob p + g / 10. calls: each call's rows and n, appended."""
    dealt = {}

    def rollout_fn(rows, n):
        calls.append((list(rows), n))
        answers = [(r, g) for r in rows for g in range(dealt.get(r, 0), dealt.get(r, 0) + n)]
        dealt.update({r: dealt.get(r, 0) + n for r in rows})
        return {"completions": [f"{r}.{g}" for r, g in answers],
                "rollout_logp": [[r + g / 10] for r, g in answers],
                "truncated": [False] * len(answers),
                "correct": [float(verdicts_by_prompt[r][g]) for r, g in answers]}
    return rollout_fn


def test_the_screen_completes_only_the_prompts_whose_first_answers_disagree():
    """screen=2 of G=4: prompt 0 (live at G, but its screen agrees) is passed over, 2 is all
    wrong; 1, 3 and 4 open. trim, 2 groups wanted: 1 and 3 get their other 2 answers, after
    their screen's, in every list alike; 4 is not completed. Without trim 4 is too."""
    verdicts = {0: [1, 1, 0, 0], 1: [1, 0, 1, 1], 2: [0, 0, 0, 0], 3: [0, 1, 1, 1], 4: [1, 0, 0, 0]}
    calls = []
    next_rows, _ = cursor(5)
    samples, stats = dynamic_sample(next_rows, dealt_rollout(verdicts, calls), 2, G,
                                    oversample=2.5, max_rounds=0, trim=True, screen=2)
    assert calls == [([0, 1, 2, 3, 4], 2), ([1, 3], 2)]
    assert samples["completions"] == ["1.0", "1.1", "1.2", "1.3", "3.0", "3.1", "3.2", "3.3"]
    assert samples["rollout_logp"] == [[1.0], [1.1], [1.2], [1.3], [3.0], [3.1], [3.2], [3.3]]
    assert samples["correct"] == [1, 0, 1, 1, 0, 1, 1, 1] and len(samples["truncated"]) == 8
    # the screens' 10 answers (5 right), the rest's 4 (all right); prompts 0 and 2 degenerate
    assert stats == {"gen_rounds": 1, "groups_sampled": 5, "groups_degenerate": 2,
                     "groups_live": 2, "samples": 14, "samples_correct": 9.0}
    calls = []
    next_rows, _ = cursor(5)
    samples, stats = dynamic_sample(next_rows, dealt_rollout(verdicts, calls), 2, G,
                                    oversample=2.5, max_rounds=0, screen=2)
    assert calls == [([0, 1, 2, 3, 4], 2), ([1, 3, 4], 2)]
    assert samples["completions"][::G] == ["1.0", "3.0", "4.0"] and stats["groups_live"] == 3


def test_a_screen_with_no_open_prompt_samples_no_rest_and_the_next_round_goes_on():
    """Round 1's screens all agree: its rest is an empty call (generate returns empty lists and
    no log-probs then) and nothing is kept; round 2 finds prompt 3."""
    verdicts = {p: [1, 0, 0, 0] if p == 3 else [1] * G for p in range(6)}
    calls = []

    dealt = dealt_rollout(verdicts, calls)

    def rollout_fn(rows, n):  # generate's answer to no prompt: rollout_logp None
        samples = dealt(rows, n)
        return samples if rows else {**samples, "rollout_logp": None}
    next_rows, _ = cursor(6)
    samples, stats = dynamic_sample(next_rows, rollout_fn, 1, G, oversample=3.0, max_rounds=0,
                                    trim=True, screen=2)
    assert calls == [([0, 1, 2], 2), ([], 2), ([3, 4, 5], 2), ([3], 2)]
    assert stats["gen_rounds"] == 2 and stats["groups_live"] == 1
    assert samples["completions"] == ["3.0", "3.1", "3.2", "3.3"]


def test_make_batch_pads_prompts_left_and_completions_right_once():
    """Two rounds' samples merged as dynamic_sample merges them (list concatenation), then padded:
    prompts to the widest on the left, completions to the longest on the right; the trainer's
    'correct' list becomes a float tensor, what it carries along for samples.jsonl (prompt and
    answer, which a dataset may write as ints) stays as it was."""
    a = {"prompt_ids": [[5, 6]], "completion_ids": [[1, 2, 3]],
         "rollout_logp": [[-0.1, -0.2, -0.3]], "truncated": [True], "completions": ["a"],
         "correct": [1.0], "prompt": ["p"], "answer": [12]}
    b = {"prompt_ids": [[4, 5, 6, 7]], "completion_ids": [[9]], "rollout_logp": [[-0.5]],
         "truncated": [False], "completions": ["b"], "correct": [0.0], "prompt": ["q"],
         "answer": [7]}
    out = make_batch({k: a[k] + b[k] for k in a}, pad_id=0)
    assert out["prompt_ids"].tolist() == [[0, 0, 5, 6], [4, 5, 6, 7]]
    assert out["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert out["completion_ids"].tolist() == [[1, 2, 3], [9, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert torch.allclose(out["rollout_logp"], torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0, 0]]))
    assert out["truncated"].tolist() == [True, False] and out["completions"] == ["a", "b"]
    assert out["correct"].tolist() == [1.0, 0.0]
    assert out["prompt"] == ["p", "q"] and out["answer"] == [12, 7]
    dtypes = {k: out[k].dtype for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                        "completion_mask", "rollout_logp", "truncated", "correct")}
    assert dtypes == {"prompt_ids": torch.long, "prompt_mask": torch.long,
                      "completion_ids": torch.long, "completion_mask": torch.float32,
                      "rollout_logp": torch.float32, "truncated": torch.bool,
                      "correct": torch.float32}


def test_make_batch_of_no_sample_has_the_usual_layout():
    """An eval rank with no problem: generate's empty samples (rollout_logp None), 'correct' added
    by the trainer."""
    empty = {"prompt_ids": [], "completion_ids": [], "rollout_logp": None, "truncated": [],
             "completions": [], "correct": []}
    out = make_batch(empty, pad_id=0)
    assert out["prompt_ids"].shape == out["prompt_mask"].shape == (0, 0)
    assert out["completion_ids"].shape == out["completion_mask"].shape == (0, 1)
    assert out["truncated"].shape == out["correct"].shape == (0,)
    assert out["rollout_logp"] is None and out["completions"] == []
    assert out["correct"].sum().item() == 0 and out["correct"].view(-1, 4).shape == (0, 4)


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
    samples, stats = dynamic_sample(next_rows, fake_rollout(verdicts), 4, G, oversample=1.0,
                                    max_rounds=3, reduce_sum=reduce_sum, world_size=2)
    # the condition was evaluated 4 times
    assert stats["gen_rounds"] == 3 and len(calls) == 2 * 3 + 2
    # each round asks for ceil(missing * oversample / world_size) prompts, missing >= world_size:
    # 4 missing -> 2 prompts, then 4 - 2 = 2 -> 1, then max(4 - 3, 2) = 2 -> 1
    assert len(state["served"]) == 2 + 1 + 1 and stats["groups_live"] == 4
    assert samples["completions"][::G] == [f"prompt {p}" for p in state["served"]]


def test_fitting_prompts_skips_the_long_prompts_and_says_how_many(capsys):
    from transformers import AutoTokenizer
    from conftest import MODEL_DIR
    from rollout import encode_prompts, fitting_prompts
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    rows = [{'prompt': [{'role': 'user', 'content': 'What is 2 + 3?'}], 'answer': '5'},
            {'prompt': [{'role': 'user', 'content': 'What is 2 + 3? ' * 20}], 'answer': '5'},
            {'prompt': [{'role': 'user', 'content': 'What is 7 + 1?'}], 'answer': '8'}]
    short = len(encode_prompts(tokenizer, [rows[0]['prompt']])[0])
    kept = fitting_prompts(tokenizer, rows, short, 'train')  # a prompt of exactly max_len is kept
    assert kept == [rows[0], rows[2]]
    assert "train: 1 prompts longer than max_prompt_len=" in capsys.readouterr().out
    assert fitting_prompts(tokenizer, rows, short - 1, 'test') == []
    assert fitting_prompts(tokenizer, rows, 10_000, 'test') == rows
    assert capsys.readouterr().out.count('longer than') == 1  # said only where one was skipped
