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

--help (or -h), anywhere on the command line: after the other arguments are applied, print
train.py's config section with each key's current value and its comment, then exit 0.
"""
import ast
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
_help = any(_arg in ('-h', '--help') for _arg in sys.argv[1:])
for _arg in sys.argv[1:]:
    if _arg in ('-h', '--help'):
        continue
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

if _help:
    # train.py's config section (from its '# config:' line to config_keys) is the documentation:
    # print it as it is, each key's default replaced by its current value, its comment kept
    _lines = open(__file__).read().splitlines()
    _start = next(i for i, line in enumerate(_lines) if line.startswith('# config:'))
    _end = next(i for i, line in enumerate(_lines) if line.startswith('config_keys'))
    _block = _lines[_start:_end]
    _keys, _inside = {}, set()  # first line of each key's assignment -> key; its other lines
    for _node in ast.parse('\n'.join(_block)).body:
        _target = _node.targets[0] if isinstance(_node, ast.Assign) else getattr(_node, 'target', 0)
        if getattr(_target, 'id', None) in _defaults:
            _keys[_node.lineno] = (_target.id, _block[_node.end_lineno - 1][_node.end_col_offset:])
            _inside.update(range(_node.lineno + 1, _node.end_lineno + 1))
    for _i, _line in enumerate(_block, 1):
        if _i in _keys:
            _key, _rest = _keys[_i]  # _rest: the spaces and the comment after the default
            _text = f"{_line.partition('=')[0]}= {globals()[_key]!r}"
            _col = len(_line) - len(_rest.lstrip())  # where the comment started: keep it there
            print(f"{_text.ljust(_col - 2)}  {_rest.strip()}" if _rest.strip() else _text)
        elif _i not in _inside:
            print(_line)
    sys.exit(0)
