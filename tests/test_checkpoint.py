"""Checkpoints survive a crash at any point of save_checkpoint: the on-disk states a crash can leave
are built here (a real checkpoint of a tiny model, renames cut short), and read_checkpoint_meta,
which train.py calls first, must find the last complete checkpoint in each. A full disk (a save
that fails) leaves the previous one and says so; the disk is checked before the first step."""
import os
import shutil
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          modeling_utils)

import checkpoint as checkpoint_py
from conftest import MODEL_DIR
from checkpoint import (checkpoint_bytes, disk_problem, load_trainer_state, read_checkpoint_meta,
                        save_checkpoint, save_run)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def tiny_model():
    """A one-layer Llama over SmolLM2's tokenizer (its vocabulary), seed 0's init, and the
    tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    return LlamaForCausalLM(config), tokenizer


def save(ckpt_dir, tiny, step):
    state = {"step": step, "model_source": MODEL_DIR, "config": {"seed": 0},
             "data_cursor": 10 * step}
    save_checkpoint(ckpt_dir, *tiny, state)


def check_loads(ckpt_dir, step, tiny):
    """meta, trainer state and weights of ckpt_dir are the checkpoint of this step."""
    assert read_checkpoint_meta(ckpt_dir)["step"] == step
    assert load_trainer_state(ckpt_dir)["data_cursor"] == 10 * step
    loaded = AutoModelForCausalLM.from_pretrained(ckpt_dir)
    assert torch.equal(loaded.lm_head.weight, tiny[0].lm_head.weight)


def crash_at_rename(monkeypatch, src_name):
    """From now on renaming a file or folder named src_name raises, as if the process died there."""
    replace = os.replace

    def dying_replace(src, dst):
        if os.path.basename(src) == src_name:
            raise KeyboardInterrupt("simulated crash")
        replace(src, dst)
    monkeypatch.setattr(checkpoint_py.os, "replace", dying_replace)


def test_only_the_previous_checkpoint_left_in_ckpt_old(tmp_path, tiny):
    # the state between save_checkpoint's renames when ckpt.tmp is gone too: ckpt.old, no ckpt
    ckpt = str(tmp_path / "ckpt")
    save(ckpt, tiny, 3)
    os.replace(ckpt, ckpt + ".old")
    check_loads(ckpt, 3, tiny)
    assert not os.path.exists(ckpt + ".old")


def test_a_crash_between_the_renames_resumes_from_the_new_checkpoint(tmp_path, tiny, monkeypatch):
    ckpt = str(tmp_path / "ckpt")
    save(ckpt, tiny, 3)
    crash_at_rename(monkeypatch, "ckpt.tmp")  # ckpt -> ckpt.old done, ckpt.tmp -> ckpt not
    with pytest.raises(KeyboardInterrupt):
        save(ckpt, tiny, 4)
    monkeypatch.undo()
    assert (not os.path.exists(ckpt) and os.path.exists(ckpt + ".old")
            and os.path.exists(ckpt + ".tmp"))
    # ckpt.tmp is complete (meta.json is in it) and newer than ckpt.old: the swap is finished
    check_loads(ckpt, 4, tiny)
    save(ckpt, tiny, 5)  # and the next save cleans up
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and read_checkpoint_meta(ckpt)["step"] == 5


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, tiny, monkeypatch):
    ckpt = str(tmp_path / "ckpt")
    save(ckpt, tiny, 3)
    crash_at_rename(monkeypatch, "meta.json.part")  # written, not yet renamed to meta.json
    with pytest.raises(KeyboardInterrupt):
        save(ckpt, tiny, 4)
    monkeypatch.undo()
    # everything else is written before meta.json appears: without it ckpt.tmp is incomplete
    written = set(os.listdir(ckpt + ".tmp"))
    assert {"trainer_state.pt", "config.json", "model.safetensors", "tokenizer.json"} <= written
    assert "meta.json" not in written
    check_loads(ckpt, 3, tiny)
    # the same incomplete ckpt.tmp next to ckpt.old, no ckpt: the previous one comes back
    os.replace(ckpt, ckpt + ".old")
    check_loads(ckpt, 3, tiny)
    assert os.path.exists(ckpt + ".tmp")  # never promoted: it has no meta.json


def test_no_checkpoint_anywhere_is_none(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    assert read_checkpoint_meta(ckpt) is None
    os.makedirs(ckpt + ".tmp")  # a write that died before meta.json
    assert read_checkpoint_meta(ckpt) is None and not os.path.exists(ckpt)
    shutil.rmtree(ckpt + ".tmp")


def save_whole_run(ckpt_dir, tiny, step):
    """save_run as train.py calls it: the weights, a stepped AdamW's state (lr 0: the shared tiny
    model keeps its weights), the trainer state."""
    model, tokenizer = tiny
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    state = {"step": step, "model_source": MODEL_DIR, "config": {"seed": 0},
             "data_cursor": 10 * step}
    save_run(ckpt_dir, model, tokenizer, {"policy": (model, optimizer)}, state, "cpu")


def full_disk(monkeypatch, where):
    """From now on a write fails as it does on a full disk (a full tmpfs, 2026-12-06): torch.save
    raises its zip writer's RuntimeError, in DCP's optimizer shards ('optimizer') or in the trainer
    state, the last file save_checkpoint writes before meta.json ('trainer_state'); safetensors
    raises SafetensorError in the weights ('weights')."""
    save_file = modeling_utils.safe_save_file

    def failing_save_file(*args, **kwargs):
        if where == "weights":
            raise SafetensorError("Error while serializing: I/O error: No space left on device")
        save_file(*args, **kwargs)
    monkeypatch.setattr(torch, "save", failing_torch_save(where))
    monkeypatch.setattr(modeling_utils, "safe_save_file", failing_save_file)


TORCH_SAVE = torch.save


# torch.save's words for a full disk (its zip writer, measured on a full tmpfs)
FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


def failing_torch_save(where, error=FULL_DISK):
    """torch.save, but failing (by default with its zip writer's error for a full disk) in DCP's
    optimizer shards ('optimizer') or in the trainer state ('trainer_state')."""
    def failing_save(obj, f, *args, **kwargs):
        optimizer_shard = not isinstance(f, (str, os.PathLike))  # DCP writes into open streams
        if optimizer_shard if where == "optimizer" else str(f).endswith("trainer_state.pt"):
            raise RuntimeError(error)
        return TORCH_SAVE(obj, f, *args, **kwargs)
    return failing_save


@pytest.mark.parametrize("where", ["optimizer", "trainer_state", "weights"])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path, tiny, monkeypatch, where):
    ckpt = str(tmp_path / "ckpt")
    save_whole_run(ckpt, tiny, 3)
    full_disk(monkeypatch, where)
    monkeypatch.setattr(checkpoint_py.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**20))
    with pytest.raises(SystemExit) as exit_info:
        save_whole_run(ckpt, tiny, 4)
    monkeypatch.undo()
    message = str(exit_info.value)
    assert message.startswith("the checkpoint of step 4 was not written (")
    assert ("No space left" if where == "weights" else "unexpected pos") in message
    assert f"0.00 GiB free in {tmp_path}" in message
    assert f"{ckpt} still holds the checkpoint of step 3" in message
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # nothing half written is left behind
    check_loads(ckpt, 3, tiny)
    assert os.listdir(os.path.join(ckpt, "optimizer"))


@pytest.mark.parametrize("where", ["optimizer", "trainer_state"])
def test_an_error_that_is_not_a_failed_write_is_raised_as_it_is(tmp_path, tiny, monkeypatch, where):
    """A bug in a save (here torch.save's RuntimeError with other words) keeps its own error and
    traceback: it is not reported as a full disk."""
    monkeypatch.setattr(torch, "save", failing_torch_save(where, error="a bug in the state"))
    with pytest.raises(BaseException, match="a bug in the state") as raised:  # DCP: BaseException
        save_whole_run(str(tmp_path / "ckpt"), tiny, 1)
    assert not isinstance(raised.value, SystemExit)


def test_a_full_disk_at_the_first_save_says_no_checkpoint_is_left(tmp_path, tiny, monkeypatch):
    ckpt = str(tmp_path / "ckpt")
    full_disk(monkeypatch, "trainer_state")
    with pytest.raises(SystemExit, match=f"no checkpoint in {ckpt}"):
        save_whole_run(ckpt, tiny, 1)
    assert os.listdir(tmp_path) == []


def test_the_disk_check_before_the_first_step(tmp_path, tiny, monkeypatch):
    ckpt = str(tmp_path / "ckpt")
    save_whole_run(ckpt, tiny, 1)
    # the estimate against what a checkpoint of the tiny model's weights and AdamW holds
    written = sum(os.path.getsize(os.path.join(folder, name))
                  for folder, _, names in os.walk(ckpt) for name in names
                  if name.endswith((".safetensors", ".distcp")))
    estimate = checkpoint_bytes([tiny[0], None])
    assert abs(written - estimate) < 0.01 * estimate
    free = 1.5 * estimate  # room for one checkpoint, not for two
    monkeypatch.setattr(checkpoint_py.shutil, "disk_usage", lambda path: SimpleNamespace(free=free))
    fresh = str(tmp_path / "fresh" / "ckpt")
    assert "GiB free" in disk_problem(fresh, [tiny[0]], ckpt_interval=10, max_iters=100)
    assert disk_problem(fresh, [tiny[0]], ckpt_interval=0, max_iters=100) is None  # the end only
    assert disk_problem(ckpt, [tiny[0]], ckpt_interval=10, max_iters=100) is None  # one there
    free = 0.5 * estimate
    assert disk_problem(fresh, [tiny[0]], ckpt_interval=0, max_iters=100)
    assert disk_problem(fresh, [tiny[0]], ckpt_interval=-1, max_iters=100) is None  # never saves


def save_two_ranks(rank, ckpt, port, messages):
    """One of two gloo ranks: a checkpoint at step 3, then at step 4 with rank 0's trainer state
    failing as on a full disk; what each rank's SystemExit says goes into messages."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tiny = tiny_model()  # the same on both ranks (seed 0)
    save_whole_run(ckpt, tiny, 3)
    if rank == 0:
        torch.save = failing_torch_save("trainer_state")
    try:
        save_whole_run(ckpt, tiny, 4)
    except SystemExit as e:
        messages.put((rank, str(e)))
    dist.destroy_process_group()


def test_a_save_that_fails_on_rank_0_ends_every_rank(tmp_path):
    """Under torchrun a write that fails on rank 0 alone (its trainer state) is not a hang nor a
    gloo traceback on the other rank: every rank learns it and exits with a message."""
    ckpt = str(tmp_path / "ckpt")
    context = torch.multiprocessing.get_context("spawn")
    messages = context.Queue()
    with socket.socket() as free:  # a port no other test holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.multiprocessing.start_processes(save_two_ranks, args=(ckpt, port, messages), nprocs=2,
                                          start_method="spawn")
    said = dict(messages.get(timeout=60) for _ in range(2))
    assert "unexpected pos" in said[0] and f"{ckpt} still holds the checkpoint of step 3" in said[0]
    assert "a write failed on another rank" in said[1]
    assert read_checkpoint_meta(ckpt)["step"] == 3 and sorted(os.listdir(tmp_path)) == ["ckpt"]
