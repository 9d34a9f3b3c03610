"""
The pass-rate curriculum: the cheaper cure for degenerate groups (prime-rl's and open-instruct's). A
group whose G answers all scored the same has advantages of 0: it teaches nothing. DAPO's dynamic
sampling pays for such groups after the fact (it samples more until enough disagree); the curriculum
avoids sampling them: it remembers each training prompt's recent groups and passes over a prompt
whose last `window` groups were all right (solved) or all wrong (out of reach) for `cooldown` steps,
then tries it again. A prompt passed over is counted (curriculum/skipped), never dropped for good.

Its state, one entry per training prompt (rows with the same prompt and answer are one), is the
same on every rank (each step's groups are summed over ranks before the rule runs, so every rank
passes over the same prompts) and goes into the checkpoint (a resume passes over the same prompts
as the run it continues):
    pass_rate   the fraction of right answers in its latest step's groups (NaN: never sampled)
    streak      +n: its groups of the last n steps it was sampled in were all right; -n: all wrong
    skip_until  the curriculum's step until which it is passed over
"""
import json
import math

import torch


class Curriculum:
    """The per-prompt state (the docstring above) and the rule: walk() the data order past the
    prompts that cool down, observe() this rank's groups during a step, end_step() once per step
    on every rank. rows: the training rows (a row is named by its index in them)."""

    def __init__(self, rows, window, cooldown):
        self.window, self.cooldown = window, cooldown
        ids = {}  # a prompt's id: the first of its rows' (same prompt and answer)
        keys = [json.dumps([r['prompt'], r['answer']]) for r in rows]
        self.prompt = torch.tensor([ids.setdefault(k, len(ids)) for k in keys])  # row -> prompt
        num_prompts = len(ids)
        self.pass_rate = torch.full((num_prompts,), math.nan, dtype=torch.float64)
        self.streak = torch.zeros(num_prompts, dtype=torch.long)
        self.skip_until = torch.zeros(num_prompts, dtype=torch.long)
        self.step = 0  # steps ended so far
        self.skipped = 0  # prompts passed over since the last stats()
        # this step's groups, per prompt: (right answers, answers)
        self.observed = torch.zeros(2, num_prompts, dtype=torch.float64)

    def cooling(self, row):
        """True while row's prompt is passed over (a solved or out-of-reach prompt's cooldown)."""
        return bool(self.skip_until[self.prompt[row]] > self.step)

    def walk(self, order, cursor, n):
        """The next n rows of order (every row's index once, taken cyclically) from position
        cursor that are not cooling, and the position after them; the rows passed over are
        counted. A walk passes over rows for one lap of the order at most: the rows still missing
        then are taken as they come (when every prompt cools down, all n are). Without that
        limit, a run where all but a few prompts cooled down sampled those few over and over,
        passing over 600,000 rows in one step (the 2-digit task: 5,000 rows, 3,730 prompts;
        window 1, cooldown 50, from step 44 on)."""
        if (self.skip_until > self.step).all():
            return [order[(cursor + j) % len(order)] for j in range(n)], cursor + n
        rows, start = [], cursor
        while len(rows) < n:
            row = order[cursor % len(order)]
            cursor += 1
            if self.cooling(row) and cursor - start <= len(order):  # within the walk's first lap
                self.skipped += 1
            else:
                rows.append(row)
        return rows, cursor

    def observe(self, rows, correct, group_size):
        """This rank's groups of the step: rows[j] (a row's index) was answered by
        correct[j * group_size:(j + 1) * group_size] (the verdicts the trainer rewards)."""
        right = (torch.tensor(correct) > 0).view(-1, group_size).sum(1).double()
        prompts = self.prompt[torch.tensor(rows, dtype=torch.long)]
        self.observed[0].index_add_(0, prompts, right)
        self.observed[1].index_add_(0, prompts, torch.full_like(right, group_size))

    def end_step(self, reduce_sum=lambda t: t):
        """Every rank's groups of the step (reduce_sum: a tensor summed over ranks), then the rule:
        a prompt whose groups were all right (or all wrong) in `window` of its steps in a row cools
        down for `cooldown` steps."""
        self.observed = reduce_sum(self.observed)
        seen = self.observed[1].nonzero().squeeze(1)
        rate = self.observed[0, seen] / self.observed[1, seen]
        self.pass_rate[seen] = rate
        streak = self.streak[seen]
        self.streak[seen] = torch.where(rate == 1, streak.clamp(min=0) + 1,
                                        torch.where(rate == 0, streak.clamp(max=0) - 1, 0))
        self.step += 1
        degenerate = seen[self.streak[seen].abs() >= self.window]
        self.skip_until[degenerate] = self.step + self.cooldown
        self.observed.zero_()

    def stats(self):
        """The log's numbers: prompts passed over since the last call; of the prompts sampled so
        far, the fractions whose latest pass rate was 0, in between and 1 (the histogram the rule
        acts on); the prompts cooling down now."""
        rate = self.pass_rate[~self.pass_rate.isnan()]
        seen = max(len(rate), 1)
        out = {'curriculum/skipped': self.skipped,
               'curriculum/cooling': int((self.skip_until > self.step).sum()),
               'curriculum/sampled_frac': len(rate) / len(self.pass_rate),
               'curriculum/pass_rate_0': (rate == 0).sum().item() / seen,
               'curriculum/pass_rate_mixed': ((rate > 0) & (rate < 1)).sum().item() / seen,
               'curriculum/pass_rate_1': (rate == 1).sum().item() / seen}
        self.skipped = 0
        return out

    def state_dict(self):
        """What a resume needs (the prompts' ids follow from the rows)."""
        return {'pass_rate': self.pass_rate, 'streak': self.streak, 'skip_until': self.skip_until,
                'step': self.step}

    def load_state_dict(self, state):
        if len(state['pass_rate']) != len(self.pass_rate):
            raise ValueError(f"the checkpoint's curriculum holds {len(state['pass_rate'])} "
                             f"prompts, "
                             f"this run's data {len(self.pass_rate)}")
        self.pass_rate, self.streak = state['pass_rate'].clone(), state['streak'].clone()
        self.skip_until, self.step = state['skip_until'].clone(), state['step']
