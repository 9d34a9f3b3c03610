"""Tests for rewards.py and the data/<task>/prepare.py conversions. Fast, offline, no model:
    python -m pytest -q tests/test_rewards.py

The length-shaping tests use the worked examples of seed 000 (DAPO's R_length, Kimi k1.5's length
reward). The hub-backed tasks are tested through their convert() on raw rows in tests/samples/ (the
hub's format), so no download is needed.
"""
import importlib.util
import json
import os
import sys
import time
from fractions import Fraction

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from rewards import (TASKS, Task, kimi_length_reward, majority_correct,  # noqa: E402
                     overlong_penalty, pass_at_k)


def load_prepare(task):
    """data/<task>/prepare.py as a module; importing it must not download or write anything."""
    path = os.path.join(REPO, "data", task, "prepare.py")
    spec = importlib.util.spec_from_file_location(f"prepare_{task}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_samples(task):
    with open(os.path.join(REPO, "tests", "samples", f"{task}.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_registry_covers_every_task():
    assert set(TASKS) == {"arithmetic", "countdown", "multiply", "gsm8k", "dapo_math", "aime24"}
    for name, task in TASKS.items():
        assert isinstance(task, Task), name
        assert all(callable(part) for part in (task.score, task.format, task.answer)), name


# ----------------------------------------------------------------------------
# DAPO's soft overlong punishment and Kimi k1.5's length reward (seed 000's worked examples)

def test_overlong_penalty_seed_example():
    # L_max 20,480, L_cache 4,096: free up to 16,384; (16,384 - 18,432) / 4,096 = -0.5
    assert overlong_penalty(18432, 20480, 4096) == -0.5


@pytest.mark.parametrize("length, expected", [
    (0, 0.0), (16384, 0.0),            # up to L_max - L_cache: no penalty
    (16385, -1 / 4096), (20480, -1.0),  # linear inside the buffer, -1 at L_max
    (20481, -1.0), (10 ** 6, -1.0),    # past L_max
])
def test_overlong_penalty_pieces(length, expected):
    assert overlong_penalty(length, 20480, 4096) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("cache_len", [0, -1, 20481])
def test_overlong_penalty_rejects_bad_cache_len(cache_len):
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(100, 20480, cache_len)


def test_kimi_length_reward_seed_example():
    assert kimi_length_reward([1000, 3000, 5000], [True] * 3, 3) == [0.5, 0.0, -0.5]
    # wrong answers get min(0, lambda): the short wrong one is not praised
    assert kimi_length_reward([1000, 3000, 5000], [False] * 3, 3) == [0.0, 0.0, -0.5]
    assert kimi_length_reward([1000, 3000, 5000], [1.0, 0.0, 1.0], 3) == [0.5, 0.0, -0.5]
    assert kimi_length_reward([1000, 3000, 5000], [0.0, 1.0, 0.0], 3) == [0.0, 0.0, -0.5]


def test_kimi_length_reward_equal_lengths_and_groups():
    assert kimi_length_reward([7, 7, 7, 7], [True, False, True, False], 4) == [0.0] * 4
    # two groups, each scaled by its own min and max: [10, 30] and [100, 100, ...]
    got = kimi_length_reward([10, 30, 20, 100, 100, 300], [True, True, True, True, False, False], 3)
    assert got == pytest.approx([0.5, -0.5, 0.0, 0.5, 0.0, -0.5])
    # the same group alone gives the same numbers: groups do not see each other
    assert got[3:] == kimi_length_reward([100, 100, 300], [True, False, False], 3)


def test_kimi_length_reward_rejects_ragged_input():
    with pytest.raises(ValueError):
        kimi_length_reward([1, 2, 3], [True] * 3, 2)
    with pytest.raises(ValueError):
        kimi_length_reward([1, 2], [True], 2)


# ----------------------------------------------------------------------------
# arithmetic

@pytest.mark.parametrize("completion, expected", [
    ("42", 1.0), ("17 + 25 = 42", 1.0), ("The answer is 42.", 1.0), ("32", 0.0),
    ("17 + 25 = 32 so 42", 0.0),
])
def test_arithmetic_reward(completion, expected):
    assert TASKS["arithmetic"].score(completion, "42") == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("4,2", "42", 0.0), ("4,2", "4", 0.0), ("1,2,3", "123", 0.0), ("12,34", "1234", 0.0),
    ("1,000", "1000", 1.0), ("-1,234,567", "-1234567", 1.0), ("42,", "42", 1.0),
])
def test_arithmetic_commas_only_group_thousands(completion, answer, expected):
    assert TASKS["arithmetic"].score(completion, answer) == expected


@pytest.mark.parametrize("completion, expected", [
    ("42", 42), ("17 + 25 = 42", 42), ("The answer is 42.", 42),  # the README's readable forms
    ("17 or 18", None), ("17, 18 or 19", None), ("1,7", None), ("17 18", None), ("17\n18", None),
    ("42.5", None), ("17 + 25 = 42 or 43", None), ("17", 17), ("-7", -7), ("42, so 42", 42),
    ("", None), ("forty-two", None),
])
def test_read_integer_answer(completion, expected):
    from rewards import read_integer_answer
    assert read_integer_answer(completion) == expected


@pytest.mark.parametrize("candidates", ["17 or 18", "17, 18 or 19", "1,7", "16 17 18", "18 or 17",
                                        "17 + 1 = 17 or 18", "17-18", "17/18", "17 (or 18)"])
def test_listing_several_candidates_never_earns_a_reward(candidates):
    """README: "listing several candidates never earns a reward", whichever of them is right."""
    for answer in ("17", "18", "1", "7", "19", "16"):
        assert TASKS["arithmetic"].score(candidates, answer) == 0.0


def test_arithmetic_prepare_holds_out_unordered_pairs(tmp_path):
    """a + b = b + a: a held-out pair is a training prompt in neither order. The script writes next
    to itself, so a copy of it runs in tmp_path (with the default arguments)."""
    import shutil
    import subprocess
    script = shutil.copy(os.path.join(REPO, "data", "arithmetic", "prepare.py"), tmp_path)
    subprocess.run([sys.executable, script], check=True, capture_output=True, timeout=60)

    def pairs(split):
        with open(tmp_path / f"{split}.jsonl") as f:
            return [(row["meta"]["a"], row["meta"]["b"]) for row in map(json.loads, f)]
    test, train = pairs("test"), pairs("train")
    assert len(test) == 100 and len(train) == 5000
    assert all(1 <= x <= 20 for pair in test + train for x in pair)
    held_out = {frozenset(pair) for pair in test}
    assert len(held_out) == 100  # 100 distinct problems, even up to order
    assert not held_out & {frozenset(pair) for pair in train}


def test_running_sum_prepare_holds_out_multisets_and_its_answers_score(tmp_path):
    """A sum is the same in every order: a held-out multiset of numbers is a training prompt in no
    order. The answer with the working shown is read at its last running total."""
    import shutil
    import subprocess
    script = shutil.copy(os.path.join(REPO, "data", "running_sum", "prepare.py"), tmp_path)
    subprocess.run([sys.executable, script], check=True, capture_output=True, timeout=60)

    def rows(split):
        with open(tmp_path / f"{split}.jsonl") as f:
            return [json.loads(line) for line in f]
    test, train = rows("test"), rows("train")
    assert len(test) == 200 and len(train) == 5000
    assert all(len(r["meta"]["numbers"]) == 8 and int(r["answer"]) == sum(r["meta"]["numbers"])
               for r in test + train)
    held_out = {tuple(sorted(r["meta"]["numbers"])) for r in test}
    assert len(held_out) == 200
    assert not held_out & {tuple(sorted(r["meta"]["numbers"])) for r in train}
    assert "What is 7 + 7 + 1 + 5 + 9 + 8 + 7 + 5?" in test[0]["prompt"][0]["content"]
    worked = "7 + 7 = 14, 14 + 1 = 15, 15 + 5 = 20, 20 + 9 = 29, 29 + 8 = 37, 37 + 7 = 44, 44 + 5 = 49."
    assert TASKS["arithmetic"].score(worked, test[0]["answer"]) == 1.0
    assert TASKS["arithmetic"].score(worked[:-5] + "48.", test[0]["answer"]) == 0.0
    too_many = subprocess.run([sys.executable, script, "--num_operands=2", "--num_test=45"],
                              capture_output=True, text=True, timeout=60)
    assert too_many.returncode == 1 and "45 distinct problems" in too_many.stderr


@pytest.mark.parametrize("completion, expected",
                         [("42", 1.0), (" 42\n", 1.0), ("The answer is 42.", 0.0)])
def test_arithmetic_format(completion, expected):
    assert TASKS["arithmetic"].format(completion) == expected


# ----------------------------------------------------------------------------
# countdown: rules (each given number exactly once, binary + - * / and parentheses, exact value)

NUMS = {"target": 24, "numbers": [1, 3, 4, 6]}


@pytest.mark.parametrize("expression, expected", [
    # non-integer intermediate (3/4): allowed, exact with Fraction
    ("6 / (1 - 3 / 4)", 1.0),
    ("(6 * 4) * (3 - 1) / 2", 0.0),       # uses 2, not given
    ("6 * 4 * (3 - 1)", 0.0),             # every number once, but the value is 48
    ("6 * 4", 0.0),                       # misses 1 and 3
    ("6 * 4 * 1 * 1", 0.0),               # uses 1 twice, misses 3
    ("6 * 4 + 3 - 3 * 1", 0.0),           # uses 3 twice
    ("(6 - 3 - 1) * 4 * 3", 0.0),         # extra 3
    ("6*4*1 + 3 - 3", 0.0),               # value 24 but 3 used twice
    ("4 * 6 * (3 - 1 - 1)", 0.0),         # 1 twice
    ("(3 - 1) * 4 + 6", 0.0),             # all numbers once, value 14
    ("6 / (4 - 3 - 1)", 0.0),             # division by zero
    ("6 / (1 - 3 / 4)" + " " * 200, 0.0), # over MAX_EXPRESSION_CHARS, though right
    # parentheses nested deeper than MAX_NESTING, though right
    ("((((((((((6 / (1 - 3 / 4)))))))))))", 0.0),
    ("(((((((((6 / (1 - 3 / 4))))))))))", 1.0),    # ... and at the limit it is fine
    ("0000006 / (1 - 3 / 4)", 0.0),       # a literal longer than MAX_LITERAL_DIGITS
    ("6.0 / (1 - 3 / 4)", 0.0),           # float literal
    ("6 / (1 - 3 / 4) + 0", 0.0),         # extra literal 0
    ("6 // (1 - 3 / 4)", 0.0),            # floor division
    ("(1 + 3) ** 2 + 6 + 4 - 2", 0.0),    # power
    ("6 * 4 * 1 ** 3", 0.0),              # power even with the right numbers and value
    ("-(1 - 3) * 6 * 4 / 2", 0.0),        # unary minus (and 2 not given)
    ("abs(6) * 4 * 1 ** 3", 0.0),         # call
    ("x = 6 / (1 - 3 / 4)", 0.0),         # name / assignment
    ("6 / (1 - 3 / 4) = 24", 0.0),        # '=' not allowed
    ("٦ / (١ - ٣ / ٤)", 0.0),             # unicode (Arabic-Indic) digits
    ("６ / (１ - ３ / ４)", 0.0),            # fullwidth digits
    ("", 0.0), ("   ", 0.0),              # empty answer
    ("6 / (1 - 3 / 4", 0.0),              # unbalanced parenthesis
    ("06 / (1 - 3 / 4)", 0.0),            # leading zero: not a Python int literal
    ("6 / (1 - 3 / 4) True", 0.0),        # bools are names
    ("1e1 + 6 + 4 + 3 + 1", 0.0),         # exponent notation
])
def test_countdown_reward_table(expression, expected):
    assert TASKS["countdown"].score(f"<think>...</think> <answer>{expression}</answer>",
                                    NUMS) == expected


@pytest.mark.parametrize("completion, answer, expected", [
    ("<answer> (1 + 2) / 3 </answer>", {"target": 1, "numbers": [1, 2, 3]}, 1.0),
    # newlines
    ("<answer>\n  (44 - 19) + 35\n</answer>", {"target": 60, "numbers": [44, 19, 35]}, 1.0),
    # a number given twice
    ("<answer>3 * 3 - 2</answer>", {"target": 7, "numbers": [3, 2, 3]}, 1.0),
    # ... must be used twice
    ("<answer>3 * 2</answer>", {"target": 6, "numbers": [3, 2, 3]}, 0.0),
    ("(1 + 2) / 3", {"target": 1, "numbers": [1, 2, 3]}, 0.0),                 # no tags
    ("<answer>(1 + 2) / 3", {"target": 1, "numbers": [1, 2, 3]}, 0.0),         # no closing tag
    ("</answer>(1 + 2) / 3<answer>", {"target": 1, "numbers": [1, 2, 3]}, 0.0),  # tags reversed
    ("<answer>1 + 2 + 3</answer> no: <answer>(1 + 2) / 3</answer>",
     {"target": 1, "numbers": [1, 2, 3]}, 1.0),
    ("<answer>(1 + 2) / 3</answer> no: <answer>1 + 2 + 3</answer>",
     {"target": 1, "numbers": [1, 2, 3]}, 0.0),
    ("<answer>5 / (3 - 3)</answer>", {"target": 5, "numbers": [5, 3, 3]}, 0.0),  # division by zero
    # negative intermediate ok
    ("<answer>2 - 3 + 4</answer>", {"target": 3, "numbers": [2, 3, 4]}, 1.0),
    ("<answer>2 - 1</answer>", {"target": 1, "numbers": [1, 2]}, 1.0),
    # Python reads 1_3 as 13
    ("<answer>1_3 + 11</answer>", {"target": 24, "numbers": [1, 3, 11]}, 0.0),
    ("<answer>-1 + 2</answer>", {"target": 1, "numbers": [1, 2]}, 0.0),  # unary minus: not allowed
    ("<answer>+2 - 1</answer>", {"target": 1, "numbers": [1, 2]}, 0.0),  # unary plus: not allowed
    # trailing spaces
    ("<answer>2 - 1</answer>" + " " * 10 ** 5, {"target": 1, "numbers": [1, 2]}, 1.0),
])
def test_countdown_reward_cases(completion, answer, expected):
    assert TASKS["countdown"].score(completion, answer) == expected


def hostile_completions():
    """200 completions built to be slow or dangerous for a careless verifier (eval, backtracking
    regex, deep recursion, huge integers). Every one must score 0.0."""
    payloads = [
        "9" * 10 ** 6, "(" * 10 ** 5, ")" * 10 ** 5, "(" * 10 ** 5 + "1" + ")" * 10 ** 5,
        "2**2**2**2**2", "9**9**9**9", "10**10**10", "(" * 150 + "1" + ")" * 150,
        "(" * 11 + "6 / (1 - 3 / 4)" + ")" * 11,
        "-" * 150 + "1", "1" + "+1" * 99, "1" + "*9" * 99, "9" * 5000 + " * 1",
        "999999999999 * 3 * 4 * 6", "1e309", "1e309 - 1e309", "float('inf')",
        "__import__('os').system('echo pwned')", "(lambda: 24)()", "().__class__.__bases__[0]",
        "open('/etc/passwd').read()", "[1, 3, 4, 6]", "{'a': 1}", "24 if True else 0", "not 0",
        "1 if 1 else 1", "sum(range(10**9))", "24j", "0x18", "0b11000", "1_3 + 4 + 6", "'24'",
        "b'24'", "f'{24}'", "24;", "exec('1')", "eval('24')",
        "٢٤", "𝟐𝟒", "²⁴", "1 + 3 + 4 + 6\x00", "1 / 0", "6 / 0 * 1 * 3 * 4",
        "(1 + 3 + 4 + 6) " * 100, "A" * 10 ** 6,
    ]
    completions = [f"<answer>{p}</answer>" for p in payloads]
    completions += ["<answer>" * 10 ** 5, "</answer>" * 10 ** 5, "<answer>" * 10 ** 5 + "</answer>",
                    "x" * 10 ** 6 + "<answer>" + "9" * 10 ** 6 + "</answer>", "<" * 10 ** 6,
                    "#" * 10 ** 6]
    i = 0
    # deterministic variations: deep nesting and long chains of many sizes
    while len(completions) < 200:
        n = 50 + 37 * i
        completions.append("<answer>" + "(" * n + "6" + ")" * n + "</answer>")
        completions.append("<answer>" + "1+" * n + "1</answer>")
        completions.append("<answer>" + "2**" * n + "2</answer>")
        i += 1
    return completions[:200]


def test_countdown_hostile_completions_are_wrong_and_fast():
    completions = hostile_completions()
    assert len(completions) == 200
    start = time.perf_counter()
    scores = [TASKS["countdown"].score(c, NUMS) for c in completions]
    elapsed = time.perf_counter() - start
    assert scores == [0.0] * 200
    assert elapsed < 1.0, f"200 hostile completions took {elapsed:.2f}s"
    start = time.perf_counter()  # the format check and the other verifiers read them quickly too
    for c in completions:
        TASKS["countdown"].format(c)
        TASKS["gsm8k"].score(c, "24"), TASKS["dapo_math"].score(c, "24")
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("completion, expected", [
    ("<think>6 * 4</think> <answer>6 / (1 - 3 / 4)</answer>", 1.0),
    ("<answer>6 * 4</answer>", 1.0),                    # format only: right place, wrong answer
    ("6 / (1 - 3 / 4)", 0.0),                           # no block
    ("<answer>1</answer> <answer>2</answer>", 0.0),     # two blocks
    ("</answer> 24 <answer>", 0.0),                     # reversed
    ("<answer> 24", 0.0),                               # unclosed
])
def test_countdown_format(completion, expected):
    assert TASKS["countdown"].format(completion) == expected


def test_countdown_generator_rows_are_solvable_and_distinct():
    countdown = load_prepare("countdown")
    rows = countdown.make_rows(300, seed=0)
    assert len(rows) == 300
    assert len({countdown.problem_key(r) for r in rows}) == 300
    for row in rows:
        numbers, target = row["answer"]["numbers"], row["answer"]["target"]
        assert 3 <= len(numbers) <= 4 and all(1 <= n <= 99 for n in numbers) and 1 <= target <= 999
        assert TASKS["countdown"].score(f"<answer>{row['meta']['solution']}</answer>",
                                        row["answer"]) == 1.0
        prompt = row["prompt"][0]["content"]
        assert prompt.startswith(
            f"Using the numbers {numbers}, create an equation that equals {target}.")
    assert countdown.make_rows(50, seed=0) == rows[:50]        # seeded
    assert countdown.make_rows(50, seed=1) != rows[:50]


def test_countdown_generator_excludes_test_problems():
    countdown = load_prepare("countdown")
    # a small space, so overlaps are likely
    small = dict(min_count=3, max_count=3, max_number=5, max_target=20)
    test = countdown.make_rows(40, seed=0, **small)
    test_keys = {countdown.problem_key(r) for r in test}
    train = countdown.make_rows(60, seed=1, exclude=test_keys, **small)
    assert not test_keys & {countdown.problem_key(r) for r in train}
    with pytest.raises(ValueError):
        countdown.make_rows(10 ** 6, seed=0, **small)  # more problems than exist


# ----------------------------------------------------------------------------
# multiply: arithmetic's verdict on the model's own text, its <calc> and <result> blocks removed

CALL = "<calc>347*86</calc><result>29842</result>"


@pytest.mark.parametrize("completion, expected", [
    (f"{CALL} 347 * 86 = 29842", 1.0),
    (CALL, 0.0),                                      # a tool result alone is never the answer
    (f"{CALL} 347 * 86 = 29841", 0.0),                # a wrong stated number
    (f"{CALL} 347 * 86 = 29,842", 1.0),
    ("347 * 86 = 29842", 1.0), ("29842", 1.0),        # no tool: as arithmetic
    ("347 * 86 = <calc>347*86</calc><result>29842</result>", 0.0),  # after '=': only the world's
    ("347 * 86 = <result>29842</result>", 0.0),       # a result block, even one the model wrote
    ("347 * 86 = <calc>29842</calc>", 0.0),           # ... and a call's argument
    ("347 * 86 = <result>29842", 0.0),                # an unclosed block runs to the end
    (f"{CALL} 347 * 86 = 29842 <calc>1+1", 1.0),
    ("347 * 86 = 298<calc>1</calc>42", 0.0),          # '298 42': two numbers, never 29842
    (f"{CALL} = 29842 or 29843", 0.0),
])
def test_multiply_reward(completion, expected):
    assert TASKS["multiply"].score(completion, "29842") == expected


@pytest.mark.parametrize("completion, expected", [
    (f"{CALL} 347 * 86 = 29842", 29842), (CALL, None), ("29842", 29842),
    (f"{CALL} 347 * 86 = 29841", 29841), ("", None),
])
def test_read_multiply_answer(completion, expected):
    assert TASKS["multiply"].answer(completion) == expected


@pytest.mark.parametrize("completion, expected", [
    (f"{CALL} 347 * 86 = 29842", 1.0), (f"{CALL} 347 * 86 = 29841\n", 1.0),  # format only
    (CALL, 0.0), ("29842", 0.0), (f"{CALL} 347 * 86 = 29842.", 0.0),
    ("347 * 86 = <result>29842</result>", 0.0),
])
def test_multiply_format(completion, expected):
    assert TASKS["multiply"].format(completion) == expected


def test_multiply_hostile_completions_are_wrong_and_fast():
    completions = hostile_completions() + [
        "<calc>" * 10 ** 5, "<result>" * 10 ** 5 + "</result>", "</calc>" * 10 ** 5,
        "<calc>" + "9" * 10 ** 6, "= <result>" + "<calc>" * 10 ** 5 + "29842",
        "<result>29842</result>" * 10 ** 4, "<calc" * 10 ** 5]
    start = time.perf_counter()
    scores = [(TASKS["multiply"].score(c, "29842"), TASKS["multiply"].format(c))
              for c in completions]
    elapsed = time.perf_counter() - start
    assert scores == [(0.0, 0.0)] * len(completions)
    assert elapsed < 1.0, f"{len(completions)} hostile completions took {elapsed:.2f}s"


# ----------------------------------------------------------------------------
# gsm8k: the number after the last '####', else the last number

def test_gsm8k_convert_samples():
    gsm8k = load_prepare("gsm8k")
    rows = [gsm8k.convert(raw) for raw in load_samples("gsm8k")]
    assert [r["answer"] for r in rows] == ["72", "10", "5"]
    assert rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["prompt"][0]["content"].startswith("Natalia sold clips to 48 of her friends")
    assert rows[0]["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert ("####" not in rows[0]["meta"]["solution"]
            and "<<48+24=72>>" in rows[0]["meta"]["solution"])
    assert gsm8k.convert({"question": "q", "answer": "so\n#### 1,000"})["answer"] == "1000"
    with pytest.raises(ValueError):
        gsm8k.convert({"question": "q", "answer": "no final line"})
    for row in rows:  # the reference solution itself scores 1, a wrong number 0
        assert TASKS["gsm8k"].score(f"{row['meta']['solution']}\n#### {row['answer']}",
                                    row["answer"]) == 1.0
        assert TASKS["gsm8k"].score(f"{row['meta']['solution']}\n#### {int(row['answer']) + 1}",
                                    row["answer"]) == 0.0


@pytest.mark.parametrize("completion, expected", [
    ("48/2 = 24, 48 + 24 = 72\n#### 72", 1.0),
    ("#### 72.0", 1.0), ("####72", 1.0), ("#### $72", 1.0), ("#### 72 clips", 1.0),
    ("She sold 72 clips in total.", 1.0),               # no '####': the last number
    ("72 is wrong, it is 73", 0.0),                     # the last number counts
    ("#### 72.5", 0.0), ("#### 73", 0.0),
    ("#### 72\nlater: #### 71", 0.0),                   # the last '####' counts
    ("I think 72. #### the answer", 0.0),               # '####' with no number after it is wrong
    ("no numbers here", 0.0), ("", 0.0),
    ("1,2,3,72", 1.0),                                  # commas only in groups of three: a list
    ("#### " + "7" * 100, 0.0),                         # absurdly long number
])
def test_gsm8k_reward(completion, expected):
    assert TASKS["gsm8k"].score(completion, "72") == expected


def test_gsm8k_reward_commas():
    assert TASKS["gsm8k"].score("#### 1,000", "1000") == 1.0
    assert TASKS["gsm8k"].score("so the total is $1,000.", "1000") == 1.0
    assert TASKS["gsm8k"].score("#### -3", "-3") == 1.0


@pytest.mark.parametrize("completion, expected", [
    ("work\n#### 72", 1.0), ("#### 1,000 dollars", 1.0), ("The answer is 72.", 0.0),
    ("#### seventy-two", 0.0),
])
def test_gsm8k_format(completion, expected):
    assert TASKS["gsm8k"].format(completion) == expected


# ----------------------------------------------------------------------------
# dapo_math and aime24: the last "Answer:" line

def test_dapo_math_convert_samples():
    dapo = load_prepare("dapo_math")
    raw_rows = load_samples("dapo_math")
    rows = [dapo.convert(raw) for raw in raw_rows]
    assert [r["answer"] for r in rows] == ["34", "113", "-3"]
    # the DAPO prompt, as given
    assert [r["prompt"] for r in rows] == [raw["prompt"] for raw in raw_rows]
    assert rows[0]["prompt"][0]["content"].endswith(
        'Remember to put your answer on its own line after "Answer:".')
    assert rows[0]["meta"]["index"] == raw_rows[0]["extra_info"]["index"]
    assert dapo.deduplicate(rows + rows[::-1]) == rows
    for row in rows:
        right, wrong = row["answer"], str(int(row["answer"]) + 1)
        assert TASKS["dapo_math"].score(f"Some work.\nAnswer: {right}", row["answer"]) == 1.0
        assert TASKS["dapo_math"].score(f"Some work.\nAnswer: {wrong}", row["answer"]) == 0.0


def test_aime24_convert_samples():
    aime = load_prepare("aime24")
    rows = [aime.convert(raw) for raw in load_samples("aime24")]
    assert [r["answer"] for r in rows] == ["204", "25", "601"]  # "025" normalized
    content = rows[0]["prompt"][0]["content"]
    assert content.startswith(
        "Solve the following math problem step by step. The last line of your response "
        "should be of the form Answer: $Answer (without quotes) where $Answer is the "
        "answer to the problem.\n\nEvery morning Aya goes for a $9$-kilometer-long walk")
    assert content.endswith(
        'coffee shop.\n\nRemember to put your answer on its own line after "Answer:".')
    assert rows[0]["meta"]["id"] == 60
    assert TASKS["aime24"].score("... so the product is 25.\nAnswer: 025", "25") == 1.0
    for row in rows:
        assert TASKS["aime24"].score(f"Work.\nAnswer: {row['answer']}", row["answer"]) == 1.0
        wrong = int(row["answer"]) + 1
        assert TASKS["aime24"].score(f"Work.\nAnswer: {wrong}", row["answer"]) == 0.0


def test_hub_prepare_without_datasets_fails_in_one_line(tmp_path):
    """No `datasets` (as here) or no hub: one clear line and exit code 1, no traceback."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(tmp_path))  # a shadow `datasets` that fails to import
    (tmp_path / "datasets.py").write_text("raise ImportError('no datasets here')\n")
    for task in ("gsm8k", "dapo_math", "aime24"):
        result = subprocess.run([sys.executable, os.path.join(REPO, "data", task, "prepare.py")],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 1
        assert (result.stderr.strip().count("\n") == 0
                and f"{task}: cannot download" in result.stderr)
        assert "pip install datasets" in result.stderr


@pytest.mark.parametrize("completion, expected", [
    ("work\nAnswer: 34", 1.0), ("Answer: 34\n", 1.0), ("answer: 34", 1.0), ("ANSWER : 34", 1.0),
    ("Answer: $34$", 1.0), ("Answer: \\boxed{34}", 1.0), ("Answer: **34**", 1.0),
    ("Answer: 34.", 1.0),
    ("Answer: 034", 1.0), ("Answer: 34.0", 1.0), ("Answer: $34$.", 1.0), ("Answer: 34...", 1.0),
    ("Answer: .34", 0.0), ("Answer: $.34$", 0.0), ("Answer: **.34**", 0.0),  # ".34" is not 34
    # the last one counts
    ("Answer: 35", 0.0), ("Answer: 34 or 35", 0.0), ("Answer: 34\nAnswer: 35", 0.0),
    ("Answer: 35\nAnswer: 34", 1.0), ("Answer:", 0.0), ("The answer is 34.", 0.0), ("34", 0.0),
    ("Answer: 34" + " " * 5000, 1.0),                     # trailing whitespace is still the tail
    ("Answer: 34\n" + "x" * 10 ** 6, 0.0),                # far from the end: not read
])
def test_dapo_math_reward(completion, expected):
    assert TASKS["dapo_math"].score(completion, "34") == expected
    assert TASKS["aime24"].score(completion, "34") == expected


def test_dapo_math_leading_dot_is_part_of_the_number():
    assert TASKS["dapo_math"].score("Answer: .5", "5") == 0.0
    assert TASKS["dapo_math"].score("Answer: 0.5", "5") == 0.0
    assert TASKS["dapo_math"].score("Answer: 5.", "5") == 1.0


@pytest.mark.parametrize("completion, expected", [
    ("work\nAnswer: 34", 1.0), ("work\nAnswer: 12\n\n", 1.0), ("Answer: 34\nthat's it", 0.0),
    ("The answer is 34", 0.0), ("work\n  Answer: x", 1.0),
])
def test_dapo_math_format(completion, expected):
    assert TASKS["dapo_math"].format(completion) == expected
    assert TASKS["aime24"].format(completion) == expected


def test_safe_score_turns_errors_and_timeouts_into_zero():
    import time

    from rewards import safe_score

    def broken(completion, answer):
        raise KeyError("target")

    def endless(completion, answer):
        while True:
            pass

    assert safe_score(TASKS["arithmetic"].score, "42", "42") == (1.0, None)
    score, error = safe_score(broken, "42", "42")
    assert score == 0.0 and isinstance(error, KeyError)
    start = time.perf_counter()
    score, error = safe_score(endless, "42", "42", timeout=0.2)
    assert score == 0.0 and isinstance(error, TimeoutError) and time.perf_counter() - start < 1.0
    # the alarm was cleared: no late raise
    assert safe_score(TASKS["arithmetic"].score, "41", "42") == (0.0, None)
    time.sleep(0.3)


# ----------------------------------------------------------------------------
# held-out metrics: the parsed answers majority voting counts, pass@k and maj@k

NUMS_123 = {"target": 1, "numbers": [1, 2, 3]}


@pytest.mark.parametrize("task, completion, answer, parsed", [
    ("arithmetic", "17 + 25 = 42", "42", 42), ("arithmetic", "17 or 18", "17", None),
    ("gsm8k", "48 + 24 = 72\n#### 72.0", "72", 72), ("gsm8k", "#### 1,000", "1000", 1000),
    ("gsm8k", "no numbers", "72", None),
    ("dapo_math", "work\nAnswer: \\boxed{034}", "34", 34),
    ("aime24", "Answer: 34 or 35", "34", None),
    ("countdown", "<answer> (1 + 2)\n / 3 </answer>", NUMS_123, "(1+2)/3"),
    ("countdown", "<answer>1 + 2 + 3</answer>", NUMS_123, "1+2+3"),
    ("countdown", "(1 + 2) / 3", NUMS_123, None),                # no answer block
    ("countdown", "<answer> </answer>", NUMS_123, None),         # an empty one
])
def test_answers_parse_what_the_verifier_compares(task, completion, answer, parsed):
    given = TASKS[task].answer(completion)
    assert given == parsed
    hash(given)  # majority voting counts answers in a Counter
    # the verifier is right exactly when the parsed answer is the reference answer (countdown's
    # verifier compares the expression's value with the target instead)
    if task != "countdown":
        assert TASKS[task].score(completion, answer) == float(parsed is not None
                                                              and parsed == Fraction(answer))


def test_answers_agree_on_equal_answers_written_differently():
    # equal parsed answers are one vote: "1,000" and "1000.0", "$34$" and "034"
    assert TASKS["gsm8k"].answer("#### 1,000") == TASKS["gsm8k"].answer("the total is 1000.0")
    assert TASKS["dapo_math"].answer("Answer: $34$") == TASKS["dapo_math"].answer("Answer: 034")
    assert TASKS["countdown"].answer("<answer>(1+2)/3</answer>") == TASKS["countdown"].answer(
        "<answer> ( 1 + 2 ) / 3 </answer>")


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0), (4, 0, 4, 0.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0),
    (4, 2, 2, 5 / 6),         # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (5, 2, 3, 0.9),           # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 4, 1, 1.0), (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_large_n_is_finite():
    for n in (1, 4, 16):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    # C(2000, 1000) has ~600 digits: exact integers, one division, no overflow
    assert pass_at_k(2000, 0, 1000) == 0.0 and pass_at_k(2000, 1, 1000) == pytest.approx(0.5)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize("answers, correct, expected", [
    ([42, 42, 41, 42], [1, 1, 0, 1], 1.0),            # the majority is right
    ([41, 41, 42, 41], [0, 0, 1, 0], 0.0),            # majority wrong, a minority right: 0
    ([41, 42, 42, 41], [0, 1, 1, 0], 0.0),            # tie 2-2: the first answer (41) wins
    ([42, 41, 41, 42], [1, 0, 0, 1], 1.0),            # tie 2-2: the first answer (42) wins
    ([None, None, None, None], [0, 0, 0, 0], 0.0),    # no parsed answer at all
    ([None, None, None, 42], [0, 0, 0, 1], 1.0),      # None is not a vote: 42 is the majority
    ([None, None, 41, 42, 42], [0, 0, 0, 1, 1], 1.0),
    ([], [], 0.0),
    (["(1+2)/3", "1+2+3", "(1+2)/3"], [1.0, 0.0, 1.0], 1.0),
])
def test_majority_correct(answers, correct, expected):
    assert majority_correct(answers, correct) == expected


def test_majority_correct_counts_equal_answers_as_one_vote():
    # 1000 (Fraction, from "1,000") and 1000.0 are the same answer: two votes against one 7
    answers = [TASKS["gsm8k"].answer(c) for c in ("#### 7", "#### 1,000", "it is 1000.0")]
    correct = [TASKS["gsm8k"].score(c, "1000") for c in ("#### 7", "#### 1,000", "it is 1000.0")]
    assert majority_correct(answers, correct) == 1.0
    with pytest.raises(ValueError, match="one verdict per answer"):
        majority_correct([1, 2], [1.0])
