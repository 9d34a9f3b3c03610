"""
Rewards: verifiers that score a completion against a row's `answer`, format checks and length shaping.

    TASKS[name] -> Task(score, format, answer), one entry per dataset, every part required:
    TASKS[name].score(completion: str, answer) -> float      correctness: 1.0 right, 0.0 wrong
    TASKS[name].format(completion: str) -> float             1.0 if the answer is where the prompt asked
    TASKS[name].answer(completion: str) -> hashable or None  the parsed answer the verifier compares
    parse_expression(text: str) -> Fraction                  + - * / and parentheses, parsed, capped
    pass_at_k(n, c, k), majority_correct(answers, correct)   held-out pass@k and maj@k
    overlong_penalty(length, max_len, cache_len) -> float    DAPO's soft overlong punishment
    kimi_length_reward(lengths, correct, group_size) -> list[float]    Kimi k1.5's length reward

Every verifier returns correctness as 1.0 / 0.0. DAPO rewards +1 right / -1 wrong: the trainer maps a wrong
answer (0.0) to its configurable `reward_wrong` (-1.0 in the DAPO recipe), so one verifier serves every recipe.

Model output is data. Verifiers read it with str methods, simple regular expressions (no nested quantifiers,
so no catastrophic backtracking), int(), Fraction() and ast.parse(); nothing the model wrote is ever executed
(no eval, exec or sympify). Verifiers read only the last TAIL_CHARS characters of a completion, as verl's DAPO
verifier reads the last 300: the final answer is at the end, and a megabyte of output costs nothing more.

To add a task: a data/<task>/prepare.py that writes the rows, and one Task entry in TASKS (its verifier,
format check and answer reader); then --reward_fn=<task> --data_dir=data/<task>.
"""
import ast
import json
import math
import os
import re
import signal
from collections import Counter
from contextlib import contextmanager
from fractions import Fraction
from itertools import accumulate
from typing import Callable, NamedTuple

TAIL_CHARS = 2000
# An integer: 42, -7, 1,000 (commas only in groups of three, so "4,2" and the list "1,2,3" are
# several integers, not 42 and 123). [0-9], not \d: \d also matches unicode digits.
INTEGER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)")
NUMBER = re.compile(INTEGER.pattern + r"(?:\.[0-9]+)?")  # an integer or a decimal: 42, 1,000, 72.0
MAX_NUMBER_CHARS = 40  # longer "numbers" are not answers (and int() refuses > 4300 digits anyway)


def _to_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:  # e.g. "1,,2" or a 10,000-digit number (Python refuses to parse those)
        return None


def _tail(completion):
    """The last TAIL_CHARS characters, trailing whitespace dropped: where the final answer is."""
    return completion.rstrip()[-TAIL_CHARS:]


def _last_match(pattern, text):
    matches = list(pattern.finditer(text))  # text is a _tail: at most TAIL_CHARS long
    return matches[-1] if matches else None


def _to_number(text):
    """'1,000' -> Fraction(1000), '72.0' -> Fraction(72); None if not exactly a NUMBER or too
    long."""
    if len(text) > MAX_NUMBER_CHARS or not NUMBER.fullmatch(text):
        return None
    return Fraction(text.replace(",", ""))


# ----------------------------------------------------------------------------
# arithmetic: 1.0 if the integer the model gave equals the answer, else 0.0

def read_integer_answer(completion):
    """The model's answer: the one integer after the last '=' (in the whole reply if it has no '='),
    or None when there is no integer there or several different ones.

    The prompt asks for only the number, so the reply holds one integer when the model obeys. Small
    models often echo the sum instead ("17 + 25 = 42"); reading after the last '=' accepts that
    form. A reply with two different integers there ("17 or 18", "1,7", "42.5") is not an answer,
    so listing several candidates never earns a reward (repeating one, "42, so 42", is fine)."""
    tail = completion.rsplit("=", 1)[-1]
    values = {_to_int(match.group()) for match in INTEGER.finditer(tail)}
    return values.pop() if len(values) == 1 else None


def arithmetic_reward(completion, answer):
    given = read_integer_answer(completion)
    return float(given is not None and given == int(answer))


def arithmetic_format(completion):
    return float(re.fullmatch(r"-?[0-9]+", completion.strip()) is not None)


# ----------------------------------------------------------------------------
# multiply (data/multiply): 3-digit by 2-digit products, with a calculator the model may call
# (tools.py: <calc>347*86</calc> answered <result>29842</result>). The verdict is arithmetic's, read
# from the completion with every call and result block removed: the number graded is one the model
# wrote itself, so a tool result alone is never an answer. An unclosed block (a reply cut inside
# one) runs to the end. The tags are spelled here, not imported from tools.py: tools.py imports
# parse_expression from this file, so importing it back would be a cycle (tests/test_tools.py
# checks that the two spellings agree). A lazy quantifier with one exit: linear time.

TOOL_BLOCK = re.compile(r"<(calc|result)>.*?(?:</\1>|\Z)", re.DOTALL)


def without_tool_blocks(completion):
    """The model's own text: every <calc>...</calc> and <result>...</result> replaced by a space
    (a space, so the digits on either side never join into one number)."""
    return TOOL_BLOCK.sub(" ", completion)


def read_multiply_answer(completion):
    return read_integer_answer(without_tool_blocks(completion))


def multiply_reward(completion, answer):
    return arithmetic_reward(without_tool_blocks(completion), answer)


def multiply_format(completion):
    """1.0 if the model's own text ends with '= ' and an integer, as the prompt asks."""
    return float(re.search(r"=\s*-?[0-9]+$", without_tool_blocks(completion).rstrip()) is not None)


# ----------------------------------------------------------------------------
# countdown (TinyZero): answer = {"target": T, "numbers": [...]}; the model writes <answer> EXPR
# </answer>. Rules: EXPR combines ALL the given numbers, each exactly once (as a multiset: a number
# given twice may be used twice), with binary + - * / and parentheses only. No unary minus (every
# operator combines two numbers: "-3" is not one of the given numbers), no ** or //, no other
# literals. Division is exact (Fraction), so a non-integer intermediate such as 6 / (1 - 3/4) = 24
# is allowed, as TinyZero's true division allows it; the final value must equal the target exactly
# (TinyZero compares floats within 1e-5). Division by zero is wrong. TinyZero checks characters with
# a regex and then calls eval(); we never eval. Caps, checked before parsing so hostile output is
# rejected in microseconds: at most 200 characters, parentheses nested at most 10 deep, literals of
# at most 6 digits. An answer over a cap is wrong.

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
MAX_EXPRESSION_CHARS = 200
MAX_NESTING = 10
MAX_LITERAL_DIGITS = 6
# [0-9], not \d: \d also matches unicode digits ('٣')
EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() ]*")
OPERATORS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__,
             ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}


def last_answer_block(completion):
    """The text inside the last <answer>...</answer>, or None. str.rfind: linear time, no regex."""
    tail = _tail(completion)
    end = tail.rfind(ANSWER_CLOSE)
    start = tail.rfind(ANSWER_OPEN, 0, max(end, 0))
    return tail[start + len(ANSWER_OPEN):end] if 0 <= start < end else None


def evaluate_expression(node):
    """Exact value of an arithmetic AST with int literals and + - * / only; ValueError on anything
    else."""
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate_expression(node.left), evaluate_expression(node.right))
    # type() is int: rejects True/False
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    what = node.op if isinstance(node, (ast.BinOp, ast.UnaryOp)) else node  # 'Pow', not 'BinOp'
    raise ValueError(f"not allowed: {type(what).__name__}")


def parse_expression(text):
    """The exact value (a Fraction) of an expression of integer literals, binary + - * / and
    parentheses, parsed, never executed; ValueError with a short reason for anything else. The
    caps come first, all before parsing, so hostile text is refused in microseconds: length,
    characters, literals, nesting. Countdown's verifier and tools.py's calculator share it."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = " ".join(text.split())  # newlines and tabs to spaces; no leading space for ast
    if not EXPRESSION_CHARS.fullmatch(text):
        raise ValueError("only digits, + - * / ( ) and spaces are allowed")
    # With only these characters, every run of digits is one integer literal of the expression.
    if any(len(x) > MAX_LITERAL_DIGITS for x in re.findall(r"[0-9]+", text)):
        raise ValueError(f"a number longer than {MAX_LITERAL_DIGITS} digits")
    depth = accumulate(1 if c == "(" else -1 if c == ")" else 0 for c in text)
    if max(depth, default=0) > MAX_NESTING:
        raise ValueError(f"parentheses nested deeper than {MAX_NESTING}")
    try:
        return evaluate_expression(ast.parse(text, mode="eval").body)
    except (SyntaxError, RecursionError):
        raise ValueError("syntax error") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def countdown_reward(completion, answer):
    expression = last_answer_block(completion)
    if expression is None:
        return 0.0
    try:
        value = parse_expression(expression)
    except ValueError:
        return 0.0
    # each given number exactly once (parse_expression allowed only digits, operators, spaces and
    # parentheses, so the runs of digits are the literals; their count is capped by the length)
    if sorted(int(x) for x in re.findall(r"[0-9]+", expression)) != sorted(answer["numbers"]):
        return 0.0
    return float(value == answer["target"])


def read_countdown_answer(completion):
    """The last answer block's expression with all whitespace removed ('(1 + 2) / 3' -> '(1+2)/3'),
    or None: the answer majority voting counts. Votes are expressions, not values: '3*8' and '8*3'
    are two different answers, as two different solutions."""
    return "".join((last_answer_block(completion) or "").split()) or None


def countdown_format(completion):
    """Exactly one <answer> and one </answer>, in that order (the whole completion is counted)."""
    opens, closes = completion.count(ANSWER_OPEN), completion.count(ANSWER_CLOSE)
    return float(opens == closes == 1 and completion.find(ANSWER_OPEN) < completion.find(ANSWER_CLOSE))


# ----------------------------------------------------------------------------
# gsm8k: answer = "72". GSM8K's reference solutions end with "#### 72" and the prompt asks for that
# form, which models usually follow. The answer is the number right after the last '####' (spaces
# and '$' skipped), like lm-eval's strict match; a '####' with no number after it is wrong. Without
# any '####', it is the last number in the completion (like lm-eval's flexible match). Compared as
# numbers: "1,000" equals 1000, "72.0" equals 72.

def _number_after_marker(tail):
    return NUMBER.match(tail.rsplit("####", 1)[1].lstrip(" \t$")) if "####" in tail else None


def read_gsm8k_answer(completion):
    tail = _tail(completion)
    match = _number_after_marker(tail) if "####" in tail else _last_match(NUMBER, tail)
    return _to_number(match.group()) if match else None


def gsm8k_reward(completion, answer):
    given = read_gsm8k_answer(completion)
    return float(given is not None and given == Fraction(answer))


def gsm8k_format(completion):
    return float(_number_after_marker(_tail(completion)) is not None)


# ----------------------------------------------------------------------------
# dapo_math, aime24: answer = "34". The DAPO prompt asks for "Answer: $Answer" on the last line. The
# answer is the text after the LAST "Answer:" (any case, as verl's math_dapo), up to the end of its
# line, with spaces, '$', '*', a trailing '.' and a \boxed{...} around it removed; it must then be
# exactly one number, so "Answer: 34 or 35" is wrong. Compared as integers: "034" and "34.0" equal
# 34.

ANSWER_LINE = re.compile(r"answer\s*:([^\n]*)", re.IGNORECASE)


def read_dapo_answer(completion):
    match = _last_match(ANSWER_LINE, _tail(completion))
    if match is None:
        return None
    # A trailing '.' ends the sentence; a leading one is part of the number (".5" is not 5).
    text = match.group(1).rstrip(" \t\r$*.").lstrip(" \t\r$*")
    if text.startswith("\\boxed{") and text.endswith("}"):
        text = text[len("\\boxed{"):-1].strip()
    return _to_number(text)


def dapo_math_reward(completion, answer):
    given = read_dapo_answer(completion)
    return float(given is not None and given == Fraction(answer))


def dapo_math_format(completion):
    return float(_tail(completion).rsplit("\n", 1)[-1].lstrip().startswith("Answer:"))


# ----------------------------------------------------------------------------
# a task's rows: every task's data/<task>/prepare.py writes this one format

def row_problem(row):
    """What is wrong with a data row, or None.
    Rows: {"prompt": [{"role": ..., "content": ...}, ...], "answer": ...}."""
    if not isinstance(row, dict):
        return "not a JSON object"
    prompt = row.get('prompt')
    def is_message(m):
        return isinstance(m, dict) and all(isinstance(m.get(k), str) for k in ('role', 'content'))
    if not isinstance(prompt, list) or not prompt or not all(is_message(m) for m in prompt):
        return "'prompt' must be a non-empty list of {'role': str, 'content': str} messages"
    if row.get('answer') is None:
        return "missing 'answer'"
    return None


def load_rows(directory, split, max_bad_rows):
    """A task's jsonl split. Malformed rows are reported with file and line, skipped and counted;
    a missing file, no usable row or more than max_bad_rows bad ones: ValueError."""
    path = os.path.join(directory, f'{split}.jsonl')
    if not os.path.exists(path):
        raise ValueError(f"{path} not found: run `python {directory}/prepare.py` first")
    rows, bad = [], 0
    for lineno, line in enumerate(open(path), 1):
        try:
            row = json.loads(line)
            problem = row_problem(row)
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg})"
        if problem is None:
            rows.append(row)
            continue
        bad += 1
        if bad <= 5:
            print(f"{path}:{lineno}: {problem}; row skipped")
        if bad > max_bad_rows:
            raise ValueError(f"{path}: more than max_bad_rows={max_bad_rows} malformed rows")
    if bad:
        print(f"{path}: {bad} malformed rows skipped, {len(rows)} kept")
    if not rows:
        raise ValueError(f"{path}: no usable rows")
    return rows


# ----------------------------------------------------------------------------
# The task registry: one entry per dataset, holding everything the trainer needs to know about it

class Task(NamedTuple):
    """One dataset's parts, all three required (a NamedTuple: a task missing a part is a TypeError
    where it is defined, not a silent 0 at eval time)."""
    score: Callable   # (completion, answer) -> 1.0 right / 0.0 wrong: the verifier
    format: Callable  # completion -> 1.0 if the answer is where the prompt asked it, else 0.0
    answer: Callable  # completion -> the parsed answer the verifier compares (maj@k), None if none


TASKS = {
    "arithmetic": Task(arithmetic_reward, arithmetic_format, read_integer_answer),
    "countdown": Task(countdown_reward, countdown_format, read_countdown_answer),
    "multiply": Task(multiply_reward, multiply_format, read_multiply_answer),
    "gsm8k": Task(gsm8k_reward, gsm8k_format, read_gsm8k_answer),
    "dapo_math": Task(dapo_math_reward, dapo_math_format, read_dapo_answer),
    # AIME 2024 is evaluated with the DAPO prompt (data/aime24/prepare.py), so with the DAPO verifier.
    "aime24": Task(dapo_math_reward, dapo_math_format, read_dapo_answer),
}


# ----------------------------------------------------------------------------
# held-out metrics: pass@k and maj@k, from k samples of each test problem

def pass_at_k(n, c, k):
    """The unbiased pass@k estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
    on Code", eq. 1): the chance that k of the n samples, drawn without replacement, hold at least
    one of the c correct ones, 1 - C(n-c, k) / C(n, k). math.comb counts exactly (Python integers):
    nothing overflows, and only the last division and subtraction round. k = 1 gives c / n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got {n=}, {c=}, {k=}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(answers, correct):
    """maj@k of one problem (majority voting, "self-consistency": Wang et al. 2022; maj@k as in
    Minerva, Lewkowycz et al. 2022): the vote is the most common non-None parsed answer among its k
    samples; 1.0 if a sample with that answer was judged correct (correct[i] > 0), else 0.0. No
    parsed answer at all: 0.0. A tie goes to the answer that appears first (Counter.most_common
    keeps first-seen order among equal counts)."""
    if len(answers) != len(correct):
        raise ValueError(f"majority_correct needs one verdict per answer, got {len(answers)} "
                         f"answers and {len(correct)} verdicts")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    vote = votes.most_common(1)[0][0]
    return float(any(ok > 0 for a, ok in zip(answers, correct) if a == vote))


def eval_sums(samples, k, read_answer):
    """The held-out sums of k samples per problem (consecutive), to be reduced over ranks: samples,
    problems, right answers, tokens, truncations, pass@1, pass@k and maj@k (the vote over
    read_answer's parse: a task's answer; one that raises costs its sample's vote)."""
    correct = [samples['correct'][i:i + k] for i in range(0, len(samples['correct']), k)]
    def parsed(completion):
        try:
            return read_answer(completion)
        except Exception:  # noqa: BLE001 -- as the trainer's verify: one bad completion, one vote
            return None
    answers = [parsed(c) for c in samples['completions']]
    n_correct = [int(sum(c)) for c in correct]
    return {'n': len(samples['correct']), 'problems': len(correct),
            'accuracy': sum(samples['correct']),
            'completion_len': sum(map(len, samples['completion_ids'])),
            'truncated': sum(samples['truncated']),
            'pass@1': sum(pass_at_k(k, c, 1) for c in n_correct),
            f'pass@{k}': sum(pass_at_k(k, c, k) for c in n_correct),
            f'maj@{k}': sum(majority_correct(answers[i * k:(i + 1) * k], c)
                            for i, c in enumerate(correct))}


# ----------------------------------------------------------------------------
# Length shaping, added to the correctness reward by the trainer.

def overlong_penalty(length, max_len, cache_len):
    """DAPO's soft overlong punishment (DAPO paper, "Overlong Reward Shaping"); L_max = max_len,
    L_cache = cache_len, |y| = length in tokens:
        R_length(y) = 0                                    if |y| <= L_max - L_cache
                      ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                      -1                                   if |y| > L_max
    E.g. L_max 20,480, L_cache 4,096: no penalty up to 16,384 tokens, -0.5 at 18,432."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong_penalty needs 0 < cache_len <= max_len, got {cache_len=}, {max_len=}")
    free = max_len - cache_len
    if length <= free:
        return 0.0
    return (free - length) / cache_len if length <= max_len else -1.0


def kimi_length_reward(lengths, correct, group_size):
    """Kimi k1.5's length reward (Kimi k1.5 paper, "Length Penalty") within each group of group_size
    consecutive samples (the answers to one prompt), lengths in tokens:
        lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)
        reward_i = lambda_i if answer i is correct, else min(0, lambda_i)
    A group whose lengths are all equal gets 0. correct[i] > 0 means correct (bools or 1.0/0.0 scores).
    E.g. lengths 1000, 3000, 5000 -> lambda = [0.5, 0, -0.5]: a short wrong answer is not praised.
    (open-r1's len_reward counts characters over the whole batch; this is per group, in tokens, as in the
    paper.)"""
    lengths, correct = list(lengths), list(correct)
    if group_size < 1 or len(lengths) != len(correct) or len(lengths) % group_size:
        raise ValueError(f"kimi_length_reward needs len(lengths) == len(correct), a multiple of {group_size=}; "
                         f"got {len(lengths)} and {len(correct)}")
    rewards = []
    for start in range(0, len(lengths), group_size):
        group = lengths[start:start + group_size]
        shortest, longest = min(group), max(group)
        for length, ok in zip(group, correct[start:start + group_size]):
            lam = 0.5 - (length - shortest) / (longest - shortest) if longest > shortest else 0.0
            rewards.append(lam if ok > 0 else min(0.0, lam))
    return rewards


def control_verdicts(control, samples, other_answers, group_size, score, rng):
    """The reward-integrity controls: the verdicts a trainer sees instead of the verifier's, in an
    arm that a recipe's gain must beat (spurious rewards, Shao et al. 2025: random rewards raised
    Qwen2.5-Math by up to 21 points, Llama and OLMo by about 0). samples: the rollout's, with the
    verifier's 'correct'; other_answers: one per group, another prompt's reference answer.
      'random'    a coin per answer that comes up right with the verdicts' own success rate: the
                  advantages keep their statistics (groups agree as often, on average), and the
                  coins depend on nothing but that rate (rng: a random.Random)
      'shuffled'  each answer scored (score: the task's verifier) against another prompt's answer"""
    if control == 'random':
        rate = sum(c > 0 for c in samples['correct']) / max(len(samples['correct']), 1)
        return [float(rng.random() < rate) for _ in samples['correct']]
    return [score(c, other_answers[i // group_size]) for i, c in enumerate(samples['completions'])]


# ----------------------------------------------------------------------------
# Running a verifier inside a training run: one bad completion must not end the run.

@contextmanager
def time_limit(seconds):
    """Raise TimeoutError in the block after `seconds` of wall time (SIGALRM: main thread, Unix)."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"took longer than {seconds}s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def safe_score(reward_fn, completion, answer, timeout=1.0):
    """(score, None), or (0.0, the exception) when reward_fn raises or runs past `timeout`
    seconds."""
    try:
        with time_limit(timeout):
            return float(reward_fn(completion, answer)), None
    except Exception as error:  # noqa: BLE001 -- any verifier bug costs one sample, never the run
        return 0.0, error
