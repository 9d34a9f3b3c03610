"""torchrun on CPU (gloo): the DDP update equals the single-process one, dynamic sampling stays in
lockstep, and the headline command runs with one vLLM engine per rank, checkpoints and resumes."""
import json
import os
import random
import socket
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, parity_reward

# --standalone: a rendezvous on a free port of its own, so that two runs on one machine never meet
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def torchrun(*args, timeout=900):
    result = subprocess.run([*TORCHRUN, *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


def records(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))]


UPDATE_CASES = [  # loss_type, adv_scale, parallel, lora
    ("dapo", "group", "ddp", ""), ("grpo", "batch", "ddp", ""), ("dr_grpo", "none", "ddp", ""),
    ("ppo", "group", "ddp", ""), ("vapo", "group", "ddp", ""), ("grpo", "group", "ddp", "lora"),
    ("grpo", "group", "fsdp", ""), ("dapo", "batch", "fsdp", ""), ("ppo", "group", "fsdp", ""),
    ("grpo", "group", "fsdp", "lora")]


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """Every case of the test below in one torchrun (two processes started once, not ten times):
    its results' folder."""
    out_dir = tmp_path_factory.mktemp("updates")
    torchrun("tests/ddp_update.py", str(out_dir), *(":".join(case) for case in UPDATE_CASES),
             timeout=600)
    return out_dir


@pytest.mark.parametrize("loss_type, adv_scale, parallel, lora", UPDATE_CASES)
def test_two_ranks_make_the_single_process_update(updates, loss_type, adv_scale, parallel, lora):
    """ppo / vapo: the critic's advantages (whitened over both ranks' tokens) and its update
    included; adv_scale='batch': the std is over both ranks' rewards. fsdp: the policy (and the
    critic, and the reference model) sharded by FSDP2 over the two ranks, tied embeddings
    included. The ranks hold 4 and 8 rows in 1 and 4 micro-batches, shared prompts and not: under
    FSDP, before model.even_micro_batches, the ranks' collectives did not match ("Received data
    size doesn't match expected size"). lora: only the adapters train (DDP all-reduces theirs
    alone; FSDP2: a frozen bf16 base and trained fp32 adapters in each layer), the KL reference is
    the policy with its adapters off."""
    result = torch.load(updates / f"{loss_type}-{adv_scale}-{parallel}-{lora}.pt")
    moved = (result["whole"] - result["start"]).abs().max()
    # the step did something
    assert moved > 1e-4
    # and the same thing on 2 ranks
    assert torch.allclose(result["split"], result["whole"], atol=1e-6)
    # whose optimizer state (the momentum buffer: the gradient), saved by the 2 ranks and loaded into
    # one unsharded optimizer, is the single process's
    assert result["whole_state"].abs().max() > 1e-4
    assert torch.allclose(result["loaded_state"], result["whole_state"], atol=1e-6)


def rank_1_all_wrong(tmp_path, n_rows=40):
    """A data folder of n_rows prompts where rank 1 gets only prompts whose answer no completion
    can match (all groups all-wrong), as long as each position of the order holds one prompt."""
    rows = [json.loads(line)
            for line in open(os.path.join(ROOT, "data", "arithmetic", "train.jsonl"))][:n_rows]
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)           # train.py's order for seed=0
    for position, index in enumerate(order):  # rank r takes positions r, r + 2, ... of the order
        if position % 2 == 1:
            rows[index]["answer"] = "-12345"
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return data


@pytest.mark.parametrize("trim", [False, True])
def test_dynamic_sampling_lockstep_when_one_rank_sees_only_degenerate_groups(tmp_path, trim):
    """Rank 1 sees only all-wrong groups: both ranks take the same rounds, skip the update together,
    and the run ends instead of hanging; also with trim_surplus, where rank 0 has its share after
    a round and keeps sampling beside rank 1 (one all-reduce a round, not two)."""
    data = rank_1_all_wrong(tmp_path)
    out_dir = str(tmp_path / "run")
    torchrun("train.py", "config/cpu_demo.py", f"--out_dir={out_dir}", f"--data_dir={data}",
             "--rollout_engine=hf", "--prompts_per_step=2", "--group_size=4", "--max_new_tokens=8",
             "--eval_interval=0", "--ckpt_interval=-1", "--max_iters=2", "--dynamic_sampling=True",
             "--max_gen_batches=2", f"--trim_surplus={trim}",
             timeout=600)
    steps = records(out_dir)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # same rounds on both ranks, no update, no hang
        assert r["skipped"] == 1 and r["gen_rounds"] == 2


def test_skip_zero_adv_and_the_curriculum_when_one_rank_has_no_live_group(tmp_path):
    """4 prompts, 2 a rank a step. Step 1: without dynamic sampling, rank 1's groups all have
    advantage 0: skip_zero_adv leaves it one group (zero gradient) so that its backward meets rank
    0's in DDP's all-reduce; the step finishes, fewer rows trained. Rank 0's answers score by the
    parity of their length, whatever the model samples: a group of 8 agrees with probability 1/128.
    Step 2: the curriculum (window 1) passes over rank 1's two all-wrong prompts on both ranks, so
    both walk the same order: positions 5 and 7 passed over in the walk's one lap, then rows taken
    as they come. Had rank 0 not summed rank 1's groups into its state it would pass over none of
    them (at most its own two, if a group of 8 agreed), and the ranks would take other prompts."""
    data = rank_1_all_wrong(tmp_path, n_rows=4)
    parity = parity_reward(tmp_path, never="-12345")
    out_dir = str(tmp_path / "run")
    torchrun("train.py", "config/cpu_demo.py", parity, f"--out_dir={out_dir}",
             f"--data_dir={data}", "--curriculum_window=1",
             "--rollout_engine=hf", "--prompts_per_step=4", "--group_size=8", "--max_new_tokens=16",
             "--eval_interval=0", "--ckpt_interval=-1", "--max_iters=2", timeout=600)
    first, second = records(out_dir)
    # rank 0 had a live group: a real gradient; rank 1 trains 1 of its 2 groups: at most 3 of 4
    assert first["reward"] > 0 and first["grad_norm"] > 0 and first["trained_frac"] < 1
    assert first["curriculum/skipped"] == 0 and first["curriculum/pass_rate_0"] >= 0.5
    assert first["curriculum/cooling"] >= 2 and first["curriculum/sampled_frac"] == 1
    assert second["curriculum/skipped"] >= 2 and "skipped" not in second

def two_nodes(tmp_path, *args, timeout=900):
    """torchrun on two "nodes" of one rank each: two launchers on this machine, as two machines
    would run them (--nnodes=2, each its --node_rank, one rendezvous address). Their output goes to
    files (a full pipe of one would stall both at the next collective). Returns node 0's stdout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            "--master_addr=127.0.0.1", f"--master_port={port}"]
    logs = [(tmp_path / f"node{rank}.out", tmp_path / f"node{rank}.err") for rank in (0, 1)]
    procs = [subprocess.Popen([*node, f"--node_rank={rank}", *args], cwd=ROOT,
                              stdout=open(out, "w"), stderr=open(err, "w"))
             for rank, (out, err) in enumerate(logs)]
    for p, (out, err) in zip(procs, logs):
        p.wait(timeout=timeout)
        assert p.returncode == 0, (out.read_text()[-2000:], err.read_text()[-4000:])
    return logs[0][0].read_text()



@pytest.mark.slow
def test_torchrun_vllm_ddp_two_nodes_then_fsdp_then_one_process(tmp_path, small_model):
    """The headline launch, one vLLM-CPU engine per rank, through every checkpoint layout:
    1. DDP on two "nodes" of one rank each (the multi-node launch): steps 1-2, evals, a checkpoint;
    2. resumed by one torchrun of 2 ranks with parallel='fsdp': the optimizer state saved by the DDP
       ranks goes into FSDP's shards; step 3 (with a KL penalty: the reference model is sharded
       too; dynamic sampling and micro-batches of 128 tokens, a group each: the ranks pack different
       numbers of micro-batches; one eval problem: rank 1 has none), its weights gathered whole
       into each engine at the sync and into an HF folder at the checkpoint, the optimizer's
       shards written by each rank;
    3. resumed by one plain process (another world size, unsharded): step 4.
    The 2-layer model (conftest.small_model): the launches, engines and layouts are the test, not
    the model's answers. entropy_coef gives every step a gradient, so an engine that did not get
    the new weights would drift from the trainer (rollout_mismatch: with a no-op sync, 0.318 at
    step 2, 31.8x step 1's, and the run stops there: stop_mismatch)."""
    out_dir = str(tmp_path / "run")
    tiny = ["train.py", "config/cpu_demo.py", f"--out_dir={out_dir}", "--prompts_per_step=2",
            "--group_size=4", "--max_new_tokens=8", "--micro_batch_size=4", "--eval_interval=2",
            "--eval_problems=4", "--eval_samples=2", "--entropy_coef=0.01", "--learning_rate=1e-4",
            f"--init_from={small_model}"]
    ckpt = os.path.join(out_dir, "ckpt")
    stdout = two_nodes(tmp_path, *tiny, "--max_iters=2")
    assert "continue: torchrun --nproc_per_node=1 --nnodes=2 --node_rank=... " in stdout
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    assert meta["step"] == 2 and meta["world"] == {"world_size": 2, "fsdp": False}

    # dynamic sampling's live groups from a reward by the parity of the answer's length (whatever
    # the model samples: entropy_coef has made it ramble by step 3)
    parity = parity_reward(tmp_path)
    result = torchrun(*tiny, parity, "--max_iters=3", "--init_from=resume", "--parallel=fsdp",
                      "--beta=0.1", "--dynamic_sampling=True", "--max_tokens_per_micro=128",
                      "--eval_problems=1")
    assert "resumed from" in result.stdout
    meta = json.load(open(os.path.join(ckpt, "meta.json")))
    assert meta["step"] == 3 and meta["world"] == {"world_size": 2, "fsdp": True}
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(ckpt)  # a plain HF folder, the head still tied
    assert model.lm_head.weight is model.model.embed_tokens.weight

    result = subprocess.run([sys.executable, *tiny, "--max_iters=4", "--init_from=resume"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "resumed from" in result.stdout and "(saved by 2 ranks, now 1)" in result.stdout
    log = records(out_dir)
    steps = [r for r in log if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # the policy has moved from the sharded reference model by step 3
    assert "loss/kl" not in steps[1] and steps[2]["loss/kl"] > 0
    # evals at 0, at step 2 (before its checkpoint: the resumed run does not repeat it) and at the
    # end of each resumed run
    assert [r["step"] for r in log if "eval/accuracy" in r] == [0, 2, 3, 4]
    first = max(steps[0]["rollout_mismatch"], 1e-3)
    for r in steps:
        # entropy_coef at lr 1e-4 raises the entropy (6.3 nats at step 3 on one CPU, 1.55 on a Xeon
        # with AMX): no upper bound
        assert r["grad_norm"] > 0 and r["updates_applied"] == 1 and r["entropy"] > 0.3, r
        # the engines follow the trainer: under the sync guard's own bound (stop_mismatch, 10x step
        # 1's); a no-op sync reads 31.8x at step 2, a working one grows with the policy's moves (on a
        # 2-core Xeon with AMX, bf16, 2026-12-07: 2.27x / 3.01x / 1.64x at steps 2 / 3 / 4)
        assert r["rollout_mismatch"] < 10 * first, (r["step"], r["rollout_mismatch"], first)
