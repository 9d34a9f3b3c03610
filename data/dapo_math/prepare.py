"""
DAPO-Math-17K (BytedTsinghua-SIA/DAPO-Math-17k): the DAPO paper's training set, ~17k competition
problems whose answers were all rewritten as integers so that a rule can check them. Downloads with
`datasets` and writes the general row format (see data/arithmetic/prepare.py).

A raw row is {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "Solve the
following math problem step by step. ... Remember to put your answer on its own line after
\"Answer:\"."}], "ability": "MATH", "reward_model": {"ground_truth": "34", "style": "..."},
"extra_info": {"index": "<uuid>"}}.
The prompt already carries DAPO's instruction, so it is kept as it is; rewards.dapo_math_reward
reads the last "Answer:" line. The hub copy repeats each problem many times (~1.79M rows), so rows
are deduplicated by prompt. The dataset has one split: a seeded random num_test problems are held
out as test.jsonl (the DAPO recipe's real eval is AIME 2024: data/aime24/prepare.py).

    python data/dapo_math/prepare.py [num_test=500 seed=0]
"""
import json
import os
import random
import sys

DATASET = "BytedTsinghua-SIA/DAPO-Math-17k"


def convert(raw):
    """A raw DAPO-Math row -> {"prompt": [chat messages as given], "answer": "34",
    "meta": {...}}."""
    return {"prompt": [{"role": m["role"], "content": m["content"]} for m in raw["prompt"]],
            "answer": str(raw["reward_model"]["ground_truth"]).strip(),
            "meta": {"index": (raw.get("extra_info") or {}).get("index"),
                     "data_source": raw.get("data_source")}}


def deduplicate(rows):
    """Keep the first row of each distinct prompt, in order."""
    seen, unique = set(), []
    for row in rows:
        key = json.dumps(row["prompt"])
        if key not in seen:
            seen.add(key)
            unique.append(row)
    return unique


def write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")


def main(argv):
    args = dict(num_test=500, seed=0)
    for arg in argv:
        key, _, val = arg.lstrip('-').partition('=')
        if key not in args:
            sys.exit(f"unknown argument {arg!r}; valid: {', '.join(args)}")
        args[key] = int(val)
    try:
        # imported here: the offline tasks and the tests don't need it
        from datasets import load_dataset
        raw_rows = load_dataset(DATASET, split="train")
    except ImportError:
        sys.exit(f"dapo_math: cannot download {DATASET} "
                 "(`datasets` is not installed: pip install datasets)")
    except Exception as e:  # no network, hub down, ...: one line, not a traceback
        sys.exit(f"dapo_math: cannot download {DATASET} (is the hub reachable? "
                 f"{type(e).__name__}: {str(e)[:200]!r})")
    rows = deduplicate(convert(raw) for raw in raw_rows)
    random.Random(args["seed"]).shuffle(rows)
    out_dir = os.path.dirname(os.path.abspath(__file__))
    write_jsonl(os.path.join(out_dir, "test.jsonl"), rows[:args["num_test"]])
    write_jsonl(os.path.join(out_dir, "train.jsonl"), rows[args["num_test"]:])


if __name__ == "__main__":
    main(sys.argv[1:])
