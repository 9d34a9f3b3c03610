#!/bin/sh
# The one-command check for the day a GPU is lent: the paths that the CPU tests cannot run get their
# first run. Offline, one GPU. Two parts:
#   1. the device's own torch and transformers only (no vLLM; what the lent H200 has, with at most
#      64 MiB carried along): the CUDA trainer path with the HF engine, on a 2-layer cut of the
#      offline model (its weights if models/smollm2/hf has them, else random weights of its shape
#      from its config and tokenizer files, a few MB):
#      a. plain python, bf16 (dtype='auto' on an Ampere-or-newer GPU): 4 steps uninterrupted, and 2
#         steps, a checkpoint, a resume for 2 more, which must sample what the uninterrupted run
#         sampled (the rank's CUDA RNG state restored);
#      b. the same under torchrun with 1 rank: DDP, NCCL.
#      (parallel='fsdp' needs the vLLM engine: part 2.)
#   2. with vLLM (pip install -r requirements.txt, python models/smollm2/prepare.py, python
#      data/arithmetic/prepare.py): 3 steps under torchrun with 1 rank, DDP then parallel='fsdp',
#      the vLLM GPU engine and its sleep mode (vllm_sleep, GPU only): the engine frees its memory
#      during the update and must serve the synced weights after it (rollout_mismatch, with
#      entropy_coef moving the weights every step, must stay at its first step's level: a sync
#      that did not land makes it jump, as the CPU tests show). The engine prints its model runner
#      (on GPU, V2 wherever Triton is installed; VLLM_USE_V2_MODEL_RUNNER=0 goes back to V1). Then
#      bench.py's step table.
#     sh gpu_check.sh            (PYTHON=... to choose the interpreter; PART=1 for part 1 only)
set -e
PYTHON=${PYTHON:-python}
OUT=${OUT:-out/gpu_check}
PART=${PART:-all}
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== part 1: the HF engine on the device's own torch"
[ -f data/arithmetic/train.jsonl ] || $PYTHON data/arithmetic/prepare.py
$PYTHON - "$OUT/model" <<'EOF'
import os, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src, dst = 'models/smollm2/hf', sys.argv[1]
if os.path.exists(os.path.join(src, 'model.safetensors')):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
else:  # the device: random weights of the same shape
    config = AutoConfig.from_pretrained(src, num_hidden_layers=2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.save_pretrained(dst)
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
print(f"{dst}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
EOF
SMALL="config/cpu_demo.py --init_from=$OUT/model --rollout_engine=hf --prompts_per_step=4 \
    --group_size=4 --max_new_tokens=16 --eval_interval=2 --eval_problems=8 --eval_samples=2 \
    --entropy_coef=0.01 --learning_rate=1e-3"
for launcher in "$PYTHON" "$PYTHON -m torch.distributed.run --standalone --nproc_per_node=1"; do
    echo "-- $launcher train.py: 4 steps, then 2 + a resume for 2"
    dir="$OUT/$(echo "$launcher" | grep -q distributed.run && echo ddp || echo plain)"
    $launcher train.py $SMALL --out_dir="$dir/full" --max_iters=4 --ckpt_interval=-1
    $launcher train.py $SMALL --out_dir="$dir/resumed" --max_iters=2
    $launcher train.py $SMALL --out_dir="$dir/resumed" --max_iters=4 --init_from=resume
    $PYTHON - "$dir" <<'EOF'
import json, sys
def steps(run):
    return {r['step']: r for r in map(json.loads, open(f'{sys.argv[1]}/{run}/log.jsonl')) if 'reward' in r}
full, resumed = steps('full'), steps('resumed')
for step in (3, 4):
    a, b = full[step], resumed[step]
    print(f"step {step}: completion_len {a['completion_len']:.3f} / {b['completion_len']:.3f}, entropy "
          f"{a['entropy']:.6f} / {b['entropy']:.6f}, peak {a['peak_memory_gib']:.2f} GiB")
    assert a['completion_len'] == b['completion_len'] and a['reward'] == b['reward'], 'resume not exact'
    assert abs(a['entropy'] - b['entropy']) < 1e-3 * abs(a['entropy']), 'resume not exact'
print('ok: the resumed run sampled what the uninterrupted one did')
EOF
done
[ "$PART" = 1 ] && exit 0

for parallel in ddp fsdp; do
    echo "== part 2, $parallel: 3 steps, 1 rank, vLLM with sleep mode"
    $PYTHON -m torch.distributed.run --standalone --nproc_per_node=1 train.py config/cpu_demo.py \
        --out_dir="$OUT/$parallel" --parallel=$parallel --max_iters=3 --eval_interval=0 \
        --prompts_per_step=8 --group_size=8 --max_new_tokens=64 --entropy_coef=0.01 \
        --learning_rate=1e-4 --ckpt_interval=-1 --vllm_sleep=True
    $PYTHON - "$OUT/$parallel/log.jsonl" <<'EOF'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if '"reward"' in line]
first = max(steps[0]['rollout_mismatch'], 1e-3)
for r in steps:
    print(f"step {r['step']}: rollout_mismatch {r['rollout_mismatch']:.2e}, grad_norm "
          f"{r['grad_norm']:.3f}, sync {r['sync_seconds']:.2f} s, peak {r['peak_memory_gib']:.2f} GiB")
    assert r['grad_norm'] > 0 and r['rollout_mismatch'] < 3 * first, 'the engine did not follow'
print('ok: the engine served the synced weights at every step')
EOF
done
echo "== bench.py --only=step"
$PYTHON bench.py --only=step
