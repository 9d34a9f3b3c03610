"""Checkpoints survive a crash at any point of save_checkpoint: the on-disk states a crash can leave
are built here (a real checkpoint of a tiny model, renames cut short), and read_checkpoint_meta,
which train.py calls first, must find the last complete checkpoint in each."""
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import checkpoint as checkpoint_py
from conftest import MODEL_DIR
from checkpoint import load_trainer_state, read_checkpoint_meta, save_checkpoint


@pytest.fixture(scope="module")
def tiny():
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
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
