"""configurator.py: every bad-config case is one clear line on stderr and exit code 2, before any model loads."""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def run_train(*args):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


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
    (["--old_logp_source=rollout", "--rollout_engine=hf"], "old_logp_source='rollout' needs rollout_engine='vllm'"),
    (["--max_tokens_per_micro=0"], "max_tokens_per_micro must be >= 1"),
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


def test_overrides_apply_in_order(tmp_path):
    """A config file, then --key=value on top; ints are accepted for floats. Checked via configurator alone."""
    cfg = tmp_path / "ok.py"
    cfg.write_text("import math\nlearning_rate = 1e-5\nmax_iters = 7\n")
    code = ("import sys; learning_rate = 1.0; max_iters = 1; loss_type = 'grpo'; "
            f"sys.argv = ['x', {str(cfg)!r}, '--learning_rate=2', '--loss_type=dapo']; "
            "exec(open('configurator.py').read()); print(repr((learning_rate, max_iters, loss_type)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "(2.0, 7, 'dapo')"


def train_defaults():
    """The config globals of train.py (literal assignments at module level), without running it."""
    defaults = {}
    for node in ast.parse(open(os.path.join(ROOT, "train.py")).read()).body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            defaults.update({t.id: value for t in node.targets})
    return defaults


RECIPES = sorted(f for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_loads_and_names_a_valid_variant(recipe):
    """Each config/*.py runs through the configurator over train.py's defaults without an error."""
    from losses import LOSS_TYPES
    defaults = train_defaults()
    code = (f"import sys, json; globals().update({defaults!r}); sys.argv = ['x', 'config/{recipe}']; "
            "exec(open('configurator.py').read()); print(json.dumps({k: globals()[k] for k in " + repr(sorted(defaults)) + "}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout.strip().splitlines()[-1])
    assert config["loss_type"] in LOSS_TYPES
    if recipe[:-3] in LOSS_TYPES:  # the variant recipes are named after their loss_type
        assert config["loss_type"] == recipe[:-3] and config["num_iterations"] == 2
