"""
Poor man's configurator, after nanoGPT. train.py runs `exec(open('configurator.py').read())`, so this
file executes inside train.py's globals, where every default is already defined.

    python train.py config/cpu_demo.py --learning_rate=1e-5 --loss_type=dapo

A bare argument is a Python config file executed over those globals; `--key=value` overrides one key,
parsed with ast.literal_eval (a bare word stays a string). Only the names in train.py's
`config_keys` are keys: imported tables (REWARDS, LOSS_TYPES, ...) are not config. A config file may
also import modules and define helper names that start with '_'; any other name it assigns is an
unknown key. Either way the new value must have the default's type (an int is fine where a float is
expected); a key whose default is None takes its type from its annotation (`eps_high: float = None`)
and may stay None. A missing file, an unknown key or a wrong type prints one line that names it and
exits with code 2.
"""
import sys
import types
from ast import literal_eval


def _fail(msg):
    print(f"config error: {msg}", file=sys.stderr)
    sys.exit(2)


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
        _fail(f"{where}: {key}={value!r} is {type(value).__name__}, expected {expected.__name__}")
    return float(value) if expected is float else value


# Only train.py's config keys, not every global: imported tables such as REWARDS are not config.
_defaults = {k: globals()[k] for k in config_keys}
_annotations = globals().get('__annotations__', {})  # `eps_high: float = None` types a None default
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
