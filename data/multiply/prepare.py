"""
Multiplication with a calculator: "What is 347 * 86?", a 3-digit by a 2-digit number (a product a
135M model does not do in its head: 0-0.8 % right without the tool, measured below); the prompt
shows the calculator of tools.py in one worked example, a turn of the chat before the question.
Generated (no download), seeded, rows in the general format (see data/arithmetic/prepare.py):
    {"prompt": [system, example question, example reply, {"role": "user", "content": "What is
     347 * 86?"}], "answer": "29842", "meta": {"a": 347, "b": 86}}
checked by rewards.TASKS['multiply'] (the integer after the last '=' of the model's own text, its
<calc> and <result> blocks removed).

The test split holds (a, b) pairs that never appear in train; the worked example's pair is in
neither. `--tool=0` writes the same problems with a prompt that has no tool (the example answered
without it), so the same task can be trained without it.

    python data/multiply/prepare.py [--num_test=200 --num_train=5000 --seed=0 --tool=1]
    python data/multiply/prepare.py --tool=0 --out_dir=data/multiply_notool
"""
import json
import os
import random
import sys

num_test = 200       # held-out problems: distinct (a, b) pairs, never in train
num_train = 5000     # training rows, sampled with replacement from the remaining pairs
seed = 0
tool = 1             # 1: the prompt teaches the calculator; 0: the same problems without it
out_dir = os.path.dirname(os.path.abspath(__file__))  # where train.jsonl and test.jsonl go
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip('-').partition('=')
    if key not in ('num_test', 'num_train', 'seed', 'tool', 'out_dir'):
        sys.exit(f"unknown argument {arg!r}")
    globals()[key] = val if key == 'out_dir' else int(val)

EXAMPLE = (123, 45)  # the worked example's pair: in neither split
# The example is a turn of the chat (a user's question, the assistant's reply), not prose inside
# one prompt: measured on 128 samples of the base model (2026-12-01), a system line and this turn
# make it call the calculator in 62 % of its answers (21 % right), one prompt with the example
# inline in 1.6 % (0 % right), and it even copied "EXPRESSION" literally.
SYSTEM = "You have a calculator. Write <calc>EXPRESSION</calc> and the result appears."
TOOL_REPLY = "<calc>{a}*{b}</calc><result>{p}</result> {a} * {b} = {p}"
NO_TOOL_REPLY = "{a} * {b} = {p}"


def row(a, b):
    x, y = EXAMPLE
    reply = (TOOL_REPLY if tool else NO_TOOL_REPLY).format(a=x, b=y, p=x * y)
    prompt = ([{"role": "system", "content": SYSTEM}] if tool else []) + [
        {"role": "user", "content": f"What is {x} * {y}?"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"What is {a} * {b}?"}]
    return {"prompt": prompt, "answer": str(a * b), "meta": {"a": a, "b": b}}


rng = random.Random(seed)
# a 3-digit by a 2-digit number: the order is part of the problem, so no mirror pair to hold out
pairs = [(a, b) for a in range(100, 1000) for b in range(10, 100) if (a, b) != EXAMPLE]
if num_test >= len(pairs):
    sys.exit(f"num_test={num_test} leaves no training pairs of {len(pairs)} pairs")
rng.shuffle(pairs)
test_pairs, train_pairs = pairs[:num_test], pairs[num_test:]
os.makedirs(out_dir, exist_ok=True)
for split, rows in [("test", [row(a, b) for a, b in test_pairs]),
                    ("train", [row(*rng.choice(train_pairs)) for _ in range(num_train)])]:
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")
