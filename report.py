"""
What a run shows: the step's record (log.jsonl), a few of its completions (samples.jsonl), the
console lines, the guards that say in words what the log shows going wrong, and the summary at the
end. A GRPO reader may skip this file: train.py calls it once a step.

Every number of a record is already summed over ranks by train.py (one reduction a step), so every
rank computes the same record and the guards come to the same verdict on every rank; rank 0 writes.
"""
import json
import os
import sys

import torch
from tqdm import tqdm

from critic import critic_record
from losses import token_weight_sums


# -----------------------------------------------------------------------------
# the step's record: sums of this rank, reduced by train.py, turned into means here

def sampling_record(counts, world_size):
    """The step's sampling record, from the counts of every round summed over ranks (rollout's
    round_counts; dynamic sampling's also its rounds and live groups)."""
    # over every sample
    record = {'samples': counts['samples'],
              'accuracy': counts['samples_correct'] / max(counts['samples'], 1),
              'degenerate_frac': counts['groups_degenerate'] / max(counts['groups_sampled'], 1)}
    if 'gen_rounds' in counts:
        record.update(gen_rounds=counts['gen_rounds'] / world_size,
                      prompts_consumed=counts['groups_sampled'], live_groups=counts['groups_live'])
    return record


def batch_stats(mb, logp, entropy, n_tokens, median_len):
    """Trainer-side statistics of the batch as sampled (first pass): entropy, the sampler's
    mismatch, and seed 000's experiment 1 in a real step (losses.token_weight_sums: grpo weighs
    short answers' tokens up)."""
    mask = mb['completion_mask']
    sums = {'n_tokens': n_tokens, 'entropy': (entropy.detach() * mask).sum().item()}
    if 'rollout_logp' in mb:  # |log pi_trainer - log pi_sampler| over the sampled tokens
        sums['rollout_mismatch'] = ((logp.detach() - mb['rollout_logp']).abs() * mask).sum().item()
    return {**sums, **token_weight_sums(logp.grad, mb['advantages'], mask, median_len)}


def step_sums(batch, reward_parts, lengths, trained, mbs, body_tokens, verified, group_size,
              critic=False):
    """This rank's sums for the step's record, beside the update's: the per-sample quantities
    (logged as their means over the step's samples), the token counts, the reward errors so far
    (verified: the trainer's counts); with shaping terms, the within-group variance of the task
    reward and of the shaping (what moves a group advantage); critic (ppo / vapo): the squared
    error of GRPO's group-mean baseline, which the critic's is compared with."""
    correct = batch['correct'] > 0
    per_sample = {'reward': batch['rewards'], 'completion_len': lengths,
                  'truncated': batch['truncated'].float(), 'trained_frac': trained.float(),
                  **{f'reward/{k}': v for k, v in reward_parts.items()}}
    if 'true_correct' in batch:  # reward_control: the verifier's verdicts, never seen by the trainer
        per_sample['reward/true_task'] = torch.tensor(batch['true_correct'], dtype=torch.float)
    if 'tool_calls' in batch:  # a tool (tools.py): its calls, errors and tokens per answer
        calls = torch.tensor(batch['tool_calls'], dtype=torch.float)
        per_sample.update({'tool/calls': calls, 'tool/call_frac': (calls > 0).float(),
                           'tool/errors': torch.tensor(batch['tool_errors'], dtype=torch.float),
                           'tool/tokens': batch['completion_attention'].sum(1) - lengths})
    sums = {**{k: v.sum().item() for k, v in per_sample.items()},
            'seqs': len(lengths), 'n_correct': correct.sum().item(),
            'len_correct': lengths[correct].sum().item(), 'body_tokens': body_tokens,
            'head_tokens': sum(mb['completion_mask'].sum().item() for mb in mbs),
            'reward_errors': verified['errors'], 'verified': verified['completions']}
    group_mean = lambda r: r.view(-1, group_size).mean(1).repeat_interleave(group_size)
    sq_dev = lambda r: ((r - group_mean(r)) ** 2).sum()  # within its group
    if len(reward_parts) > 1:
        sums['var_task'] = sq_dev(reward_parts['task']).item()
        sums['var_shaping'] = sq_dev(sum(v for k, v in reward_parts.items() if k != 'task')).item()
    if critic:
        sums['group_sq_err'] = sq_dev(batch['rewards']).item()
    return sums


def rank_numbers(batch, seconds, pad_frac, device):
    """This rank's own numbers of the step (logged as rank 0's): stage seconds, memory, padding."""
    mask = batch['completion_mask']
    # the padding of this rank's rows at the batch's full width, before micro_batches packs them
    full_width = len(mask) * (batch['prompt_ids'].shape[1] + mask.shape[1])
    real_tokens = mask.sum().item() + batch['prompt_mask'].sum().item()
    return {**seconds, 'peak_memory_gib': peak_memory(device) / 2**30, 'pad_frac': pad_frac,
            'pad_frac_unpacked': 1 - real_tokens / full_width}


def step_record(step, totals, update, sample_record, num_iterations, local):
    """The step's log record: means of totals (step_sums and the update's statistics, summed over
    ranks) per sample, or per token of the trained rows; update: what the optimizer passes did;
    local: this rank's own numbers (rank_numbers)."""
    totals = dict(totals)
    n_tokens = max(totals.pop('n_tokens', 0), 1e-9)
    seqs, n_correct = totals['seqs'], totals['n_correct']
    len_wrong = totals['completion_len'] - totals['len_correct']
    per_sample = ['reward', 'completion_len', 'truncated', 'trained_frac',
                  *(k for k in totals if k.startswith(('reward/', 'tool/')))]
    record = {
        'step': step + 1,
        **{k: totals[k] / seqs for k in per_sample},
        **sample_record,
        'completion_len_correct': totals['len_correct'] / n_correct if n_correct else None,
        'completion_len_wrong': len_wrong / (seqs - n_correct) if n_correct < seqs else None,
        # over the trained rows' tokens, as the loss/ statistics
        'entropy': totals['entropy'] / n_tokens,
        # loss, grad_norm, lr, nonfinite_skipped, updates_applied (optimizer steps of the policy,
        # of num_iterations), policy_frozen (vapo's warm-up)
        **update,
        'reward_errors': totals['reward_errors'],
        **local,
        # real tokens through the body (a shared prompt once) and through the LM head, all passes
        'train_tokens': totals['body_tokens'] * num_iterations,
        'train_completion_tokens': totals['head_tokens'] * num_iterations,
        # completion tokens through the update (the trained rows, after masking), all passes
        'tokens_per_second': totals['head_tokens'] * num_iterations / local['train_seconds'],
        **{k: v / n_tokens for k, v in totals.items() if k.startswith('loss/')},
    }
    if 'rollout_mismatch' in totals:
        record['rollout_mismatch'] = totals['rollout_mismatch'] / n_tokens
    if totals.get('var_task', 0) + totals.get('var_shaping', 0) > 0:
        # of the within-group variance of the reward (task + shaping), the shaping's share
        record['reward/shaping_share'] = totals['var_shaping'] / (totals['var_task']
                                                                  + totals['var_shaping'])
    if totals['n_short'] and totals['n_long']:  # grpo: > 1, dapo: 1 (losses.token_weight_sums)
        short = totals['weight_short'] / totals['n_short']
        record['token_weight_short_long'] = short / (totals['weight_long'] / totals['n_long'])
    # the critic as a baseline: explained variance, V(s_0) vs GRPO's group mean
    if 'group_sq_err' in totals:
        record.update(critic_record(totals, n_tokens, seqs, totals['group_sq_err']))
    return record


def step_line(record):
    """The step's console line."""
    if 'skipped' in record:
        return f"step {record['step']}: no live group, update skipped"
    return (f"step {record['step']}: reward {record['reward']:.3f} "
            f"len {record['completion_len']:.1f} entropy {record['entropy']:.3f} "
            f"clip {record.get('loss/clip_frac', 0):.4f} gnorm {record['grad_norm']:.3f} "
            f"| rollout {record['rollout_seconds']:.1f}s train {record['train_seconds']:.1f}s "
            f"sync {record['sync_seconds']:.2f}s")


def bad_step_line(record, bad_steps, num_iterations):
    return (f"step {record['step']}: non-finite loss or grad norm, optimizer step skipped "
            f"({bad_steps} in a row; {record['updates_applied']} of {num_iterations} updates "
            f"applied before it)")


def abort_line(bad_steps, max_bad_steps):
    return (f"aborting: {bad_steps} steps in a row with a non-finite loss or grad norm "
            f"(max_bad_steps={max_bad_steps}); the last checkpoint holds the last good weights")


def eval_record(sums):
    """The eval's means of rewards.eval_sums' sums (over ranks): per sample accuracy (avg@k),
    length and truncation; per problem pass@ and maj@."""
    sums = dict(sums)
    n, problems = sums.pop('n'), sums.pop('problems')
    return {f'eval/{key}': v / (problems if '@' in key else n) for key, v in sums.items()}


def eval_lines(record, k, problems, samples):
    """The eval's console lines: its numbers, then one right and one wrong answer of rank 0's
    samples (prompt, completion), where it has one."""
    lines = [f"step {record['step']}: eval accuracy {record['eval/accuracy']:.3f} (avg@{k}) "
             f"pass@{k} {record[f'eval/pass@{k}']:.3f} maj@{k} {record[f'eval/maj@{k}']:.3f} "
             f"({problems} problems, {record['eval/seconds']:.0f}s)"]
    for label, right in [('right', True), ('wrong', False)]:
        example = next((i for i, ok in enumerate(samples['correct']) if (ok > 0) == right), None)
        if example is not None:
            prompt, completion = samples['prompt'][example], samples['completions'][example]
            lines.append(f"  {label}: {prompt[-80:]!r} -> {completion[:120]!r}")
    return lines


# -----------------------------------------------------------------------------
# the guards: what the log shows going wrong, said once in words with the knob that changes it

class Guards:
    """Each step's record goes through check, each eval's through check_eval; they keep the state a
    guard needs across steps (the degenerate steps in a row, the first step's rollout_mismatch, the
    training means since the last eval and those of the eval before)."""

    def __init__(self, cfg):
        self.cfg = cfg  # the run's config (the thresholds and the knobs the messages name)
        self.said, self.degenerate_steps, self.first_mismatch = set(), 0, None
        self.window, self.last_eval = {}, None  # sums since the last eval; (accuracy, means) at it

    def check(self, record, verified):
        """{name: message} of the guards this record trips, each also logged as guard/<name> = 1;
        a message is printed (rank 0) the first time its guard trips, except 'sync': the caller
        stops the run with it. verified: the completions verified so far, over ranks."""
        c = self.cfg
        self.degenerate_steps = self.degenerate_steps + 1 if record.get('degenerate_frac', 0) == 1 else 0
        mismatch = record.get('rollout_mismatch', 0.0)  # (vLLM only)
        if 'rollout_mismatch' in record and self.first_mismatch is None:
            self.first_mismatch = max(mismatch, 0.01)  # the engine was loaded with these weights: in sync
        ratio = mismatch / self.first_mismatch if self.first_mismatch else 0.0
        guards = [
            ('truncated', record.get('truncated', 0) > c['warn_truncated'],
             f"{record.get('truncated', 0):.0%} of the answers were cut at "
             f"max_new_tokens={c['max_new_tokens']}: raise it (or mask_truncated=True)"),
            ('degenerate', self.degenerate_steps >= c['warn_degenerate_steps'] > 0,
             f"every group's answers agreed for {self.degenerate_steps} steps: no gradient; the task "
             f"is too easy or too hard for the model (or try dynamic_sampling=True)"),
            ('reward_errors', record.get('reward_errors', 0) > max(3, 0.01 * verified),
             f"{record.get('reward_errors', 0):.0f} completions' verifier raised or timed out (each "
             f"scored 0): check reward_fn={c['reward_fn']!r} and reward_timeout={c['reward_timeout']}"),
            ('mismatch', ratio > c['warn_mismatch'] > 0,
             f"rollout_mismatch {mismatch:.3f} is {ratio:.1f}x the first step's: the sampler drifts "
             f"from the trainer (tis_mode='token_truncate' corrects for it)"),
            ('sync', ratio > c['stop_mismatch'] > 0,
             f"rollout_mismatch {mismatch:.3f} is {ratio:.1f}x the first step's (stop_mismatch="
             f"{c['stop_mismatch']}): the sampler no longer follows the trainer; is the weight sync "
             f"(rollout.sync_weights) working?"),
        ]
        if 'reward' in record:  # (not a skipped step) the means the eval's guards compare
            self.window['steps'] = self.window.get('steps', 0) + 1
            for key in ('reward/task', 'completion_len', 'reward/shaping_share'):
                self.window[key] = self.window.get(key, 0.0) + record.get(key, 0.0)
        return self.trip(record, guards)

    def check_eval(self, record):
        """The reward-hacking guards, at an eval: over the steps since the previous eval, against
        the steps before it. The task reward rose (or the answers grew longer) while the held-out
        accuracy did not, or the shaping terms moved the advantages more than the task reward."""
        c, window, self.window = self.cfg, self.window, {}
        steps = window.get('steps', 0)
        means = {k: v / steps for k, v in window.items()} if steps else None
        accuracy = record['eval/accuracy']
        previous, self.last_eval = self.last_eval, (accuracy, means)
        if means is None:
            return {}
        guards = [('shaping', means['reward/shaping_share'] > 0.5,
                   f"the shaping terms made {means['reward/shaping_share']:.0%} of the reward's "
                   f"variance within groups over the last {steps:.0f} steps: they, not the task, "
                   f"decide the advantages (lower format_coef / length_reward_coef, "
                   f"overlong_buffer)")]
        if previous is not None and previous[1] is not None:
            last_accuracy, last = previous
            flat = accuracy <= last_accuracy
            reward_rise = means['reward/task'] - last['reward/task']
            length_rise = means['completion_len'] / max(last['completion_len'], 1e-9) - 1
            guards += [
                ('reward_gap', flat and reward_rise > c['warn_reward_gap'] > 0,
                 f"the task reward rose by {reward_rise:.2f} since the last eval while the "
                 f"held-out accuracy went {last_accuracy:.3f} -> {accuracy:.3f}: the policy may be "
                 f"fitting the reward or the training prompts, not the task (read samples.jsonl)"),
                ('length_gap', flat and length_rise > c['warn_length_rise'] > 0,
                 f"the answers grew {length_rise:.0%} longer since the last eval while the "
                 f"held-out accuracy went {last_accuracy:.3f} -> {accuracy:.3f}: length without "
                 f"skill (a length bias of the loss, or of the reward)")]
        return self.trip(record, guards)

    def trip(self, record, guards):
        """{name: message} of the (name, trips, message) that trip, each logged as guard/<name> =
        1 in record and said once (rank 0), except 'sync': the caller stops the run with it."""
        tripped = {name: message for name, trips, message in guards if trips}
        for name, message in tripped.items():
            record[f'guard/{name}'] = 1
            if name != 'sync' and name not in self.said and self.cfg['master']:
                tqdm.write(f"warning, step {record['step']}: {message}")
            self.said.add(name)
        return tripped


# -----------------------------------------------------------------------------
# the files: log.jsonl (one record a step, and one an eval), samples.jsonl, wandb

class RunLog:
    """log.jsonl and samples.jsonl in out_dir, and wandb when it is on. Rank 0 writes; on the other
    ranks every call does nothing."""

    def __init__(self, out_dir, master, resume, wandb_config=None, wandb_project='', wandb_name=''):
        self.master, self.wandb = master, None
        if not master:
            return
        mode = 'a' if resume else 'w'  # a resumed run continues its files
        self.records = open(os.path.join(out_dir, 'log.jsonl'), mode)
        self.samples = open(os.path.join(out_dir, 'samples.jsonl'), mode)
        if wandb_config is not None:
            import wandb
            self.wandb = wandb
            wandb.init(project=wandb_project, name=wandb_name, config=wandb_config, resume='allow')

    def record(self, record):
        if self.master:
            self.records.write(json.dumps(record) + '\n')
            self.records.flush()
            if self.wandb:
                self.wandb.log(record, step=record['step'])

    def step_samples(self, step, batch, reward_parts, n):
        """n of this rank's completions of the step, spread over its groups: prompt, completion,
        the reference answer, reward and its parts, advantage, truncated, length."""
        B = len(batch['completions'])
        if not self.master or n <= 0 or B == 0:
            return
        rows = list(range(0, B, max(1, B // n)))[:n]
        lengths = batch['completion_mask'].sum(1)
        samples = [{'step': step + 1, 'prompt': batch['prompt'][i],
                    'completion': batch['completions'][i], 'answer': batch['answer'][i],
                    'reward': batch['rewards'][i].item(),
                    **{f'reward/{k}': v[i].item() for k, v in reward_parts.items()},
                    'advantage': batch['advantages'][i].item(),
                    'truncated': bool(batch['truncated'][i]), 'completion_len': int(lengths[i])}
                   for i in rows]
        self.samples.write(''.join(json.dumps(s) + '\n' for s in samples))
        self.samples.flush()
        if self.wandb:
            columns = list(samples[0])
            table = self.wandb.Table(columns=columns, data=[[s[c] for c in columns] for s in samples])
            self.wandb.log({'samples': table}, step=step + 1)


def summary(out_dir, k, saved_step, ckpt_dir, max_iters, world_size):
    """What a user wants at the end: held-out numbers at the first and last eval of the run (from
    the log, so a resumed run counts from its start), where the checkpoint is, what comes next
    (world_size: torchrun's, 0 for plain python)."""
    evals = [r for r in map(json.loads, open(os.path.join(out_dir, 'log.jsonl')))
             if 'eval/accuracy' in r]
    for key in ['eval/accuracy', f'eval/pass@{k}', f'eval/maj@{k}'] if evals else []:
        print(f"{key}: {evals[0].get(key, float('nan')):.3f} at step {evals[0]['step']} -> "
              f"{evals[-1].get(key, float('nan')):.3f} at step {evals[-1]['step']}")
    args = [a for a in sys.argv[1:] if not a.startswith(('--init_from=', '--max_iters='))]
    per_node = int(os.environ.get('LOCAL_WORLD_SIZE', world_size))
    launcher = f"torchrun --nproc_per_node={per_node}" if world_size else "python"
    if world_size > per_node:  # several nodes: each launches its share, with its rendezvous flags
        launcher += f" --nnodes={world_size // per_node} --node_rank=... --rdzv_endpoint=..."
    # this run's checkpoint (not one an earlier run left in out_dir); a stopped run continues to
    # max_iters, a finished one beyond it
    if saved_step is not None:
        more = max_iters if saved_step < max_iters else 2 * max_iters
        print(f"checkpoint (step {saved_step}): {ckpt_dir}\ncontinue: {launcher} train.py "
              f"{' '.join(args)} --init_from=resume --max_iters={more}")
    print(f"plot: python plot.py {out_dir}")


def peak_memory(device):
    """This rank's peak memory in bytes: CUDA's allocated peak (CPU: the resident set)."""
    if device.startswith('cuda'):
        return torch.cuda.max_memory_allocated()
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
