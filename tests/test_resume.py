"""Long runs are safe to interrupt: exact resume after SIGKILL or a stop at max_iters, in both body
dtypes, a clean stop on SIGTERM, clear errors for a checkpoint that does not fit the run. CPU, HF
engine (its sampler's RNG is ours to save), the 2-layer model (conftest.small_model), tiny
steps."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import DTYPES, ROOT, SMALL_MODEL_DIR, parity_reward

TINY_HF = ["config/cpu_demo.py", "--prompts_per_step=2", "--group_size=4", "--max_new_tokens=8",
           "--micro_batch_size=4", "--rollout_engine=hf", "--eval_interval=0", "--max_iters=6",
           f"--init_from={SMALL_MODEL_DIR}"]


@pytest.fixture(autouse=True)
def _small_model(small_model):  # every test here runs the 2-layer model
    return small_model


def command(*args):
    return [sys.executable, "train.py", *TINY_HF, *args]


def run(*args, expect=0):
    result = subprocess.run(command(*args), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == expect, result.stderr[-3000:]
    return result


def steps(out_dir):
    """The last record of each step (a resumed run appends to log.jsonl), evals left out."""
    return {r["step"]: r for r in map(json.loads, open(os.path.join(out_dir, "log.jsonl")))
            if "reward" in r}


def checkpoint_step(out_dir):
    try:
        return json.load(open(os.path.join(out_dir, "ckpt", "meta.json")))["step"]
    except (OSError, ValueError):
        return 0


def logged_steps(out_dir):
    try:
        return len(open(os.path.join(out_dir, "log.jsonl")).readlines())
    except OSError:
        return 0


def start_and_signal(out_dir, signum, ready, *args):
    """Start a run, send signum as soon as ready(out_dir) holds, return (exit code, stdout,
    stderr)."""
    proc = subprocess.Popen(command(f"--out_dir={out_dir}", *args), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not ready(out_dir) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_resume_after_sigkill_or_a_stop_continues_the_same_run(tmp_path, dtype):
    """A run resumed from its step-2 checkpoint samples exactly what the uninterrupted one sampled
    (RNG, data position and weights restored: rewards and lengths equal; losses, gradients and
    entropies to 1e-4), whether it was stopped at max_iters=2, whose end has an eval, or killed
    (SIGKILL, during step 3; fp32 only: a crash is the same in both dtypes). Before the eval
    drew from an RNG stream of its own it consumed the training stream, and the resumed run
    sampled other answers (issue #25: 57 of 89 logged values of steps 4-6 differed on a bf16 CPU;
    this test then failed at the first resumed step's loss). entropy_coef gives every step a
    gradient. To 1e-4, not bit for bit: runs once differed here (grad_norm 1.1e-5 relative apart
    at step 4, seen once in 4 runs), likely by the shared prompt's backward, which until 2026-12-06
    added a group's gradients in a varying order on 2 threads (model.completion_hidden), and 4
    steps at lr 1e-3 grow such noise. Since its fix, 3 runs here compared bit for bit were equal
    (2-core Zen 5 EPYC); the margin stays for CPUs it has not run on. A resume that lost the
    optimizer state or an RNG changes these numbers by percents (the eval's: 19 % of step 3's loss
    in bf16).
    The curriculum's state too: 4 prompts, two of them never right (the verifier is the parity of
    the answer's length, conftest.parity_reward), all 4 sampled by step 2; with window 1 the two
    cool down, and steps 3-4 pass over them. A resume without that state would sample them."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "answer": "-12345" if i % 2 else str(2 * i)} for i in range(4)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # evals at 0, 3 and 4 (the end); a run stopped at max_iters=2 has one more, at 2
    common = [f"--dtype={dtype}", "--max_iters=4", "--eval_interval=3", "--eval_problems=2",
              "--eval_samples=2", "--entropy_coef=0.01", "--learning_rate=1e-3",
              f"--data_dir={data}", parity_reward(tmp_path, never="-12345"),
              "--curriculum_window=1"]
    full, killed, stopped = (str(tmp_path / name) for name in ("full", "killed", "stopped"))
    run(f"--out_dir={full}", "--ckpt_interval=-1", *common)  # the reference: its log only
    resumed = [stopped] + ([killed] if dtype == "float32" else [])
    if killed in resumed:  # killed as soon as its step-2 checkpoint is complete
        code, _, _ = start_and_signal(killed, signal.SIGKILL, lambda d: checkpoint_step(d) >= 2,
                                      "--ckpt_interval=2", *common)
        assert code == -signal.SIGKILL and checkpoint_step(killed) == 2
    run(f"--out_dir={stopped}", *common, "--max_iters=2")
    for out_dir in resumed:
        result = run(f"--out_dir={out_dir}", "--init_from=resume", "--ckpt_interval=2", *common)
        assert "resumed from" in result.stdout and "at step 2" in result.stdout
    a = steps(full)
    assert all(a[step]["grad_norm"] > 0 for step in a)
    # each never-right prompt's next visit (positions 4-7) is passed over
    assert a[2]["curriculum/cooling"] >= 2
    assert a[3]["curriculum/skipped"] + a[4]["curriculum/skipped"] >= 2
    for out_dir in resumed:
        b = steps(out_dir)
        assert sorted(b) == [1, 2, 3, 4]
        for step in (3, 4):
            for key in ("reward", "completion_len"):
                assert a[step][key] == b[step][key], (out_dir, step, key, a[step][key], b[step][key])
            for key in ("loss", "grad_norm", "entropy"):
                assert a[step][key] == pytest.approx(b[step][key], rel=1e-4, abs=1e-7), (step, key)


def test_sigterm_finishes_the_step_checkpoints_and_exits_cleanly(tmp_path):
    out_dir = str(tmp_path / "run")
    code, out, err = start_and_signal(out_dir, signal.SIGTERM, lambda d: logged_steps(d) >= 1,
                                      "--ckpt_interval=0")
    assert code == 0, err[-3000:]
    done = checkpoint_step(out_dir)  # no checkpoint was due before step 6: this one is the stop's
    # usually the signal lands in step 2, which finishes (done = 2); on a loaded CPU it can land
    # between step 1's log line and its stop check (done = 1, seen with 2 busy cores): correct too
    assert 1 <= done < 6 and f"stopped after step {done}" in out
    assert max(steps(out_dir)) == done  # every finished step is logged and in the checkpoint


def test_resume_after_a_crash_between_the_checkpoint_renames(tmp_path):
    """save_checkpoint renames ckpt -> ckpt.old, then ckpt.tmp -> ckpt: a crash between the two
    leaves no ckpt/. Resume must still find the last complete checkpoint (here ckpt.old, the only
    one) and load it: model, optimizer, RNGs. One step, then a resume with nothing left to do."""
    out_dir, tiny = str(tmp_path / "run"), ["--group_size=2", "--max_iters=1"]
    run(f"--out_dir={out_dir}", *tiny)
    os.replace(os.path.join(out_dir, "ckpt"), os.path.join(out_dir, "ckpt.old"))
    result = run(f"--out_dir={out_dir}", "--init_from=resume", *tiny)
    assert "restored from" in result.stdout and "at step 1" in result.stdout
    assert checkpoint_step(out_dir) == 1 and not os.path.exists(os.path.join(out_dir, "ckpt.old"))


def write_meta(out_dir, **meta):
    os.makedirs(os.path.join(out_dir, "ckpt"), exist_ok=True)
    json.dump(meta, open(os.path.join(out_dir, "ckpt", "meta.json"), "w"))


def test_a_checkpoint_that_does_not_fit_is_an_error_before_any_work(tmp_path):
    other = str(tmp_path / "other")
    fitting = {"data_dir": "data/arithmetic", "seed": 0, "prompts_per_step": 2, "group_size": 4,
               "max_prompt_len": 1024}
    write_meta(other, step=5, model_source="Qwen/Qwen2.5-0.5B-Instruct", config=fitting)
    result = run(f"--out_dir={other}", expect=2)
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: {other}/ckpt is a checkpoint of 'Qwen/Qwen2.5-0.5B-Instruct', "
        f"not {SMALL_MODEL_DIR!r}: choose another out_dir, or --init_from=resume")
    result = run(f"--out_dir={other}", "--init_from=resume", "--seed=1", expect=2)
    assert "cannot resume" in result.stderr and "different seed" in result.stderr
    # another max_prompt_len keeps other rows before the shuffle: the data position would point
    # into another order
    result = run(f"--out_dir={other}", "--init_from=resume", "--max_prompt_len=500", expect=2)
    assert "with a different max_prompt_len (the data position" in result.stderr
    # a checkpoint from before the DCP optimizer folder: one line, not DCP's metadata error
    result = run(f"--out_dir={other}", "--init_from=resume", expect=2)
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: {other}/ckpt has no optimizer/ folder (it predates the DCP optimizer "
        f"state): resume it with the revision that wrote it, or start from its weights: "
        f"--init_from={other}/ckpt")
    result = run(f"--out_dir={tmp_path / 'empty'}", "--init_from=resume", expect=2)
    assert "holds no checkpoint" in result.stderr


def test_prompts_longer_than_max_prompt_len_are_skipped_at_load(tmp_path):
    # every arithmetic prompt is ~46 tokens with the chat template: none fits in 20
    result = run(f"--out_dir={tmp_path / 'run'}", "--max_prompt_len=20", expect=2)
    assert "train: 5000 prompts longer than max_prompt_len=20 tokens skipped" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "config error: no training prompt fits in max_prompt_len=20 tokens")
