"""The one vocabulary of value checks: every user-settable value (runner keys, dataset, partition and
noise options, a method's own hyperparameters) is checked by these functions before any training.

Each raises ``ConfigError("KEY=VALUE is invalid: allowed ...")``: one line naming the key, the value
given and what is allowed; the runner prints it as ``fedlnl-run: error: ...`` with exit code 2.
Booleans are never numbers here (``true`` is not 1) and ``null`` is refused where a number is
required unless the check says ``optional``. Pure Python, no imports from the rest of fedlnl: the
data layer, the methods and the benchmark all read it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Mapping


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


class Rule:
    """``check`` with its arguments after (key, value) bound: the rule of one field of a declaration,
    e.g. ``rule(number, lambda v: v >= 0, "a weight >= 0")``."""

    def __init__(self, check: Callable, *args, **kwargs):
        self.check, self.args, self.kwargs = check, args, kwargs

    def __call__(self, key: str, value) -> None:
        self.check(key, value, *self.args, **self.kwargs)

    def required(self, key: str, value) -> None:
        """The rule without its ``optional`` (null refused): a relation that needs the value."""
        self.check(key, value, *self.args, **{**self.kwargs, "optional": False})


rule = Rule


class _Shown:
    """A value no check accepts: asking a check about it yields the text its error says is allowed."""

    def __repr__(self) -> str:
        return "?"


def allowed(check: Callable) -> str:
    """What ``check`` allows, in the words of its one-line error (the docs' key tables show it)."""
    try:
        check("key", _Shown())
    except ValueError as err:
        return str(err).partition(" is invalid: allowed ")[2] or str(err)
    return "anything"


# ------------------------------------------------------------------------------ declarations
def key(doc: str, check: Callable[[str, object], None] | None = None, **metadata):
    """One declared config key: its one-line ``doc`` and its ``check`` (a ``rule``); the field's
    annotation is its type. ``required=True``: an absent key is checked as null (so refused unless
    its rule allows null); other keys are checked where present. ``read_if=lambda node: ...``: the
    key is read (so checked) only in the configurations where this holds. Every declaration (a
    method's ``Params``, the run keys, the ``fl`` group, a dataset loader's options, a partition or
    noise kind's options) is a dataclass of these."""
    default = metadata.pop("default", dataclasses.MISSING)
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check, **metadata})


def check_node(decl, node: Mapping, prefix: str, closed: str | None = None, partial: bool = False) -> None:
    """Check a config node against its declaration: with ``closed`` (what the node is, for the
    message), a key the declaration lacks is refused; each declared key present (or required) is
    checked by its rule; then ``decl.relations(node, prefix)`` (checks that relate keys) when the
    declaration has it."""
    fields = dataclasses.fields(decl)
    if closed is not None:
        names = [f.name for f in fields]
        unknown = sorted(k for k in node if k not in names)
        if unknown:
            fail(f"{prefix}{unknown[0]}", node[unknown[0]], f"the keys of {closed}: {', '.join(names)}")
    for f in fields:
        if f.metadata.get("read_if") is not None and not f.metadata["read_if"](node):
            continue  # a key this configuration does not read (iid's sigma with equal sizes)
        if f.metadata.get("check") is not None and (f.name in node or (f.metadata.get("required") and not partial)):
            f.metadata["check"](prefix + f.name, node.get(f.name))
    if hasattr(decl, "relations") and not partial:
        decl.relations(node, prefix)
