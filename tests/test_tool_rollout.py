"""Multi-turn rollouts with a tool (tools.tool_rollout, rollout.sample_turns): the masks and the
ids token for token (a scripted engine, then vLLM and HF), and what the trainer makes of a batch
that holds a tool's tokens (the loss, the statistics, the log-probs)."""
import json

import pytest
from transformers import AutoTokenizer

import tools
from conftest import MODEL_DIR, train_log
from rollout import make_batch

TOKENIZER = AutoTokenizer.from_pretrained(MODEL_DIR)
EOS = TOKENIZER.eos_token_id


def ids(text):
    return TOKENIZER.encode(text, add_special_tokens=False)


def result_ids(value):
    return ids(f"{tools.RESULT_OPEN}{value}{tools.RESULT_CLOSE}")


def scripted(turns):
    """A sample_turns that plays back turns[i] (a list of (ids, finish)) for sample i, one per call,
    each cut to the budget it is given (finish 'length' then); it records what it was asked."""
    asked = []

    def sample_turns(prompts, budgets, stops):
        asked.append((prompts, budgets, stops))
        out = []
        for prompt, budget, stop in zip(prompts, budgets, stops):
            i = next(i for i, p in enumerate(PROMPTS) if prompt[:len(p)] == p)
            new, finish = turns[i].pop(0)
            out.append((new[:budget], [-0.5] * len(new[:budget]),
                        "length" if len(new) > budget else finish))
        return out
    return sample_turns, asked


PROMPTS = [ids("What is 347 * 86?"), ids("What is 2 + 2? Be brief.")]
CALL_1, CALL_2 = ids("Let me see. <calc>347*86</calc>"), ids(" and <calc>2+2</calc>")
END = ids(" so 347 * 86 = 29842") + [EOS]


def test_two_calls_then_an_answer_masks_and_ids():
    turns = [[(CALL_1, "stop"), (CALL_2, "stop"), (END, "eos")], [(ids(" 4") + [EOS], "eos")]]
    sample_turns, asked = scripted(turns)
    out = tools.tool_rollout(sample_turns, TOKENIZER, PROMPTS, 200, "calc", max_tool_calls=4,
                             timeout=1.0)
    r1, r2 = result_ids("29842"), result_ids("4")
    # the completion is the sampler's ids and the tool's, as they were, in order
    assert out["completion_ids"][0] == CALL_1 + r1 + CALL_2 + r2 + END
    assert out["model_mask"][0] == ([1] * len(CALL_1) + [0] * len(r1) + [1] * len(CALL_2)
                                    + [0] * len(r2) + [1] * len(END))
    assert out["rollout_logp"][0] == [-0.5 if m else 0.0 for m in out["model_mask"][0]]
    assert out["completion_ids"][1] == ids(" 4") + [EOS]
    assert out["model_mask"][1] == [1] * len(ids(" 4") + [EOS])
    assert out["tool_calls"] == [2, 0] and out["tool_errors"] == [0, 0]
    assert out["truncated"] == [False, False]
    # each turn continues after exactly those ids, with what is left of the budget; a finished
    # sample is not asked again
    assert asked[0] == (PROMPTS, [200, 200], ["</calc>", "</calc>"])
    assert asked[1] == ([PROMPTS[0] + CALL_1 + r1], [200 - len(CALL_1 + r1)], ["</calc>"])
    assert asked[2][0] == [PROMPTS[0] + CALL_1 + r1 + CALL_2 + r2]
    # the batch: the loss mask is the model's, the attention every real token
    batch = make_batch({**out, "prompt_ids": [PROMPTS[0], PROMPTS[1]],
                        "completions": ["", ""]}, TOKENIZER.pad_token_id)
    width, short = len(out["completion_ids"][0]), len(out["completion_ids"][1])
    assert batch["completion_mask"][0].tolist() == [float(m) for m in out["model_mask"][0]]
    assert batch["completion_attention"][0].tolist() == [1] * width
    assert batch["completion_attention"][1].tolist() == [1] * short + [0] * (width - short)
    assert batch["completion_mask"][1].tolist() == [1.0] * short + [0.0] * (width - short)


def test_the_budget_runs_out_inside_a_call_or_inside_a_result():
    # inside the call: the model's turn is cut before it closes, no tool runs
    sample_turns, _ = scripted([[(ids("<calc>12*34"), "stop")], [(ids("<calc>1+"), "stop")]])
    out = tools.tool_rollout(sample_turns, TOKENIZER, PROMPTS, 3, "calc", 4, 1.0)
    assert out["truncated"] == [True, True] and out["tool_calls"] == [0, 0]
    assert all(m == [1, 1, 1] for m in out["model_mask"])
    # inside the result: the call fits, its result only in part (cut at the budget)
    call = ids("<calc>123456*654321</calc>")
    result = result_ids(123456 * 654321)
    budget = len(call) + 3
    sample_turns, asked = scripted([[(call, "stop")], [(ids(" 4") + [EOS], "eos")]])
    out = tools.tool_rollout(sample_turns, TOKENIZER, PROMPTS, budget, "calc", 4, 1.0)
    assert out["completion_ids"][0] == call + result[:3] and len(result) > 3
    assert out["model_mask"][0] == [1] * len(call) + [0, 0, 0]
    assert out["truncated"] == [True, False] and out["tool_calls"] == [1, 0]
    assert len(asked) == 1  # no token left: the sample is not continued


def test_calls_beyond_max_tool_calls_are_not_answered_and_bad_calls_are_errors():
    # max_tool_calls=1: the second turn samples with no stop string (a close is just text)
    sample_turns, asked = scripted([[(CALL_1, "stop"), (END, "eos")],
                                    [(ids("</calc>"), "stop"), (ids(" 4") + [EOS], "eos")]])
    out = tools.tool_rollout(sample_turns, TOKENIZER, PROMPTS, 200, "calc", 1, 1.0)
    assert asked[1][2] == [None, None]
    # a close with no open: the model sees an error result, counted
    assert out["tool_calls"] == [1, 1] and out["tool_errors"] == [0, 1]
    error = TOKENIZER.decode(out["completion_ids"][1])
    assert error.startswith("</calc><result>error: ") and error.endswith(" 4<|im_end|>")
    # a hostile call: an error string, the sample goes on
    sample_turns, _ = scripted([[(ids("<calc>1/0</calc>"), "stop"), (END, "eos")],
                                [(ids("<calc>" + "(" * 50 + "1" + ")" * 50 + "</calc>"), "stop"),
                                 (END, "eos")]])
    out = tools.tool_rollout(sample_turns, TOKENIZER, PROMPTS, 400, "calc", 4, 1.0)
    assert out["tool_errors"] == [1, 1] and out["truncated"] == [False, False]
    assert all(TOKENIZER.decode(c).endswith("29842<|im_end|>") for c in out["completion_ids"])


# -----------------------------------------------------------------------------
# train.py with the calculator: the real model, data/multiply's prompt begun with '<calc>' (the
# base model then calls it in ~98 % of its answers: every step has calls)

def multiply_rows(tmp_path, n=4):
    data = tmp_path / "data"
    data.mkdir()
    shot = [{"role": "user", "content": "What is 123 * 45?"},
            {"role": "assistant", "content": "<calc>123*45</calc><result>5535</result> 123 * 45 = 5535"}]
    rows = [{"prompt": shot + [{"role": "user", "content": f"What is {a} * 86?"},
                               {"role": "assistant", "content": tools.CALL_OPEN}],
             "answer": str(a * 86)} for a in range(347, 347 + n)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


TOOL_RUN = ["config/cpu_demo.py", "--reward_fn=multiply", "--tool=calc", "--prompts_per_step=2",
            "--group_size=4", "--max_new_tokens=24", "--micro_batch_size=8", "--eval_problems=2",
            "--eval_samples=2", "--entropy_coef=0.01", "--learning_rate=1e-5"]


def train(*args):
    return train_log(*TOOL_RUN, *args)


@pytest.mark.slow
def test_a_vllm_run_with_the_tool_logs_its_calls_and_scores_the_samplers_context(tmp_path):
    """vLLM, TIS on: the trainer scores each sample with the tool's tokens in its context, so its
    log-probs are the sampler's (rollout_mismatch: the kernels' round-off, 0.02-0.03 nats per token
    without a tool, test_engine); the tool's calls, errors and tokens are logged per answer, the
    model's tokens alone are completion_len; the eval also runs with the calls unanswered."""
    log = train(f"--out_dir={tmp_path / 'run'}", f"--data_dir={multiply_rows(tmp_path)}",
                "--max_iters=2", "--eval_interval=2", "--tis_mode=token_truncate",
                "--ckpt_interval=-1")
    steps = [r for r in log if "reward" in r]
    evals = [r for r in log if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    for r in steps:
        assert r["tool/call_frac"] >= 0.5 and r["tool/calls"] >= r["tool/call_frac"]
        assert 0 <= r["tool/errors"] <= r["tool/calls"] and r["tool/tokens"] >= 5
        assert r["completion_len"] + r["tool/tokens"] <= 24
        assert r["rollout_mismatch"] < 0.1
    assert all(0 <= r["eval/accuracy_no_tool"] <= 1 for r in evals)


@pytest.mark.slow
def test_a_tool_run_resumes_exactly(tmp_path):
    """HF engine (its sampler's RNG is ours to save): a run stopped at step 1 and resumed samples
    step 2 as the uninterrupted run did, turn after turn, calls and results included."""
    data = multiply_rows(tmp_path)
    common = [f"--data_dir={data}", "--rollout_engine=hf", "--eval_interval=0"]
    full = train(f"--out_dir={tmp_path / 'full'}", *common, "--max_iters=2", "--ckpt_interval=-1")
    train(f"--out_dir={tmp_path / 'cut'}", *common, "--max_iters=1")
    cut = train(f"--out_dir={tmp_path / 'cut'}", *common, "--max_iters=2", "--init_from=resume")
    a, b = ({r["step"]: r for r in log if "reward" in r} for log in (full, cut))
    assert sorted(b) == [1, 2] and a[2]["tool/calls"] > 0 and a[2]["grad_norm"] > 0
    for key in ("reward", "completion_len", "tool/calls", "tool/tokens", "tool/errors"):
        assert a[2][key] == b[2][key], key
    for key in ("loss", "grad_norm", "entropy"):
        assert a[2][key] == pytest.approx(b[2][key], rel=1e-4, abs=1e-7), key
