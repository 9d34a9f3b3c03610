"""plot.py and compare.py: grouping by seed suffix, final metrics as mean ± std, the honesty rule,
PNGs, and compare.py's commands and failure handling. Synthetic logs with known numbers; one tiny
real train.py run."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

import plot


def write_log(run_dir, records):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(run_dir)


def train_record(step, reward, entropy, **extra):
    return {"step": step, "reward": reward, "accuracy": reward, "entropy": entropy,
            "completion_len": 10.0, "completion_len_correct": 8.0, "completion_len_wrong": 12.0,
            "loss/clip_frac_low": 0.01, "loss/clip_frac_high": 0.02, "loss/clip_frac": 0.03,
            "loss/cov_logp_adv": 0.1, "rollout_mismatch": 0.02,
            "rollout_seconds": 1.0, "train_seconds": 2.0, "sync_seconds": 0.5, **extra}


def make_runs(tmp_path):
    """alpha and beta, seeds 0-2, steps 1-5, evals at 0 and 5. Per run: reward = base + 0.1 * seed
    + 0.01 * step (final = mean of steps 3-5 = base + 0.1 * seed + 0.04), entropy = e0 + 0.2 * seed,
    last eval = a0 + 0.1 * seed. alpha: base 0, e0 1.0, a0 0.3; beta: base 0.8, e0 1.1, a0 0.35. So
    the reward differs far beyond the seed spread (0.14 vs 0.94, std 0.1 each); entropy (1.2 vs 1.3,
    std 0.2) and eval accuracy (0.4 vs 0.45, std 0.1) do not."""
    dirs = []
    for variant, base, e0, a0 in [("alpha", 0.0, 1.0, 0.3), ("beta", 0.8, 1.1, 0.35)]:
        for seed in range(3):
            records = [{"step": 0, "eval/accuracy": 0.1, "eval/completion_len": 12.0,
                        "eval/seconds": 5.0}]
            records += [train_record(t, base + 0.1 * seed + 0.01 * t, e0 + 0.2 * seed)
                        for t in range(1, 6)]
            records.append({"step": 5, "eval/accuracy": a0 + 0.1 * seed,
                            "eval/completion_len": 9.0})
            # logged step 4, killed, resumed from step 3's checkpoint
            if (variant, seed) == ("alpha", 0):
                records[4:4] = [train_record(4, 9.0, 9.0)]
            if (variant, seed) == ("alpha", 1):  # a dynamic-sampling step without a live group
                records.append({"step": 6, "accuracy": 0.0, "rollout_seconds": 3.0, "skipped": 1})
            if (variant, seed) == ("beta", 1):   # no answer was right at step 5
                records[5]["completion_len_correct"] = None
            if (variant, seed) == ("beta", 2):   # a key only some runs log
                records[5]["value/loss"] = 0.5
            dirs.append(write_log(tmp_path / "cmp" / f"{variant}_s{seed}", records))
    return dirs


def test_read_log_keeps_the_last_record_of_a_step(tmp_path):
    dirs = make_runs(tmp_path)
    with open(os.path.join(dirs[0], "log.jsonl"), "a") as f:
        f.write('{"step": 6, "rew')  # a still-running run: half a line
    records = plot.read_log(dirs[0])
    assert [(r["step"], plot.is_eval(r)) for r in records] == [
        (0, True), (1, False), (2, False), (3, False), (4, False), (5, False), (5, True)]
    assert [r["reward"] for r in records if "reward" in r] == pytest.approx(
        [0.01, 0.02, 0.03, 0.04, 0.05])
    assert records[1]["step_seconds"] == 3.5
    assert plot.read_log(tmp_path / "nothing_here") == []


def test_grouping_by_seed_suffix(tmp_path):
    runs = plot.load_runs(make_runs(tmp_path))
    assert list(runs) == ["alpha", "beta"]
    assert [os.path.basename(d) for d in runs["beta"]] == ["beta_s0", "beta_s1", "beta_s2"]
    assert plot.variant_name("out/cmp/grpo_s12") == "grpo"
    assert plot.variant_name("out/cmp/dr_grpo_s0/") == "dr_grpo"
    assert plot.variant_name("out/cpu_demo") == "cpu_demo"
    assert plot.variant_name("out/run_seed1") == "run_seed1"


def test_final_metrics_mean_and_std_over_seeds(tmp_path):
    runs = plot.load_runs(make_runs(tmp_path))
    stats = plot.final_metrics(runs)
    # the resumed run's stale steps are gone
    assert stats["alpha"]["reward"] == pytest.approx((0.14, 0.1, 3))
    assert stats["beta"]["reward"] == pytest.approx((0.94, 0.1, 3))
    assert stats["alpha"]["entropy"] == pytest.approx((1.2, 0.2, 3))
    # the last eval, not step 0's
    assert stats["beta"]["eval/accuracy"] == pytest.approx((0.45, 0.1, 3))
    assert stats["beta"]["completion_len"] == pytest.approx((10.0, 0.0, 3))
    # the skipped step counts only with what it logged (its rollout seconds): alpha_s1's last 3
    # are 3.5, 3.5, 3.0
    assert stats["alpha"]["step_seconds"][0] == pytest.approx((3.5 + 10 / 3 + 3.5) / 3)
    assert "degenerate_frac" not in stats["alpha"]
    # None is skipped: beta_s1's final completion_len_correct is the mean of steps 2-4
    beta_s1 = runs["beta"][os.path.join(str(tmp_path), "cmp", "beta_s1")]
    assert plot.final_value(beta_s1, "completion_len_correct") == 8.0
    assert plot.series(beta_s1, "completion_len_correct")[-1][0] == 4


def test_summary_reports_only_differences_beyond_seed_spread(tmp_path):
    text = plot.summary_table(plot.load_runs(make_runs(tmp_path)))
    lines = text.splitlines()
    # degenerate_frac: no run has it, no column
    assert ("| variant | seeds | reward | eval/accuracy | entropy | completion_len | "
            "loss/clip_frac | rollout_mismatch | step_seconds |") in lines
    assert any(line.startswith("| alpha | 3 | 0.14 ± 0.1 | 0.4 ± 0.1 | 1.2 ± 0.2 | 10 ± 0 |")
               for line in lines)
    diffs = lines[lines.index("## Differences beyond seed spread"):]
    assert "- reward: beta 0.94 ± 0.1 > alpha 0.14 ± 0.1 (difference 0.8, spread 0.2)" in diffs
    assert not any(line.startswith(("- entropy", "- eval/accuracy", "- completion_len"))
                   for line in diffs)
    assert not any("one seed" in line for line in diffs)


def test_summary_says_when_nothing_differs_and_when_one_seed_is_all(tmp_path):
    dirs = make_runs(tmp_path)
    # two seeds each: reward 0.19 vs 0.89 +- 0.071
    text = plot.summary_table(plot.load_runs(dirs[:2] + dirs[3:5]))
    assert "- reward: beta" in text
    same = plot.load_runs([d for d in dirs if "alpha" in d])
    same["alpha_copy"] = same["alpha"]
    assert "- No difference exceeds the seed spread" in plot.summary_table(same)
    solo = write_log(tmp_path / "solo", [train_record(1, 0.9, 0.5)])
    text = plot.summary_table(plot.load_runs(dirs[:3] + [solo]))
    assert "| solo | 1 | 0.9 | – | 0.5 |" in text
    assert "- solo has only one seed: no claim can be made about it." in text
    assert "- No pair of variants has >= 2 seeds" in text


def test_plots_are_written(tmp_path):
    paths, text = plot.plot_runs(make_runs(tmp_path), str(tmp_path / "plots"))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(["reward.png", "eval_accuracy.png", "entropy.png", "completion_len.png",
                            "clip_frac.png", "rollout_mismatch.png", "cov_logp_adv.png",
                            "value_loss.png", "summary.md"])
    for p in paths:
        assert os.path.getsize(p) > 1000 or p.endswith(".md")
        if p.endswith(".png"):
            assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert open(tmp_path / "plots" / "summary.md").read() == text
    # the command line, default --out: the runs' common parent
    out = subprocess.run([sys.executable, "plot.py", *make_runs(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "## Differences beyond seed spread" in out
    assert os.path.getsize(tmp_path / "cmp" / "plots" / "reward.png") > 1000


def drawn_lines(monkeypatch, runs, name, keys, path):
    """{label: (steps, values)} of the lines plot_figure draws (the figure is caught before it is
    closed)."""
    figures = []
    monkeypatch.setattr(plot.plt, "close", figures.append)
    assert plot.plot_figure(runs, name, keys, str(path))
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in figures[0].axes[0].get_lines()}


def test_pass_and_maj_at_k_join_eval_accuracy(tmp_path, monkeypatch):
    """train.py logs eval/pass@1, eval/pass@{k} and eval/maj@{k} (k = eval_samples) beside
    eval/accuracy: found by prefix, drawn in the eval_accuracy figure and summarized after
    eval/accuracy, k in numeric order. Keys that only look alike are not picked up."""
    dirs = make_runs(tmp_path)
    for d in dirs:  # every eval record gets pass@1 = accuracy, pass@4 and maj@4 (and pass@16)
        records = [json.loads(line) for line in open(os.path.join(d, "log.jsonl"))]
        for r in records:
            if plot.is_eval(r):
                a = r["eval/accuracy"]
                r.update({"eval/pass@16": 1.0, "eval/maj@4": a + 0.1, "eval/pass@1": a,
                          "eval/pass@4": a + 0.2, "eval/pass@k": 9.0, "eval/maj@4x": 9.0})
        write_log(d, records)
    runs = plot.load_runs(dirs)
    assert plot.with_prefixed(["reward", "eval/accuracy", "entropy"], runs) == [
        "reward", "eval/accuracy", "eval/pass@1", "eval/pass@4", "eval/pass@16", "eval/maj@4",
        "entropy"]
    text = plot.summary_table(runs)
    assert ("| variant | seeds | reward | eval/accuracy | eval/pass@1 | eval/pass@4 | "
            "eval/pass@16 | eval/maj@4 | entropy |") in text
    # the last eval, as for eval/accuracy: alpha's 0.4 ± 0.1 -> pass@4 0.6 ± 0.1, maj@4 0.5 ± 0.1
    assert ("| alpha | 3 | 0.14 ± 0.1 | 0.4 ± 0.1 | 0.4 ± 0.1 | 0.6 ± 0.1 | 1 ± 0 | 0.5 ± 0.1 |"
            in text)
    keys = plot.with_prefixed(plot.FIGURES["eval_accuracy"], runs)
    lines = drawn_lines(monkeypatch, runs, "eval_accuracy", keys, tmp_path / "eval.png")
    assert lines["beta eval/maj@4 (3 seeds)"][0] == [0, 5]
    assert lines["beta eval/maj@4 (3 seeds)"][1] == pytest.approx([0.2, 0.55])
    assert sorted(lines) == sorted(f"{v} {k} (3 seeds)" for v in ("alpha", "beta") for k in keys)
    # runs without them: eval/accuracy alone, as before
    plain = plot.load_runs(make_runs(tmp_path / "plain"))
    assert plot.with_prefixed(plot.SUMMARY, plain) == plot.SUMMARY


def test_a_duplicate_eval_at_the_resume_step_is_drawn_once(tmp_path, monkeypatch):
    """A run ended at step 5 (its last eval at step 5), then resumed with max_iters=7: the resumed
    run of an older train.py evaluated step 5 again before going on. read_log keeps the last eval of step 5, so the eval
    series, the figure and the summary have one point per step; the train record of step 5 stays."""
    records = [{"step": 0, "eval/accuracy": 0.1, "eval/pass@4": 0.2}]
    records += [train_record(t, 0.5, 1.0) for t in range(1, 6)]
    records.append({"step": 5, "eval/accuracy": 0.4, "eval/pass@4": 0.6})
    records.append({"step": 5, "eval/accuracy": 0.45, "eval/pass@4": 0.65})  # the resumed run's
    records += [train_record(t, 0.5, 1.0) for t in range(6, 8)]
    records.append({"step": 7, "eval/accuracy": 0.5, "eval/pass@4": 0.7})
    run = write_log(tmp_path / "cmp" / "resumed_s0", records)
    read = plot.read_log(run)
    assert [(r["step"], plot.is_eval(r)) for r in read] == [
        (0, True), (1, False), (2, False), (3, False), (4, False), (5, False), (5, True),
        (6, False), (7, False), (7, True)]
    assert plot.series(read, "eval/accuracy") == [(0, 0.1), (5, 0.45), (7, 0.5)]
    runs = plot.load_runs([run])
    lines = drawn_lines(monkeypatch, runs, "eval_accuracy",
                        plot.with_prefixed(["eval/accuracy"], runs), tmp_path / "eval.png")
    assert lines == {"resumed eval/accuracy": ([0, 5, 7], [0.1, 0.45, 0.5]),
                     "resumed eval/pass@4": ([0, 5, 7], [0.2, 0.65, 0.7])}
    stats = plot.final_metrics(runs, ["eval/accuracy", "eval/pass@4"])["resumed"]
    assert stats == {"eval/accuracy": (0.5, 0.0, 1), "eval/pass@4": (0.7, 0.0, 1)}


def compare(*args, timeout=120):
    return subprocess.run([sys.executable, "compare.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_compare_dry_run_prints_the_commands(tmp_path):
    cfg = tmp_path / "my_variant.py"
    cfg.write_text("loss_type = 'dapo'\nmax_iters = 4\n")
    out = tmp_path / "cmp"
    # reaches max_iters=3: skipped
    write_log(out / "grpo_s1", [train_record(t, 0.5, 1.0) for t in (1, 2, 3)])
    os.makedirs(out / "my_variant_s0" / "ckpt")
    # stopped at step 2 of 4: resumed
    (out / "my_variant_s0" / "ckpt" / "meta.json").write_text('{"step": 2}')
    result = compare("--variants=grpo," + str(cfg), "--seeds=0,1", f"--out={out}", "--dry_run",
                     "--", "--max_iters=3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    commands = [line.split(" ", 2)[2] for line in lines if not line.startswith("#")]
    assert commands == [
        f"config/cpu_demo.py --loss_type=grpo --max_iters=3 --out_dir={out}/grpo_s0 --seed=0",
        f"config/cpu_demo.py --loss_type=grpo --max_iters=3 --out_dir={out}/grpo_s1 --seed=1",
        f"config/cpu_demo.py {cfg} --max_iters=3 --out_dir={out}/my_variant_s0 --seed=0 "
        "--init_from=resume",
        f"config/cpu_demo.py {cfg} --max_iters=3 --out_dir={out}/my_variant_s1 --seed=1"]
    assert all(line.split(" ", 2)[1].endswith("train.py")
               for line in lines if not line.startswith("#"))
    assert ("# grpo_s1: skipped, its log reaches max_iters (delete its directory to run it again)"
            in lines)
    assert "# grpo_s0: runs" in lines
    # the --max_iters=3 override wins over the file's 4: a checkpoint at step 2 is resumed
    assert "# my_variant_s0: resumes from its checkpoint" in lines
    # max_iters=4 from the file
    result = compare("--variants=" + str(cfg), "--seeds=0", f"--out={out}", "--dry_run")
    assert result.stdout.splitlines()[1].endswith("--seed=0 --init_from=resume")
    assert not os.path.exists(out / "grpo_s0")  # a dry run runs nothing


def test_compare_reports_a_failed_run_and_runs_the_others(tmp_path):
    """A variant whose config file raises fails (train.py: exit code 2); the next run still runs
    (max_iters=0, no eval: model load only, a few seconds) and compare.py exits 1."""
    cfg = tmp_path / "broken.py"
    cfg.write_text("raise RuntimeError('boom')\n")
    out = tmp_path / "cmp"
    result = compare(f"--variants={cfg},grpo", f"--out={out}", "--", "--max_iters=0",
                     "--eval_interval=0", "--rollout_engine=hf")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "broken_s0: FAILED with exit code 2" in result.stdout
    assert f"{cfg}: RuntimeError: boom" in result.stdout  # the tail of its train.out
    assert "grpo_s0: done" in result.stdout
    assert "1 of 2 runs failed: broken_s0" in result.stdout
    assert "config error" in open(out / "broken_s0" / "train.out").read()
    assert (os.path.exists(out / "grpo_s0" / "log.jsonl")
            and os.path.exists(out / "grpo_s0" / "train.out"))
