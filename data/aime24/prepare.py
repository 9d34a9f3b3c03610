"""
AIME 2024 (HuggingFaceH4/aime_2024): the 30 problems of AIME I and II 2024, integer answers 0..999.
Eval-only: writes data/aime24/test.jsonl and no train split (the hub serves the 30 rows as its
"train" split; training on them would be training on the benchmark). Downloads with `datasets`.

A raw row is {"id": 60, "problem": "...", "solution": "...", "answer": "204", "url": "...",
"year": "2024"}. The prompt is DAPO's, so DAPO-Math-trained models see the format they learned,
and rewards.TASKS["aime24"].score is the DAPO verifier (the last "Answer:" line). Answers are
normalized to plain integers ("025" -> "25").

    python data/aime24/prepare.py
"""
import json
import os
import sys

DATASET = "HuggingFaceH4/aime_2024"
TEMPLATE = ("Solve the following math problem step by step. The last line of your response "
            "should be of the form Answer: $Answer (without quotes) where $Answer is the "
            "answer to the problem.\n\n{problem}\n\n"
            "Remember to put your answer on its own line after \"Answer:\".")


def convert(raw):
    """A raw AIME row -> {"prompt": [user message with the DAPO prompt], "answer": "204",
    "meta": {...}}."""
    return {"prompt": [{"role": "user",
                        "content": TEMPLATE.format(problem=raw["problem"].strip())}],
            "answer": str(int(raw["answer"])),
            "meta": {"id": raw.get("id"), "url": raw.get("url")}}


def write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    print(f"wrote {len(rows)} rows to {path}")


def main():
    try:
        # imported here: the offline tasks and the tests don't need it
        from datasets import load_dataset
        rows = load_dataset(DATASET, split="train")
    except ImportError:
        sys.exit(f"aime24: cannot download {DATASET} "
                 "(`datasets` is not installed: pip install datasets)")
    except Exception as e:  # no network, hub down, ...: one line, not a traceback
        sys.exit(f"aime24: cannot download {DATASET} (is the hub reachable? "
                 f"{type(e).__name__}: {str(e)[:200]!r})")
    out_dir = os.path.dirname(os.path.abspath(__file__))
    write_jsonl(os.path.join(out_dir, "test.jsonl"), [convert(raw) for raw in rows])


if __name__ == "__main__":
    main()
