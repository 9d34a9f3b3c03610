"""
Tools: the functions a model may call in the middle of its answer, and the sandbox they run in. A
room of its own: a reader of the GRPO path may skip it.

    <calc>347*86</calc>             the model's call: the tool's name is the tag, its argument in it
    <result>29842</result>          the world's answer, appended after the call
    TOOLS[name] -> fn(str) -> str   the registry; a config file may add to it: TOOLS['t'] = fn
    IN_PROCESS                      the names trusted to run in the trainer's process ({'calc'})
    call_tool(name, argument, timeout=5.0) -> (result_text, error_kind)   never raises on the
                                    model's input; error_kind None, 'timeout', 'exception' or
                                    'too_long'
    calculator(expression) -> str   exact + - * / and parentheses: '29842', '7/2', 'error: ...'
    tags(name) -> (open, close)     call_argument(text, name='calc') -> str or None
    stop_worker()                   kill and reap the worker (at exit too); a call restarts it

Which tokens are the policy's and which the world's. The call, `<calc>347*86</calc>`, is the
model's: sampled from the policy, so it gets a log-prob, an advantage and a loss like every other
token it wrote. The result, `<result>29842</result>`, is the world's: the model attends to it as
context (every later token is conditioned on it), but it is never trained on, for the policy did
not choose those tokens: there is no action to reinforce, and their log-probs under the policy say
nothing about the policy's choices. (Training on them would teach the model to predict the
calculator.)

Why a sandbox needs a hard time limit that stops any code. A model's argument reaches a user's tool,
and a tool can run forever on it: a catastrophic regex (re.match(r'(a+)+$', 'a' * 40 + 'b')), or
sum(range(10**14)). A thread or asyncio timeout (future.result(timeout=...), asyncio.wait_for) only
stops the waiting: the thread runs on, Python cannot kill a thread, and code inside one C call
never returns to the interpreter loop, so no exception can be raised into it; it holds the GIL
meanwhile, so the trainer's own threads starve too (verl #288: runs hung in its code sandbox;
asyncio.wait_for around a busy loop never fires). SIGALRM (rewards.time_limit) waits as well: a
Python signal handler runs between bytecodes, after the C call. Only the operating system stops any
code: a separate process, killed (SIGKILL) at the deadline. Every tool outside IN_PROCESS runs so;
the calculator stays in-process because it is capped and fast (rewards.parse_expression: 200
characters, 6-digit literals, nesting 10: microseconds, never a loop).

The worker: one process for the tools outside IN_PROCESS, started at the first call, reused across
calls (a call to a warm worker costs ~0.05 ms), killed at a timeout and restarted lazily at the next
call (~50 ms: a fresh interpreter importing this file and the tool's module). It is a fresh
interpreter, not a fork: the trainer runs threads (vLLM's, torch's), and a fork copies the locks
they hold but not the threads that would release them. It is started by subprocess, not by
multiprocessing's 'spawn': that re-runs the parent's __main__ script in the child, and train.py is
a script: the worker would start a second training run. The tool travels to the worker by
reference (pickled as module and name, imported there), so a worker tool must be a module-level
function of an importable module: not a lambda, a nested function or a function defined in a config
file (a config file runs in no module): `import mytools, tools; tools.TOOLS['search'] =
mytools.search`; the worker takes the trainer's sys.path when it starts. Calls take turns (a
lock): one worker, one call at a time.

No zombie, no orphan: a killed worker is reaped at once; stop_worker runs at exit; a worker waiting
for a call exits when the trainer's end of its pipe closes; and if the trainer dies without exiting
(SIGKILL, out of memory) mid-call, the kernel kills the worker (Linux: PR_SET_PDEATHSIG). The kernel
sends that signal when the *thread* that started the worker ends: a worker started from a
short-lived thread dies with it and is restarted at the next call (correct, only slower).

Results: a worker tool's return value is str()'d (an int becomes its digits), in the worker, under
the time limit. A result over MAX_RESULT_CHARS is refused ('error: result too long', 'too_long'),
not cut: a cut number is a wrong number the model would trust. An exception becomes its name only
('error: ZeroDivisionError'): a traceback is not context the model should attend to. A worker that
dies (a crash in C, os._exit) answers 'error: worker died' ('exception') and is restarted. The
calculator's own errors ('error: division by zero') are its answers: error_kind None. A tool that
cannot run in the worker at all (not picklable by reference, its module does not import there) is
the config's bug, not the model's: ValueError at its first call, before any result.
"""
import atexit
import os
import pickle
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from rewards import parse_expression

MAX_ARGUMENT_CHARS = 1000  # a longer argument is refused before any tool sees it
MAX_RESULT_CHARS = 100     # a longer result is refused: it would crowd the model's context
LOAD_TIMEOUT = 60.0        # seconds a worker may take to import a tool's module (the config's)
TOO_LONG = "error: result too long"


def tags(name):
    """A tool's call tags: the tool named 'calc' is called as <calc>ARGUMENT</calc>."""
    return f"<{name}>", f"</{name}>"


CALL_OPEN, CALL_CLOSE = tags('calc')
RESULT_OPEN, RESULT_CLOSE = '<result>', '</result>'


def call_argument(text, name='calc'):
    """The argument of the call `text` ends with ('... <calc>347*86</calc>' -> '347*86'), or None
    when it does not end with a closed call: what sampling stopped on the closing tag produced."""
    open_tag, close_tag = tags(name)
    if not text.endswith(close_tag):
        return None
    end = len(text) - len(close_tag)
    start = text.rfind(open_tag, 0, end)
    return text[start + len(open_tag):end] if start >= 0 else None


def calculator(expression):
    """Exact arithmetic over + - * / and parentheses, parsed, never executed (countdown's capped
    evaluator): '347*86' -> '29842', '(1+2)/4' -> '3/4', '7/0' -> 'error: division by zero'."""
    try:
        value = parse_expression(expression)
    except ValueError as e:
        return f"error: {e}"
    text = str(value)  # a Fraction's str: '29842' if an integer, else exact: '7/2', '-3/4'
    return text if len(text) <= MAX_RESULT_CHARS else TOO_LONG


TOOLS = {'calc': calculator}
IN_PROCESS = {'calc'}


def run_tool(fn, argument):
    """(result_text, error_kind) of one call, where it runs: the trainer (IN_PROCESS) or the
    worker. Exception, not BaseException: a tool's sys.exit ends the worker (which restarts)."""
    try:
        text = str(fn(argument))
    except Exception as e:  # noqa: BLE001 -- a tool's bug is an answer the model sees
        return f"error: {type(e).__name__}", 'exception'
    return (text, None) if len(text) <= MAX_RESULT_CHARS else (TOO_LONG, 'too_long')


def call_tool(name, argument, timeout=5.0):
    """Call the tool `name` on the model's `argument`: (result_text, error_kind). A tool outside
    IN_PROCESS runs in the worker, stopped after `timeout` seconds of the call itself ('error:
    timeout', 'timeout'); in-process tools run to completion (they are trusted to be capped)."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}: tools.TOOLS has {sorted(TOOLS)}")
    if len(argument) > MAX_ARGUMENT_CHARS:
        return f"error: argument longer than {MAX_ARGUMENT_CHARS} characters", 'too_long'
    if name in IN_PROCESS:
        return run_tool(TOOLS[name], argument)
    try:
        request = pickle.dumps((TOOLS[name], argument))
    except Exception as e:  # a lambda, a nested function, a function of a config file
        raise ValueError(f"tool {name!r} cannot run in the worker ({e}): it must be a module-level "
                         "function of an importable module (tools.py's docstring)") from None
    with _lock:
        return _call_in_worker(name, request, timeout)


# ----------------------------------------------------------------------------
# the worker: a separate process, so a timeout can kill whatever the tool is running

_worker = None  # (process, requests, replies) while one is running
_lock = threading.RLock()  # one call at a time; reentrant: _call_in_worker calls stop_worker


def _start_worker():
    # Two pipes, one each way; the worker gets its ends by number (pass_fds), and its stdin, stdout
    # and stderr stay the trainer's (a tool may print).
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); import tools; "
            f"tools._serve({requests_r}, {replies_w}, {os.getpid()})")
    process = subprocess.Popen([sys.executable, '-c', code], pass_fds=(requests_r, replies_w))
    os.close(requests_r)
    os.close(replies_w)
    requests = Connection(requests_w, readable=False)
    replies = Connection(replies_r, writable=False)
    requests.send(sys.path)  # the trainer's import path: the worker finds the tools' modules too
    return process, requests, replies


def _serve(requests_fd, replies_fd, parent_pid):
    """The worker's loop: load a call (fn, argument), say it loaded (the call's clock starts then,
    not during the import of fn's module), run it, send (result_text, error_kind)."""
    try:  # Linux: the kernel SIGKILLs this process when the thread that started it ends
        import ctypes
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the end-of-file below still ends an idle worker
        pass
    if os.getppid() != parent_pid:  # the trainer died before the line above: nobody to serve
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's; its exit stops us
    requests = Connection(requests_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    sys.path[:] = requests.recv()
    while True:
        try:
            fn, argument = pickle.loads(requests.recv_bytes())
        except EOFError:  # the trainer closed its end, or died
            return
        except Exception as e:  # noqa: BLE001 -- fn's module does not import here: tell the trainer
            replies.send(f"{type(e).__name__}: {e}")
            continue
        replies.send(None)
        replies.send(run_tool(fn, argument))


def _call_in_worker(name, request, timeout):
    global _worker
    if _worker is None or _worker[0].poll() is not None:  # not started yet, or died since
        stop_worker()
        _worker = _start_worker()
    _, requests, replies = _worker
    try:
        requests.send_bytes(request)
        loaded = replies.recv() if replies.poll(LOAD_TIMEOUT) else f"no answer in {LOAD_TIMEOUT} s"
        if loaded is None:
            if not replies.poll(timeout):
                stop_worker()  # SIGKILL: stops any code, a C loop included
                return "error: timeout", 'timeout'
            return replies.recv()
    except (EOFError, OSError):  # the worker died: a crash in C, os._exit, out of memory
        stop_worker()
        return "error: worker died", 'exception'
    stop_worker()
    raise ValueError(f"tool {name!r} did not load in the worker ({loaded}): it must be a module-"
                     "level function of a module the worker can import (tools.py's docstring)")


def stop_worker():
    """Kill the worker, if any, and reap it (no zombie); the next call starts a fresh one."""
    global _worker
    with _lock:
        if _worker is None:
            return
        process, requests, replies = _worker
        _worker = None
        process.kill()  # SIGKILL; nothing if it has already exited
        process.wait()
        requests.close()
        replies.close()


atexit.register(stop_worker)


# -----------------------------------------------------------------------------
# the multi-turn rollout: the model's turns and the tool's results, as token ids

def tool_rollout(sample_turns, tokenizer, prompts, max_new_tokens, name, max_tool_calls, timeout):
    """Multi-turn samples: each prompt is continued until the model ends (an EOS) or closes a call
    (CALL_CLOSE of the tool `name`); the tool answers, its result is appended as token ids and the
    sample continues, up to max_tool_calls calls and max_new_tokens tokens after the prompt in all
    (the model's and the tool's). Samples continue independently: each turn asks the engine for
    every unfinished sample at once (sample_turns: rollout.sample_turns on the engine).

    Token-in / token-out: the completion is the sampler's own ids, turn after turn, and the tool's
    ids as encoded once here; the next turn is sampled after exactly these ids and the trainer
    scores exactly them. Decoding the conversation and encoding it again would give other ids at
    the seams (TRL #5224, verl #3960): the trainer would score tokens the sampler never produced.

    Returns per-sample lists: completion_ids (model and tool tokens), model_mask (1 on the model's
    tokens, 0 on the tool's: the tool's are context, attended to and never trained on),
    rollout_logp (the sampler's log-probs, 0 on the tool's tokens; None from HF), truncated (the
    budget ran out, in a turn or in a result), tool_calls and tool_errors (per sample)."""
    call_open, call_close = tags(name)
    n = len(prompts)
    ids, mask, logps = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    calls, errors, truncated = [0] * n, [0] * n, [False] * n
    active = list(range(n))
    while active:
        turns = sample_turns([prompts[i] + ids[i] for i in active],
                             [max_new_tokens - len(ids[i]) for i in active],
                             [call_close if calls[i] < max_tool_calls else None for i in active])
        still = []
        for i, (new, new_logp, finish) in zip(active, turns):
            # a call opened in the prompt (a reply begun with CALL_OPEN) is closed in the first turn
            opened = tokenizer.decode(prompts[i][-8:]) if not ids[i] else ''
            ids[i] += new
            mask[i] += [1] * len(new)
            logps[i] += new_logp if new_logp is not None else [0.0] * len(new)
            if finish != 'stop':  # the model ended its answer, or the budget did
                truncated[i] = finish == 'length'
                continue
            text = opened + tokenizer.decode(new)  # (its last token may run past the close)
            argument = call_argument(text[:text.find(call_close) + len(call_close)], name)
            result = (f"error: {call_close} without {call_open}" if argument is None
                      else call_tool(name, argument, timeout)[0])
            calls[i] += 1
            errors[i] += result.startswith('error:')  # the sandbox's, or the tool's own answer
            result_ids = tokenizer.encode(RESULT_OPEN + result + RESULT_CLOSE,
                                          add_special_tokens=False)
            room = max_new_tokens - len(ids[i])
            ids[i] += result_ids[:room]
            mask[i] += [0] * len(result_ids[:room])
            logps[i] += [0.0] * len(result_ids[:room])
            if len(result_ids) >= room:  # no token left for the model: cut in (or after) the result
                truncated[i] = True
            else:
                still.append(i)
        active = still
    return {'completion_ids': ids, 'model_mask': mask, 'rollout_logp': logps,
            'truncated': truncated, 'tool_calls': calls, 'tool_errors': errors}
