"""Tests for tools.py (the calculator, the registry, the worker's hard time limit) and
data/multiply/prepare.py. Fast, offline, no model:
    python -m pytest -q tests/test_tools.py

The user tools below are module-level functions of this file: a worker tool travels to the worker
by reference, so the worker imports this file (it finds it on the trainer's sys.path).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import rewards  # noqa: E402
import tools  # noqa: E402
from tools import MAX_ARGUMENT_CHARS, call_tool, calculator  # noqa: E402


def echo(argument):
    return argument[::-1]


def spin_in_c(argument):
    return sum(range(10 ** 14))  # hours inside one C call: no bytecode boundary, the GIL held


def backtrack(argument):
    return str(re.match(r"(a+)+$", "a" * 40 + "b"))  # catastrophic backtracking, inside re's C code


def divide(argument):
    return 1 / 0


def an_int(argument):
    return 42


def a_page(argument):
    return "x" * 1000


def die(argument):
    os._exit(3)


@pytest.fixture
def user_tools(monkeypatch):
    """This file's tools in tools.TOOLS for one test; the worker stopped after it."""
    for fn in (echo, spin_in_c, backtrack, divide, an_int, a_page, die):
        monkeypatch.setitem(tools.TOOLS, fn.__name__, fn)
    yield
    tools.stop_worker()


def alive(pid):
    """True while pid is a process that is not a zombie (a zombie has exited, not been reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------------------
# the calculator: exact, parsed, never executed, capped as countdown's verifier

@pytest.mark.parametrize("expression, expected", [
    ("347*86", "29842"), ("(1+2)/4", "3/4"), ("1+2*3", "7"), ("(1+2)*3", "9"), ("10-4-3", "3"),
    ("2*3/4", "3/2"), ("7/2", "7/2"), ("8/4", "2"), ("1-5", "-4"), ("2-15/4", "-7/4"),
    (" 12 *\n3 ", "36"), ("6 / (1 - 3 / 4)", "24"), ("999999*999999", "999998000001"),
])
def test_calculator_is_exact(expression, expected):
    assert calculator(expression) == expected
    assert call_tool("calc", expression) == (expected, None)


@pytest.mark.parametrize("expression, expected", [
    ("7/0", "division by zero"), ("1/(2-2)", "division by zero"),
    ("1" * 201, "expression longer than 200 characters"),
    ("1234567*2", "a number longer than 6 digits"),
    ("(" * 11 + "1" + ")" * 11, "parentheses nested deeper than 10"),
    ("__import__('os').system('ls')", "only digits, + - * / ( ) and spaces are allowed"),
    ("abc", "only digits, + - * / ( ) and spaces are allowed"),
    ("2.5*2", "only digits, + - * / ( ) and spaces are allowed"),
    ("2**10", "not allowed: Pow"), ("7//2", "not allowed: FloorDiv"), ("-3*4", "not allowed: USub"),
    ("(1+2", "syntax error"), ("", "syntax error"), ("1 2", "syntax error"),
    ("06*2", "syntax error"),  # a leading zero is no Python int literal
])
def test_calculator_errors_are_strings(expression, expected):
    assert calculator(expression) == f"error: {expected}"
    assert call_tool("calc", expression) == (f"error: {expected}", None)  # the calculator's answer


def test_hostile_calls_are_answered_within_the_caps_and_fast():
    product = "*".join(["999999"] * 28)  # 195 characters, 168 digits: over MAX_RESULT_CHARS
    shorter = "*".join(["999999"] * 14)  # 97 characters, 84 digits: answered exactly
    assert len(product) <= 200
    hostile = [product, shorter, "1/" + "/".join(["999999"] * 28), "(" * 10 + "1" + ")" * 10,
               "(" * 10 ** 5, "9" * 10 ** 6, "2**2**2**2**2", "9**9**9", "1e309", "lambda: 1",
               "().__class__.__bases__[0]", "open('/etc/passwd').read()", "\x00", "٣*٤",
               "x" * 10 ** 6]
    start = time.perf_counter()
    answers = [call_tool("calc", h) for h in hostile]
    elapsed = time.perf_counter() - start
    assert answers[0] == ("error: result too long", None)
    assert answers[1] == (str(999999 ** 14), None)
    assert answers[2] == ("error: result too long", None)  # 1/999999**28: 169 characters
    assert answers[3] == ("1", None)  # nesting 10: at the cap, allowed
    assert answers[4] == answers[5] == answers[-1] == (
        f"error: argument longer than {MAX_ARGUMENT_CHARS} characters", "too_long")
    assert all(text.startswith("error: ") for text, _ in answers[4:]), answers
    assert calculator("9" * 10 ** 6) == "error: expression longer than 200 characters"
    assert elapsed < 0.1, f"{len(hostile)} hostile calls took {elapsed:.3f} s"


def test_unknown_and_unpicklable_tools_are_config_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        call_tool("nope", "1")
    monkeypatch.setitem(tools.TOOLS, "anonymous", lambda argument: argument)
    with pytest.raises(ValueError, match="module-level function"):
        call_tool("anonymous", "1")


# ----------------------------------------------------------------------------
# user tools: in a worker process, with a hard time limit that stops any code

@pytest.mark.parametrize("loop", ["spin_in_c", "backtrack"])
def test_a_tool_looping_in_c_times_out_and_the_worker_restarts(user_tools, loop):
    assert call_tool("echo", "abc", 5.0) == ("cba", None)  # a warm worker
    pid = tools._worker[0].pid
    start = time.perf_counter()
    assert call_tool(loop, "x", 0.5) == ("error: timeout", "timeout")
    assert time.perf_counter() - start < 2.0
    assert tools._worker is None and not alive(pid)  # killed and reaped: no zombie
    assert call_tool("echo", "xyz", 5.0) == ("zyx", None)  # restarted
    assert tools._worker[0].pid != pid


def test_a_tools_failures_are_results_the_model_sees(user_tools):
    assert call_tool("divide", "1", 5.0) == ("error: ZeroDivisionError", "exception")
    pid = tools._worker[0].pid
    assert call_tool("an_int", "1", 5.0) == ("42", None)  # str()'d
    assert call_tool("a_page", "1", 5.0) == ("error: result too long", "too_long")  # refused
    assert call_tool("echo", "y" * (MAX_ARGUMENT_CHARS + 1), 5.0) == (
        f"error: argument longer than {MAX_ARGUMENT_CHARS} characters", "too_long")
    assert tools._worker[0].pid == pid  # the same worker throughout
    assert call_tool("die", "1", 5.0) == ("error: worker died", "exception")
    assert not alive(pid) and call_tool("echo", "ab", 5.0) == ("ba", None)


def test_no_orphan_when_the_trainer_is_killed_mid_call(tmp_path):
    """The trainer SIGKILLed while its worker spins in C: the kernel kills the worker too."""
    (tmp_path / "slow.py").write_text(
        "def spin(marker):\n    open(marker, 'w').close()\n    return sum(range(10 ** 14))\n")
    marker = tmp_path / "spinning"
    (tmp_path / "trainer.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{REPO!r}, {str(tmp_path)!r}]
        import slow, tools
        tools.TOOLS['spin'] = slow.spin
        tools.TOOLS['calc_in_worker'] = tools.calculator  # not in IN_PROCESS: runs in the worker
        tools.call_tool('calc_in_worker', '1+1', 30.0)
        print(tools._worker[0].pid, flush=True)
        tools.call_tool('spin', {str(marker)!r}, 600.0)
    """))
    trainer = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py")],
                               stdout=subprocess.PIPE, text=True)
    try:
        pid = int(trainer.stdout.readline())
        deadline = time.time() + 10
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert marker.exists() and alive(pid)  # the worker is inside the C loop
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.time() + 5
    while alive(pid) and time.time() < deadline:
        time.sleep(0.02)
    assert not alive(pid)


def test_a_tool_the_worker_cannot_import_is_a_config_error(user_tools, tmp_path, monkeypatch):
    """The worker takes sys.path when it starts: a module found only on a later path is not
    found there, and that is the config's error, said at the first call."""
    assert call_tool("echo", "ab", 5.0) == ("ba", None)
    (tmp_path / "late_tools.py").write_text("def upper(argument):\n    return argument.upper()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_tools
    monkeypatch.setitem(tools.TOOLS, "upper", late_tools.upper)
    with pytest.raises(ValueError, match="did not load in the worker .ModuleNotFoundError"):
        call_tool("upper", "ab", 5.0)
    assert call_tool("upper", "ab", 5.0) == ("AB", None)  # a fresh worker, started on this path


# ----------------------------------------------------------------------------
# the call format, and the verifier's agreement with it

def test_the_call_format():
    assert tools.tags("calc") == (tools.CALL_OPEN, tools.CALL_CLOSE) == ("<calc>", "</calc>")
    assert (tools.RESULT_OPEN, tools.RESULT_CLOSE) == ("<result>", "</result>")
    assert tools.call_argument("so <calc>1+1</calc> then <calc>347*86</calc>") == "347*86"
    assert tools.call_argument("<calc>347*86") is None
    assert tools.call_argument("347*86</calc>") is None
    assert tools.call_argument("<search>nanoGPT</search>", "search") == "nanoGPT"


def test_the_multiply_verifier_strips_tools_own_tags():
    """rewards.py spells the tags itself (an import of tools.py would be a cycle): they agree."""
    call = tools.CALL_OPEN + "347*86" + tools.CALL_CLOSE
    result = tools.RESULT_OPEN + calculator("347*86") + tools.RESULT_CLOSE
    assert rewards.without_tool_blocks(f"a{call}b{result}c") == "a b c"


# ----------------------------------------------------------------------------
# data/multiply/prepare.py

def test_multiply_prepare_with_and_without_the_tool(tmp_path):
    script = shutil.copy(os.path.join(REPO, "data", "multiply", "prepare.py"), tmp_path)
    for flags, out in [([], tmp_path), (["--tool=0", f"--out_dir={tmp_path / 'notool'}"],
                                        tmp_path / "notool")]:
        subprocess.run([sys.executable, script, "--num_train=500"] + flags, check=True,
                       capture_output=True, timeout=60)

    def rows(directory, split):
        with open(os.path.join(directory, f"{split}.jsonl")) as f:
            return [json.loads(line) for line in f]
    test, train = rows(tmp_path, "test"), rows(tmp_path, "train")
    assert len(test) == 200 and len(train) == 500
    pairs = [(r["meta"]["a"], r["meta"]["b"]) for r in test + train]
    assert all(100 <= a <= 999 and 10 <= b <= 99 for a, b in pairs)
    assert all(r["answer"] == str(r["meta"]["a"] * r["meta"]["b"]) for r in test + train)
    held_out = {(r["meta"]["a"], r["meta"]["b"]) for r in test}
    assert len(held_out) == 200 and not held_out & set(pairs[200:]) and (123, 45) not in pairs
    a, b = test[0]["meta"]["a"], test[0]["meta"]["b"]
    # the example is a turn of the chat, the question the last message
    system, question, reply, prompt = test[0]["prompt"]
    assert system["role"] == "system" and "<calc>EXPRESSION</calc>" in system["content"]
    assert question == {"role": "user", "content": "What is 123 * 45?"}
    assert reply == {"role": "assistant",
                     "content": "<calc>123*45</calc><result>5535</result> 123 * 45 = 5535"}
    assert prompt == {"role": "user", "content": f"What is {a} * {b}?"}
    # the same problems without the tool
    for split, with_tool in [("test", test), ("train", train)]:
        without = rows(tmp_path / "notool", split)
        assert [r["meta"] for r in without] == [r["meta"] for r in with_tool]
        assert [r["answer"] for r in without] == [r["answer"] for r in with_tool]
    assert rows(tmp_path / "notool", "test")[0]["prompt"] == [
        question, {"role": "assistant", "content": "123 * 45 = 5535"}, prompt]
    # the example's own answer, written as the prompt shows it, is right
    answer = f"{tools.CALL_OPEN}{a}*{b}{tools.CALL_CLOSE}{tools.RESULT_OPEN}" \
             f"{calculator(f'{a}*{b}')}{tools.RESULT_CLOSE} {a} * {b} = {a * b}"
    assert rewards.TASKS["multiply"].score(answer, test[0]["answer"]) == 1.0
    assert rewards.TASKS["multiply"].format(answer) == 1.0
