"""train.py end to end on the real model: a tiny vLLM run that logs and checkpoints, then a
resume."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import DTYPES, ROOT, verifier_config

TINY = ["config/cpu_demo.py", "--prompts_per_step=2", "--group_size=4", "--max_new_tokens=8",
        "--eval_interval=2", "--eval_problems=4", "--eval_samples=2", "--micro_batch_size=4",
        "--ckpt_interval=-1"]  # no checkpoint (1.6 GB) unless a test asks for one
STEP_KEYS = {"step", "reward", "accuracy", "completion_len", "truncated", "entropy",
             "loss/clip_frac", "grad_norm", "rollout_seconds", "train_seconds", "sync_seconds",
             "tokens_per_second"}


def train(*args):
    result = subprocess.run([sys.executable, "train.py", *TINY, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def records(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]


@pytest.mark.slow
def test_train_logs_checkpoints_and_resumes(tmp_path):
    out_dir = str(tmp_path / "run")
    lr_args = ["--learning_rate=1e-5", "--decay_lr=True", "--min_lr=1e-6"]  # cosine, over max_iters
    result = train(f"--out_dir={out_dir}", "--max_iters=2", "--rollout_engine=vllm",
                   "--ckpt_interval=0", *lr_args)
    assert "step 1: reward" in result.stdout and "step 2: reward" in result.stdout
    # the engine says which model runner it is (on GPU vLLM may take V2, which no CPU test runs)
    assert "vLLM engine: vllm.v1.worker.cpu_model_runner (enforce_eager=True" in result.stdout
    # a quiet console: none of vLLM's INFO lines, nor its expected warnings at start and at each sync
    # (rollout.quiet_vllm), nor transformers' progress bars
    for noise in [" INFO ", "Failed to load weights", "Attempted to load weight", "Loading weights"]:
        assert noise not in result.stdout + result.stderr, noise
    log = records(out_dir)
    steps = [r for r in log if "reward" in r]
    evals = [r for r in log if "eval/accuracy" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    for r in steps:
        assert STEP_KEYS <= set(r), STEP_KEYS - set(r)
        assert 0 <= r["accuracy"] <= 1 and 0 < r["completion_len"] <= 8
        # a gradient exactly when some group's answers disagree
        assert (r["grad_norm"] > 0) == (r["degenerate_frac"] < 1), r
        assert 0 <= r["rollout_mismatch"] < 0.5      # vLLM only: mean |logp_trainer - logp_sampler|
        # per-token means: the base model's entropy on its own samples is ~2 nats, and every
        # fraction is in [0, 1]
        assert (0.3 < r["entropy"] < 6 and 0 <= r["loss/zero_grad_frac"] <= 1
                and r["loss/clip_frac"] == 0)  # num_iterations=1: the ratio is exactly 1
    for r in evals:  # eval_samples=2: pass@1 is avg@2 (c/k per problem), pass@2 >= it
        assert r["eval/pass@1"] == pytest.approx(r["eval/accuracy"])
        assert 0 <= r["eval/accuracy"] <= r["eval/pass@2"] <= 1 and 0 <= r["eval/maj@2"] <= 1
    # the end of the run says where things are and what comes next
    assert f"eval/accuracy: {evals[0]['eval/accuracy']:.3f} at step 0 ->" in result.stdout
    assert (f"continue: python train.py {' '.join(TINY)} --out_dir={out_dir} "
            f"--rollout_engine=vllm --ckpt_interval=0 {' '.join(lr_args)} --init_from=resume "
            f"--max_iters=4"
            in result.stdout and f"plot: python plot.py {out_dir}" in result.stdout)

    # the checkpoint is a plain HF folder (transformers loads it) plus the trainer's state and
    # AdamW's (DCP: two moments of every parameter)
    ckpt = os.path.join(out_dir, "ckpt")
    state = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)
    assert state["step"] == 2 and state["config"]["max_iters"] == 2
    import torch.distributed.checkpoint as dcp
    saved = dcp.FileSystemReader(os.path.join(ckpt, "optimizer")).read_metadata().state_dict_metadata
    assert "policy.state.model.norm.weight.exp_avg_sq" in saved
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(ckpt)

    # resume (with the HF engine this time): continues at step 3, does not redo steps 1-2
    # (its cosine still ends at step 2, nanoGPT's lr_decay_iters: then it holds min_lr)
    result = train(f"--out_dir={out_dir}", "--max_iters=3", "--init_from=resume",
                   "--rollout_engine=hf", "--ckpt_interval=0", "--lr_decay_iters=2", *lr_args)
    assert ("resumed from" in result.stdout and "step 3: reward" in result.stdout
            and "step 2: reward" not in result.stdout)
    steps = [r for r in records(out_dir) if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and "rollout_mismatch" not in steps[-1]
    # lr = min_lr + (lr - min_lr) (1 + cos(pi t / max_iters)) / 2 at the step's index t: t = 0, 1
    # of 2 steps; then t = 2, past lr_decay_iters=2: min_lr (over max_iters=3 it would be 3.25e-6)
    assert [r["lr"] for r in steps] == pytest.approx([1e-5, 5.5e-6, 1e-6])
    # step 2's eval ran before step 2's checkpoint: the resumed run does not evaluate it again
    assert [r["step"] for r in records(out_dir) if "eval/accuracy" in r] == [0, 2, 3]
    assert torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)["step"] == 3

    # a new run in this out_dir that saves nothing does not offer the earlier run's checkpoint
    result = train(f"--out_dir={out_dir}", "--max_iters=0", "--eval_interval=0",
                   "--rollout_engine=hf")
    assert "continue:" not in result.stdout and f"plot: python plot.py {out_dir}" in result.stdout


def test_dapo_sampling_reward_shaping_and_malformed_rows(tmp_path):
    """One HF-engine step with every DAPO / Kimi switch on (dynamic sampling behind a screen of 2
    answers a prompt), over a data folder with two malformed rows."""
    data = tmp_path / "data"
    data.mkdir()
    good = [json.loads(line)
            for line in open(os.path.join(ROOT, "data", "arithmetic", "train.jsonl"))][:50]
    lines = [json.dumps(r) for r in good]
    lines.insert(1, '{"prompt": "not a list", "answer": "3"}')
    lines.insert(3, "{not json")
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    (data / "test.jsonl").write_text("\n".join(lines[:3]) + "\n")
    out_dir = str(tmp_path / "run")
    result = train(f"--out_dir={out_dir}", f"--data_dir={data}", "--max_iters=1",
                   "--rollout_engine=hf", "--eval_interval=0", "--prompts_per_step=1",
                   "--dynamic_sampling=True", "--max_gen_batches=0", "--screen_size=2",
                   "--mask_truncated=True", "--overlong_buffer=4", "--length_reward_coef=0.5", "--format_coef=0.1",
                   "--loss_type=dapo", "--reward_wrong=-1.0", "--num_iterations=2", "--beta=0.01",
                   # long enough that some completions end and survive mask_truncated
                   "--max_new_tokens=16",
                   # the weights stay: both passes see ratio 1 (loss/* are means over passes)
                   "--learning_rate=0.0")
    assert f"{data}/train.jsonl:2: 'prompt' must be a non-empty list" in result.stdout
    assert f"{data}/train.jsonl:4: not valid JSON" in result.stdout
    assert f"{data}/train.jsonl: 2 malformed rows skipped, 50 kept" in result.stdout
    (step,) = records(out_dir)
    assert step["live_groups"] >= 1 and step["gen_rounds"] >= 1 and 0 <= step["degenerate_frac"] < 1
    assert step["prompts_consumed"] >= step["gen_rounds"]
    # the screen: 2 answers for every prompt, the other 2 of G=4 only for the live groups
    assert step["samples"] == 2 * step["prompts_consumed"] + 2 * step["live_groups"]
    for part in ("reward/task", "reward/format", "reward/overlong", "reward/length"):
        assert part in step
    assert -1 <= step["reward/task"] <= 1 and -1 <= step["reward/overlong"] <= 0
    # DAPO's overlong filtering, whatever was sampled: every row trains (beta > 0: no skip_zero_adv),
    # and exactly the tokens of the answers not cut at max_new_tokens=16 go through the update,
    # in each of the 2 passes (a cut answer has 16 tokens)
    rows = step["live_groups"] * 4
    kept = rows * step["completion_len"] - rows * step["truncated"] * 16
    assert step["trained_frac"] == 1
    assert step["train_completion_tokens"] == pytest.approx(2 * kept, abs=1e-6)
    # num_iterations=2 kept the first pass's log-probs as pi_old, beta > 0 loaded the reference: with
    # lr 0 the policy, pi_old and the reference are the same weights in both passes, so the ratio
    # is 1 and the k3 KL 0 on the tokens that survived (when every answer was cut, as bf16 kernels
    # made it on one CPU, there is none: the means are 0)
    survived = step["truncated"] < 1
    assert abs(step["loss/ratio_mean"] - survived) < 1e-5 and abs(step["loss/kl"]) < 1e-5
    assert abs(step["reward"] - sum(step[p] for p in ("reward/task", "reward/format",
                                                      "reward/overlong", "reward/length"))) < 1e-5

    # more malformed rows than allowed: a clear error and exit code 2, before any model is loaded
    bad = subprocess.run([sys.executable, "train.py", f"--data_dir={data}", "--max_bad_rows=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        f"config error: {data}/train.jsonl: more than max_bad_rows=1 malformed rows")



def test_non_finite_steps_are_skipped_then_the_run_stops(tmp_path):
    """A temperature of 1e-45: vLLM samples greedily (it treats T < 1e-5 as greedy), while the
    trainer's logits / T overflow, so every loss is NaN. Each step is skipped, and the run stops
    after max_bad_steps."""
    out_dir = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "train.py", *TINY, f"--out_dir={out_dir}",
                             "--temperature=1e-45", "--eval_interval=0", "--max_iters=5",
                             "--max_bad_steps=2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "aborting: 2 steps in a row with a non-finite loss or grad norm (max_bad_steps=2); "
        "the last checkpoint holds the last good weights")
    steps = records(out_dir)
    assert [r["step"] for r in steps] == [1, 2] and all(r["nonfinite_skipped"] == 1 for r in steps)
    assert ("step 2: non-finite loss or grad norm, optimizer step skipped (2 in a row; 0 of 1 "
            "updates" in result.stdout)


@pytest.mark.parametrize("dtype", DTYPES)
def test_old_logp_from_the_sampler_makes_the_ratio_the_rollout_mismatch(tmp_path, small_model, dtype):
    """old_logp_source='rollout' (verl's bypass): vLLM's log-probs are pi_old, so the ratio's
    |log rho| is exactly the rollout/trainer mismatch (with lr 0, in both passes), not 0 as with
    the trainer's own first-pass log-probs. In both dtypes (the engine serves the trainer's), on
    the 2-layer model."""
    out_dir = str(tmp_path / "bypass")
    train(f"--out_dir={out_dir}", "--max_iters=1", "--eval_interval=0", "--rollout_engine=vllm",
          "--num_iterations=2", "--old_logp_source=rollout", f"--init_from={small_model}",
          f"--dtype={dtype}", "--learning_rate=0.0")  # both passes: the same weights
    step = [r for r in records(out_dir) if "reward" in r][-1]
    # bf16 on both sides: ~0.02 (two engines' kernels); fp32 on both: ~1e-6, still not 0; a bf16
    # engine beside an fp32 trainer (or the reverse): ~0.03, which the bound on fp32 catches
    assert 0 < step["rollout_mismatch"] < (0.2 if dtype == "bfloat16" else 1e-3)
    assert not os.path.exists(os.path.join(out_dir, "ckpt"))  # ckpt_interval=-1: none written
    assert (abs(step["loss/log_ratio_abs_mean"] - step["rollout_mismatch"])
            < 1e-6 * step["rollout_mismatch"] + 1e-9)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_token_weights_of_short_and_long_answers_in_a_real_step(tmp_path, loss_type):
    """Seed 000 experiment 1, logged from a real step: |dLoss/dlogp| / |A| per token, answers
    shorter than the median over the others. grpo's 1/|o_i| gives short answers' tokens more
    weight; dapo's token mean does not."""
    out_dir = str(tmp_path / loss_type)
    train(f"--out_dir={out_dir}", "--max_iters=1", "--eval_interval=0", "--rollout_engine=hf",
          f"--loss_type={loss_type}", "--prompts_per_step=2", "--dynamic_sampling=True",
          "--max_gen_batches=0", "--max_new_tokens=12")
    ratio = [r for r in records(out_dir) if "reward" in r][-1]["token_weight_short_long"]
    if loss_type == "grpo":
        assert ratio > 1.05, ratio
    else:
        assert ratio == pytest.approx(1.0, abs=1e-6)


def test_a_non_finite_pass_ends_the_steps_updates_and_the_log_says_what_was_applied(tmp_path):
    """num_iterations=2 at lr 1e30: the first pass is finite and its AdamW step applied (the weights
    jump to ~1e30; dynamic sampling makes sure some group has a gradient), the second pass's loss
    overflows. The step stops there, and the log says one update was applied."""
    out_dir = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "train.py", *TINY, f"--out_dir={out_dir}",
                             "--rollout_engine=hf", "--eval_interval=0", "--max_iters=1",
                             "--num_iterations=2", "--learning_rate=1e30",
                             "--dynamic_sampling=True", "--max_gen_batches=0",
                             "--max_new_tokens=12"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (step,) = records(out_dir)
    assert step["nonfinite_skipped"] == 1 and step["updates_applied"] == 1
    assert "(1 in a row; 1 of 2 updates applied before it)" in result.stdout


def test_guards_say_what_went_wrong_once_and_log_it(tmp_path):
    """Conditions built to trip three guards in one HF-engine step: 1 new token (nearly every answer
    is cut at max_new_tokens), a verifier that raises on every completion (every reward 0, so
    every group is degenerate, and warn_degenerate_steps=1)."""
    raising = verifier_config(tmp_path, "lambda completion, answer: 1 / 0")
    out_dir = str(tmp_path / "run")
    result = train(raising, f"--out_dir={out_dir}", "--rollout_engine=hf", "--max_iters=2",
                   "--eval_interval=0", "--max_new_tokens=1", "--warn_degenerate_steps=1")
    steps = records(out_dir)
    for r in steps:
        assert r["guard/truncated"] == r["guard/degenerate"] == r["guard/reward_errors"] == 1
    warnings = [line for line in result.stdout.splitlines() if "warning, step" in line]
    assert len(warnings) == 3, warnings  # once each, though both steps trip them
    assert any("were cut at max_new_tokens=1: raise it" in w for w in warnings)
    assert any("every group's answers agreed for 1 steps" in w for w in warnings)
    assert any("verifier raised or timed out" in w and "reward_fn='arithmetic'" in w
               for w in warnings)


def test_a_weight_sync_that_stopped_working_stops_the_run_with_a_checkpoint(tmp_path):
    """A real vLLM engine whose sync does nothing (the config file replaces train.py's
    sync_weights): the sampler stays at the initial weights while the trainer moves at lr 1e-4, so
    rollout_mismatch leaves its first-step level; past stop_mismatch x it the run checkpoints and
    stops with exit code 1 and a message that names the sync."""
    no_sync = tmp_path / "no_sync.py"
    no_sync.write_text("import sys\n"
                       "sys.modules['__main__'].sync_weights = lambda *args: None\n")
    out_dir = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "train.py", *TINY, str(no_sync),
                             f"--out_dir={out_dir}", "--rollout_engine=vllm", "--eval_interval=0",
                             "--max_iters=6", "--max_new_tokens=16", "--learning_rate=1e-4", "--ckpt_interval=0"],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "is the weight sync (rollout.sync_weights) working?" in result.stderr.splitlines()[-1]
    steps = records(out_dir)
    first, last = steps[0]["rollout_mismatch"], steps[-1]
    assert last["guard/sync"] == 1 and last["rollout_mismatch"] > 10 * max(first, 0.01)
    assert all("guard/sync" not in r for r in steps[:-1]) and len(steps) < 6
    assert last["guard/mismatch"] == 1  # the warning's threshold (3x) is below the stop's (10x)
    meta = json.load(open(os.path.join(out_dir, "ckpt", "meta.json")))
    assert meta["step"] == last["step"]


def test_samples_jsonl_and_the_evals_right_and_wrong_answer(tmp_path, small_model):
    """Every step writes samples_per_step of its completions to samples.jsonl (prompt, completion,
    answer, reward and its parts, advantage, truncated, length), spread over the groups; every eval
    prints one right and one wrong answer. The verifier here is right exactly on the first test
    problem (answer '10'), so the eval has both."""
    reward = verifier_config(tmp_path, "lambda completion, answer: float(answer == '10')")
    out_dir = str(tmp_path / "run")
    result = train(reward, f"--out_dir={out_dir}", "--max_iters=2", "--rollout_engine=hf",
                   f"--init_from={small_model}", "--dtype=float32", "--format_coef=0.1",
                   "--samples_per_step=3", "--eval_interval=2")
    for step in (0, 2):
        eval_line = next(i for i, line in enumerate(result.stdout.splitlines())
                         if line.startswith(f"step {step}: eval accuracy"))
        right, wrong = result.stdout.splitlines()[eval_line + 1:eval_line + 3]
        assert right.startswith("  right: 'What is 7 + 3? Reply with only the number.' -> ")
        assert wrong.startswith("  wrong: 'What is ") and "7 + 3" not in wrong
    samples = [json.loads(line) for line in open(os.path.join(out_dir, "samples.jsonl"))]
    steps = [r for r in records(out_dir) if "reward" in r]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    for s in samples:
        assert set(s) == {"step", "prompt", "completion", "answer", "reward", "reward/task",
                          "reward/format", "advantage", "truncated", "completion_len"}
        assert s["prompt"].startswith("What is ") and s["reward/task"] == float(s["answer"] == "10")
        assert s["reward"] == pytest.approx(s["reward/task"] + s["reward/format"])
        assert 1 <= s["completion_len"] <= 8 and (s["completion_len"] == 8 or not s["truncated"])
        assert isinstance(s["advantage"], float) and isinstance(s["completion"], str)
    # rows 0, 2 and 4 of a step's 8: two of the first group's (G = 4), one of the second's
    assert len(steps) == 2
    for first, second, third in (samples[:3], samples[3:]):
        assert first["prompt"] == second["prompt"] != third["prompt"]
