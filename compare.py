"""
Run variants x seeds of train.py, then plot and summarize them with plot.py (the honesty rule: only
a difference larger than the seed spread counts).

    python compare.py --variants=grpo,gspo --seeds=0,1,2 --out=out/cmp
        -- --num_iterations=2 --max_iters=10
    python compare.py --variants=grpo,config/dapo.py --seeds=0,1 --dry_run # print the commands only

A variant is a loss_type (passed as --loss_type=NAME) or a config file (*.py, passed after --config;
its basename without .py names the variant). Everything after `--` goes to every run. Run (variant,
seed) goes to <out>/<variant>_s<seed>, its stdout and stderr to train.out there. train.py runs as it
is, in a subprocess: with GPUs, one run per GPU in parallel (CUDA_VISIBLE_DEVICES); on CPU, one
after another. A run whose log already reaches max_iters is skipped; one with an unfinished
checkpoint (stopped by SIGTERM / Ctrl-C) continues from it (--init_from=resume). A failed run is
reported and the others still run; the exit code is 1 if any failed. Each run keeps its checkpoint
(1.6 GB for the demo model); `-- --ckpt_interval=-1` writes none (and then nothing can resume).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

import plot

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train.py')
argv = sys.argv[1:]
cut = argv.index('--') if '--' in argv else len(argv)
overrides = argv[cut + 1:]  # --key=value for every run
parser = argparse.ArgumentParser(usage='python compare.py --variants=A,B [--seeds=0,1,2] '
                                       '[--config=FILE] [--out=DIR] [--dry_run] '
                                       '[-- --key=value ...]')
parser.add_argument('--variants', required=True,
                    help='comma-separated loss_type names and/or config files (*.py)')
parser.add_argument('--seeds', default='0', help='comma-separated seeds')
parser.add_argument('--config', default='config/cpu_demo.py',
                    help="the base config file ('' for none)")
parser.add_argument('--out', default='out/compare',
                    help='runs go to <out>/<variant>_s<seed>, plots to <out>/plots')
parser.add_argument('--dry_run', action='store_true', help='print the commands, run nothing')
args = parser.parse_args(argv[:cut])


def target_max_iters(config_files):
    """max_iters as train.py will see it: the last --max_iters override, else the last config file
    that sets it, else train.py's default. None if it cannot be told (then the run is simply run
    again)."""
    try:
        for a in reversed(overrides):
            if a.startswith('--max_iters='):
                return int(a.split('=', 1)[1])
        scope = {}
        for f in config_files:
            exec(open(f).read(), scope)
        if 'max_iters' in scope:
            return int(scope['max_iters'])
        return int(re.search(r'^max_iters = (\d+)', open(TRAIN).read(), re.M).group(1))
    except Exception:
        return None  # train.py will say what is wrong with the file or the value


def run_state(run_dir, max_iters):
    """'done' if the log reaches max_iters, 'resume' if an unfinished checkpoint is there, else
    'run'."""
    if max_iters is None:
        return 'run'
    if any(r['step'] >= max_iters for r in plot.read_log(run_dir)):
        return 'done'
    try:
        step = json.load(open(os.path.join(run_dir, 'ckpt', 'meta.json')))['step']
        return 'resume' if step < max_iters else 'run'
    except (OSError, ValueError, KeyError):
        return 'run'


runs = []  # (name, run_dir, command, state)
for variant in args.variants.split(','):
    is_file = variant.endswith('.py')
    configs = [c for c in [args.config] if c] + ([variant] if is_file else [])
    max_iters = target_max_iters(configs)
    for seed in args.seeds.split(','):
        name = f"{os.path.basename(variant)[:-3] if is_file else variant}_s{seed}"
        run_dir = os.path.join(args.out, name)
        state = run_state(run_dir, max_iters)
        cmd = [sys.executable, TRAIN, *configs, *([] if is_file else [f'--loss_type={variant}']),
               *overrides, f'--out_dir={run_dir}', f'--seed={seed}',
               *(['--init_from=resume'] if state == 'resume' else [])]
        runs.append((name, run_dir, cmd, state))

NOTES = {'done': 'skipped, its log reaches max_iters (delete its directory to run it again)',
         'resume': 'resumes from its checkpoint', 'run': 'runs'}
for name, _, cmd, state in runs:
    print(f"# {name}: {NOTES[state]}" + (f"\n{shlex.join(cmd)}" if args.dry_run else ''))
if args.dry_run:
    sys.exit(0)

import torch  # noqa: E402  (only to count the GPUs; a dry run does without it)

n_gpus = torch.cuda.device_count()
visible = os.environ.get('CUDA_VISIBLE_DEVICES')
# None: CPU
slots = (visible.split(',') if visible else [str(i) for i in range(n_gpus)])[:n_gpus] or [None]
todo = [r for r in runs if r[3] != 'done']
if todo:
    print("one run per GPU, in parallel: GPUs " + ','.join(slots) if slots[0] else
          "no GPU: one run after another")
running, failed = {}, []  # running: process -> (name, run_dir, slot)
try:
    while todo or running:
        while todo and slots:
            (name, run_dir, cmd, state), slot = todo.pop(0), slots.pop(0)
            os.makedirs(run_dir, exist_ok=True)
            print(f"start {name}{f' on GPU {slot}' if slot else ''}: {shlex.join(cmd)}", flush=True)
            with open(os.path.join(run_dir, 'train.out'), 'a' if state == 'resume' else 'w') as f:
                env = {**os.environ, 'CUDA_VISIBLE_DEVICES': slot} if slot else None
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
                running[proc] = (name, run_dir, slot)
        time.sleep(1)
        for proc in [p for p in running if p.poll() is not None]:
            name, run_dir, slot = running.pop(proc)
            slots.append(slot)
            rc = proc.returncode
            print(f"{name}: {'done' if rc == 0 else f'FAILED with exit code {rc}'}", flush=True)
            if rc:
                failed.append(name)
                tail = open(os.path.join(run_dir, 'train.out'),
                            errors='replace').read().splitlines()[-15:]
                # chr(13): tqdm's \r
                print('\n'.join(f"  | {line.rsplit(chr(13), 1)[-1]}" for line in tail))
# the runs got the Ctrl-C too: they finish their step and write a checkpoint
except KeyboardInterrupt:
    print("interrupted: waiting for the running runs to checkpoint; the same command resumes those "
          "that wrote one (not with --ckpt_interval=-1: they start again)")
    for proc in running:
        proc.wait()
    sys.exit(130)

paths, text = plot.plot_runs([r[1] for r in runs], os.path.join(args.out, 'plots'))
print(text)
for p in paths:
    print(f"wrote {p}")
if failed:
    print(f"{len(failed)} of {len(runs)} runs failed: {', '.join(failed)} "
          "(see train.out in their directories)")
    sys.exit(1)
