"""The lab's instruments: the pass-rate curriculum's rule, its walk and its state over ranks
(curriculum.py), the reward-integrity controls (rewards.control_verdicts, train.py's
train_rollout), the reward-hacking guards (report.Guards.check_eval) and the shaping share they
read. The curriculum's DDP agreement runs in test_ddp, its exact resume in test_resume."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SMALL_MODEL_DIR, verifier_config
from curriculum import Curriculum
from report import Guards, step_sums
from rewards import control_verdicts

G = 4


def coin_verdicts(correct, rng):
    """The random control's verdicts for the verifier's `correct`."""
    return control_verdicts('random', {'correct': correct}, [], G, None, rng)


def rows(n):
    """n training rows with n different prompts."""
    return [{'prompt': [{'role': 'user', 'content': f'What is {i} + 1?'}], 'answer': str(i + 1)}
            for i in range(n)]


def groups(*rights):
    """Flat verdicts of groups of G with rights[j] right answers each."""
    return [v for r in rights for v in [1.0] * r + [0.0] * (G - r)]


def test_the_curriculum_passes_over_a_prompt_solved_or_failed_window_times_in_a_row():
    c = Curriculum(rows(4), window=2, cooldown=3)
    c.observe([0, 1, 2, 3], groups(4, 0, 2, 4), G)  # step 1: solved, failed, mixed, solved
    c.end_step()
    assert c.streak.tolist() == [1, -1, 0, 1] and not any(c.cooling(p) for p in range(4))
    c.observe([0, 1, 2, 3], groups(4, 0, 4, 0), G)  # step 2: 3 switches from solved to failed
    c.end_step()
    assert c.streak.tolist() == [2, -2, 1, -1]
    assert [c.cooling(p) for p in range(4)] == [True, True, False, False]
    assert c.skip_until.tolist()[:2] == [5, 5]  # cooled down after steps 3, 4 and 5
    assert c.pass_rate.tolist() == [1.0, 0.0, 1.0, 0.0]
    for _ in range(3):  # no group of prompts 0 and 1 while they cool down
        c.observe([2], groups(2), G)
        c.end_step()
    assert not c.cooling(0) and c.streak[2] == 0  # a mixed group ends a streak
    c.observe([0], groups(4), G)  # still solved after its cooldown: passed over again at once
    c.end_step()
    assert c.cooling(0) and c.skip_until[0] == c.step + 3
    c.observe([1], groups(1), G)  # one right answer: its streak ends, it stays in
    c.end_step()
    assert not c.cooling(1) and c.streak[1] == 0


def test_the_curriculum_sums_every_ranks_groups_so_every_rank_holds_the_same_state():
    """Two ranks each observe their own groups (a prompt may be in both, sampled twice in a step):
    with their observations summed (train.py's reduce_sum), both hold the state one process
    observing all the groups would. Without the sum each would pass over other prompts, and the
    ranks' walks over the data order (train.py's next_rows) would part."""
    one, ranks = Curriculum(rows(5), 1, 10), [Curriculum(rows(5), 1, 10) for _ in range(2)]
    one.observe([0, 1, 2, 4, 2], groups(4, 0, 4, 3, 0), G)
    ranks[0].observe([0, 1, 2], groups(4, 0, 4), G)
    ranks[1].observe([4, 2], groups(3, 0), G)
    total = ranks[0].observed + ranks[1].observed
    one.end_step()
    for c in ranks:
        c.end_step(lambda t: total.clone())
        for key, value in one.state_dict().items():
            mine = torch.as_tensor(c.state_dict()[key])
            assert torch.equal(mine.nan_to_num(-1), torch.as_tensor(value).nan_to_num(-1)), key
    # prompt 2: 4 + 0 of 8 answers right over the two ranks: mixed, not solved; 3 never sampled
    assert one.pass_rate[2] == 0.5 and not one.cooling(2) and one.pass_rate[3].isnan()
    assert [one.cooling(p) for p in range(5)] == [True, True, False, False, False]
    assert one.stats() == {'curriculum/skipped': 0, 'curriculum/cooling': 2,
                           'curriculum/sampled_frac': 0.8, 'curriculum/pass_rate_0': 0.25,
                           'curriculum/pass_rate_mixed': 0.5, 'curriculum/pass_rate_1': 0.25}


def test_the_walk_passes_over_the_rows_of_a_cooling_prompt_and_counts_them():
    """Rows 0 and 3 hold the same prompt (and answer): one prompt, one state. Once it cools down,
    a walk over the order passes over both of its rows, for one lap at most (then rows are taken
    as they come: a few prompts not cooling are not sampled over and over); when every prompt
    cools, none is passed over (the step still gets its rows)."""
    data = rows(3) + rows(1)
    c = Curriculum(data, window=1, cooldown=5)
    assert c.prompt.tolist() == [0, 1, 2, 0]
    order = [3, 1, 0, 2]
    assert c.walk(order, 0, 4) == ([3, 1, 0, 2], 4) and c.skipped == 0
    c.observe([3], groups(4), G)  # row 3 solved: its prompt, also row 0's, cools
    c.end_step()
    assert c.cooling(0) and c.cooling(3) and not c.cooling(1)
    # one lap passes over rows 3 and 0 and finds 1 and 2; the third row is taken as it comes
    assert c.walk(order, 4, 3) == ([1, 2, 3], 9) and c.stats()['curriculum/skipped'] == 2
    c.observe([1, 2], groups(0, 4), G)  # now all three prompts cool
    c.end_step()
    assert c.walk(order, 0, 2) == ([3, 1], 2)  # every prompt cools: taken as they come
    assert c.stats()['curriculum/skipped'] == 0
    assert c.walk(order, 3, 3) == ([2, 3, 1], 6)  # cyclically, from any position


def test_the_curriculum_state_round_trips_and_refuses_other_data():
    c = Curriculum(rows(3), 1, 2)
    c.observe([0, 2], groups(4, 1), G)
    c.end_step()
    other = Curriculum(rows(3), 1, 2)
    other.load_state_dict(c.state_dict())
    assert other.step == 1 and other.cooling(0) and other.pass_rate[2] == 0.25
    with pytest.raises(ValueError, match="holds 3 prompts, this run's data 4"):
        Curriculum(rows(4), 1, 2).load_state_dict(c.state_dict())


def test_the_random_control_depends_on_the_success_rate_alone():
    """Two verdict lists with the same rate give the same coins: no answer's reward says whether it
    was right. Rate 0 and 1 stay 0 and 1; over 20,000 answers at 0.25 the coins' rate is 0.25 to
    within 4 binomial standard deviations (0.012)."""
    right_first = [1.0] * 8 + [0.0] * 24
    shuffled = random.Random(1).sample(right_first, len(right_first))
    assert coin_verdicts(right_first, random.Random(7)) == coin_verdicts(shuffled, random.Random(7))
    assert coin_verdicts([0.0] * 16, random.Random(0)) == [0.0] * 16
    assert coin_verdicts([1.0] * 16, random.Random(0)) == [1.0] * 16
    coins = coin_verdicts(([1.0] + [0.0] * 3) * 5000, random.Random(0))
    assert abs(sum(coins) / len(coins) - 0.25) < 4 * (0.25 * 0.75 / len(coins)) ** 0.5


def test_the_shaping_share_is_the_within_group_variance_of_the_shaping():
    """Two groups of 2: task rewards (1, 0) and (1, 1), format rewards 0.1 * (0, 1) and (1, 0).
    Within-group squared deviations: task 0.5 + 0 = 0.5, format 0.005 + 0.005 = 0.01."""
    batch = {'correct': torch.tensor([1., 0., 1., 1.]), 'rewards': torch.zeros(4),
             'truncated': torch.zeros(4, dtype=torch.bool)}
    parts = {'task': torch.tensor([1., 0., 1., 1.]), 'format': torch.tensor([0., .1, .1, 0.])}
    sums = step_sums(batch, parts, torch.ones(4), torch.ones(4, dtype=torch.bool), [], 0,
                     {'errors': 0, 'completions': 4}, group_size=2)
    assert sums['var_task'] == pytest.approx(0.5) and sums['var_shaping'] == pytest.approx(0.01)
    assert 'group_sq_err' not in sums  # (the critic's)


def guard_run(evals, steps=5, **cfg):
    """Guards fed `steps` training records before each eval: evals are (task reward, mean length,
    shaping share, held-out accuracy) of each window; the held-out at step 0 is 0. Returns the
    names tripped at each eval."""
    guards = Guards({'warn_truncated': 0.5, 'warn_degenerate_steps': 5, 'warn_mismatch': 0,
                     'stop_mismatch': 0, 'warn_reward_gap': 0.1, 'warn_length_rise': 0.5,
                     'reward_fn': 'arithmetic', 'reward_timeout': 1, 'max_new_tokens': 16,
                     'master': False, **cfg})
    guards.check_eval({'step': 0, 'eval/accuracy': 0.0})
    tripped, step = [], 0
    for task, length, share, accuracy in evals:
        for _ in range(steps):
            step += 1
            guards.check({'step': step, 'reward': task, 'reward/task': task,
                          'completion_len': length, 'reward/shaping_share': share}, verified=0)
        record = {'step': step, 'eval/accuracy': accuracy}
        tripped.append(sorted(guards.check_eval(record)))
        assert all(record[f'guard/{name}'] == 1 for name in tripped[-1])
    return tripped


def test_the_reward_hacking_guards_trip_when_the_held_out_accuracy_does_not_follow():
    # the first window has nothing to compare with; the reward rises, the held-out with it: fine
    assert guard_run([(0.2, 10, 0, 0.2), (0.5, 10, 0, 0.5)]) == [[], []]
    # the reward rises by 0.3 while the held-out falls, then stays flat
    assert guard_run([(0.2, 10, 0, 0.3), (0.5, 10, 0, 0.25), (0.65, 10, 0, 0.25)]) == [
        [], ['reward_gap'], ['reward_gap']]
    # within warn_reward_gap, or off
    assert guard_run([(0.2, 10, 0, 0.3), (0.28, 10, 0, 0.2)]) == [[], []]
    assert guard_run([(0.2, 10, 0, 0.3), (0.5, 10, 0, 0.2)], warn_reward_gap=0) == [[], []]
    # the answers grow 60 % longer with the held-out flat; 40 % is within warn_length_rise
    assert guard_run([(0.5, 10, 0, 0.5), (0.5, 16, 0, 0.5)]) == [[], ['length_gap']]
    assert guard_run([(0.5, 10, 0, 0.5), (0.5, 14, 0, 0.5)]) == [[], []]
    # the shaping terms make most of the reward's within-group variance: from the first window on
    assert guard_run([(0.5, 10, 0.6, 0.5), (0.5, 10, 0.4, 0.6)]) == [['shaping'], []]


@pytest.mark.slow
@pytest.mark.parametrize("control", ["shuffled", "random"])
def test_a_reward_control_trains_on_a_reward_without_the_answers_signal(tmp_path, small_model,
                                                                        control):
    """Rows alternate the answers '-12345' and '7', and the verifier says right exactly when the
    answer is '7' (whatever the completion), so every verdict is known. 'shuffled' scores each row
    against the next row's answer: the '-12345' rows are rewarded, the '7' rows never. 'random':
    coins with the step's true rate, the very coins of rewards.control_verdicts seeded as train.py
    seeds them. The verifier's verdicts are logged apart (reward/true_task), and the held-out eval
    uses them (accuracy 0.5: half the rows are '7')."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
             "answer": "-12345" if i % 2 == 0 else "7"} for i in range(8)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "train.py", "config/cpu_demo.py",
         verifier_config(tmp_path, "lambda completion, answer: float(answer == '7')"),
         f"--init_from={SMALL_MODEL_DIR}", f"--data_dir={data}", f"--out_dir={out_dir}",
         "--rollout_engine=hf", "--prompts_per_step=4", "--group_size=4", "--max_new_tokens=4",
         "--max_iters=2", "--eval_interval=2", "--eval_problems=8", "--eval_samples=2",
         "--samples_per_step=16", "--ckpt_interval=-1", f"--reward_control={control}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = [json.loads(line) for line in open(out_dir / "samples.jsonl")]
    log = [json.loads(line) for line in open(out_dir / "log.jsonl")]
    steps = [r for r in log if 'reward' in r]
    assert [r['step'] for r in steps] == [1, 2] and len(samples) == 32
    for r in steps:
        mine = [s for s in samples if s['step'] == r['step']]  # the step's 16, in batch order
        true = [float(s['answer'] == '7') for s in mine]
        assert r['reward/true_task'] == sum(true) / 16
        if control == 'shuffled':
            expected = [1.0 - t for t in true]
        else:  # seed 0, data_cursor 4 * step after the step's rows, one rank
            expected = coin_verdicts(true, random.Random(4 * r['step']))
        assert [s['reward'] for s in mine] == expected
    evals = [r['eval/accuracy'] for r in log if 'eval/accuracy' in r]
    assert evals == [0.5, 0.5]


def fake_run(path, evals, entropy):
    """A run directory whose log has a step record per eval and the evals (step 10 i)."""
    path.mkdir(parents=True)
    with open(path / 'log.jsonl', 'w') as f:
        for i, accuracy in enumerate(evals):
            if i:
                f.write(json.dumps({'step': 10 * i, 'reward': accuracy, 'entropy': entropy,
                                    'rollout_seconds': 5.0, 'train_seconds': 5.0}) + '\n')
            f.write(json.dumps({'step': 10 * i, 'eval/accuracy': accuracy,
                                'eval/seconds': 30.0}) + '\n')


def test_the_lab_page_gives_each_prediction_its_verdict_by_the_seed_spread(tmp_path):
    """lab.report on logs with known numbers: grpo ends at 0.60 +- 0.02 over 3 seeds, its control
    at 0.10 +- 0.02, a third arm at 0.62 +- 0.02 (within the spread: not reproduced) and a fourth
    with one seed (inconclusive)."""
    import lab
    finals = {'grpo': [0.58, 0.60, 0.62], 'random_reward': [0.08, 0.10, 0.12],
              'close': [0.60, 0.62, 0.64], 'lonely': [0.9]}
    run_dirs = []
    for arm, values in finals.items():
        for seed, final in enumerate(values):
            run_dirs.append(str(tmp_path / 'runs' / f'{arm}_s{seed}'))
            fake_run(tmp_path / 'runs' / f'{arm}_s{seed}', [0.05, final / 2, final], entropy=0.5)
    study = dict(claim='C.', prediction='P.', config='config/cpu_2digit.py', steps=20,
                 baseline='grpo', arms={'grpo': {}, 'close': {}, 'lonely': {}},
                 verdicts=[('grpo', 'random_reward', 'eval/accuracy', 'higher'),
                           ('close', 'grpo', 'eval/accuracy', 'higher'),
                           ('close', 'grpo', 'eval/accuracy', 'not lower'),
                           ('lonely', 'grpo', 'eval/accuracy', 'higher')])
    page = open(lab.report('demo', study, run_dirs, str(tmp_path / 'docs'), 'cmd')).read()
    assert ("- grpo vs random_reward, eval/accuracy higher: **reproduced**: 0.6 ± 0.02 vs "
            "0.1 ± 0.02 (difference +0.5, spread 0.04: beyond it)") in page
    assert "- close vs grpo, eval/accuracy higher: **not reproduced**: 0.62 ± 0.02" in page
    assert "- close vs grpo, eval/accuracy not lower: **reproduced**" in page
    assert "- lonely vs grpo, eval/accuracy higher: **inconclusive** (fewer than 2 seeds)" in page
    assert "- random_reward: +0.050 ± 0.020 (3 seeds)" in page  # its gain over step 0's 0.05
    # 10 runs x 2 windows of 10 s of stages + 3 evals of 30 s: 110 s each
    assert "Wall time of the runs, summed: 18 min" in page
    # every run's evals: accuracy (minutes to it: 30 s an eval, 10 s of stages between)
    assert "| run | step 0 | step 10 | step 20 |" in page
    assert "| grpo_s0 | 0.050 (0.5) | 0.290 (1.2) | 0.580 (1.8) |" in page
    for figure in ('eval_accuracy_time', 'eval_accuracy', 'entropy'):
        assert os.path.exists(tmp_path / 'docs' / 'demo' / f'{figure}.png')


def test_the_headline_counts_seeds_that_hold_the_line_at_both_last_evals_in_time(tmp_path):
    """lab.headline_line: a seed counts when both of its last two evals are at the line and the
    last is within the minutes (fake_run: 0.5 / 1.2 / 1.8 min to its evals)."""
    import lab
    import plot
    runs = {}
    for seed, evals in enumerate([[0.1, 0.9, 0.95], [0.1, 0.89, 0.95], [0.1, 0.95, 0.9]]):
        fake_run(tmp_path / f'recipe_s{seed}', evals, entropy=0.5)
        runs[str(tmp_path / f'recipe_s{seed}')] = plot.read_log(str(tmp_path / f'recipe_s{seed}'))
    assert lab.headline_line({'recipe': runs}, 'recipe', 0.9, 2) == (
        "- recipe: 2 of 3 seeds held 0.90 at both last evals within 2 min "
        "(recipe_s0 at 1.8 min, recipe_s2 at 1.8 min)")
    assert lab.headline_line({'recipe': runs}, 'recipe', 0.9, 1.5) == (
        "- recipe: 0 of 3 seeds held 0.90 at both last evals within 1.5 min")


def test_every_study_names_keys_the_trainer_has_and_data_the_lab_can_make():
    """A study's arms and common overrides are train.py config keys (a typo would be a config
    error an hour into a study), its verdicts compare arms it has, and every data folder it
    trains on is one lab.PREPARE makes (or the config's own)."""
    import ast
    import lab
    tree = ast.parse(open(os.path.join(ROOT, "train.py")).read())
    keys = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)}
    for name, study in lab.STUDIES.items():
        overrides = [study.get("common", {}), *study["arms"].values()]
        assert set().union(*overrides) <= keys, (name, set().union(*overrides) - keys)
        arms = set(study["arms"]) | {"random_reward"}
        assert study["baseline"] in arms and all({a, b} <= arms for a, b, _, _ in study["verdicts"])
        config_data = lab.config_values(os.path.join(ROOT, study["config"]))["data_dir"]
        for data in {o["data_dir"] for o in overrides if "data_dir" in o}:
            assert data in lab.PREPARE or data == config_data, (name, data)


def test_the_screen_recipe_arm_is_the_recipes_cures():
    """lab.RECIPE is what config/cpu_hard.py sets over the 2-digit task's config: its cures, read
    from the file (its length, evals and out_dir aside); screen_recipe's arm is that at the rate
    its runs had (3e-5, the config's until 2026-12-05, no stop string before 2026-12-07);
    hard_recipe keeps the one-pass recipe."""
    import lab
    assert lab.RECIPE == {
        'dynamic_sampling': True, 'screen_size': 2, 'oversample': 12, 'trim_surplus': True,
        'num_iterations': 2, 'eps_high': 0.28, 'micro_batch_size': 64, 'learning_rate': 4e-5,
        'decay_lr': True, 'min_lr': 3e-6, 'stop_string': '\n'}
    assert lab.STUDIES['screen_recipe']['arms']['recipe'] == {**lab.RECIPE, 'learning_rate': 3e-5,
                                                              'stop_string': ''}
    assert lab.STUDIES['hard_recipe']['arms']['recipe'] == lab.ONE_PASS


def test_the_cured_demo_config_is_the_demo_cures_arm_that_held():
    """config/cpu_demo_cured.py sets over config/cpu_demo.py exactly what demo_cures' screen_decay
    arm ran in fp32 and demo_cures_bf16's in bf16 (its out_dir aside): the screen's dynamic
    sampling and the decay."""
    import lab
    demo = lab.config_values("config/cpu_demo.py")
    cured = {k: v for k, v in lab.config_values("config/cpu_demo_cured.py").items()
             if demo.get(k) != v and k != "out_dir" and not k.startswith("__")}
    assert cured == lab.STUDIES["demo_cures"]["arms"]["screen_decay"]
    assert cured == lab.STUDIES["demo_cures_bf16"]["arms"]["screen_decay"]
    assert cured == {**lab.SCREEN, "decay_lr": True, "min_lr": 2e-6}


def test_the_problems_summary_counts_by_pass_rate():
    """lab.py --problems: five problems of 4 answers; the wrong answers and the gain since an
    earlier checkpoint, by pass rate, counted by hand."""
    import lab
    counts = [(0, 4, '51', '24 + 27 = 41'), (1, 4, '98', '28 + 70 = 108'), (3, 4, '60', '50'),
              (4, 4, '7', None), (4, 4, '9', None)]
    before = [(4, 4, '51', None), (0, 4, '98', 'x'), (3, 4, '60', 'x'), (4, 4, '7', None),
              (2, 4, '9', 'x')]
    assert lab.problems_summary(counts, before) == [
        "5 problems x 4: accuracy 0.6000, 8 wrong answers, 1 problems never right",
        "  pass rate   0-0.5:    2 problems,  88% of the wrong answers",  # 4 + 3 of 8
        "  pass rate 0.5-0.9:    1 problems,  12% of the wrong answers",
        "  pass rate   0.9-1:    0 problems,   0% of the wrong answers",
        "  pass rate       1:    2 problems,   0% of the wrong answers",
        "    0/4 right, answer 51: '24 + 27 = 41'",
        "    1/4 right, answer 98: '28 + 70 = 108'",
        "gain since the first checkpoint by its pass rate (2 problems moved by more than 0.3):",
        "  pass rate   0-0.5:    1 problems, accuracy +0.0500",  # 0 -> 1/4, over 5 problems
        "  pass rate 0.5-0.9:    2 problems, accuracy +0.1000",  # 3/4 -> 3/4, 2/4 -> 4/4
        "  pass rate   0.9-1:    0 problems, accuracy +0.0000",
        "  pass rate       1:    2 problems, accuracy -0.2000"]  # 4/4 -> 0, 4/4 -> 4/4


def test_the_problem_counts_are_the_verifiers_verdicts(tmp_path, small_model, monkeypatch):
    """lab.problem_counts on a checkpoint folder (the 2-layer model, a meta.json) with the HF
    engine: each of the run's eval problems, in order, gets `samples` answers from its prompt, and
    its right count is the verifier's (here: an even number of characters is right)."""
    import lab
    import rewards
    for name in os.listdir(small_model):
        os.symlink(os.path.join(small_model, name), tmp_path / name)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}], "answer": str(2 * a)}
            for a in (3, 5, 7)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = dict(data_dir=str(tmp_path), eval_data_dir='', eval_problems=2, reward_fn='arithmetic',
                  tool='', dtype='float32', max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0)
    (tmp_path / "meta.json").write_text(json.dumps({"step": 1, "config": config}))
    seen = []
    def even(completion, answer):
        seen.append((completion, answer))
        return float(len(completion) % 2 == 0)
    task = rewards.TASKS['arithmetic']._replace(score=even)
    monkeypatch.setitem(rewards.TASKS, 'arithmetic', task)
    torch.manual_seed(0)
    counts = lab.problem_counts(str(tmp_path), samples=5, engine_kind='hf')
    assert [answer for _, answer in seen] == ['6'] * 5 + ['10'] * 5  # eval_problems = 2, in order
    for (right, n, answer, wrong), mine in zip(counts, (seen[:5], seen[5:])):
        odd = [c for c, _ in mine if len(c) % 2]
        assert (right, n, answer, wrong) == (5 - len(odd), 5, mine[0][1], odd[0] if odd else None)
    with pytest.raises(SystemExit, match="no checkpoint there"):
        lab.problem_counts(str(tmp_path / "none"), samples=5, engine_kind='hf')
