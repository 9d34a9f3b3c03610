"""
Checkpoints: what a run saves, how a crash mid-write never loses the last good one, and how a
resume picks up exactly where the run stopped.

A checkpoint is a folder: the HF model (loadable by transformers and vLLM), the critic's, the
optimizers' state (torch.distributed.checkpoint: every rank writes its own shards), and
trainer_state.pt (step, data position, every rank's RNG states, the config). It is written to
ckpt.tmp and swapped in (save_checkpoint); meta.json, written last, marks it complete.
"""
import itertools
import json
import os
import random
import shutil
import signal
import threading
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)
from tqdm import tqdm

from lora import merged_weights, save_adapter
from model import save_critic

# DCP (save_optimizers) in one process, without torch.distributed, is what plain python means
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
# what a full disk raises, measured on a full tmpfs: OSError (open, json), RuntimeError (torch.save:
# "unexpected pos"), SafetensorError (the weights), CheckpointException (DCP, around each rank's)
FULL_DISK_ERRORS = (OSError, RuntimeError, SafetensorError, CheckpointException)
# the words that tell a failed write from a bug among the RuntimeErrors and SafetensorErrors
# (torch 2.13's zip writer, safetensors' I/O error); any other error is raised as it is
WRITE_FAILURE_WORDS = ("unexpected pos", "file write failed", "I/O error", "No space left")

# -----------------------------------------------------------------------------
# checkpoints: an HF folder (loadable by transformers and vLLM) plus the trainer's state

def full_state(net):
    """A sharded (FSDP) net's whole state dict on rank 0 (CPU; every rank takes part), for its HF
    folder, a tied weight once (as save_pretrained writes it); None for an unsharded net."""
    if not any(hasattr(p, "full_tensor") for p in net.parameters()):
        return None
    state = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    first = {}  # parameter -> its first name; a later name is a tied copy (lm_head = embed_tokens)
    tied = [name for name, p in net.named_parameters(remove_duplicate=False)
            if first.setdefault(p, name) != name]
    return {k: v for k, v in state.items() if k not in tied}


def save_optimizers(path, optimizers):
    """Every rank: the optimizers' states, {name: (module, optimizer)}, into the folder path with
    torch.distributed.checkpoint (DCP). Keyed by parameter name; each rank writes its own shards
    (FSDP) or its share of the replicated state (DDP), so no rank ever holds a whole sharded state,
    and the folder loads into any number of ranks, sharded or not (DCP reshards). An optimizer that
    has not stepped yet (VAPO's policy in its warm-up) has no state and is left out."""
    states = {name: get_optimizer_state_dict(module, opt)
              for name, (module, opt) in optimizers.items() if opt.state}
    dcp.save(states, checkpoint_id=path, no_dist=not dist.is_initialized())


def load_optimizers(path, optimizers):
    """Every rank: the states saved by save_optimizers into the optimizers (fresh ones: their state
    is made by one zero step first, then overwritten), each rank reading the part it holds."""
    saved = {key.split(".")[0] for key in dcp.FileSystemReader(path).read_metadata().state_dict_metadata}
    optimizers = {name: pair for name, pair in optimizers.items() if name in saved}
    for module, opt in optimizers.values():
        opt.zero_grad(set_to_none=True)  # else the zero step that makes the state is not taken
    states = {name: get_optimizer_state_dict(module, opt) for name, (module, opt) in optimizers.items()}
    if states:
        dcp.load(states, checkpoint_id=path, no_dist=not dist.is_initialized())
    for name, (module, opt) in optimizers.items():
        set_optimizer_state_dict(module, opt, states[name])


def save_checkpoint(ckpt_dir, model, tokenizer, trainer_state, critic=None, state_dict=None,
                    critic_state_dict=None, optimizer_dir=None, lora_base=None):
    """Write to ckpt_dir + '.tmp', then swap it in: ckpt -> ckpt.old, ckpt.tmp -> ckpt, drop
    ckpt.old. state_dict / critic_state_dict: the weights to write (FSDP's, gathered whole), if not
    the model's own; optimizer_dir: a folder written by save_optimizers, moved in as 'optimizer';
    lora_base (LoRA: the model the adapters adapt): state_dict holds the merged weights and the
    adapters, which go to 'adapter' in PEFT's format. A checkpoint is complete once it has
    meta.json, written last and atomically. A crash at any point leaves a complete checkpoint in
    ckpt, or (between the two renames) none there but the new one in ckpt.tmp and the previous one
    in ckpt.old: read_checkpoint_meta then finishes the swap."""
    tmp, old = ckpt_dir + ".tmp", ckpt_dir + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    if lora_base is not None:  # state_dict: the merged weights and the adapters (save_run's)
        adapters = {k: state_dict.pop(k) for k in list(state_dict) if '.lora_' in k}
        save_adapter(os.path.join(tmp, "adapter"), model, lora_base, adapters)
    model.save_pretrained(tmp, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    if critic is not None:
        save_critic(os.path.join(tmp, "critic"), critic, critic_state_dict)
    if optimizer_dir is not None:
        os.replace(optimizer_dir, os.path.join(tmp, "optimizer"))
    torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
    meta = {k: trainer_state[k] for k in ("step", "model_source", "config", "world") if k in trainer_state}
    with open(os.path.join(tmp, "meta.json.part"), "w") as f:
        json.dump(meta, f, indent=1, default=str)  # readable without torch
    # a rename, so that meta.json is either absent or whole: its presence marks tmp as complete
    os.replace(os.path.join(tmp, "meta.json.part"), os.path.join(tmp, "meta.json"))
    if os.path.exists(ckpt_dir):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt_dir, old)
    os.replace(tmp, ckpt_dir)
    shutil.rmtree(old, ignore_errors=True)


def is_complete_checkpoint(path):
    return os.path.exists(os.path.join(path, "meta.json"))  # written last by save_checkpoint


def recover_checkpoint(ckpt_dir):
    """No ckpt_dir but a complete ckpt.tmp or ckpt.old: save_checkpoint crashed between its renames.
    Finish the swap: ckpt.tmp is the newer checkpoint (complete before the renames began), so it
    wins; ckpt.old is the fallback when no complete ckpt.tmp exists. Under DDP every rank may get
    here at once: a rename another rank made first fails, and the loop finds ckpt_dir in place."""
    for candidate in (ckpt_dir + ".tmp", ckpt_dir + ".old"):
        if os.path.exists(ckpt_dir):
            return
        if is_complete_checkpoint(candidate):
            try:
                os.replace(candidate, ckpt_dir)
                print(f"{ckpt_dir}: restored from {candidate} (a checkpoint write was interrupted)")
            except OSError:
                pass  # another rank renamed first


def read_checkpoint_meta(ckpt_dir):
    """step, model_source and config of the checkpoint in ckpt_dir, or None if there is none. Called
    first by train.py: it recovers a checkpoint whose write was interrupted (recover_checkpoint)."""
    recover_checkpoint(ckpt_dir)
    path = os.path.join(ckpt_dir, "meta.json")
    return json.load(open(path)) if os.path.exists(path) else None


def load_trainer_state(ckpt_dir):
    return torch.load(os.path.join(ckpt_dir, "trainer_state.pt"), weights_only=False)


# -----------------------------------------------------------------------------
# what train.py calls: the resume checks, the RNG states, a checkpoint of the whole run

# a resume must keep what the data position means (the shuffled order, what a step consumes;
# max_prompt_len decides which rows the order holds). Another world size or DDP <-> FSDP may
# change: the position is global and the optimizer state is resharded on load (load_optimizers).
POSITION_KEYS = ('data_dir', 'seed', 'prompts_per_step', 'group_size', 'max_prompt_len')


def resume_problem(ckpt_dir, meta, init_from, config):
    """Why the checkpoint in ckpt_dir (meta: read_checkpoint_meta's) does not fit this run, or None:
    checked before any model loads."""
    if init_from != 'resume':
        if meta and meta['model_source'] != init_from:
            return (f"{ckpt_dir} is a checkpoint of {meta['model_source']!r}, not {init_from!r}: "
                    f"choose another out_dir, or --init_from=resume")
        return None
    if meta is None:
        return f"init_from='resume' but {ckpt_dir} holds no checkpoint"
    saved = meta['config']
    if changed := [k for k in POSITION_KEYS if k in saved and saved[k] != config[k]]:
        return (f"cannot resume {ckpt_dir} with a different {', '.join(changed)} "
                f"(the data position would not mean the same)")
    if saved.get('lora_rank', 0) != config['lora_rank']:
        return (f"{ckpt_dir} was trained with lora_rank={saved.get('lora_rank', 0)}, not "
                f"{config['lora_rank']}: resume with the same adapters (or start from its merged "
                f"weights: --init_from={ckpt_dir})")
    if not os.path.isdir(os.path.join(ckpt_dir, 'optimizer')):
        return (f"{ckpt_dir} has no optimizer/ folder (it predates the DCP optimizer state): resume "
                f"it with the revision that wrote it, or start from its weights: --init_from={ckpt_dir}")
    return None


def rng_state(device):
    return {'python': random.getstate(), 'torch': torch.get_rng_state(),
            # this rank's GPU only: a resume may see fewer GPUs (get_rng_state_all: one per GPU)
            'cuda': torch.cuda.get_rng_state(device) if device.startswith('cuda') else None}


def stop_on_signals():
    """SIGTERM / SIGINT (a scheduler's preemption, Ctrl-C) set the returned Event: the loop finishes
    its step, saves a checkpoint and exits."""
    stop = threading.Event()

    def request_stop(signum, frame):
        stop.set()
        tqdm.write(f"{signal.Signals(signum).name}: finishing this step, then checkpoint and exit")

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


def restore_rng(states, rank, device):
    """This rank's RNG states as saved; on more ranks than saved, a new rank keeps its own fresh
    stream (seed + rank)."""
    if rank < len(states):
        random.setstate(states[rank]['python'])
        torch.set_rng_state(states[rank]['torch'])
        if device.startswith('cuda') and states[rank]['cuda'] is not None:
            torch.cuda.set_rng_state(states[rank]['cuda'], device)


def save_run(ckpt_dir, model, tokenizer, optimizers, trainer_state, device, critic=None,
             lora_base=None):
    """Every rank: a checkpoint of the run, written by rank 0, with every rank's RNG state. Every
    rank writes its part of the optimizer state (DCP) into a folder that rank 0 moves into the
    checkpoint; FSDP: the weights are gathered whole to rank 0 (every rank takes part). lora_base
    (LoRA): the HF folder holds the merged weights (vLLM and transformers load it), 'adapter' the
    adapters. A write that fails (a full disk) leaves the previous checkpoint in place and ends
    the run on every rank with SystemExit: what failed, and which step ckpt_dir still holds
    (failed_save)."""
    distributed = dist.is_initialized()
    master = not distributed or dist.get_rank() == 0
    mine = rng_state(device)
    rngs = [mine] * (dist.get_world_size() if distributed else 1)
    if distributed:  # every rank's, in rank order
        dist.all_gather_object(rngs, mine)
    optimizer_dir = ckpt_dir + '.optimizer'
    if master:
        shutil.rmtree(optimizer_dir, ignore_errors=True)
    if distributed:
        dist.barrier()
    try:
        save_optimizers(optimizer_dir, optimizers)
        weights = {'model': None if lora_base else full_state(model),
                   'critic': full_state(critic) if critic else None}
        if lora_base:  # the merged weights and the adapters, one at a time, gathered whole (FSDP)
            adapters = ((k, v) for k, v in model.state_dict().items() if '.lora_' in k)
            whole = ((k, v.full_tensor() if hasattr(v, 'full_tensor') else v)
                     for k, v in itertools.chain(merged_weights(model), adapters))
            weights['model'] = {k: v.detach().cpu() for k, v in whole if master}  # every rank gathers
        if master:
            save_checkpoint(ckpt_dir, model, tokenizer, {**trainer_state, 'rng': rngs}, critic=critic,
                            state_dict=weights['model'], critic_state_dict=weights['critic'],
                            optimizer_dir=optimizer_dir, lora_base=lora_base)
    except FULL_DISK_ERRORS as e:
        error = next(iter(e.failures.values()))[0] if hasattr(e, 'failures') else e  # DCP: a rank's
        if not isinstance(error, OSError) and not any(w in str(error) for w in WRITE_FAILURE_WORDS):
            raise  # not a failed write: a bug, with its own traceback
    else:
        error = None
    if distributed:  # a barrier that tells every rank whether a write failed on any rank
        failed = torch.tensor([error is not None], dtype=torch.int32, device=device)
        dist.all_reduce(failed)
        if failed.item() and error is None:
            error = "a write failed on another rank (rank 0 says which)"
    if error is not None:
        raise SystemExit(failed_save(ckpt_dir, trainer_state['step'], error, master))


def failed_save(ckpt_dir, step, error, master):
    """The message for a checkpoint write that failed, with the disk's free space (torch.save's
    own words for a full disk are "unexpected pos"); rank 0 first removes what it left half written
    (the optimizer folder, an incomplete ckpt.tmp), so a full disk is not left fuller."""
    folder = os.path.dirname(os.path.abspath(ckpt_dir))
    error = f"{error}; {shutil.disk_usage(folder).free / 2**30:.2f} GiB free in {folder}"
    if not master:
        return f"the checkpoint of step {step} was not written: {error}"
    shutil.rmtree(ckpt_dir + '.optimizer', ignore_errors=True)
    if not is_complete_checkpoint(ckpt_dir + '.tmp'):  # a complete one is the newest: kept
        shutil.rmtree(ckpt_dir + '.tmp', ignore_errors=True)
    meta = read_checkpoint_meta(ckpt_dir)  # finishes a swap cut short between its renames
    kept = (f"{ckpt_dir} still holds the checkpoint of step {meta['step']} (free some space, then "
            f"continue from it with --init_from=resume)" if meta else f"no checkpoint in {ckpt_dir}")
    return f"the checkpoint of step {step} was not written ({error}): {kept}"


def checkpoint_bytes(nets):
    """About what a checkpoint of nets takes on disk: each weight as it is held, and AdamW's two
    moments (exp_avg and exp_avg_sq, in the parameter's dtype) of each one it trains."""
    return sum(p.numel() * p.element_size() * (3 if p.requires_grad else 1)
               for net in nets if net is not None for p in net.parameters())


def disk_problem(ckpt_dir, nets, ckpt_interval, max_iters):
    """Why the disk of ckpt_dir cannot hold this run's checkpoints, or None: checked before the
    first step, so that a full disk stops the run there, not at its end with its weights unsaved.
    A save writes the new checkpoint whole beside the previous one (save_checkpoint): room for one
    more where a checkpoint is already there or only the last step saves, else room for two."""
    if ckpt_interval == -1:  # no checkpoints
        return None
    one_save = os.path.exists(ckpt_dir) or not 0 < ckpt_interval < max_iters
    need = checkpoint_bytes(nets) * (1 if one_save else 2)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(ckpt_dir))).free
    if free >= need:
        return None
    return (f"{os.path.dirname(ckpt_dir)} has {free / 2**30:.2f} GiB free, and this run's "
            f"checkpoints need about {need / 2**30:.2f} GiB: free some space, choose another "
            f"out_dir, or --ckpt_interval=-1 (no checkpoints)")
