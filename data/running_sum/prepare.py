"""
Long answers for the length claims: "What is 3 + 5 + 2 + 7 + 4 + 6 + 1 + 8? Add the numbers one at
a time, writing each running total." With the working shown ("3 + 5 = 8, 8 + 2 = 10, ...") an
answer runs to ~70 tokens; without it ("... = 36") to ~20: the length is the model's to choose, so
a loss that favours short or long answers can move it (seed 000's length bias: GRPO's 1/|o_i|
against DAPO's token mean and Dr. GRPO; lab.py's length_bias study). The base SmolLM2-135M's
held-out accuracy (100 problems x 4, T = 1, <= 128 tokens; 2-core AMD EPYC, 2026-12-02): 8
numbers 0.3 % (0.7 % with one worked example as a chat turn before the question), 5 numbers 1.0 %,
4 numbers 1.25 %, 3 numbers 1.75 % (pass@4 7 %, 87 tokens, 41 % cut at 128): 3 numbers start
about where the 2-digit addition task does (2-3 %), which GRPO learns. Generated (no download),
seeded, rows in the general format (see data/arithmetic/prepare.py), checked by
rewards.TASKS['arithmetic'] (the one integer after the last '=': the final running total):
    {"prompt": [{"role": "user", "content": "What is 3 + 5 + ...?  ..."}], "answer": "36",
     "meta": {"numbers": [3, 5, 2, 7, 4, 6, 1, 8]}}

The test split holds multisets of numbers that never appear in train in any order: a sum is the
same in every order, so a held-out problem's answer is not given away by a reordered training row.

    python data/running_sum/prepare.py [--num_operands=8 --num_test=200 --num_train=5000 --seed=0]
"""
import json
import math
import os
import random
import sys

num_operands = 8     # numbers per problem, each 1..9
num_test = 200       # held-out problems: distinct multisets, in training in no order
num_train = 5000     # training rows: random sequences whose multiset is not held out
seed = 0
out_dir = os.path.dirname(os.path.abspath(__file__))  # where train.jsonl and test.jsonl go
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip('-').partition('=')
    if key not in ('num_operands', 'num_test', 'num_train', 'seed', 'out_dir'):
        sys.exit(f"unknown argument {arg!r}")
    globals()[key] = val if key == 'out_dir' else int(val)
if num_operands < 2:
    sys.exit(f"num_operands={num_operands}: a sum needs at least 2 numbers")

TEMPLATE = "What is {sum}? Add the numbers one at a time, writing each running total."


def row(numbers):
    text = TEMPLATE.format(sum=' + '.join(map(str, numbers)))
    return {"prompt": [{"role": "user", "content": text}], "answer": str(sum(numbers)),
            "meta": {"numbers": list(numbers)}}


rng = random.Random(seed)
draw = lambda: [rng.randint(1, 9) for _ in range(num_operands)]
test, held_out = [], set()
for _ in range(100 * num_test):  # distinct multisets, drawn (there are C(num_operands + 8, 8))
    if len(test) == num_test:
        break
    numbers = draw()
    if tuple(sorted(numbers)) not in held_out:
        held_out.add(tuple(sorted(numbers)))
        test.append(numbers)
if len(test) < num_test or len(test) == math.comb(num_operands + 8, 8):
    sys.exit(f"num_test={num_test}: {num_operands} numbers of 1..9 make "
             f"{math.comb(num_operands + 8, 8)} distinct problems, too few to hold out that many")
train = []
while len(train) < num_train:
    numbers = draw()
    if tuple(sorted(numbers)) not in held_out:
        train.append(numbers)
os.makedirs(out_dir, exist_ok=True)
for split, rows in [("test", [row(n) for n in test]), ("train", [row(n) for n in train])]:
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")
