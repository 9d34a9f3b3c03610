"""
GSM8K (openai/gsm8k, config "main"): grade-school word problems whose answers are integers.
Downloads from the Hugging Face hub with `datasets` (pip install datasets) and writes the general
row format (see data/arithmetic/prepare.py): train.jsonl (7,473 rows) and test.jsonl (1,319 rows),
the dataset's splits.

A raw row is {"question": "...", "answer": "<worked solution>\\n#### 72"}. Our row's answer is the
integer after '####' ("72", commas removed); the worked solution goes to meta. The prompt is the
question plus verl's GSM8K instruction, which asks for the same '#### N' form that
rewards.gsm8k_reward reads.

    python data/gsm8k/prepare.py
"""
import json
import os
import re
import sys

DATASET, CONFIG = "openai/gsm8k", "main"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def convert(raw):
    """A raw GSM8K row -> {"prompt": [user message], "answer": "72", "meta": {"solution": ...}}."""
    solution, marker, final = raw["answer"].rpartition("####")
    answer = final.strip().replace(",", "")
    if not marker or not re.fullmatch(r"-?[0-9]+", answer):
        raise ValueError("GSM8K answer does not end with '#### <integer>': "
                         f"{raw['answer'][-80:]!r}")
    return {"prompt": [{"role": "user", "content": f"{raw['question']} {INSTRUCTION}"}],
            "answer": answer, "meta": {"solution": solution.strip()}}


def write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")


def main():
    try:
        # imported here: the offline tasks and the tests don't need it
        from datasets import load_dataset
        splits = load_dataset(DATASET, CONFIG)
    except ImportError:
        sys.exit(f"gsm8k: cannot download {DATASET} "
                 "(`datasets` is not installed: pip install datasets)")
    except Exception as e:  # no network, hub down, ...: one line, not a traceback
        sys.exit(f"gsm8k: cannot download {DATASET} (is the hub reachable? "
                 f"{type(e).__name__}: {str(e)[:200]!r})")
    out_dir = os.path.dirname(os.path.abspath(__file__))
    for split in ("train", "test"):
        write_jsonl(os.path.join(out_dir, f"{split}.jsonl"),
                    [convert(raw) for raw in splits[split]])


if __name__ == "__main__":
    main()
