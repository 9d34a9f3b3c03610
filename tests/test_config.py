"""configurator.py: every bad-config case is one clear line on stderr and exit code 2, before any
model loads."""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def run_train(*args, env=None):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


# bad config, one clear line each: (argv, what the last line of stderr says). Run in one process
# with the range checks below (CHECK_EACH): the configurator and the checks run before anything
# loads, and test_bad_value_ends_a_real_run_before_anything_loads shows that a real run stops there
BAD = [
    (["--no_such_key=1"], "unknown config key 'no_such_key'"),
    (["--learning_rate='fast'"], "learning_rate='fast' is str, expected float"),
    (["--max_iters=2.5"], "max_iters=2.5 is float, expected int"),
    (["--wandb_log=1"], "wandb_log=1 is int, expected bool"),
    (["config/does_not_exist.py"], "cannot read config file 'config/does_not_exist.py'"),
    (["--max_iters"], "expected --key=value"),
    (["--loss_type=ppo2"], "loss_type='ppo2'; valid: grpo"),
    (["--adv_scale=std"], "adv_scale='std'; valid: group, batch, none"),
    (["--old_logp_source=vllm"], "old_logp_source='vllm'; valid: policy, rollout"),
    (["--old_logp_source=rollout", "--rollout_engine=hf"],
     "old_logp_source='rollout' needs rollout_engine='vllm'"),
    (["--TASKS={}"], "unknown config key 'TASKS'"),  # imported tables are not config
    (["--LOSS_TYPES=()"], "unknown config key 'LOSS_TYPES'"),
    (["--eps_high=abc"], "eps_high='abc' is str, expected float"),  # None default, annotated
    (["--value_warmup_steps=2.5"], "value_warmup_steps=2.5 is float, expected int"),
    (["--tis_mode=token_truncate", "--rollout_engine=hf"],
     "tis_mode='token_truncate' corrects for the sampler's"),
    (["--parallel=zero3"], "parallel='zero3'; valid: ddp, fsdp"),
    (["--parallel=fsdp", "--rollout_engine=hf"], "parallel='fsdp' needs rollout_engine='vllm'"),
    (["--dtype=float16"], "dtype='float16' trains without a gradient scaler (small gradients "
                          "underflow to 0): use 'bfloat16' where the hardware has it, else 'float32'"),
    (["--dtype=fp32"], "dtype='fp32'; valid: auto, float32, bfloat16"),
    (["--lora_alpha=16"], "lora_alpha=16.0 is set but lora_rank=0 (LoRA off): set lora_rank too"),
    (["--reward_control=coin"], "reward_control='coin'; valid: none, random, shuffled"),
    (["--tool=calculator"], "tool='calculator'; valid: calc"),
    (["--screen_size=2"], "screen_size=2 needs dynamic_sampling=True and 2 <= screen_size < "),
    (["--dynamic_sampling=True", "--screen_size=8"], "screen_size=8 needs dynamic_sampling=True"),
    (["--dynamic_sampling=True", "--screen_size=1"], "screen_size=1 needs dynamic_sampling=True"),
    # the shell's --stop_string=\n is a backslash and an n: a stop that never comes, not a newline
    (["--stop_string=\\n"], "stop_string='\\\\n' holds a backslash and an n: for a newline write"),
    (["--tool=calc", "--stop_string='.'"], "stop_string='.' with tool='calc': a tool's turns stop"),
]


@pytest.mark.parametrize("args, expected", BAD, ids=[" ".join(args) for args, _ in BAD])
def test_bad_config_is_one_clear_line(checked, args, expected):
    status, out, err, _ = checked[tuple(args)]
    assert status == 2, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert expected in last, last


# Every number's range check in train.py, one bad value each: (--key=value, the valid range). The
# error must read "config error: key=value must be <range>".
RANGES = [
    ("--reward_wrong=1.5", "<= 1 (a right answer scores 1.0)"), ("--format_coef=-0.1", ">= 0"),
    ("--length_reward_coef=-0.1", ">= 0"), ("--length_reward_warmup=-1", ">= 0"),
    ("--max_bad_rows=-1", ">= 0"), ("--max_prompt_len=0", ">= 1"),
    ("--reward_timeout=0.0", "> 0"), ("--prompts_per_step=0", ">= 1"),
    ("--group_size=1", ">= 2 (a group advantage needs 2 samples per prompt)"),
    ("--max_new_tokens=0", ">= 1"), ("--overlong_buffer=99", "in [0, max_new_tokens=16]"),
    ("--overlong_buffer=-1", "in [0, max_new_tokens=16]"), ("--temperature=0.0", "> 0"),
    ("--top_p=0.0", "in (0, 1]"), ("--top_p=1.5", "in (0, 1]"), ("--top_k=-1", ">= 0"),
    ("--oversample=0.5", ">= 1"), ("--max_gen_batches=-1", ">= 0"),
    ("--vllm_gpu_memory_utilization=0.0", "in (0, 1]"),
    ("--vllm_gpu_memory_utilization=1.5", "in (0, 1]"),
    ("--num_iterations=0", ">= 1"), ("--eps_low=1.0", "in [0, 1)"),
    ("--eps_low=-0.1", "in [0, 1)"), ("--eps_high=-0.1", ">= 0"),
    ("--tau_pos=0.0", "> 0"), ("--tau_neg=-1.0", "> 0"), ("--cispo_eps_high=-1.0", ">= 0"),
    ("--clip_cov_ratio=1.5", "in [0, 1]"), ("--clip_cov_lb=6.0", "<= clip_cov_ub=5.0"),
    ("--kl_cov_ratio=-0.1", "in [0, 1]"), ("--kl_cov_coef=-1.0", ">= 0"), ("--beta=-0.1", ">= 0"),
    ("--entropy_coef=1e999", "finite"), ("--tis_cap=0.0", "> 0"), ("--critic_lr=-1.0", ">= 0"),
    ("--vf_clip=0.0", "> 0"), ("--gae_lambda=1.5", "in [0, 1]"),
    ("--value_warmup_steps=-1", ">= 0"), ("--lam_alpha=0.0", "> 0"),
    ("--lm_coef=-0.1", ">= 0"), ("--learning_rate=-1.0", ">= 0"), ("--weight_decay=-0.1", ">= 0"),
    ("--beta1=1.0", "in [0, 1)"), ("--beta2=-0.1", "in [0, 1)"),
    ("--grad_clip=-1.0", ">= 0"),
    ("--warmup_iters=-1", ">= 0"), ("--max_iters=-1", ">= 0"), ("--micro_batch_size=0", ">= 1"),
    ("--max_tokens_per_micro=0", ">= 1"), ("--eval_interval=-1", ">= 0"),
    ("--eval_samples=0", ">= 1"),
    ("--eval_problems=0", ">= 1"),
    ("--ckpt_interval=-2", ">= -1 (-1: never)"), ("--max_bad_steps=0", ">= 1"),
    ("--warn_truncated=1.5", "in [0, 1]"), ("--warn_degenerate_steps=-1", ">= 0"),
    ("--warn_mismatch=-1.0", ">= 0"), ("--stop_mismatch=-1.0", ">= 0"),
    ("--lora_rank=-1", ">= 0"), ("--lora_alpha=0.0", "> 0"),
    ("--curriculum_window=-1", ">= 0"), ("--curriculum_cooldown=-1", ">= 0"),
    ("--warn_reward_gap=-0.1", ">= 0"), ("--warn_length_rise=-0.5", ">= 0"),
    ("--min_lr=1e-3", "in [0, learning_rate=2e-05]"), ("--min_lr=-1e-6", "in [0, learning_rate=2e-05]"),
    ("--lr_decay_iters=0", ">= 1"),
    ("--max_tool_calls=-1", ">= 0"), ("--tool_timeout=0.0", "> 0"),
]
NO_MODEL = "--init_from=tests"  # any folder passes the checks: they load nothing
# values at the edge of a range, or meaningful though unusual: accepted
VALID = [[NO_MODEL], ["--init_from=resume"], ["--init_from=owner/name"],  # a hub id, hub online
         [NO_MODEL, "--top_p=1.0", "--learning_rate=0.0", "--grad_clip=0.0", "--eps_low=0.0",
          "--eps_high=0.0", "--reward_wrong=-1.0", "--gae_lambda=1.0", "--clip_cov_lb=5.0"],
         [NO_MODEL, "--entropy_coef=-0.01"],  # entropy minimisation
         [NO_MODEL, "--stop_string='\\n'"],  # Python's quotes kept: a newline
         [NO_MODEL, "--eval_interval=0", "--eval_samples=0", "--eval_problems=0"],
         [NO_MODEL, "--value_warmup_steps=0", "--ckpt_interval=-1", "--max_iters=0"]]
# the advantage's scale: the variant's default (VARIANTS' adv), an explicit adv_scale still wins
ADV_SCALES = [([NO_MODEL, "--loss_type=dr_grpo"], "none"), ([NO_MODEL, "--loss_type=dapo"], "group"),
              ([NO_MODEL, "--loss_type=dr_grpo", "--adv_scale=batch"], "batch")]
VALID += [args for args, _ in ADV_SCALES]

# train.py from the top to the end of its config section (the configurator with its checks, and
# the variant's defaults: all that runs before data and model load), once per argv, in one
# process: a train.py start costs ~5 s of imports, 80 of them minutes
CHECK_EACH = """
import contextlib, io, json, sys
lines = open('train.py').read().splitlines(keepends=True)
start = next(i for i, line in enumerate(lines) if line.startswith("exec(open("))
end = next(i for i in range(start, len(lines)) if lines[i].startswith('# ---'))
head = compile(''.join(lines[:end]), 'train.py', 'exec')
results = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ['train.py', *argv]
    out, err = io.StringIO(), io.StringIO()
    config = {'__name__': '__main__', '__file__': 'train.py'}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(head, config)
            status = 0
        except SystemExit as e:
            status = e.code
    results.append((status, out.getvalue(), err.getvalue(), config.get('adv_scale')))
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def checked():
    """{argv: (exit status, stdout, stderr, adv_scale after the checks)} of train.py's checks for
    VALID, BAD and RANGES."""
    # VALID first: any import noise lands there
    cases = VALID + [args for args, _ in BAD] + [[arg] for arg, _ in RANGES]
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # 'owner/name' is valid with the hub on
    env = {k: v for k, v in os.environ.items() if k not in offline}
    result = subprocess.run([sys.executable, "-c", CHECK_EACH, json.dumps(cases)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return dict(zip(map(tuple, cases), json.loads(result.stdout.splitlines()[-1])))


@pytest.mark.parametrize("arg, valid", RANGES, ids=[arg[2:] for arg, _ in RANGES])
def test_out_of_range_is_one_config_error(checked, arg, valid):
    key, _, value = arg[2:].partition("=")
    status, out, err, _ = checked[(arg,)]
    expected = f"config error: {key}={ast.literal_eval(value)!r} must be {valid}\n"
    assert (status, err) == (2, expected)
    assert all(line.startswith("Overriding") for line in out.splitlines()), out


@pytest.mark.parametrize("args", VALID, ids=" ".join)
def test_in_range_passes_the_checks(checked, args):
    status, out, err, _ = checked[tuple(args)]
    assert status == 0, err


@pytest.mark.parametrize("args, scale", ADV_SCALES, ids=[" ".join(a[1:]) for a, _ in ADV_SCALES])
def test_the_advantage_scale_is_the_variants_unless_set(checked, args, scale):
    """--loss_type=dr_grpo alone is the whole of Dr. GRPO: no std division (it used to keep
    adv_scale='group', and only config/dr_grpo.py set 'none')."""
    assert checked[tuple(args)][3] == scale


@pytest.mark.parametrize("arg, error", [
    ("--temperature=0.0", "temperature=0.0 must be > 0"),  # was HF generate's ValueError
    ("--max_new_tokens=0", "max_new_tokens=0 must be >= 1"),
    ("--learning_rate=-1.0", "learning_rate=-1.0 must be >= 0"),  # was AdamW's ValueError
    ("--init_from=does/not/exist",  # was the hub's OSError about a repo id
     "init_from='does/not/exist' is not a folder (and not a hub id 'owner/name')"),
    ("--top_p=0.0", "top_p=0.0 must be in (0, 1]"),  # was accepted
    ("--eval_samples=0", "eval_samples=0 must be >= 1"),  # was accepted
])
def test_bad_value_ends_a_real_run_before_anything_loads(arg, error):
    """The issue's cases as a user runs them: one line, exit code 2, and nothing on stdout but the
    configurator's own lines (setup, data and model loading would print)."""
    result = run_train(arg)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("config error:")]
    assert errors == [f"config error: {error}"] and "Traceback" not in result.stderr
    assert all(line.startswith("Overriding") for line in result.stdout.splitlines()), result.stdout


def test_hub_id_with_the_hub_offline_and_no_cached_copy():
    result = run_train("--init_from=nobody/no_such_model", env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "config error: init_from='nobody/no_such_model' is not a folder, and the hub is offline "
        "(HF_HUB_OFFLINE=1) with no cached copy of it")


def test_help_prints_every_key_with_its_value_and_comment():
    """--help: train.py's config section with the current values, after every other argument."""
    result = run_train("--help")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "# rollout" in lines and "# I/O" in lines  # the section comments
    assert any(line.startswith("temperature = 1.0") and "# sampling temperature" in line
               for line in lines)
    shown = {line.partition("  #")[0].rstrip() for line in lines}
    for key, (value, hint) in train_config().items():
        assert (f"{key}: {hint} = {value!r}" if hint else f"{key} = {value!r}") in shown, key
    # -h first, a config file and an override after it: printed after both were applied
    result = run_train("-h", "config/cpu_demo.py", "--max_iters=3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "out_dir = 'out/cpu_demo'" in result.stdout  # cpu_demo.py's, not the default 'out'
    assert any(line.startswith("max_iters = 3 ") for line in result.stdout.splitlines())


def test_bad_key_inside_config_file(tmp_path):
    cfg = tmp_path / "bad.py"
    cfg.write_text("learning_rate = 1e-5\nlearning_rat = 3e-4  # typo\n")
    result = run_train(str(cfg))
    assert result.returncode == 2
    assert f"{cfg}: unknown config key 'learning_rat'" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("line, name", [
    ("TASKS = {}", "TASKS"), ("LOSS_TYPES = ()", "LOSS_TYPES"), ("def helper(): 0", "helper")])
def test_config_file_may_assign_only_config_keys(tmp_path, line, name):
    """Besides config keys, a config file may define '_' helpers and import modules: no more."""
    cfg = tmp_path / "bad.py"
    cfg.write_text(f"import math\n_lr = 1e-5\nlearning_rate = _lr\n{line}\n")
    result = run_train(str(cfg))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{cfg}: unknown config key {name!r}" in result.stderr.strip().splitlines()[-1]


def configurator(head, *argv):
    """Run configurator.py's parsing alone (no torch, not its checks of train.py's keys) over the
    globals that the code `head` defines (with config_keys and config_error, as train.py); it
    prints the config keys' values on its last line."""
    code = (f"import sys\n{head}\nsys.argv = ['x', *{list(argv)!r}]\n"
            "def config_error(msg):\n    print(f'config error: {msg}', file=sys.stderr)\n"
            "    sys.exit(2)\n"
            "exec(open('configurator.py').read().split('# checks that fail fast')[0])\n"
            "print(repr(tuple(globals()[k] for k in config_keys)))")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def run_configurator(head, *argv):
    result = configurator(head, *argv)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_config_keys_itself_is_not_a_key(tmp_path):
    cfg = tmp_path / "bad.py"
    cfg.write_text("config_keys = []\n")
    head = "learning_rate = 1.0; config_keys = ['learning_rate']"
    for argv, where in [(["--config_keys=[]"], ""), ([str(cfg)], f"{cfg}: ")]:
        result = configurator(head, *argv)
        assert result.returncode == 2
        assert result.stderr.strip() == f"config error: {where}unknown config key 'config_keys'"


def test_overrides_apply_in_order(tmp_path):
    """A config file, then --key=value on top; ints are accepted for floats. Checked via
    configurator alone."""
    cfg = tmp_path / "ok.py"
    cfg.write_text("import math\n_base = 1e-5\nlearning_rate = _base\nmax_iters = 7\n")
    head = ("learning_rate = 1.0; max_iters = 1; loss_type = 'grpo'; "
            "config_keys = ['learning_rate', 'max_iters', 'loss_type']")
    got = run_configurator(head, str(cfg), "--learning_rate=2", "--loss_type=dapo")
    assert got == "(2.0, 7, 'dapo')"


def test_none_defaults_take_their_annotated_type(tmp_path):
    """eps_high: float = None takes a float (an int becomes one) or None, and nothing else."""
    cfg = tmp_path / "ok.py"
    cfg.write_text("eps_low, eps_high = 0.2, 0.28\n")
    head = ("eps_low: float = None\neps_high: float = None\nvalue_warmup_steps: int = None\n"
            "config_keys = ['eps_low', 'eps_high', 'value_warmup_steps']")
    assert run_configurator(head) == "(None, None, None)"
    got = run_configurator(head, str(cfg), "--eps_low=0", "--value_warmup_steps=3")
    assert got == "(0.0, 0.28, 3)"
    assert run_configurator(head, str(cfg), "--eps_high=None") == "(0.2, None, None)"
    for arg, error in [("--eps_high=abc", "eps_high='abc' is str, expected float"),
                       ("--value_warmup_steps=2.5",
                        "value_warmup_steps=2.5 is float, expected int")]:
        result = configurator(head, arg)
        assert result.returncode == 2 and result.stderr.strip() == f"config error: {arg}: {error}"


def train_config():
    """train.py's config section, not run: {key: (default, annotation or None)}, read from the
    literal module-level assignments above its `config_keys` line (`eps_high: float = None` too)."""
    config = {}
    for node in ast.parse(open(os.path.join(ROOT, "train.py")).read()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else []
        if [getattr(t, "id", None) for t in targets] == ["config_keys"]:
            break
        if not targets or node.value is None or not all(isinstance(t, ast.Name) for t in targets):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        hint = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else None
        config.update({t.id: (value, hint) for t in targets})
    return config


def test_every_none_default_is_annotated():
    """configurator.py types a None default by its annotation; without one, any value would pass."""
    untyped = [k for k, (value, hint) in train_config().items() if value is None and hint is None]
    assert not untyped, f"annotate these train.py defaults, e.g. `{untyped[0]}: float = None`"


RECIPES = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_loads_and_names_a_valid_variant(recipe):
    """Each config/*.py runs through the configurator over train.py's defaults without an error."""
    from losses import LOSS_TYPES
    head = "\n".join(f"{k}: {hint} = {value!r}" if hint else f"{k} = {value!r}"
                     for k, (value, hint) in train_config().items())
    code = (f"import sys, json\n{head}\nconfig_keys = {sorted(train_config())!r}\n"
            "def config_error(msg):\n    sys.exit(f'config error: {msg}')\n"
            f"sys.argv = ['x', 'config/{recipe}']\n"
            "exec(open('configurator.py').read().split('# checks that fail fast')[0])\n"
            "print(json.dumps({k: globals()[k] for k in config_keys}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout.strip().splitlines()[-1])
    assert config["loss_type"] in LOSS_TYPES
    if recipe[:-3] in LOSS_TYPES:  # the variant recipes are named after their loss_type
        assert config["loss_type"] == recipe[:-3] and config["num_iterations"] == 2


def test_the_loss_knobs_defaults_are_train_pys():
    """losses.LOSS_HP names the knobs that reach policy_loss as one dict (train.py: its config's
    values); each is a train.py key with the same default (max_new_tokens, a rollout key that Dr.
    GRPO's constant needs, has none in losses.py)."""
    from losses import LOSS_HP
    defaults = {k: value for k, (value, _) in train_config().items()}
    assert {k: defaults[k] for k in LOSS_HP if k != "max_new_tokens"} == {
        k: v for k, v in LOSS_HP.items() if k != "max_new_tokens"}
