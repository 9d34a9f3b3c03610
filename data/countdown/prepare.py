"""
Countdown (TinyZero): given 3 or 4 numbers and a target, write an expression that uses every number
exactly once with + - * / and equals the target. Generated offline, seeded; rows in the general
format (see data/arithmetic/prepare.py) with answer = {"target": T, "numbers": [...]}, checked by
rewards.countdown_reward.

Every target is reachable by construction: the generator combines the numbers in random order with
random operators (keeping only exact divisions and positive intermediate results), and the target
is the value. The expression it built is kept in meta["solution"] (the tests score it with the
verifier). Other solutions may exist; any that the verifier accepts earns the reward.

The test split holds problems (the numbers as a multiset, plus the target) that never appear in
train.

    python data/countdown/prepare.py [num_train=20000 num_test=200 min_count=3 max_count=4
                                      max_number=99 max_target=999 seed=0]
"""
import json
import os
import random
import sys

TEMPLATE = ("Using the numbers {numbers}, create an equation that equals {target}. You can use "
            "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show "
            "your work in <think> </think> tags. And return the final answer in <answer> </answer> "
            "tags, for example <answer> (1 + 2) / 3 </answer>.")


def combine(a, b, op):
    """(value, expression) of a op b, or None unless the result is a positive integer."""
    (x, ex), (y, ey) = a, b
    if op == "+":
        value = x + y
    elif op == "-":
        value = x - y
    elif op == "*":
        value = x * y
    elif x % y == 0:  # "/": only exact divisions
        value = x // y
    else:
        return None
    return (value, f"({ex} {op} {ey})") if value > 0 else None


def random_problem(rng, count, max_number, max_target):
    """Draw `count` numbers in 1..max_number, fold them into one expression at random; None if the
    value falls outside 1..max_target (the caller draws again)."""
    numbers = [rng.randint(1, max_number) for _ in range(count)]
    terms = [(n, str(n)) for n in numbers]
    while len(terms) > 1:
        a, b = rng.sample(terms, 2)
        # "+" always fits
        options = [t for t in (combine(a, b, op) for op in "+-*/") if t is not None]
        terms.remove(a)
        terms.remove(b)
        terms.append(rng.choice(options))
    target, expression = terms[0]
    if not 1 <= target <= max_target:
        return None
    return numbers, target, expression[1:-1] if expression.startswith("(") else expression


def problem_key(row):
    """Two rows are the same problem when they have the same numbers (in any order) and target."""
    return tuple(sorted(row["answer"]["numbers"])), row["answer"]["target"]


def make_rows(n, seed, min_count=3, max_count=4, max_number=99, max_target=999, exclude=()):
    """n distinct problems (by problem_key), none of them in `exclude`; deterministic given the
    arguments. Gives up with ValueError after 10,000 draws in a row that found no new problem (the
    space is used up)."""
    rng = random.Random(seed)
    seen, rows, misses = set(exclude), [], 0
    while len(rows) < n:
        if misses == 10_000:
            raise ValueError(f"found only {len(rows)} of {n} distinct problems: "
                             "widen max_number or max_target")
        misses += 1
        problem = random_problem(rng, rng.randint(min_count, max_count), max_number, max_target)
        if problem is None:
            continue
        numbers, target, solution = problem
        row = {"prompt": [{"role": "user",
                           "content": TEMPLATE.format(numbers=numbers, target=target)}],
               "answer": {"target": target, "numbers": numbers}, "meta": {"solution": solution}}
        if problem_key(row) not in seen:
            seen.add(problem_key(row))
            rows.append(row)
            misses = 0
    return rows


def write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")


def main(argv):
    args = dict(num_train=20000, num_test=200, min_count=3, max_count=4, max_number=99,
                max_target=999, seed=0)
    for arg in argv:
        key, _, val = arg.lstrip('-').partition('=')
        if key not in args:
            sys.exit(f"unknown argument {arg!r}; valid: {', '.join(args)}")
        args[key] = int(val)
    shape = {k: args[k] for k in ("min_count", "max_count", "max_number", "max_target")}
    if (not 2 <= shape["min_count"] <= shape["max_count"] or shape["max_number"] < 1
            or shape["max_target"] < 1):
        sys.exit(f"need 2 <= min_count <= max_count, max_number >= 1, max_target >= 1; got {shape}")
    test = make_rows(args["num_test"], args["seed"], **shape)
    train = make_rows(args["num_train"], args["seed"] + 1, exclude={problem_key(r) for r in test},
                      **shape)
    out_dir = os.path.dirname(os.path.abspath(__file__))
    write_jsonl(os.path.join(out_dir, "test.jsonl"), test)
    write_jsonl(os.path.join(out_dir, "train.jsonl"), train)


if __name__ == "__main__":
    main(sys.argv[1:])
