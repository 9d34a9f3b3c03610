"""
Plot and summarize runs of train.py, and say which differences between variants survive the seed
spread.

    python plot.py out/cmp/grpo_s0 out/cmp/grpo_s1 out/cmp/gspo_s0 out/cmp/gspo_s1
        [--out=out/cmp/plots]

What it teaches: an RL curve of one seed is an anecdote. Runs are grouped into variants by their
directory name without the seed suffix (grpo_s0, grpo_s1 -> 'grpo'); each figure overlays the
variants, a mean line with a min-max band over seeds. The summary table gives each variant's final
metrics as mean +- std over seeds, and the honesty rule reports a difference between two variants
only when it is larger than their seed spreads added together (|mean_a - mean_b| > std_a + std_b,
both with >= 2 seeds). Works on finished and on still-running runs (it reads log.jsonl as far as it
goes).
"""
import argparse
import itertools
import json
import math
import os
import re
import statistics

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

# figure name -> the keys drawn in it (one line style each); a figure no run has a key of is skipped
FIGURES = {
    'reward': ['reward'], 'eval_accuracy': ['eval/accuracy'], 'entropy': ['entropy'],
    'completion_len': ['completion_len_correct', 'completion_len_wrong'],
    'clip_frac': ['loss/clip_frac_low', 'loss/clip_frac_high'],
    'degenerate_frac': ['degenerate_frac'],
    'rollout_mismatch': ['rollout_mismatch'], 'cov_logp_adv': ['loss/cov_logp_adv'],
    'value_loss': ['value/loss'], 'value_explained_var': ['value/explained_var'],
    'token_weight_short_long': ['token_weight_short_long'],
    # with a tool (tools.py): the answers that call it, its errors; the eval with calls unanswered
    'tool_calls': ['tool/call_frac', 'tool/errors'],
    'eval_accuracy_no_tool': ['eval/accuracy_no_tool'],
}
STYLES = ['-', '--', ':', '-.']  # one per key of a figure (used again past the fourth)
# the summary's columns; step_seconds = rollout + train + sync seconds of a step (added by read_log)
SUMMARY = ['reward', 'eval/accuracy', 'entropy', 'completion_len', 'loss/clip_frac',
           'degenerate_frac', 'rollout_mismatch', 'step_seconds']
# keys whose name holds k (eval_samples, which varies by run), found by prefix in the records and
# drawn and summarized right after the key they belong with: eval/pass@1, eval/pass@4, eval/maj@4
BY_PREFIX = {'eval/accuracy': ['eval/pass@', 'eval/maj@']}
LAST_N = 3  # a run's final value of a training metric: the mean of its last 3 records that have it


def read_log(run_dir):
    """The records of run_dir/log.jsonl sorted by step; a step logged twice (a resumed run appends)
    keeps its last record (train and eval records of one step are kept apart). So a step is drawn
    once: the train records (and evals) a killed run logs past its checkpoint are replaced when it
    resumes. train.py evaluates a step before its checkpoint, so a resumed run does not repeat an
    eval; logs of older versions, which evaluated the resume step again, keep its last eval. A
    half-written last line is ignored."""
    records = {}
    try:
        lines = open(os.path.join(run_dir, 'log.jsonl')).readlines()
    except OSError:
        return []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and 'step' in r:
            times = [r[k] for k in ('rollout_seconds', 'train_seconds', 'sync_seconds')
                     if is_number(r.get(k))]
            if times:
                r['step_seconds'] = sum(times)
            records[(r['step'], is_eval(r))] = r
    return [records[k] for k in sorted(records)]


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_eval(record):
    return any(k.startswith('eval/') for k in record)


def variant_name(run_dir):
    """The run directory's basename without a trailing seed suffix: out/cmp/grpo_s1 -> 'grpo'."""
    return re.sub(r'_s\d+$', '', os.path.basename(os.path.normpath(run_dir)))


def load_runs(run_dirs):
    """{variant: {run_dir: records}}, in the order given; runs without a record yet are left out
    (and said)."""
    runs = {}
    for d in run_dirs:
        records = read_log(d)
        if records:
            runs.setdefault(variant_name(d), {})[d] = records
        else:
            print(f"{d}: no log records yet, left out")
    return runs


def with_prefixed(keys, runs):
    """keys, each followed by the keys of the runs' records that are one of its BY_PREFIX prefixes
    and a number, by prefix and then by number: eval/accuracy -> eval/accuracy, eval/pass@1,
    eval/pass@4, eval/maj@4."""
    present = {k for by_run in runs.values() for records in by_run.values()
               for r in records for k in r}
    out = []
    for key in keys:
        out.append(key)
        for prefix in BY_PREFIX.get(key, []):
            found = [k for k in present if k.startswith(prefix) and k[len(prefix):].isdigit()]
            out += sorted(found, key=lambda k: int(k[len(prefix):]))
    return out


def series(records, key):
    """(step, value) of the records where key holds a number (absent keys and None are skipped)."""
    return [(r['step'], r[key]) for r in records if is_number(r.get(key))]


def final_value(records, key):
    """A run's final value: the last eval record for eval/ keys, else the mean of the last 3; None
    if absent."""
    values = [v for _, v in series(records, key)]
    if not values:
        return None
    return values[-1] if key.startswith('eval/') else statistics.mean(values[-LAST_N:])


def final_metrics(runs, keys=SUMMARY):
    """{variant: {key: (mean, std, n)}} over the variant's runs that have the key; std is the sample
    std (n - 1 in the denominator), 0.0 for a single run. Keys no run of the variant has are
    absent."""
    out = {}
    for variant, by_run in runs.items():
        out[variant] = {}
        for key in keys:
            finals = [v for v in (final_value(rs, key) for rs in by_run.values()) if v is not None]
            if finals:
                std = statistics.stdev(finals) if len(finals) > 1 else 0.0
                out[variant][key] = (statistics.mean(finals), std, len(finals))
    return out


def differences(stats, keys=SUMMARY):
    """The honesty rule: lines naming each (metric, pair of variants) whose means differ by more
    than the sum of their stds, both with >= 2 seeds; says so when nothing does, and which variants
    cannot be judged."""
    found, compared, variants = [], 0, list(stats)
    for key, (a, b) in itertools.product(keys, itertools.combinations(variants, 2)):
        if (key not in stats[a] or key not in stats[b]
                or min(stats[a][key][2], stats[b][key][2]) < 2):
            continue
        compared += 1
        hi, lo = sorted((a, b), key=lambda v: -stats[v][key][0])
        (mh, sh, _), (ml, sl, _) = stats[hi][key], stats[lo][key]
        if mh - ml > sh + sl:
            found.append(f"- {key}: {hi} {mh:.4g} ± {sh:.2g} > {lo} {ml:.4g} ± {sl:.2g} "
                         f"(difference {mh - ml:.3g}, spread {sh + sl:.3g})")
    if len(variants) < 2:
        found.append("- Only one variant: nothing to compare.")
    elif not found:
        found.append(f"- No difference exceeds the seed spread ({compared} metric/pair "
                     "comparisons)." if compared else
                     "- No pair of variants has >= 2 seeds of a metric: nothing can be compared.")
    for v in variants:
        if max((n for _, _, n in stats[v].values()), default=0) < 2:
            found.append(f"- {v} has only one seed: no claim can be made about it.")
    return found


def summary_table(runs):
    """Markdown: one row per variant, final metrics as mean ± std over seeds, then the honesty
    rule."""
    columns = with_prefixed(SUMMARY, runs)
    stats = final_metrics(runs, columns)
    keys = [k for k in columns if any(k in s for s in stats.values())]
    lines = ['| variant | seeds | ' + ' | '.join(keys) + ' |', '|---' * (len(keys) + 2) + '|']
    for variant, s in stats.items():
        cells = []
        for k in keys:
            m, sd, n = s.get(k, (None, None, 0))
            cell = '–' if n == 0 else f'{m:.4g}' if n == 1 else f'{m:.4g} ± {sd:.2g}'
            cells.append(cell + (f' (n={n})' if 0 < n < len(runs[variant]) else ''))
        lines.append(f'| {variant} | {len(runs[variant])} | ' + ' | '.join(cells) + ' |')
    return '\n'.join([
        "Final values: mean ± sample std over seeds; a run's final value is the mean of its last "
        f"{LAST_N} training records (the last eval for eval/ metrics); "
        "step_seconds = rollout + train + sync.", '',
        *lines, '', '## Differences beyond seed spread', '',
        'Reported when |mean_a - mean_b| > std_a + std_b and both variants have >= 2 seeds.', '',
        *differences(stats, columns)]) + '\n'


def plot_figure(runs, name, keys, path):
    """One PNG: every variant in its own color, one line style per key; several seeds: mean and
    min-max band. At each step the mean is over the seeds that logged it. False if no run has any of
    the keys."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    for color, (variant, by_run) in zip(plt.cm.tab10.colors * 10, runs.items()):
        for style, key in zip(itertools.cycle(STYLES), keys):
            at_step = {}
            for records in by_run.values():
                for step, v in series(records, key):
                    at_step.setdefault(step, []).append(v)
            if not at_step:
                continue
            steps = sorted(at_step)
            label = variant + (f' {key}' if len(keys) > 1 else '')
            label += f' ({len(by_run)} seeds)' if len(by_run) > 1 else ''
            ax.plot(steps, [statistics.mean(at_step[s]) for s in steps], style, color=color,
                    label=label, marker='o' if len(steps) < 12 else None)
            if len(by_run) > 1:
                ax.fill_between(steps, [min(at_step[s]) for s in steps],
                                [max(at_step[s]) for s in steps],
                                color=color, alpha=0.2, linewidth=0)
            drawn = True
    if drawn:
        band = (' (mean, band: min-max over seeds)'
                if any(len(by_run) > 1 for by_run in runs.values()) else '')
        ax.set(xlabel='step', ylabel=' / '.join(keys), title=name + band)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn


def plot_runs(run_dirs, out_dir=None):
    """Every figure that has data and summary.md into out_dir (default: <common parent of the
    runs>/plots). Returns (written paths, summary text)."""
    runs = load_runs(run_dirs)
    if out_dir is None:
        parent = os.path.commonpath([os.path.dirname(os.path.abspath(d)) for d in run_dirs])
        out_dir = os.path.join(os.path.relpath(parent), 'plots')
    if not runs:
        print("no run has log records: nothing to plot")
        return [], ''
    os.makedirs(out_dir, exist_ok=True)
    paths = [p for name, keys in FIGURES.items() if plot_figure(
        runs, name, with_prefixed(keys, runs), p := os.path.join(out_dir, f'{name}.png'))]
    text = summary_table(runs)
    with open(os.path.join(out_dir, 'summary.md'), 'w') as f:
        f.write(text)
    return paths + [os.path.join(out_dir, 'summary.md')], text


if __name__ == '__main__':
    # the description: the docstring's first paragraph (one sentence, wrapped), on one line
    parser = argparse.ArgumentParser(description=' '.join(__doc__.strip().split('\n\n')[0].split()))
    parser.add_argument('run_dirs', nargs='+', help='run directories (each holds a log.jsonl)')
    parser.add_argument('--out', default=None,
                        help='where PNGs and summary.md go (default: <common parent>/plots)')
    args = parser.parse_args()
    paths, text = plot_runs(args.run_dirs, args.out)
    print(text)
    for p in paths:
        print(f"wrote {p}")
