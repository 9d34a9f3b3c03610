"""
Rewards: verifiers that score a completion against a row's `answer`, and a registry by name.

    REWARDS[name](completion: str, answer) -> float

Model output is data. Verifiers read it with regular expressions and int(); nothing the model wrote is
ever executed (no eval, exec or sympify).
"""
import re

INTEGER = re.compile(r"-?\d[\d,]*")  # 42, -7, 1,000


def _to_int(text):
    try:
        return int(text.replace(",", ""))
    except ValueError:  # e.g. "1,,2" or a 10,000-digit number (Python refuses to parse those)
        return None


# ----------------------------------------------------------------------------
# arithmetic: 1.0 if the integer the model gave equals the answer, else 0.0

def read_integer_answer(completion):
    """The model's answer: the first integer after the last '=', or else the first integer.

    The prompt asks for only the number, so the first integer is the answer when the model obeys.
    Small models often echo the sum instead ("17 + 25 = 42"); reading after the last '=' accepts that
    form. Taking the first number (not the last, not "any") means listing several candidates never
    earns a reward."""
    tail = completion.rsplit("=", 1)[-1]
    match = INTEGER.search(tail)
    return _to_int(match.group()) if match else None


def arithmetic_reward(completion, answer):
    given = read_integer_answer(completion)
    return float(given is not None and given == int(answer))


REWARDS = {
    "arithmetic": arithmetic_reward,
}
