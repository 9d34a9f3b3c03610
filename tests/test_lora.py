"""LoRA (lora.py): step 0 is the base exactly, the adapters' gradients are the hand-derived ones,
the merged weights are W + (alpha / r) B A under the HF names, the base never moves, the adapters
off are pi_ref, PEFT's file format; then a real run: the engine follows the trainer."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, tiny_llama
from lora import (ALL_LINEAR, LoRALinear, add_lora, adapters_off, load_adapter, merged_weights,
                  save_adapter)
from model import completion_logprobs


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(7)[None] < torch.tensor([7, 3, 5, 1])[:, None]).float()
    return (torch.randint(1, 96, (4, 5), generator=g), torch.ones(4, 5, dtype=torch.long),
            torch.randint(1, 96, (4, 7), generator=g), mask)


def lora_copy(rank=4, alpha=8.0, base_dtype=torch.float32, targets=ALL_LINEAR):
    return add_lora(tiny_llama(), rank, alpha, targets, base_dtype, seed=0)


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16])
def test_at_b_zero_the_log_probs_are_the_base_models_exactly(autocast_dtype):
    base = tiny_llama()
    # the frozen base stored in the body's dtype: bf16 holds what autocast rounds to anyway
    model = lora_copy(base_dtype=autocast_dtype or torch.float32)
    if autocast_dtype is not None:  # weights on bf16 values (the demo model is bf16-exact)
        for m in (base, model):
            for p in m.parameters():
                p.data = p.data.to(autocast_dtype).to(p.dtype)
    want = completion_logprobs(base, *batch(), 0.7, autocast_dtype)
    got = completion_logprobs(model, *batch(), 0.7, autocast_dtype)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    assert len([m for m in model.modules() if isinstance(m, LoRALinear)]) == 2 * len(ALL_LINEAR)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all('.lora_' in n for n in trained)


def test_the_adapters_gradients_are_the_hand_derivation():
    """y = (W + s B A) x, loss = sum(g * y): with G = g^T x, dL/dB = s G A^T, dL/dA = s B^T G, and
    none for W (frozen)."""
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(5, 4), rank=2, alpha=3.0, base_dtype=torch.float32,
                       generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(4, 2))
    x, g = torch.randn(3, 5), torch.randn(3, 4)
    (layer(x) * g).sum().backward()
    s, G = 1.5, g.T @ x
    A, B = layer.lora_A.detach(), layer.lora_B.detach()
    assert torch.allclose(layer.lora_B.grad, s * G @ A.T, atol=1e-6)
    assert torch.allclose(layer.lora_A.grad, s * B.T @ G, atol=1e-6)
    assert layer.weight.grad is None and layer.bias.grad is None


def test_merged_weights_are_the_base_plus_the_scaled_product_under_hf_names():
    model = lora_copy()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('lora_B'):
                p.normal_()
    merged = dict(merged_weights(model))
    assert set(merged) == set(tiny_llama().state_dict())  # a plain HF checkpoint's names
    layer = model.model.layers[1].mlp.down_proj
    want = layer.weight + 2.0 * layer.lora_B @ layer.lora_A
    assert torch.equal(merged['model.layers.1.mlp.down_proj.weight'], want.detach())
    # loaded into the plain architecture, the merged weights give the LoRA model's log-probs
    plain = tiny_llama(seed=5)
    plain.load_state_dict(merged)
    assert torch.equal(completion_logprobs(plain, *batch())[0], completion_logprobs(model, *batch())[0])
    # what the sync streams: the projections (a fused q/k/v and gate/up layer gets all its parts)
    moved = dict(merged_weights(add_lora(tiny_llama(), 2, 4.0, ('q_proj',)), changed_only=True))
    assert {n.split('.')[-2] for n in moved} == set(ALL_LINEAR) and len(moved) == 2 * len(ALL_LINEAR)


def test_steps_move_the_adapters_never_the_base_and_adapters_off_is_the_base():
    base = tiny_llama()
    model = lora_copy()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        completion_logprobs(model, *batch())[0].sum().backward()
        optimizer.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    moved = completion_logprobs(model, *batch())[0]
    want = completion_logprobs(base, *batch())[0]
    assert not torch.equal(moved, want)
    with adapters_off(model):
        assert torch.equal(completion_logprobs(model, *batch())[0], want)
    assert torch.equal(completion_logprobs(model, *batch())[0], moved)  # switched back on


def test_the_adapter_in_peft_format_round_trips(tmp_path):
    model = lora_copy(targets=('q_proj', 'v_proj'))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('lora_B'):
                p.normal_()
    save_adapter(str(tmp_path), model, 'base-id')
    config = json.load(open(tmp_path / 'adapter_config.json'))
    assert config['peft_type'] == 'LORA' and config['r'] == 4 and config['lora_alpha'] == 8.0
    assert config['target_modules'] == ['q_proj', 'v_proj']
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / 'adapter_model.safetensors'))
    assert saved['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'].shape == (4, 32)
    assert saved['base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight'].shape == (16, 4)
    assert len(saved) == 2 * 2 * 2
    again = lora_copy(targets=('q_proj', 'v_proj'))
    load_adapter(str(tmp_path), again)
    assert torch.equal(completion_logprobs(again, *batch())[0], completion_logprobs(model, *batch())[0])
    peft = pytest.importorskip('peft')  # a test dependency where installed, never a runtime one
    loaded = peft.PeftModel.from_pretrained(tiny_llama(), str(tmp_path))
    assert torch.allclose(loaded(batch()[0]).logits, model(batch()[0]).logits, atol=1e-5)


def test_a_bad_target_or_rank_is_a_clear_error():
    with pytest.raises(ValueError, match="no linear layer named qkv"):
        add_lora(tiny_llama(), 4, 8.0, ('q_proj', 'qkv'))
    with pytest.raises(ValueError, match=r"lora_rank=40 is above the width of .*k_proj \(32 -> 16\)"):
        add_lora(tiny_llama(), 40, 8.0, ('k_proj',))


@pytest.mark.slow
def test_a_lora_run_the_engine_follows_and_the_checkpoint_loads(tmp_path, small_model):
    """The demo model with rank-8 adapters on vLLM, lr 1e-3 and an entropy bonus (every step moves
    the adapters): rollout_mismatch stays below 3x its first step's, the mismatch guard's warning
    threshold (the merged weights synced in the engine's dtype: the trainer's forward rounds the
    same merged weight). Measured, the same run without beta, on a 2-core Xeon with AMX (bf16),
    2026-12-01: 0.027, 0.017, 0.018, 0.012, 0.011, 0.016; without the sync (the engine left at the
    base) 0.027, 0.248, 0.584, 0.712, 0.642: 9x at step 2. The checkpoint: the merged HF
    folder, the adapters in PEFT's format; the KL reference is the base (beta > 0, no second model);
    a bad target ends the run as a config error."""
    out_dir = str(tmp_path / "run")
    result = subprocess.run(
        [sys.executable, "train.py", "config/cpu_demo.py", "--prompts_per_step=2", "--group_size=4",
         "--micro_batch_size=4", "--eval_interval=0", "--max_iters=4", "--max_new_tokens=16",
         "--learning_rate=1e-3", "--lora_rank=8", "--entropy_coef=0.01", "--beta=0.01",
         f"--out_dir={out_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Failed to load weights" not in result.stdout + result.stderr
    steps = [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]
    first = steps[0]["rollout_mismatch"]
    assert all(r["grad_norm"] > 0 for r in steps)
    assert max(r["rollout_mismatch"] for r in steps) < 3 * max(first, 0.01), steps
    assert all(r["loss/kl"] > 0 for r in steps[1:])
    ckpt = os.path.join(out_dir, "ckpt")
    assert os.path.exists(os.path.join(ckpt, "adapter", "adapter_model.safetensors"))
    assert json.load(open(os.path.join(ckpt, "adapter", "adapter_config.json")))["r"] == 8
    bad = subprocess.run([sys.executable, "train.py", "config/cpu_demo.py", "--lora_rank=8",
                          f"--init_from={small_model}",
                          "--lora_targets=q_proj,qkv", "--max_iters=0", "--eval_interval=0",
                          f"--out_dir={tmp_path / 'bad'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "config error: lora_targets: no linear layer named qkv" in bad.stderr


@pytest.mark.slow
def test_a_lora_run_resumed_from_its_checkpoint_continues_the_same_run(tmp_path, small_model):
    """The 2-layer model, HF engine (its sampler's RNG is ours to save), rank-4 adapters: 2 steps,
    a checkpoint (adapters, their AdamW state, the merged weights), a resume to step 4, against 4
    steps in one go: the same samples (rewards, lengths) and, to 1e-4, the same losses and
    gradients (as test_resume's, whose docstring says why not bit for bit)."""
    def run(out_dir, *args):
        result = subprocess.run(
            [sys.executable, "train.py", "config/cpu_demo.py", "--prompts_per_step=2",
             "--group_size=4", "--max_new_tokens=8", "--micro_batch_size=4", "--rollout_engine=hf",
             "--eval_interval=0", f"--init_from={small_model}", "--lora_rank=4",
             "--learning_rate=1e-3", "--entropy_coef=0.01", f"--out_dir={out_dir}", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        return {r["step"]: r for r in map(json.loads, open(os.path.join(out_dir, "log.jsonl")))}
    full, stopped = str(tmp_path / "full"), str(tmp_path / "stopped")
    a = run(full, "--max_iters=4", "--ckpt_interval=-1")
    run(stopped, "--max_iters=2")
    b = run(stopped, "--max_iters=4", "--init_from=resume")
    assert sorted(b) == [1, 2, 3, 4] and all(a[s]["grad_norm"] > 0 for s in a)
    for step in (3, 4):
        for key in ("reward", "completion_len"):
            assert a[step][key] == b[step][key], (step, key)
        for key in ("loss", "grad_norm", "entropy"):
            assert a[step][key] == pytest.approx(b[step][key], rel=1e-4, abs=1e-7), (step, key)
