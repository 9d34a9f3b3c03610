#!/bin/sh
# The one-command check for the day a GPU is lent (issue #17): the paths that the CPU tests cannot
# run get their first run. Offline (SmolLM2-135M from models/, the arithmetic task), one GPU, about
# 5-8 minutes:
#   1. 3 steps under torchrun with 1 rank, DDP, the vLLM GPU engine and its sleep mode (vllm_sleep,
#      GPU only): the engine frees its memory during the update and must serve the synced weights
#      after it (rollout_mismatch, with entropy_coef moving the weights every step, must stay at its
#      first step's level: a sync that did not land makes it jump, as the CPU tests show);
#   2. the same with parallel='fsdp' (1 rank: FSDP2's code path, no memory saved);
#   3. bench.py's step table (the standard workload, before / after).
# Needs: pip install -r requirements.txt; python models/smollm2/prepare.py;
#        python data/arithmetic/prepare.py (the Makefile's setup, with the CUDA requirements).
#     sh gpu_check.sh            (PYTHON=... to choose the interpreter)
set -e
PYTHON=${PYTHON:-python}
OUT=${OUT:-out/gpu_check}
rm -rf "$OUT"
for parallel in ddp fsdp; do
    echo "== $parallel: 3 steps, 1 rank, vLLM with sleep mode"
    $PYTHON -m torch.distributed.run --nproc_per_node=1 train.py config/cpu_demo.py \
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
