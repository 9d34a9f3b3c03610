"""
Addition problems as chat prompts: the offline default task, generated (no download), seeded.

Every task in data/ writes rows of one general format, one JSON object per line:
    {"prompt": [{"role": "user", "content": "..."}], "answer": "42", "meta": {...}}
`prompt` is a list of chat messages (the tokenizer's chat template turns it into text), `answer` is
what the task's verifier in rewards.py compares against (math answers are integers written as
strings), `meta` is optional and free-form.

The test split holds operand pairs that never appear in the train split, in either order: a + b is
b + a, so if {a, b} is held out, neither "a + b" nor "b + a" is a training prompt. Held-out accuracy
then measures the skill, not recall of the training prompts (or of their mirror images).

    python data/arithmetic/prepare.py [--min_operand=1 --max_operand=20 --num_test=100 --seed=0]
    python data/arithmetic/prepare.py --min_operand=10 --max_operand=99 --num_test=200 \
        --out_dir=data/arithmetic_2digit      # config/cpu_2digit.py, cpu_hard.py
"""
import json
import os
import random
import sys

min_operand = 1      # smallest operand
max_operand = 20     # largest operand
num_test = 100       # held-out problems: distinct unordered pairs, in training in neither order
num_train = 5000     # training rows, sampled with replacement from the remaining ordered pairs
seed = 0
out_dir = os.path.dirname(os.path.abspath(__file__))  # where train.jsonl and test.jsonl go
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip('-').partition('=')
    if key not in ('min_operand', 'max_operand', 'num_test', 'num_train', 'seed', 'out_dir'):
        sys.exit(f"unknown argument {arg!r}")
    globals()[key] = val if key == 'out_dir' else int(val)

TEMPLATE = "What is {a} + {b}? Reply with only the number."


def row(a, b):
    return {"prompt": [{"role": "user", "content": TEMPLATE.format(a=a, b=b)}],
            "answer": str(a + b), "meta": {"a": a, "b": b}}


rng = random.Random(seed)
operands = range(min_operand, max_operand + 1)
# Hold out unordered pairs {a, b} (a <= b): a + b = b + a, so "b + a" in train gives "a + b" away.
unordered = [(a, b) for a in operands for b in operands if a <= b]
if num_test >= len(unordered):
    sys.exit(f"num_test={num_test} leaves no training pairs of {len(unordered)} unordered pairs")
rng.shuffle(unordered)
held_out = set(unordered[:num_test])
test_pairs = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in unordered[:num_test]]
train_pairs = [(a, b) for a in operands for b in operands if (min(a, b), max(a, b)) not in held_out]
os.makedirs(out_dir, exist_ok=True)
for split, rows in [("test", [row(a, b) for a, b in test_pairs]),
                    ("train", [row(*rng.choice(train_pairs)) for _ in range(num_train)])]:
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")
