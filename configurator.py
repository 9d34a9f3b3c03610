"""
Poor man's configurator, after nanoGPT. train.py runs `exec(open('configurator.py').read())`, so this
file executes inside train.py's globals, where every default is already defined.

    python train.py config/cpu_demo.py --learning_rate=1e-5 --loss_type=dapo

A bare argument is a Python config file executed over those globals; `--key=value` overrides one key,
parsed with ast.literal_eval (a bare word stays a string). Either way the new value must have the
default's type (an int is fine where a float is expected). A missing file, an unknown key or a wrong
type prints one line that names it and exits with code 2.
"""
import sys
import types
from ast import literal_eval


def _fail(msg):
    print(f"config error: {msg}", file=sys.stderr)
    sys.exit(2)


def _check_type(key, value, where):
    default = _defaults[key]
    if default is None or value is None:
        return value
    ok = (type(value) is type(default)) if isinstance(default, bool) or isinstance(value, bool) \
        else isinstance(value, (int, float)) if isinstance(default, float) else isinstance(value, type(default))
    if not ok:
        _fail(f"{where}: {key}={value!r} is {type(value).__name__}, expected {type(default).__name__}")
    return float(value) if isinstance(default, float) else value


_defaults = {k: v for k, v in globals().items() if not k.startswith('_')
             and isinstance(v, (int, float, bool, str, list, tuple, dict, type(None)))}
for _arg in sys.argv[1:]:
    if not _arg.startswith('--'):  # a config file
        try:
            _src = open(_arg).read()
        except OSError as e:
            _fail(f"cannot read config file {_arg!r}: {e.strerror}")
        print(f"Overriding config with {_arg}")
        _scope = {k: globals()[k] for k in _defaults}
        try:
            exec(compile(_src, _arg, 'exec'), _scope)
        except Exception as e:
            _fail(f"{_arg}: {type(e).__name__}: {e}")
        for _key, _val in _scope.items():
            if _key.startswith('_') or isinstance(_val, types.ModuleType):
                continue
            if _key not in _defaults:
                _fail(f"{_arg}: unknown config key {_key!r}")
            globals()[_key] = _check_type(_key, _val, _arg)
    else:  # --key=value
        _key, _eq, _val = _arg[2:].partition('=')
        if not _eq:
            _fail(f"expected --key=value, got {_arg!r}")
        if _key not in _defaults:
            _fail(f"unknown config key {_key!r}")
        try:
            _val = literal_eval(_val)
        except (SyntaxError, ValueError):
            pass  # a bare word such as --loss_type=dapo stays a string
        globals()[_key] = _check_type(_key, _val, _arg)
        print(f"Overriding: {_key} = {globals()[_key]!r}")
