"""
Rollout: G sampled completions per prompt, from vLLM or from plain HF `generate`.

generate returns the samples, a dict of per-sample lists (one entry per completion, in the same
order for both engines), so that dynamic sampling can drop groups and merge rounds by list
selection and concatenation before anything is padded:
    prompt_ids       B lists of int    the sample's prompt (B = prompts x G)
    completion_ids   B lists of int    its completion, the closing EOS included (any EOS id of the
                                       model: see stop_token_ids)
    rollout_logp     B lists of float  the sampler's log-prob of each completion token (vLLM), or
                                       None (HF, and no prompt at all: the engine is never asked)
    truncated        B bools           True when the completion hit max_new_tokens without an EOS
    completions      B strings         the decoded completions (what the verifier reads)
With a tool (tools.tool_rollout), also model_mask (B lists of 1 / 0: the model's tokens / the
tool's), tool_calls and tool_errors (B ints). The trainer adds its own per-sample lists
('correct', the verifier's verdicts; the prompts and answers).

make_batch then pads once, at the final width, into the batch that model.py relies on:
    prompt_ids       (B, P)  long   prompts left-padded to the longest one
    prompt_mask      (B, P)  long   1 on real prompt tokens
    completion_ids   (B, C)  long   completions right-padded to the longest one (C >= 1)
    completion_mask  (B, C)  float  1 on real completion tokens, the closing EOS included (with a
                                    tool: on the model's tokens only, the tool's results are 0)
    completion_attention (B, C) long  with a tool only: 1 on every real completion token, the
                                    model's and the tool's (what the model attends to; without a
                                    tool completion_mask is it)
    rollout_logp     (B, C)  float  0 on padding, or None
    truncated        (B,)    bool
    completions      list of B strings
    correct          (B,)    float  the trainer's verdicts, when the samples have them (its other
                                    lists pass through as they are)
The G samples of one prompt are consecutive rows: rows g*G .. g*G+G-1 form group g.

vLLM runs in the training process (colocated, in-process engine core). After every optimizer step
sync_weights() pushes the trainer's weights into it; without that, the next rollout samples from a stale
policy while the trainer believes it is on-policy (the bug of TRL issue #5312).
"""
import logging
import math
import os
import warnings

import torch

# engine core in this process, not a child
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# GiB of KV cache when vLLM runs on CPU
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def encode_prompts(tokenizer, prompts):
    """Chat messages -> token ids with the model's chat template, ready for the assistant's turn. A
    last message of the assistant's is a reply begun for the model (a prefill): it continues it."""
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=p[-1]["role"] != "assistant",
                                           continue_final_message=p[-1]["role"] == "assistant",
                                           tokenize=False) for p in prompts]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def fitting_prompts(tokenizer, rows, max_len, split):
    """The rows whose prompt is at most max_len tokens in the chat template; the others are skipped,
    and their number said."""
    kept = [r for r in rows if len(encode_prompts(tokenizer, [r["prompt"]])[0]) <= max_len]
    if len(kept) < len(rows):
        print(f"{split}: {len(rows) - len(kept)} prompts longer than max_prompt_len={max_len} "
              f"tokens skipped")
    return kept


def quiet_vllm():
    """vLLM's INFO lines (~150 at engine start, 3 at every sync) off unless the user sets
    VLLM_LOGGING_LEVEL; and the WARNINGs that are expected here, dropped:
    - "Attempted to load weight ... with dtype torch.float32 into parameter with dtype
      torch.bfloat16", once per weight at start: the checkpoint is fp32 and the engine serves bf16
      on purpose (the trainer keeps fp32 master weights);
    - "<layer>: Failed to load weights" and "Following weights were not loaded", at every sync: a
      layer that the streamed weights leave out keeps its tensors (vLLM puts them back as they
      were). The rotary layer's only tensor is its cos/sin cache, computed from the config and
      never in a checkpoint; with LoRA only the projections are streamed (the norms, embedding and
      head are frozen). Nothing that training changes is lost (test_engine's and test_lora's sync
      tests check that the engine follows the trainer);
    - "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding", a few times
      at start: vLLM-CPU pins its own threads and ignores later requests."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")  # torch renames
    expected = ["with dtype torch.float32 into parameter with dtype torch.bfloat16",
                ": Failed to load weights", "Following weights were not loaded from checkpoint",
                "`torch.set_num_threads` after the thread"]
    for name in ["vllm.model_executor.models.utils", "vllm.v1.worker.cpu_worker",
                 "vllm.model_executor.model_loader.reload.layerwise",
                 "vllm.model_executor.model_loader.reload.inplace"]:
        logging.getLogger(name).addFilter(
            lambda record: not any(e in record.getMessage() for e in expected))


def init_engine(kind, model_path, seed=0, gpu_memory_utilization=0.3, fp32_head=True, distributed=False,
                sleep_mode=False, verbose=False, dtype="bfloat16", enforce_eager=None):
    """'vllm': a colocated vLLM engine on the weights in model_path; under torchrun every rank
    starts its own (external_launcher: vLLM joins the trainer's processes instead of spawning
    workers). 'hf': generation reuses the trainer's own model (passed later to generate): nothing to
    start and nothing to sync.

    dtype: the engine's weights, the trainer's body dtype (train.py passes it). A bf16 engine beside
    an fp32 trainer cannot follow it: an update of lr 2e-5 moves a weight by far less than half a
    bf16 step, so its bf16 copy mostly stays where it was while the fp32 policy moves. Measured on
    the demo: rollout_mismatch 0.027 at step 1, 0.110 at step 2, 0.360 at step 4 (13x: the sampler
    was no longer the policy being trained).

    sleep_mode: GPU only (it frees GPU memory for the update), ignored on CPU. enforce_eager: no
    compiled model (None: eager on CPU, where compiling costs ~70 s at the start; on GPU, CUDA
    graphs: faster decoding for some memory). The runner is printed: on GPU, vLLM 0.32 / 0.33
    take Model Runner V2 wherever Triton is installed, which no CPU test runs (the CPU build runs
    V1); VLLM_USE_V2_MODEL_RUNNER=0 goes back to V1 if the sync guard (train.py's stop_mismatch)
    trips there."""
    if kind == "hf":
        return {"kind": "hf"}
    if kind != "vllm":
        raise ValueError(f"rollout_engine must be 'vllm' or 'hf', got {kind!r}")
    if not verbose:
        quiet_vllm()  # before vLLM's first import: it reads its logging level then
    from vllm import LLM
    sleep_mode = sleep_mode and torch.cuda.is_available()
    enforce_eager = not torch.cuda.is_available() if enforce_eager is None else enforce_eager
    llm = LLM(model=model_path, dtype=dtype, enforce_eager=enforce_eager, seed=seed,
              gpu_memory_utilization=gpu_memory_utilization,
              # MiniMax-M1: FP32 head in the sampler too
              hf_overrides={"head_dtype": "float32"} if fp32_head else None,
              # log-probs after temperature, as the trainer scores them
              logprobs_mode="processed_logprobs",
              # the G samples of a prompt share its KV cache blocks (full blocks only) ...
              enable_prefix_caching=True,
              # ... and on CPU the default block is 128 tokens
              block_size=None if torch.cuda.is_available() else 32,
              distributed_executor_backend="external_launcher" if distributed else None,
              enable_sleep_mode=sleep_mode, use_tqdm_on_load=verbose)
    if os.environ.get("RANK", "0") == "0":
        runner = llm.collective_rpc(lambda worker: type(worker.model_runner).__module__)[0]
        print(f"vLLM engine: {runner} (enforce_eager={enforce_eager}, sleep mode {sleep_mode})")
    return {"kind": "vllm", "llm": llm, "sleep_mode": sleep_mode, "dtype": getattr(torch, dtype)}


def shutdown(engine):
    """Stop the vLLM engine (vLLM 0.32 then destroys the default process group too, 0.33 no longer
    does: train.py destroys it after this, if it is still there)."""
    if engine["kind"] == "vllm":
        engine["llm"].llm_engine.engine_core.shutdown()


def sleep(engine):
    """GPU: free the KV cache (and park the weights in CPU memory) while the trainer needs the
    memory."""
    if engine.get("sleep_mode"):
        engine["llm"].sleep(level=1)


def sync_weights(engine, model, weights=None):
    """Load the trainer's current weights into vLLM (in the dtype it serves), then drop cached
    prefixes: their KV entries were computed with the old weights. weights: (name, tensor) pairs of
    HF names, if not the model's whole state dict (LoRA: the merged weights, all that moved). The
    weights are streamed one tensor at a time (a generator), so the extra memory is one tensor, not
    a second model; FSDP's shards are cast to the engine's dtype, then gathered whole (full_tensor:
    bf16 moves half the bytes of fp32) as they go, every rank in the same order. Sleep mode (GPU):
    the weights wake first and the KV cache only after the sync, so it is not resident while the
    weights stream in (as verl and TRL do)."""
    if engine["kind"] != "vllm":
        return
    if engine["sleep_mode"]:
        engine["llm"].wake_up(tags=["weights"])
    whole = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    weights = model.state_dict().items() if weights is None else weights
    weights = ((name, whole(p.detach().to(engine["dtype"]))) for name, p in weights)
    engine["llm"].collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    engine["llm"].reset_prefix_cache()
    if engine["sleep_mode"]:
        engine["llm"].wake_up(tags=["kv_cache"])


def generate(engine, tokenizer, prompt_token_ids, group_size, max_new_tokens, temperature,
             model=None, top_p=1.0, top_k=0, autocast_dtype=torch.bfloat16, tool=None, stop=''):
    """Sample group_size completions for each prompt; return the samples described at the top, still
    unpadded (make_batch pads them). No prompt (an eval rank with no problem when there are fewer
    than ranks): every list empty and rollout_logp None, whatever the engine. stop: a string that
    also ends a completion, right after the token that completes it ('': only an EOS). tool: a dict of
    tools.tool_rollout's keywords (the tool's name, max_tool_calls, timeout): multi-turn samples,
    the model's turns and the tool's results in each completion (tools.py)."""
    if not prompt_token_ids:
        return {"prompt_ids": [], "completion_ids": [], "rollout_logp": None, "truncated": [],
                "completions": []}
    if tool:
        import tools  # a room of its own: the tool, its sandbox and the multi-turn loop
        prompts = [ids for ids in prompt_token_ids for _ in range(group_size)]
        turns = lambda prompts, budgets, stops: sample_turns(
            engine, tokenizer, prompts, budgets, stops, temperature, model, top_p, top_k,
            autocast_dtype)
        samples = tools.tool_rollout(turns, tokenizer, prompts, max_new_tokens, **tool)
        if engine["kind"] == "hf":
            samples["rollout_logp"] = None
        return {**samples, "prompt_ids": prompts,
                "completions": tokenizer.batch_decode(samples["completion_ids"],
                                                      skip_special_tokens=True)}
    if engine["kind"] == "vllm":
        from vllm import SamplingParams
        params = SamplingParams(n=group_size, temperature=temperature, top_p=top_p, top_k=top_k or -1,
                                max_tokens=max_new_tokens, logprobs=0, seed=None,
                                stop=[stop] if stop else None)
        requests = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
        outputs = engine["llm"].generate(requests, params, use_tqdm=False)
        completions, logps, truncated = [], [], []
        for out in outputs:
            for sample in out.outputs:
                completions.append(list(sample.token_ids))
                logps.append([lp[tok].logprob for lp, tok in zip(sample.logprobs, sample.token_ids)])
                # vLLM's own verdict: it stopped on max_tokens, not on a stop id or the stop string
                truncated.append(sample.finish_reason == "length")
    else:
        completions, truncated = _hf_generate(model, tokenizer, prompt_token_ids, group_size,
                                              max_new_tokens, temperature, top_p, top_k,
                                              autocast_dtype)
        # cut after the stop string as vLLM does (what HF sampled after it is dropped)
        ends = [stop_end(tokenizer, row, stop) if stop else None for row in completions]
        completions = [row if end is None else row[:end] for row, end in zip(completions, ends)]
        truncated = [cut and end is None for cut, end in zip(truncated, ends)]
        logps = None
    return {"prompt_ids": [ids for ids in prompt_token_ids for _ in range(group_size)],
            "completion_ids": completions, "rollout_logp": logps, "truncated": truncated,
            "completions": tokenizer.batch_decode(completions, skip_special_tokens=True)}


def sample_turns(engine, tokenizer, prompts, budgets, stops, temperature, model=None, top_p=1.0,
                 top_k=0, autocast_dtype=torch.bfloat16):
    """One turn of each sample (a multi-turn rollout's step, tools.tool_rollout): prompts[i] (the
    prompt and the sample's turns so far, token ids) continued by at most budgets[i] tokens,
    stopping at an EOS or, where stops[i] is a string, right after the token that completes it.
    Returns a (token ids, their log-probs (vLLM) or None (HF), finish) per sample, finish 'eos',
    'stop' or 'length'. The ids are the sampler's own, never a decoded and re-encoded text."""
    if engine["kind"] == "vllm":
        from vllm import SamplingParams
        params = [SamplingParams(n=1, temperature=temperature, top_p=top_p, top_k=top_k or -1,
                                 max_tokens=budget, logprobs=0, stop=[stop] if stop else None)
                  for budget, stop in zip(budgets, stops)]
        outputs = engine["llm"].generate([{"prompt_token_ids": ids} for ids in prompts], params,
                                         use_tqdm=False)
        turns = []
        for out in outputs:
            sample = out.outputs[0]
            # stop_reason: the stop string that ended it (None: an EOS, or the limit)
            finish = ("length" if sample.finish_reason == "length"
                      else "stop" if isinstance(sample.stop_reason, str) else "eos")
            turns.append((list(sample.token_ids),
                          [lp[tok].logprob for lp, tok in zip(sample.logprobs, sample.token_ids)],
                          finish))
        return turns
    # HF: one generate over the longest budget, each row cut afterwards at its own stop string or
    # budget (what is sampled after a row's cut is dropped: the kept tokens are as sampled)
    rows, _ = _hf_generate(model, tokenizer, prompts, 1, max(budgets), temperature, top_p, top_k,
                           autocast_dtype)
    eos = stop_token_ids(tokenizer, model.generation_config)
    turns = []
    for row, budget, stop in zip(rows, budgets, stops):
        row = row[:budget]
        end = stop_end(tokenizer, row, stop) if stop else None
        if end is not None:
            turns.append((row[:end], None, "stop"))
        else:
            turns.append((row, None, "eos" if row and row[-1] in eos else "length"))
    return turns


def stop_end(tokenizer, ids, stop):
    """The length of the shortest prefix of ids whose text contains stop, or None (a binary
    search: a prefix's text grows with it)."""
    if stop not in tokenizer.decode(ids):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if stop in tokenizer.decode(ids[:mid]) else (mid + 1, hi)
    return lo


def stop_token_ids(tokenizer, generation_config=None):
    """The ids that end a completion: the tokenizer's EOS and every EOS of the model's
    generation_config (an int or a list; Qwen2.5-Instruct lists <|im_end|> and <|endoftext|>).
    vLLM stops on exactly this set; HF generate is given it, so both engines stop alike."""
    eos = getattr(generation_config, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return sorted({tokenizer.eos_token_id, *eos})


@torch.no_grad()
def _hf_generate(model, tokenizer, prompt_token_ids, group_size, max_new_tokens, temperature, top_p,
                 top_k, autocast_dtype):
    """HF generate on the trainer's model -> (completions, truncated), as vLLM would cut them."""
    device = next(model.parameters()).device
    stops = stop_token_ids(tokenizer, model.generation_config)
    prompts = [ids for ids in prompt_token_ids for _ in range(group_size)]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    was_training = model.training
    model.eval()
    model.config.use_cache = True
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                             do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k,
                             max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=stops)
    model.config.use_cache = False
    model.train(was_training)
    completions = [cut_at_stop(row, stops) for row in out[:, prompt_ids.shape[1]:].tolist()]
    # cut at the limit without a stop id: what vLLM reports as finish_reason "length"
    truncated = [len(c) >= max_new_tokens and c[-1] not in stops for c in completions]
    return completions, truncated


def cut_at_stop(row, stops):
    """Keep the first stop id, drop what HF pads after it (the pad id may itself be a stop id)."""
    end = next((i for i, tok in enumerate(row) if tok in stops), None)
    return row if end is None else row[:end + 1]


def left_pad(seqs, pad_id):
    width = max((len(s) for s in seqs), default=0)
    shape = (len(seqs), width)  # (0, 0) for no row
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs], dtype=torch.long).view(shape)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long).view(shape)
    return ids, mask


def make_batch(samples, pad_id):
    """Samples (generate's dict of per-sample lists, the trainer's additions included) -> the batch
    described at the top: the one place where rows are padded, once, to the widest prompt and
    completion of the samples given (after dynamic sampling: of the live groups of every round).
    The trainer's 'correct' (the verifier's verdicts) becomes a (B,) float tensor; its other lists
    (the prompt and answer of each sample, for samples.jsonl) pass through as they are."""
    completions, logps = samples["completion_ids"], samples["rollout_logp"]
    width = max(1, max(map(len, completions), default=0))  # C: no row is 0 tokens wide
    pad = lambda s, v: s + [v] * (width - len(s))
    shape = (len(completions), width)  # (0, 1) for no row
    prompt_ids, prompt_mask = left_pad(samples["prompt_ids"], pad_id)  # (B, P); (0, 0) for no row
    batch = {
        **samples,  # the completions' texts and the trainer's lists, as they are
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.tensor([pad(c, pad_id) for c in completions],
                                       dtype=torch.long).view(shape),
        # tool rollouts: the model's tokens only (model_mask); the tool's are attended to, below
        "completion_mask": torch.tensor([pad([float(m) for m in mask], 0.0) for mask in
                                         samples.get("model_mask", [[1] * len(c) for c in completions])]
                                        ).view(shape),
        "rollout_logp": None if logps is None
                        else torch.tensor([pad(lp, 0.0) for lp in logps]).view(shape),
        "truncated": torch.tensor(samples["truncated"], dtype=torch.bool),
    }
    if "model_mask" in samples:  # every real token, the model's and the tool's
        batch["completion_attention"] = torch.tensor([pad([1] * len(c), 0) for c in completions],
                                                     dtype=torch.long).view(shape)
    if "correct" in samples:
        batch["correct"] = torch.tensor(samples["correct"], dtype=torch.float)
    return batch


# -----------------------------------------------------------------------------
# DAPO dynamic sampling: keep only groups whose answers disagree

def round_counts(correct, group_size):
    """One round's counts (its samples, right answers, groups, and degenerate groups: every answer
    scored the same, so A = 0 and no gradient) and the indices of its live groups. correct: the
    verdicts, group_size consecutive ones per group."""
    correct = torch.tensor(correct, dtype=torch.float).view(-1, group_size)  # (groups, G)
    live = (correct.max(1).values != correct.min(1).values).nonzero().squeeze(1)
    return {'samples': correct.numel(), 'samples_correct': correct.sum().item(),
            'groups_sampled': len(correct), 'groups_degenerate': len(correct) - len(live)}, live


def screened_round(rows, rollout_fn, group_size, screen, wanted=None):
    """One round of dynamic sampling with a screen (not in the seeds): `screen` answers for every
    prompt first, then the other group_size - screen only for the prompts whose first answers
    disagree (the first `wanted` of them; None: all). Such a group is live whatever its other
    answers say, and the prompts whose screen agrees (late in training nearly all, all right) cost
    `screen` answers instead of G. The price: a prompt whose screen agrees by chance is passed over
    (at a pass rate p, with probability p^screen + (1-p)^screen), so the groups kept lean to the
    middle pass rates. Returns the open groups' samples (G answers each, the screen's first) and the
    round's counts (round_counts'; the prompts whose screen agreed are its degenerate groups)."""
    k, m = screen, group_size - screen
    first = rollout_fn(rows, k)
    counts, open_ = round_counts(first['correct'], k)
    open_ = open_.tolist()[:wanted]
    rest = rollout_fn([rows[i] for i in open_], m)
    counts['samples'] += len(rest['correct'])
    counts['samples_correct'] += sum(rest['correct'])

    def groups(v, w):  # each open prompt's screen answers, then its m others
        return [x for j, i in enumerate(open_) for x in v[i * k:(i + 1) * k] + w[j * m:(j + 1) * m]]
    return {key: None if v is None else groups(v, rest[key]) for key, v in first.items()}, counts


def dynamic_sample(next_rows, rollout_fn, prompts_per_step, group_size, oversample=1.5, max_rounds=10,
                   reduce_sum=lambda x: x, world_size=1, trim=False, screen=0):
    """DAPO's dynamic sampling (seed 000, "Dynamic Sampling"): a group whose G answers are all right or all
    wrong has zero advantage everywhere and only dilutes the batch. Generate, drop those degenerate groups,
    and generate more (oversample x the groups still missing, per round) until the step has at least
    prompts_per_step live groups, or max_rounds rounds have run (0: no bound; then proceed with what we have).
    Live groups beyond prompts_per_step are trained on too, not thrown away: they are as on-policy as the rest.
    trim (DAPO's own recipe in verl): every rank samples until it has its share of the live groups
    (prompts_per_step / world_size) and trains on exactly that share, the surplus dropped: a step's
    update costs the same however many groups the last round brought. screen: screened_round's
    (0: off; every prompt gets its G answers at once).

    Under DDP every rank samples its own prompts, and the loop condition uses the live counts summed over
    ranks (reduce_sum), so all ranks take the same number of rounds; a rank still without a live group keeps
    the others generating until it has one or the bound is hit.
    next_rows(n) -> n dataset rows; rollout_fn(rows, n) -> samples, n a row (generate's per-sample
    lists) with a 'correct' list of floats. The samples are still unpadded, so keeping a group and
    merging rounds are list operations; make_batch pads the result once, at its final width.
    Returns (samples of this rank's live groups, round by round, or None if it has none; counts of
    this rank)."""
    kept, counts = {}, dict(gen_rounds=0, groups_sampled=0, groups_degenerate=0, groups_live=0,
                            samples=0, samples_correct=0.0)
    share = prompts_per_step // world_size
    while True:
        have = counts['groups_live']
        if trim:  # every rank has its share; this rank samples for its missing groups
            enough = reduce_sum(int(have < share)) == 0
            n_prompts = math.ceil(max(share - have, 1) * oversample)
        else:  # the step has its groups and every rank one; the ranks share the missing ones
            total_live, ranks_without = reduce_sum(have), reduce_sum(int(have == 0))
            enough = total_live >= prompts_per_step and ranks_without == 0
            n_prompts = math.ceil(max(prompts_per_step - total_live, world_size) * oversample / world_size)
        if enough or (max_rounds and counts['gen_rounds'] >= max_rounds):
            break
        counts['gen_rounds'] += 1
        rows = next_rows(n_prompts)
        if screen:  # every group it returns is live; trim: only as many as this rank lacks
            samples, new = screened_round(rows, rollout_fn, group_size, screen,
                                          share - have if trim else None)
            live = torch.arange(len(samples['correct']) // group_size)
        else:
            samples = rollout_fn(rows, group_size)
            new, live = round_counts(samples['correct'], group_size)
        counts.update({k: counts[k] + v for k, v in new.items()})
        # every live group is kept, the surplus of the last round too (trim: dropped below)
        if len(live):
            rows = (live[:, None] * group_size + torch.arange(group_size)).flatten().tolist()
            # this round's live rows after the earlier rounds' (HF's rollout_logp None stays None)
            kept = {k: None if v is None else kept.get(k, []) + [v[i] for i in rows]
                    for k, v in samples.items()}
            counts['groups_live'] += len(live)
    if trim and counts['groups_live'] > share:  # the first share live groups, in the order sampled
        kept = {k: None if v is None else v[:share * group_size] for k, v in kept.items()}
        counts['groups_live'] = share
    return kept or None, counts
