"""The one vocabulary of value checks: every user-settable value (runner keys, dataset, partition and
noise options, a method's own hyperparameters) is checked by these functions before any training.

Each raises ``ConfigError("KEY=VALUE is invalid: allowed ...")``: one line naming the key, the value
given and what is allowed; the runner prints it as ``fedlnl-run: error: ...`` with exit code 2.
Booleans are never numbers here (``true`` is not 1) and ``null`` is refused where a number is
required unless the check says ``optional``. Pure Python, no imports from the rest of fedlnl: the
data layer, the methods and the benchmark all read it.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable


class ConfigError(ValueError):
    """A config value outside its allowed range; the message is one line for the user."""


def fail(key: str, value, allowed: str):
    raise ConfigError(f"{key}={value!r} is invalid: allowed {allowed}")


# ------------------------------------------------------------------------------ predicates
def is_number(value) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value, low: int | None = None) -> bool:
    """An int, not a bool (and >= ``low`` when given)."""
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


# ------------------------------------------------------------------------------ checks
def number(key: str, value, ok: Callable[[float], bool], allowed: str, optional: bool = False,
           word: str | None = None) -> None:
    """A finite number for which ``ok`` holds (``optional``: or null; ``word``: or that word, e.g. ``noise``)."""
    if (optional and value is None) or (word is not None and value == word):
        return
    if not is_number(value) or not ok(value):
        fail(key, value, allowed)


def integer(key: str, value, low: int, optional: bool = False) -> None:
    """An integer >= ``low`` (``optional``: or null)."""
    if optional and value is None:
        return
    if not is_int(value, low):
        fail(key, value, f"null or an integer >= {low}" if optional else f"an integer >= {low}")


def positive(key: str, value, allowed: str = "a number > 0") -> None:
    number(key, value, lambda v: v > 0, allowed)


def nonnegative(key: str, value, allowed: str = "a number >= 0") -> None:
    number(key, value, lambda v: v >= 0, allowed)


def unit(key: str, value, allowed: str = "a number in [0, 1]", optional: bool = False) -> None:
    """A probability, share or level in [0, 1]."""
    number(key, value, lambda v: 0.0 <= v <= 1.0, allowed, optional)


def flag(key: str, value) -> None:
    if not isinstance(value, bool):
        fail(key, value, "true or false")


def choice(key: str, value, options: Iterable, text: bool = False):
    """One of ``options`` (``text``: and a string, so ``1`` never matches ``"1"``); returns it."""
    options = tuple(options)
    if (text and not isinstance(value, str)) or value not in options:
        fail(key, value, ", ".join(map(str, options)))
    return value


def rule(check: Callable, *args, **kwargs) -> Callable[[str, object], None]:
    """``check`` with its arguments after (key, value) bound: the rule of one field of a parameter
    object, e.g. ``rule(number, lambda v: v >= 0, "a weight >= 0")``."""
    return lambda key, value: check(key, value, *args, **kwargs)
