"""model.py: the chunked FP32 head equals the naive (B, C, V) path, gradients included; gradient
checkpointing and a group's shared prompt forward change nothing but memory and time, and its
backward repeats bit for bit on 2 threads; train.py's token-budget micro-batches change nothing but
speed."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, parity_reward, tiny_llama
from model import HeadLogprobs, completion_logprobs, micro_batches


def tiny_model(vocab=96):
    return tiny_llama(vocab).double()


def tiny_batch(vocab=96):
    """3 rows: left-padded prompts of 4, 2 and 3 tokens; right-padded completions of 5, 1 and 3
    tokens."""
    g = torch.Generator().manual_seed(1)
    prompt_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]).double()
    prompt_ids = torch.randint(1, vocab, (3, 4), generator=g) * prompt_mask
    completion_ids = torch.randint(1, vocab, (3, 5), generator=g) * completion_mask.long()
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def naive_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """The textbook path: the full (B, C, V) logits from the HF model, log-softmax, gather."""
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], 1)
    logits = model(input_ids=torch.cat([prompt_ids, completion_ids], 1),
                   attention_mask=attention_mask,
                   position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0)).logits
    # (B, C, V)
    logp_all = torch.log_softmax(logits[:, prompt_ids.shape[1] - 1:-1] / temperature, -1)
    logp = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)
    return logp * completion_mask, -(logp_all.exp() * logp_all).sum(-1) * completion_mask


def loss_and_grads(model, fn, **kw):
    """A loss that uses both outputs with per-token weights, and its gradient for every
    parameter."""
    model.zero_grad()
    logp, entropy = fn(model, *tiny_batch(), 0.7, **kw)
    w = torch.linspace(-1, 2, logp.numel(), dtype=logp.dtype).view_as(logp)
    loss = (w * logp).sum() + 0.3 * (w.flip(0) * entropy).sum()
    loss.backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# 2 tokens per chunk (5 chunks) or 1 chunk; logits recomputed in backward (keep_elements=0) or kept
@pytest.mark.parametrize("chunk_elements,keep_elements",
                         [(96 * 2, 0), (96 * 100, 0), (96 * 2, 2**28)])
def test_chunked_head_equals_naive_path_with_gradients(chunk_elements, keep_elements):
    model = tiny_model()
    logp0, ent0, grads0 = loss_and_grads(model, naive_logprobs)
    logp1, ent1, grads1 = loss_and_grads(model, completion_logprobs, chunk_elements=chunk_elements,
                                         keep_elements=keep_elements)
    # the model is float64, the head runs in fp32 in both paths' place: agreement to fp32 round-off
    # (~1e-7 relative)
    close = lambda a, b: (a.to(b) - b).abs().max() <= 1e-6 * b.abs().max()
    assert close(logp1, logp0) and close(ent1, ent0)
    assert (logp1[1, 1:] == 0).all() and (ent1[2, 3:] == 0).all()       # padding positions are 0
    # a random model: high entropy everywhere
    assert ent0[0].min() > 1.0
    for name, g in grads0.items():
        assert close(grads1[name], g), name


@pytest.mark.parametrize("keep", [False, True])
def test_head_backward_matches_finite_differences(keep):
    """HeadLogprobs' hand-written backward (onehot - p for log pi, -p (log p + H) for entropy)
    against gradcheck, with the logits recomputed in backward or kept from forward."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.double, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.double, generator=g, requires_grad=True)
    targets = torch.randint(11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: HeadLogprobs.apply(h, w, targets, 0.7, 3, keep),
                                    (hidden, weight))
    # only log pi used: the entropy's gradient is skipped, the result is the same as through
    # autograd
    logp, _ = HeadLogprobs.apply(hidden, weight, targets, 0.7, 3, keep)
    (gh,) = torch.autograd.grad(logp.sum(), hidden)
    ref = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(1, targets[:, None]).sum()
    assert torch.allclose(gh, torch.autograd.grad(ref, hidden)[0], atol=1e-12)


def test_gradient_checkpointing_changes_nothing_but_memory():
    model = tiny_model().train()
    logp0, ent0, grads0 = loss_and_grads(model, completion_logprobs)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    logp1, ent1, grads1 = loss_and_grads(model, completion_logprobs)
    assert (model.model.gradient_checkpointing and torch.equal(logp0, logp1)
            and torch.equal(ent0, ent1))
    for name, g in grads0.items():
        assert torch.allclose(grads1[name], g, atol=1e-12), name


def test_shared_prompt_forward_equals_separate_forwards():
    """Two groups of 3 answers (prompts of 4 and 2 tokens, left-padded) in one batch: each prompt
    goes through the body once and its KV cache serves its 3 answers. Every row's log-prob, entropy
    and every parameter's gradient equal those of the 6 rows scored one at a time (one pass over
    prompt + answer each)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = tiny_batch()
    # tiny_batch's answers, reused
    prompt_rows, answer_rows = [0, 0, 0, 1, 1, 1], [0, 1, 2, 2, 0, 1]
    batch = (prompt_ids[prompt_rows], prompt_mask[prompt_rows], completion_ids[answer_rows],
             completion_mask[answer_rows])
    # loss_and_grads' own batch replaced
    shared = lambda model, *a: completion_logprobs(model, *batch, 0.7)
    one_by_one = lambda model, *a: [
        torch.cat(x) for x in zip(*(completion_logprobs(model, *(t[i:i + 1] for t in batch), 0.7)
                                    for i in range(6)))]
    model = tiny_model()
    logp0, ent0, grads0 = loss_and_grads(model, one_by_one)
    logp1, ent1, grads1 = loss_and_grads(model, shared)
    close = lambda a, b: (a - b).abs().max() <= 1e-6 * b.abs().max()
    assert (close(logp1, logp0) and close(ent1, ent0) and (logp1[1, 1:] == 0).all()
            and ent1[0].min() > 1.0)
    for name, g in grads0.items():
        assert close(grads1[name], g), name


def test_shared_prompt_backward_repeats_bit_for_bit_on_two_threads():
    """The backward that sums a group's answers into its one prompt pass adds them in a fixed order.
    32 prompts x 8 answers in fp32 with 2 threads, a prompt's rows spread over the batch as the
    packing spreads them: indexing's backward (index_put_ with accumulate) added such rows with
    atomics from both threads: 5 repeats of the same backward gave 5 different gradients, in each
    of 6 tries (2026-12-06, 2-core EPYC); completion_hidden's index_select gives one. (A 1-core
    machine cannot show the race.)"""
    model = tiny_llama(hidden=128)
    g = torch.Generator().manual_seed(2)
    # (256, 4): row i answers prompt i % 32 (fp32 rows of 128 x 256 answers: over torch's grain)
    prompt_ids = torch.randint(1, 96, (32, 4), generator=g)[torch.arange(256) % 32]
    completion_ids = torch.randint(1, 96, (256, 5), generator=g)
    prompt_mask, completion_mask = torch.ones(256, 4, dtype=torch.long), torch.ones(256, 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(5):
            model.zero_grad(set_to_none=True)
            logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids,
                                          completion_mask)
            logp.sum().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grad, grads[0]) for grad in grads[1:])


def test_cpu_attention_runs_sdpas_math_backend():
    """On a CPU the body's attention runs SDPA's math backend (not under gradient checkpointing), in
    the prompt's pass and the answers' alike: q, k and v in fp32 as in the flash kernel, and a
    backward about twice as fast at these short rows (bench.py --only=attention)."""
    model = tiny_model().float()
    prompt_ids, prompt_mask, completion_ids, completion_mask = tiny_batch()
    # two rows share a prompt: the prompt pass and the answers' pass both run
    rows = [0, 0, 1]
    with torch.profiler.profile() as prof:
        completion_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                            completion_mask[rows], 1.0, torch.bfloat16)[0].sum().backward()
    ops = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" in ops
    assert not any("flash" in op for op in ops), ops


def run_step(out_dir, *args):
    """One step on the HF engine, in fp32: its record."""
    cmd = [sys.executable, "train.py", "config/cpu_demo.py", "--rollout_engine=hf", "--loss_type=dapo",
           "--prompts_per_step=4", "--group_size=4", "--max_new_tokens=12", "--max_iters=1",
           "--eval_interval=0", "--dtype=float32", "--ckpt_interval=-1", f"--out_dir={out_dir}",
           *args]
    # dapo: its token-mean loss is not 0 on-policy (grpo's is: sum_i A_i = 0 in each group, so
    # comparing grpo's losses would compare round-off)
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))][-1]


def test_token_budget_micro_batches_change_nothing_but_work(tmp_path, small_model):
    """The same step (same seed, same samples: 4 groups of 4) in micro-batches of 4 rows with
    gradient checkpointing (every row runs its own prompt: HF's checkpointing drops the shared
    prompt's KV cache), and packed by a budget of 400 tokens (a group's prompt runs once per
    micro-batch): the loss and gradient are the same sums, with fewer tokens through the body.
    The 2-layer model (conftest.small_model), rewarded by the parity of the answer's length: live
    groups whatever it samples (its answers mostly run to the limit, and DAPO's on-policy loss of
    equal lengths is 0: the gradient is the check)."""
    args = [parity_reward(tmp_path), "--skip_zero_adv=False", f"--init_from={small_model}"]
    fixed = run_step(tmp_path / "fixed", *args, "--micro_batch_size=4",
                     "--max_tokens_per_micro=100000", "--gradient_checkpointing=True")
    packed = run_step(tmp_path / "packed", *args, "--micro_batch_size=16",
                      "--max_tokens_per_micro=400")
    assert packed["grad_norm"] > 0
    assert (fixed["reward"] == packed["reward"]
            and fixed["completion_len"] == packed["completion_len"])
    assert packed["loss"] == pytest.approx(fixed["loss"], rel=1e-5, abs=1e-7)
    assert packed["grad_norm"] == pytest.approx(fixed["grad_norm"], rel=1e-4)
    assert fixed["train_tokens"] - packed["train_tokens"] > 8 * 20, (
        fixed["train_tokens"], packed["train_tokens"])


def packed_groups(prompt_len, completion_lens, micro_batch_size, G=4):
    """model.micro_batches of groups of G rows (one prompt of prompt_len tokens each, the given
    completion lengths): each micro-batch's rows (as group numbers), and its real body tokens."""
    B, C = len(completion_lens), max(completion_lens)
    completion_mask = (torch.arange(C)[None] < torch.tensor(completion_lens)[:, None]).float()
    group = torch.arange(B) // G
    batch = {'prompt_ids': (group[:, None] + 1).expand(B, prompt_len).clone(),  # the group's prompt
             'prompt_mask': torch.ones(B, prompt_len, dtype=torch.long),
             'completion_ids': completion_mask.long() * 7, 'completion_mask': completion_mask,
             'row': torch.arange(B)}
    mbs, real, _ = micro_batches(batch, G, micro_batch_size, 10**6, 'cpu')
    return [sorted((mb['row'] // G).tolist()) for mb in mbs], real


def test_micro_batches_keep_a_groups_rows_together_when_that_is_cheaper():
    """Sorted by length, two groups whose answers alternate long and short would put both prompts
    into each micro-batch of 4 rows; packed group by group each prompt runs once: 2 x 40 body
    tokens of prompt instead of 4 x 40, beside the answers' 76. With short prompts and answers of
    very different lengths in each group the length order pads less, and is kept."""
    packs, real = packed_groups(40, [10, 9, 10, 9, 10, 9, 10, 9], micro_batch_size=4)
    assert packs == [[0, 0, 0, 0], [1, 1, 1, 1]] and real == 2 * 40 + 4 * 10 + 4 * 9
    packs, real = packed_groups(2, [100, 1, 100, 1, 100, 1, 100, 1], micro_batch_size=4)
    # padding included: by group 2 x (2 + 4 x 100) = 804 tokens; by length (2 x 2 + 4 x 100) + 8
    assert packs == [[0, 0, 1, 1], [0, 0, 1, 1]] and real == 2 * 2 * 2 + 4 * 100 + 4 * 1


def test_skipping_zero_advantage_groups_changes_nothing_but_work(tmp_path):
    """The same step with and without skip_zero_adv: groups whose 4 answers all scored the same
    (advantage 0) contribute nothing to the loss or gradient of GRPO or DAPO, so skipping their forward and
    backward leaves loss and gradient norm as they were (the token denominators still count them),
    with fewer tokens through the body. Both kinds of group whatever the model samples: 4 of the 8
    prompts can never be answered right, the others score their answers by the parity of their
    length (a group of 4 agrees with probability 1/8; all 4 agree: 2e-4)."""
    rows = [json.loads(line)
            for line in open(os.path.join(ROOT, "data", "arithmetic", "train.jsonl"))][:40]
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)  # train.py's order for seed=0: the step's 8 prompts come first
    for position in (1, 3, 5, 7):
        rows[order[position]]["answer"] = "never"
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text((data / "train.jsonl").read_text())
    parity = parity_reward(tmp_path, never="never")
    args = [parity, f"--data_dir={data}", "--prompts_per_step=8", "--max_new_tokens=12"]
    full = run_step(tmp_path / "full", *args, "--skip_zero_adv=False")
    skip = run_step(tmp_path / "skip", *args)
    assert full["reward"] == skip["reward"] and full["trained_frac"] == 1.0
    # some groups skipped, some trained
    assert 0 < skip["trained_frac"] < 1, skip["trained_frac"]
    assert skip["loss"] == pytest.approx(full["loss"], rel=1e-5, abs=1e-7) and skip["loss"] != 0
    assert skip["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert skip["train_tokens"] < full["train_tokens"]
    # the speed counts what went through the update (it counted the skipped groups' tokens too)
    assert skip["tokens_per_second"] == pytest.approx(
        skip["train_completion_tokens"] / skip["train_seconds"])


def test_bf16_in_hardware_on_a_gpu_means_ampere_or_newer(monkeypatch):
    """torch.cuda.is_bf16_supported() also counts emulation (V100, T4: compute capability 7.x),
    where bf16 is slow and vLLM refuses it: dtype='auto' must take fp32 there."""
    from model import native_bf16
    for capability, native in [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        assert native_bf16("cuda:0") == native, capability


def test_keep_freed_memory_keeps_a_freed_block_in_the_process():
    """By default glibc gives a freed 256 MiB tensor back to the kernel (the next one is faulted in
    anew, which is slow in a VM that reclaims freed memory); after keep_freed_memory() the process
    keeps it: its resident memory does not fall when the tensor is freed."""
    script = ("import sys, torch\n"
              "from model import keep_freed_memory\n"
              "if sys.argv[1] == 'keep': assert keep_freed_memory()\n"
              "def rss_mib():\n"
              "    status = open('/proc/self/status').read().split('VmRSS:')[1]\n"
              "    return int(status.split()[0]) // 1024\n"
              "before = rss_mib()\n"
              "x = torch.ones(2**26)\n"  # 256 MiB, every page touched
              "del x\n"
              "print(rss_mib() - before)\n")
    kept = {}
    for mode in ['default', 'keep']:
        out = subprocess.run([sys.executable, '-c', script, mode], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, check=True).stdout
        kept[mode] = int(out.split()[-1])  # MiB still resident after the free
    assert kept['default'] < 64 and kept['keep'] > 192, kept
