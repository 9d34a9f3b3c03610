"""Is a refactor the same run, number for number? Runs a few short trainings with train.py at two
git revisions on this machine and compares every logged value except timings and memory.

    python tests/same_run.py BEFORE_REV [AFTER_REV]     # AFTER_REV: the working tree if omitted
    python tests/same_run.py BEFORE_REV --keep=/tmp/same  # BEFORE_REV's logs kept there, reused

--threads=N runs every training with N CPU threads (OMP_NUM_THREADS). With 1 the runs are
deterministic, so "bit for bit" means the same arithmetic: with 2, two runs of hf_ppo_kl at one
revision differed by ~1e-6 relative (its explained variance, a difference of near-equal sums, by
1e-5 absolute) on a 2-core Xeon with AMX, 2026-12-01, while the other runs were equal.

--ignore=KEY,... leaves keys out of the comparison, for a change meant to move them (the output
says how many of their values moved).

--keep=DIR keeps each revision's logs as DIR/<rev>.json and reuses a revision's file when it is
there, so that the slow "before" half runs once while the "after" half is iterated on (the
working tree's are kept as DIR/tree.json, never reused).

Deterministic on one machine only (bf16 and fp32 kernels round differently per CPU), so both
revisions run here, in fp32 (bf16 on a CPU without bf16 instructions is emulated, ~60x slower), one
after the other, on the same model, data and seeds. Each revision is
checked out with `git worktree` into a temporary folder; the model and the data are the working
tree's.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["config/cpu_demo.py", f"--init_from={ROOT}/models/smollm2/hf",
        f"--data_dir={ROOT}/data/arithmetic", "--prompts_per_step=2", "--group_size=4",
        "--max_new_tokens=8", "--eval_interval=2", "--eval_problems=4", "--eval_samples=2",
        "--max_iters=2", "--micro_batch_size=4", "--dtype=float32"]
RUNS = {  # name: overrides; together they pass every block of the step
    "vllm_grpo": ["--rollout_engine=vllm"],
    "hf_dapo_two_passes": ["--rollout_engine=hf", "--loss_type=dapo", "--num_iterations=2",
                           "--learning_rate=1e-5", "--entropy_coef=0.01", "--mask_truncated=True",
                           "--beta=0.05"],
    "hf_dynamic_sampling": ["--rollout_engine=hf", "--loss_type=gspo", "--dynamic_sampling=True",
                            "--max_gen_batches=3", "--overlong_buffer=2", "--format_coef=0.1"],
    "hf_ppo_kl": ["--rollout_engine=hf", "--loss_type=ppo", "--beta=0.05", "--num_iterations=2",
                  "--reward_wrong=-1.0"],
    # every other loss_type, off-policy (two passes) so that its clip or gate acts
    **{f"hf_{loss_type}": ["--rollout_engine=hf", f"--loss_type={loss_type}", "--num_iterations=2",
                           "--learning_rate=1e-4"]
       for loss_type in ("dr_grpo", "gspo_token", "clip_cov", "kl_cov", "vapo")},
    "vllm_cispo_tis": ["--rollout_engine=vllm", "--loss_type=cispo", "--num_iterations=2",
                       "--tis_mode=token_truncate", "--length_reward_coef=0.1"],
    "vllm_sapo_bypass": ["--rollout_engine=vllm", "--loss_type=sapo", "--num_iterations=2",
                         "--old_logp_source=rollout", "--adv_scale=batch"],
}
UNSTABLE = ("_seconds", "tokens_per_second", "peak_memory_gib", "eval/seconds")


def run_all(tree, out_root, threads=None):
    logs = {}
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    for name, overrides in RUNS.items():
        out_dir = os.path.join(out_root, name)
        result = subprocess.run([sys.executable, "train.py", *TINY, *overrides,
                                 f"--out_dir={out_dir}"], cwd=tree, capture_output=True, text=True,
                                env=env)
        if result.returncode != 0:
            sys.exit(f"{name} failed in {tree}:\n{result.stderr[-3000:]}")
        logs[name] = [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]
        print(f"{tree}: {name} done", flush=True)
    return logs


def checkout(rev, tmp):
    path = os.path.join(tmp, rev.replace("/", "_"))
    subprocess.run(["git", "worktree", "add", "--detach", path, rev], cwd=ROOT, check=True,
                   capture_output=True)
    return path


def same(a, b):
    """Counts, rewards, strings: equal. Other floats: to 1e-5 relative, since fp32 CPU kernels are not
    bit-deterministic run to run (multithreaded reductions: two runs of the same code differed by 2e-7
    relative in grad_norm here), while a changed formula moves them by far more."""
    if isinstance(a, float) and isinstance(b, float):
        # abs_tol: quantities near 0 that are differences of near-equal sums (explained_var at
        # -0.0026 moved by 1.1e-7 between two revisions of the same arithmetic) amplify that noise
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    return a == b


def compare(before, after, ignore=()):
    """Every record's keys and values equal, except the timings (and the values of the keys in
    ignore); returns the number of values compared, how many were bit-for-bit equal, and how many
    of the ignored values moved."""
    compared = exact = moved = 0
    for name in RUNS:
        a, b = before[name], after[name]
        assert len(a) == len(b), f"{name}: {len(a)} records before, {len(b)} after"
        for ra, rb in zip(a, b):
            ka = {k for k in ra if not k.endswith(UNSTABLE)}
            kb = {k for k in rb if not k.endswith(UNSTABLE)}
            assert ka == kb, f"{name} step {ra.get('step')}: only before {ka - kb}, only after {kb - ka}"
            for k in sorted(ka):
                if k in ignore:
                    moved += not same(ra[k], rb[k])
                    continue
                assert same(ra[k], rb[k]), (f"{name} step {ra['step']}: {k} = {ra[k]!r} before, "
                                            f"{rb[k]!r} after")
                compared += 1
                exact += ra[k] == rb[k]
    return compared, exact, moved


def logs_of(rev, tmp, keep, threads=None):
    """The logs of a revision (None: the working tree), from keep/<rev>.json when it is there."""
    saved = os.path.join(keep, f"{rev.replace('/', '_') if rev else 'tree'}.json") if keep else None
    if rev and saved and os.path.exists(saved):
        print(f"{rev}: logs from {saved}")
        return json.load(open(saved))
    tree = checkout(rev, tmp) if rev else ROOT
    try:
        logs = run_all(tree, os.path.join(tmp, f"out_{rev or 'tree'}"), threads)
    finally:
        if rev:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT)
    if saved:
        os.makedirs(keep, exist_ok=True)
        json.dump(logs, open(saved, "w"))
    return logs


if __name__ == "__main__":
    keep = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--keep=")), None)
    ignore = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:]
                   if a.startswith("--ignore=")), [])
    threads = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--threads=")),
                   None)
    revs = [a for a in sys.argv[1:] if not a.startswith("--")][:2]
    with tempfile.TemporaryDirectory() as tmp:
        logs = [logs_of(rev, tmp, keep, threads) for rev in revs + [None] * (2 - len(revs))]
        n, exact, moved = compare(*logs, ignore)
        print(f"same run: {len(RUNS)} runs, {n} logged values equal (timings excluded), {exact} of "
              f"them bit for bit" + (f"; of {', '.join(ignore)} (not compared), {moved} values "
                                     f"moved" if ignore else ""))
