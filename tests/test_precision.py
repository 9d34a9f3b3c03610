"""Issue #15, weights on bf16 rounding ties: the prepared demo model has none, a tiny optimizer step
moves the ratio only a tiny bit, and model.round_ties finds (exactly) and rounds such ties in any
model at load."""
import os

import torch
from transformers import AutoTokenizer

from conftest import MODEL_DIR, tiny_llama
from model import MAX_TIE_FRAC, load_model, round_ties, rounding_ties

# Bound on the mean |log pi - log pi_old| of the second pass after one AdamW step at lr 1e-8 (bf16
# body, fp32 head) on the demo model. With the old weights (8.1 % on ties) it is ~0.33 nats at any
# lr, whatever the CPU: the jumps are in the weights. With bf16-exact weights the linear layers'
# bf16 images do not move at all; what remains is bf16 rounding noise: the fp32 parts (embedding
# lookup, RMSNorm scales, the fp32 head) move by 1e-8, which re-rolls a few roundings of activations
# to bf16, and that depends on the CPU's bf16 kernels: 0.021-0.024 measured on a 2-core AMD EPYC
# without bf16 instructions (emulated bf16), 0.0064 on an Intel Xeon with AMX (issue #15). 0.08 is
# 3.3x the worst seen and 4x below the floor of ties.
FLOOR_BOUND = 0.08


def mirror_ties(w, dtype=torch.bfloat16):
    """The definition, slowly: y = w rounded to dtype; w is a tie iff z = 2w - y (exact in float64)
    is a dtype value too, i.e. the other neighbour, at the same distance. An overflow (y = inf) is
    not a tie."""
    x, y = w.double(), w.to(dtype).double()
    z = 2 * x - y
    return (x != y) & torch.isfinite(y) & (z.to(dtype).double() == z)


def neighbour_midpoints(w, dtype):
    """For each entry: the point half-way between w rounded to dtype and the next dtype value away
    from zero (built from dtype's own bits, not rounding_ties' rules): a tie by construction."""
    y = w.to(dtype)
    up = (y.view(torch.int16) + 1).view(dtype)    # the next value of larger magnitude
    return (y.float() + up.float()) / 2           # exact: one bit more than dtype holds


def test_rounding_ties_is_the_definition():
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (2**20,), generator=g,
                         dtype=torch.int64).to(torch.int32)
    # every kind of fp32: nan, inf, subnormal, huge
    w = bits.view(torch.float32)
    small = torch.randn(2**18, generator=g) * 1e-5
    scaled = torch.randn(2**18, generator=g) * 10.0 ** torch.randint(-9, 5, (2**18,), generator=g)
    edges = torch.tensor([0.0, -0.0, 2**-25, 3 * 2**-25, 2**-26, 2**-14 - 2**-25, 2**-14 + 2**-24,
                          65504.0, 65512.0, 65520.0, 3.39617752923046e+38, 1e-40, float('inf'),
                          float('nan')])
    for x in (w, small, scaled, neighbour_midpoints(small, dtype),
              neighbour_midpoints(scaled, dtype), edges, -edges):
        assert torch.equal(rounding_ties(x), mirror_ties(x, dtype))
    ties = neighbour_midpoints(scaled, dtype)
    assert rounding_ties(ties[ties.abs() < 1e38]).all()


def put_on_ties(model, dtype, every=10):
    """Every `every`-th weight moved onto a dtype tie, all others onto dtype values (so: no other
    ties); a few subnormal ties among them. Returns the number of ties."""
    n = 0
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(-1)
            # some small weights (< 6.1e-5)
            flat[::every * 7] *= 1e-3
            flat.copy_(flat.to(dtype).float())
            flat[::every] = neighbour_midpoints(flat[::every], dtype)
            n += len(flat[::every])
    return n


def test_guard_counts_exactly_rounds_and_prints_one_line(capsys):
    dtype = torch.bfloat16
    model = tiny_llama()
    n = put_on_ties(model, dtype)
    total = sum(p.numel() for p in model.parameters())
    assert n > MAX_TIE_FRAC * total
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert round_ties(model, dtype, name='tiny') == n
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and f"{n:,} of {total:,}" in lines[0], lines
    for name, p in model.state_dict().items():
        assert not rounding_ties(p).any(), name
        # what the autocast body sees: unchanged
        assert torch.equal(p.to(dtype), before[name].to(dtype)), name
        # here every weight is now a dtype value
        assert torch.equal(p, p.to(dtype).float())
    assert round_ties(model, dtype) == 0 and capsys.readouterr().out == ''   # done once


def test_guard_leaves_a_tie_free_model_alone(capsys):
    model = tiny_llama()  # a fresh fp32 init: a tie is a 2**-16 accident
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for dtype in (torch.bfloat16, None, torch.float32):
        assert round_ties(model, dtype) < MAX_TIE_FRAC * sum(p.numel() for p in model.parameters())
    model_few = tiny_llama()
    # 0.5 %: below the threshold
    few = put_on_ties(model_few, torch.bfloat16, every=200)
    assert round_ties(model_few, torch.bfloat16) == few
    assert capsys.readouterr().out == ''
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert sum(int(rounding_ties(p).sum()) for p in model_few.parameters()) == few


def test_load_model_rounds_ties_for_the_autocast_dtype(tmp_path, capsys):
    model = tiny_llama()
    n = put_on_ties(model, torch.bfloat16)
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(MODEL_DIR).save_pretrained(tmp_path)
    capsys.readouterr()
    loaded = load_model(str(tmp_path))[0]                                 # fp32 body: nothing to do
    assert capsys.readouterr().out == ''
    assert sum(int(rounding_ties(p).sum()) for p in loaded.parameters()) == n
    loaded = load_model(str(tmp_path), autocast_dtype=torch.bfloat16)[0]
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert not any(rounding_ties(p).any() for p in loaded.parameters())


def test_prepared_model_is_bf16_exact():
    assert 'bf16-exact' in open(os.path.join(MODEL_DIR, 'DONE')).read()
    model = load_model(MODEL_DIR)[0]
    for name, p in model.named_parameters():
        assert torch.equal(p, p.to(torch.bfloat16).float()), name


def test_a_tiny_step_jumps_on_ties_and_round_ties_takes_the_jump_away():
    """The mechanism, on a tiny model (any CPU, a second): half of the weights on bf16 ties, one
    AdamW step at lr 1e-8 moves the second pass's log-probs by 0.075 nats (5 % clipped); with the
    ties rounded first, by 2.5e-7."""
    from bench import ratio_floor
    model = tiny_llama(hidden=64, initializer_range=0.3)
    g = torch.Generator().manual_seed(1)
    batch = {'prompt_ids': torch.randint(1, 96, (8, 6), generator=g),
             'prompt_mask': torch.ones(8, 6, dtype=torch.long),
             'completion_ids': torch.randint(1, 96, (8, 10), generator=g),
             'completion_mask': torch.ones(8, 10)}
    put_on_ties(model, torch.bfloat16, every=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    assert ratio_floor(model, batch, 1e-8)[0] > 0.01
    model.load_state_dict(start)
    round_ties(model, torch.bfloat16)
    assert ratio_floor(model, batch, 1e-8)[0] < 1e-3


def test_a_tiny_step_moves_the_demo_models_ratio_a_tiny_bit():
    """The issue's measurement: one AdamW step at lr 1e-8 with num_iterations=2 and a bf16 body, on
    2 prompts x 4 answers (<= 8 tokens) sampled from the demo model (HF generate, fp32, seed 0), as
    it is on disk (no round_ties). Fails with the old conversion of models/smollm2 (fp32, 8.1 % of
    the weights on bf16 ties)."""
    from bench import floor_batch, ratio_floor
    model, tokenizer = load_model(MODEL_DIR)
    batch = floor_batch(model, tokenizer, max_new_tokens=8)
    start = [p.detach().clone() for p in model.parameters()]
    log_ratio, clip = ratio_floor(model, batch, 1e-8)
    # the step was taken
    assert any(not torch.equal(p, p0) for p, p0 in zip(model.parameters(), start))
    assert log_ratio < FLOOR_BOUND, (log_ratio, clip)
