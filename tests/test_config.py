"""configurator.py: every bad-config case is one clear line on stderr and exit code 2, before any model loads."""
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
