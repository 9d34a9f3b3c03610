"""configurator.py: every bad-config case is one clear line on stderr and exit code 2, before any
model loads."""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def run_train(*args):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, expected", [
    (["--no_such_key=1"], "unknown config key 'no_such_key'"),
    (["--learning_rate='fast'"], "learning_rate='fast' is str, expected float"),
    (["--max_iters=2.5"], "max_iters=2.5 is float, expected int"),
    (["--wandb_log=1"], "wandb_log=1 is int, expected bool"),
    (["config/does_not_exist.py"], "cannot read config file 'config/does_not_exist.py'"),
    (["--max_iters"], "expected --key=value"),
    (["--loss_type=ppo2"], "loss_type='ppo2'; valid: grpo"),
    (["--adv_scale=std"], "adv_scale='std'; valid: group, batch, none"),
    (["--overlong_buffer=99"], "overlong_buffer=99 must lie in 0..max_new_tokens=16"),
    (["--old_logp_source=vllm"], "old_logp_source='vllm'; valid: policy, rollout"),
    (["--old_logp_source=rollout", "--rollout_engine=hf"],
     "old_logp_source='rollout' needs rollout_engine='vllm'"),
    (["--max_tokens_per_micro=0"], "max_tokens_per_micro must be >= 1"),
    (["--REWARDS={}"], "unknown config key 'REWARDS'"),  # imported tables are not config
    (["--LOSS_TYPES=()"], "unknown config key 'LOSS_TYPES'"),
    (["--eps_high=abc"], "eps_high='abc' is str, expected float"),  # None default, annotated
    (["--value_warmup_steps=2.5"], "value_warmup_steps=2.5 is float, expected int"),
    (["--tis_mode=token_truncate", "--rollout_engine=hf"],
     "tis_mode='token_truncate' corrects for the sampler's"),
])
def test_bad_config_is_one_clear_line(args, expected):
    result = run_train(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert expected in last, last


def test_bad_key_inside_config_file(tmp_path):
    cfg = tmp_path / "bad.py"
    cfg.write_text("learning_rate = 1e-5\nlearning_rat = 3e-4  # typo\n")
    result = run_train(str(cfg))
    assert result.returncode == 2
    assert f"{cfg}: unknown config key 'learning_rat'" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("line, name", [
    ("REWARDS = {}", "REWARDS"), ("LOSS_TYPES = ()", "LOSS_TYPES"), ("def helper(): 0", "helper")])
def test_config_file_may_assign_only_config_keys(tmp_path, line, name):
    """Besides config keys, a config file may define '_' helpers and import modules: no more."""
    cfg = tmp_path / "bad.py"
    cfg.write_text(f"import math\n_lr = 1e-5\nlearning_rate = _lr\n{line}\n")
    result = run_train(str(cfg))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{cfg}: unknown config key {name!r}" in result.stderr.strip().splitlines()[-1]


def configurator(head, *argv):
    """Run configurator.py alone (no torch) over the globals that the code `head` defines (with
    config_keys, as train.py); it prints the config keys' values on its last line."""
    code = (f"import sys\n{head}\nsys.argv = ['x', *{list(argv)!r}]\n"
            "exec(open('configurator.py').read())\n"
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
            f"sys.argv = ['x', 'config/{recipe}']\nexec(open('configurator.py').read())\n"
            "print(json.dumps({k: globals()[k] for k in config_keys}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout.strip().splitlines()[-1])
    assert config["loss_type"] in LOSS_TYPES
    if recipe[:-3] in LOSS_TYPES:  # the variant recipes are named after their loss_type
        assert config["loss_type"] == recipe[:-3] and config["num_iterations"] == 2
