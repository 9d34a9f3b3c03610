"""
Poor man's configurator, after nanoGPT. train.py runs `exec(open('configurator.py').read())`, so this
file executes inside train.py's globals, where every default is already defined.

    python train.py config/cpu_demo.py --learning_rate=1e-5 --loss_type=dapo

A bare argument is a Python config file executed over those globals; `--key=value` overrides one key,
parsed with ast.literal_eval (a bare word stays a string). Only the names in train.py's
`config_keys` are keys: imported tables (TASKS, LOSS_TYPES, ...) are not config. A config file may
also import modules and define helper names that start with '_'; any other name it assigns is an
unknown key. Either way the new value must have the default's type (an int is fine where a float is
expected); a key whose default is None takes its type from its annotation (`eps_high: float = None`)
and may stay None. A missing file, an unknown key or a wrong type prints one line that names it and
exits with code 2 (config_error: train.py's).

--help (or -h), anywhere on the command line: after the other arguments are applied, print
train.py's config section with each key's current value and its comment, then exit 0.

Then the checks that fail fast, before any model is loaded: every choice among its valid values,
every number in its range, and the keys that only work together (config_error, the same one line
and exit code 2).
"""
import ast
import math
import os
import sys
import types
from ast import literal_eval



def _expected_type(key):
    """The default's type; for a None default, the key's annotation in train.py, if any."""
    default = _defaults[key]
    return _annotations.get(key) if default is None else type(default)


def _check_type(key, value, where):
    expected = _expected_type(key)
    if expected is None or value is None:
        return value
    ok = (type(value) is expected) if expected is bool or isinstance(value, bool) \
        else isinstance(value, (int, float)) if expected is float else isinstance(value, expected)
    if not ok:
        config_error(f"{where}: {key}={value!r} is {type(value).__name__}, expected {expected.__name__}")
    return float(value) if expected is float else value


# Only train.py's config keys, not every global: imported tables such as TASKS are not config.
_defaults = {k: globals()[k] for k in config_keys}
_annotations = globals().get('__annotations__', {})  # `eps_high: float = None` types a None default
_help = any(_arg in ('-h', '--help') for _arg in sys.argv[1:])
for _arg in sys.argv[1:]:
    if _arg in ('-h', '--help'):
        continue
    if not _arg.startswith('--'):  # a config file
        try:
            _src = open(_arg).read()
        except OSError as e:
            config_error(f"cannot read config file {_arg!r}: {e.strerror}")
        print(f"Overriding config with {_arg}")
        _scope = {k: globals()[k] for k in _defaults}
        try:
            exec(compile(_src, _arg, 'exec'), _scope)
        except Exception as e:
            config_error(f"{_arg}: {type(e).__name__}: {e}")
        for _key, _val in _scope.items():
            if _key.startswith('_') or isinstance(_val, types.ModuleType):
                continue
            if _key not in _defaults:
                config_error(f"{_arg}: unknown config key {_key!r}")
            globals()[_key] = _check_type(_key, _val, _arg)
    else:  # --key=value
        _key, _eq, _val = _arg[2:].partition('=')
        if not _eq:
            config_error(f"expected --key=value, got {_arg!r}")
        if _key not in _defaults:
            config_error(f"unknown config key {_key!r}")
        try:
            _val = literal_eval(_val)
        except (SyntaxError, ValueError):
            pass  # a bare word such as --loss_type=dapo stays a string
        globals()[_key] = _check_type(_key, _val, _arg)
        print(f"Overriding: {_key} = {globals()[_key]!r}")

if _help:
    # train.py's config section (from its '# config:' line to config_keys) is the documentation:
    # print it as it is, each key's default replaced by its current value, its comment kept. A
    # key's line is `key = default` or `key: type = default`, then its comment after two spaces
    # (PEP 8's inline comment)
    _lines = open(__file__).read().splitlines()
    _start = next(i for i, line in enumerate(_lines) if line.startswith('# config:'))
    _end = next(i for i, line in enumerate(_lines) if line.startswith('config_keys'))
    for _line in _lines[_start:_end]:
        _code, _hash, _comment = _line.partition('  #')
        _key = _code.partition('=')[0].partition(':')[0].strip()
        if _key in _defaults:
            _text = f"{_code.partition('=')[0]}= {globals()[_key]!r}"
            _line = f"{_text.ljust(len(_code))}  #{_comment}" if _hash else _text
        print(_line)
    sys.exit(0)

# -----------------------------------------------------------------------------
# checks that fail fast with a clear message, before any model is loaded
import losses as _losses  # noqa: E402 (the valid choices: train.py's tables)
import rewards as _rewards  # noqa: E402
import tools as _tools  # noqa: E402
if dtype == 'float16':  # fp16's range: small gradients underflow to 0 without torch.amp.GradScaler
    config_error("dtype='float16' trains without a gradient scaler (small gradients underflow to 0): "
                 "use 'bfloat16' where the hardware has it, else 'float32'")
for _key, _valid in [('loss_type', _losses.LOSS_TYPES), ('reward_fn', tuple(_rewards.TASKS)),
                   ('adv_scale', (None, 'group', 'batch', 'none')),
                   ('rollout_engine', ('vllm', 'hf')),
                   ('dtype', ('auto', 'float32', 'bfloat16')), ('tis_mode', _losses.TIS_MODES),
                   ('kl_estimator', _losses.KL_ESTIMATORS), ('old_logp_source', ('policy', 'rollout')),
                   ('parallel', ('ddp', 'fsdp')),
                   ('reward_control', ('none', 'random', 'shuffled')),
                   ('tool', ('', *_tools.TOOLS))]:
    if globals()[_key] not in _valid:
        config_error(f"{_key}={globals()[_key]!r}; valid: {', '.join(v for v in _valid if v)}")
if tool and stop_string:  # a tool's turns end at its own closing tags (tools.tool_rollout)
    config_error(f"stop_string={stop_string!r} with tool={tool!r}: a tool's turns stop at its tags")
if '\\n' in stop_string:  # the shell passes --stop_string=\n as a backslash and an n, not a newline
    config_error(f"stop_string={stop_string!r} holds a backslash and an n: for a newline write "
                 f"--stop_string=\"'\\n'\" (Python's quotes kept) or set it in a config file")
# every number's valid range, keys grouped by it (a None default may stay None). The comparisons
# are written so that a NaN (a config file's float('nan')) fails them too.
for _valid, _in_range, _keys in [
        ('>= 0', lambda v: v >= 0,
         ['format_coef', 'length_reward_coef', 'length_reward_warmup', 'max_bad_rows', 'top_k',
          'max_gen_batches', 'eps_high', 'cispo_eps_high', 'kl_cov_coef', 'beta', 'critic_lr',
          'value_warmup_steps', 'lm_coef', 'learning_rate', 'weight_decay', 'grad_clip',
          'warmup_iters', 'max_iters', 'eval_interval', 'warn_degenerate_steps', 'warn_mismatch',
          'stop_mismatch', 'samples_per_step', 'lora_rank', 'curriculum_window',
          'curriculum_cooldown', 'warn_reward_gap', 'warn_length_rise', 'max_tool_calls']),
        # oversample < 1 could never fill a step in one round
        ('>= 1', lambda v: v >= 1,
         ['max_prompt_len', 'prompts_per_step', 'max_new_tokens', 'oversample', 'num_iterations',
          'micro_batch_size', 'max_tokens_per_micro', 'max_bad_steps', 'lr_decay_iters']
         + (['eval_samples', 'eval_problems'] if eval_interval else [])),
        ('> 0', lambda v: v > 0,
         ['reward_timeout', 'temperature', 'tau_pos', 'tau_neg', 'tis_cap', 'vf_clip', 'lam_alpha',
          'lora_alpha', 'tool_timeout']),
        ('in (0, 1]', lambda v: 0 < v <= 1, ['top_p', 'vllm_gpu_memory_utilization']),
        ('in [0, 1]', lambda v: 0 <= v <= 1,
         ['clip_cov_ratio', 'kl_cov_ratio', 'gae_lambda', 'warn_truncated']),
        ('in [0, 1)', lambda v: 0 <= v < 1, ['eps_low', 'cispo_eps_low', 'beta1', 'beta2']),
        ('>= 2 (a group advantage needs 2 samples per prompt)', lambda v: v >= 2, ['group_size']),
        ('<= 1 (a right answer scores 1.0)', lambda v: v <= 1, ['reward_wrong']),
        ('>= -1 (-1: never)', lambda v: v >= -1, ['ckpt_interval']),
        (f'in [0, max_new_tokens={max_new_tokens}]', lambda v: 0 <= v <= max_new_tokens,
         ['overlong_buffer']),
        (f'<= clip_cov_ub={clip_cov_ub}', lambda v: v <= clip_cov_ub, ['clip_cov_lb']),
        (f'in [0, learning_rate={learning_rate}]', lambda v: 0 <= v <= learning_rate, ['min_lr']),
        # either sign: < 0 minimises the entropy, which is a method of its own
        ('finite', math.isfinite, ['entropy_coef'])]:
    for _key in _keys:
        if globals()[_key] is not None and not _in_range(globals()[_key]):
            config_error(f"{_key}={globals()[_key]!r} must be {_valid}")
# init_from: 'resume', a folder or a hub id. A mistyped folder would otherwise end, after the long
# imports, in the hub's OSError about a repo id.
if init_from != 'resume' and not os.path.isdir(init_from):
    import huggingface_hub as _hub
    try:
        _hub.utils.validate_repo_id(init_from)  # 'name' or 'owner/name', in the hub's characters
        _cached = isinstance(_hub.try_to_load_from_cache(init_from, 'config.json'), str)
    except _hub.utils.HFValidationError:
        config_error(f"init_from={init_from!r} is not a folder (and not a hub id 'owner/name')")
    if _hub.constants.HF_HUB_OFFLINE and not _cached:  # offline, a hub id loads from the cache only
        config_error(f"init_from={init_from!r} is not a folder, and the hub is offline "
                     f"(HF_HUB_OFFLINE=1) with no cached copy of it")
if tis_mode != 'none' and rollout_engine != 'vllm':
    config_error(f"tis_mode={tis_mode!r} corrects for the sampler's log-probs: it needs "
                 f"rollout_engine='vllm' (the 'hf' engine samples with the trainer's own model)")
if parallel == 'fsdp' and rollout_engine != 'vllm':
    config_error("parallel='fsdp' needs rollout_engine='vllm': HF generate runs the model's own "
                 "forward, which does not gather the sharded weights")
if screen_size and not (dynamic_sampling and 2 <= screen_size < group_size):
    config_error(f"screen_size={screen_size} needs dynamic_sampling=True and 2 <= screen_size < "
                 f"group_size={group_size} (the screen's answers must be able to disagree)")
if lora_rank == 0 and lora_alpha is not None:
    config_error(f"lora_alpha={lora_alpha} is set but lora_rank=0 (LoRA off): set lora_rank too")
if old_logp_source == 'rollout' and (rollout_engine != 'vllm' or tis_mode != 'none'):
    config_error("old_logp_source='rollout' needs rollout_engine='vllm' (its log-probs) and "
                 "tis_mode='none' (the sampler is pi_old then: no mismatch is left to correct)")
