import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODEL_DIR = os.path.join(ROOT, "models", "smollm2", "hf")
SMALL_MODEL_DIR = os.path.join(ROOT, "models", "smollm2", "hf-2layers")
# the body dtypes a dtype-sensitive test runs in, on every machine: 'auto' takes bf16 only where the
# CPU has bf16 matmuls (AVX512-BF16, AMX), so each path would otherwise go untested somewhere
DTYPES = ["float32", "bfloat16"]


@pytest.fixture(scope="session")
def small_model():
    """The offline model cut to its first 2 of 30 decoder layers (the same tokenizer, embeddings,
    final norm and head): a real model whose samples depend on the RNG and the weights, for the
    tests that run in both dtypes, bf16 included where it is emulated (~60x slower than fp32 on an
    AVX2-only CPU; 2 layers make that affordable). Built once into models/smollm2/hf-2layers."""
    done = os.path.join(SMALL_MODEL_DIR, "DONE")
    if not os.path.exists(done):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
        model.model.layers = model.model.layers[:2]
        model.config.num_hidden_layers = 2
        model.save_pretrained(SMALL_MODEL_DIR)
        AutoTokenizer.from_pretrained(MODEL_DIR).save_pretrained(SMALL_MODEL_DIR)
        open(done, "w").close()
    return SMALL_MODEL_DIR


def tiny_llama(vocab=96, hidden=32, seed=0, **config):
    """A tiny Llama in fp32 (2 layers, 4 heads over 2 key / value heads, tied head) with seed's
    init: the shape of SmolLM2's body at a size a test runs in a second."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, **config))


def verifier_config(tmp_path, score):
    """A config file (its path) that replaces the arithmetic task's verifier with the lambda
    `score` (source text of `lambda completion, answer: ...`)."""
    path = tmp_path / "verifier.py"
    path.write_text("import rewards\n"
                    "rewards.TASKS['arithmetic'] = rewards.TASKS['arithmetic']._replace(\n"
                    f"    score={score})\n")
    return str(path)


def parity_reward(tmp_path, never=None):
    """A config file (its path) that replaces the arithmetic verifier: an answer is right when its
    length in characters is even, so that, whatever the model samples, a group of G agrees with
    probability 2 / 2**G (live groups almost surely); the answer `never` of a data row is never
    right (its groups are surely degenerate)."""
    return verifier_config(tmp_path, "lambda completion, answer: "
                           f"0.0 if answer == {never!r} else float(len(completion) % 2 == 0)")


def train_log(*args, timeout=600):
    """Run train.py with args (one of them --out_dir=...), check that it exits 0, return the
    records of its log.jsonl."""
    result = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    out_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--out_dir="))
    return [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]
