"""Is a refactor the same run, number for number? Runs a few short trainings with train.py at two
git revisions on this machine and compares every logged value except timings and memory.

    python tests/same_run.py BEFORE_REV [AFTER_REV]     # AFTER_REV: the working tree if omitted

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
}
UNSTABLE = ("_seconds", "tokens_per_second", "peak_memory_gib", "eval/seconds")


def run_all(tree, out_root):
    logs = {}
    for name, overrides in RUNS.items():
        out_dir = os.path.join(out_root, name)
        result = subprocess.run([sys.executable, "train.py", *TINY, *overrides,
                                 f"--out_dir={out_dir}"], cwd=tree, capture_output=True, text=True)
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


def compare(before, after):
    """Every record's keys and values equal, except the timings; returns the number of values compared
    and how many were bit-for-bit equal."""
    compared = exact = 0
    for name in RUNS:
        a, b = before[name], after[name]
        assert len(a) == len(b), f"{name}: {len(a)} records before, {len(b)} after"
        for ra, rb in zip(a, b):
            ka = {k for k in ra if not k.endswith(UNSTABLE)}
            kb = {k for k in rb if not k.endswith(UNSTABLE)}
            assert ka == kb, f"{name} step {ra.get('step')}: only before {ka - kb}, only after {kb - ka}"
            for k in sorted(ka):
                assert same(ra[k], rb[k]), (f"{name} step {ra['step']}: {k} = {ra[k]!r} before, "
                                            f"{rb[k]!r} after")
                compared += 1
                exact += ra[k] == rb[k]
    return compared, exact


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        trees = [checkout(rev, tmp) for rev in sys.argv[1:3]]
        trees += [ROOT] if len(trees) == 1 else []
        try:
            logs = [run_all(tree, os.path.join(tmp, f"out{i}")) for i, tree in enumerate(trees)]
            n, exact = compare(*logs)
            print(f"same run: {len(RUNS)} runs, {n} logged values equal (timings excluded), {exact} of "
                  f"them bit for bit")
        finally:
            for tree in trees:
                if tree != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT)
