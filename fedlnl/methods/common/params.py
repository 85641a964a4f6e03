"""Each method's own hyperparameters as one frozen, documented parameter object (the declaration
form every config node shares: ``fedlnl.conf.checks.key``).

A method declares ``Params``: a frozen dataclass whose fields are the keys of its YAML
(``conf/method/<name>.yaml``, where every value lives), each built with ``param(doc, rule)``: one line
saying what the number is, and its check from the vocabulary of ``fedlnl.conf.checks``. Building the
object checks every field once, then ``check`` (relations between fields)::

    @dataclass(frozen=True)
    class FedProxParams(Params):
        mu: float = param("proximal weight μ (Eq. 2); 0 = FedAvg", rule(number, lambda v: v >= 0, "..."))

    class FedProx(FedAvg):
        Params = FedProxParams

The method is built as before, ``FedProx(fl=..., mu=1.0)``: ``Method.__init__`` keeps ``fl`` and builds
``self.params``; each field, and each value the Params derive (a property), reads as ``self.mu``
(read-only). The class's signature is ``fl`` plus the fields, which is what ``compose.build_method``
checks a YAML node against.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

from fedlnl.conf.checks import key, number, rule  # noqa: F401 (rule: the methods write their fields with it)
from fedlnl.methods.common.plans import Planned, UpdatePlan, client_size, local_steps

if TYPE_CHECKING:  # annotations only: this module stays torch-free
    from torch import nn

    from fedlnl.methods.common.protocol import ClientUpdate, ClientView, FederationInfo, RoundContext

#: the config path a method's own keys are shown under in error messages
PREFIX = "method."
#: a rate hyperparameter set to this means "the federation's nominal noise rate" (known from the noise
#: config alone, never measured on labels: docs/methods/rofl.md R3)
NOISE = "noise"


@dataclass(frozen=True)
class Space:
    """Where equal-budget tuning searches one value (``experiment=tune``): a float or int range
    (``low``..``high``, log or linear), a ``choices`` list, or a range ``around`` the value the run
    would use (``[v / around, v * around]``, log: the learning rates, whose defaults differ by method
    and dataset). ``source`` says where the range comes from (a paper passage, or our choice and
    why); ``lr`` marks a learning rate (tuned as the method's lr, not counted among its <= 3 keys)."""

    source: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple | None = None
    around: float | None = None
    lr: bool = False

    def bounds(self, default) -> tuple:
        """(low, high) of a range, resolved against the run's ``default`` for an ``around`` range
        (an integer range rounded inwards, never below 1)."""
        if self.around is None:
            return self.low, self.high
        low, high = default / self.around, default * self.around
        if self.integer:
            return max(1, math.ceil(low)), max(1, math.floor(high))
        return low, high

    def contains(self, value, default) -> bool:
        if self.choices is not None:
            return value in self.choices
        low, high = self.bounds(default)
        return low <= value <= high


def log_range(low: float, high: float, source: str) -> Space:
    """Log-uniform over [low, high]."""
    return Space(source, low, high, log=True)


def linear(low: float, high: float, source: str) -> Space:
    """Uniform over [low, high]."""
    return Space(source, low, high)


def ints(low: int, high: int, source: str, log: bool = False) -> Space:
    """An integer in [low, high]."""
    return Space(source, low, high, log=log, integer=True)


def among(values: Sequence, source: str) -> Space:
    """One of ``values`` (a paper's grid)."""
    return Space(source, choices=tuple(values))


def around(factor: float, source: str, integer: bool = False, lr: bool = False) -> Space:
    """Log-uniform over [v / factor, v · factor] around the run's value v."""
    return Space(source, log=True, around=float(factor), integer=integer, lr=lr)


#: the learning rate of every method (``fl.lr``, a pin ``method.lr``, or a method's own lr fields):
#: two decades centred on the value the method runs with in the tuned setting. Relative, because the
#: methods' defaults differ (FedProx 0.01 beside FedAvg 0.03 on CIFAR-10, Adam's 3e-4): each method
#: gets the same breadth around its own paper's value, which is the equal budget.
LR = around(10, "our choice: log-uniform over [lr/10, lr·10] around the method's lr in the tuned setting "
                "(the papers give one value each, no range)", lr=True)


def param(doc: str, check: Callable[[str, object], None] | None = None, *,
          default=dataclasses.MISSING, convert: Callable | None = None, search: Space | None = None):
    """One field: its one-line ``doc``, its ``check`` (``rule(...)``; None: checked in ``check``), an
    optional ``convert`` applied after the check (``float``, ``int``), its ``search`` space for
    tuning (``Space``; None: not tuned) and, rarely, a ``default`` (the value lives in the YAML; a
    default only keeps older YAML files working)."""
    return key(doc, check, default=default, convert=convert, search=search)


def check_rate(key: str, value) -> None:
    """A share in [0, 1) or ``noise``."""
    number(key, value, lambda v: 0.0 <= v < 1.0, f"a share in [0, 1) or {NOISE} (the federation's nominal noise rate)",
           word=NOISE)


def rate(doc: str):
    """A rate field: a share in [0, 1) or ``noise`` (then ``Method.noise_rate_key`` names it, and
    preflight checks the federation's noise rate is known)."""
    return key(doc, check_rate, convert=None, rate=True)


@dataclass(frozen=True)
class Params:
    """A method's own hyperparameters; subclasses add the fields."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check, convert = f.metadata.get("check"), f.metadata.get("convert")
            value = getattr(self, f.name)
            if check is not None:
                check(PREFIX + f.name, value)
            if convert is not None and value is not None:
                object.__setattr__(self, f.name, convert(value))
        self.check()

    def check(self) -> None:
        """Checks that relate several fields (override)."""

    def unread(self) -> frozenset[str]:
        """Own fields this configuration does not read (a value of the other noise group, ...): not
        tuned (override)."""
        return frozenset()


class Method:
    """Base of every method: the plugin contract the runner calls (``fedlnl.benchmark.runner``).

    A method subclasses it (or a method that does: FedProx extends ``FedAvg``), names its ``Params``
    and its ``family``, and implements the five required hooks; every optional hook below is a
    method with the default the runner relies on, overridden where the method differs (as a
    Lightning callback). The runner's loop::

        state = method.init(model, info, ctx0)
        for round in range(method.total_rounds(info, fl.rounds)):
            ids = method.sample_clients(state, ctx)
            updates = [method.client_update(state, view(k), ctx) for k in ids]
            state, metrics = method.aggregate(state, updates, ctx)
            evaluate(method.eval_model(state))

    The method is built as ``cls(fl=FLSettings(...), **its YAML keys)``: ``__init__`` keeps ``fl``
    and builds ``self.params`` (each field reads as ``self.<key>``).
    """

    Params: ClassVar[type[Params]] = Params
    #: the report's table group (one of ``fedlnl.methods.common.families.FAMILIES``); every method
    #: class declares its own (a subclass does not inherit its parent's by accident: a test checks)
    family: ClassVar[str | None] = None
    #: the shared ``fl`` keys the method does not read, with the reason (a typed override of one is
    #: refused rather than ignored); e.g. ``{"rounds": "its schedule is method.T1 + method.T2"}``
    fl_unused: Mapping[str, str] = MappingProxyType({})

    def __init__(self, fl, *args, **values):
        self.fl = fl
        self.params = self.Params(*args, **values)

    # ----------------------------------------------------------------- required hooks
    def init(self, model: nn.Module, info: FederationInfo, ctx: RoundContext) -> Any:
        """The server state before round 0 (global weights, the one working model, ...)."""
        raise NotImplementedError(f"{type(self).__name__}.init")

    def sample_clients(self, state: Any, ctx: RoundContext) -> list[int]:
        """The clients that train in round ``ctx.round`` (``[ALL_CLIENTS]``: the pooled data)."""
        raise NotImplementedError(f"{type(self).__name__}.sample_clients")

    def client_update(self, state: Any, client: ClientView, ctx: RoundContext) -> ClientUpdate:
        """Client ``client.client``'s local step on its observed labels."""
        raise NotImplementedError(f"{type(self).__name__}.client_update")

    def aggregate(self, state: Any, updates: list[ClientUpdate], ctx: RoundContext) -> tuple[Any, dict]:
        """The server step: (new state, metrics of the round; ``stage`` names a stage)."""
        raise NotImplementedError(f"{type(self).__name__}.aggregate")

    def eval_model(self, state: Any) -> nn.Module:
        """The model the runner tests after the round."""
        raise NotImplementedError(f"{type(self).__name__}.eval_model")

    # ----------------------------------------------------------------- optional hooks
    def total_rounds(self, info: FederationInfo, rounds: int) -> int:
        """Rounds the runner runs, given ``rounds`` = ``fl.rounds`` (the FedAvg-equivalent budget).
        Default: ``rounds``. A method with its own schedule (stages) returns its length."""
        return int(rounds)

    def nested(self) -> dict[str, "Method"]:
        """The methods this one runs inside it, by their config key (FedCorr's ``stage3``); their
        ``fl`` keys, pins and search spaces are checked as the outer method's. Default: none."""
        return {}

    def nested_rounds(self, key: str, info: FederationInfo) -> int | None:
        """Rounds the nested method ``key`` runs (recorded in summary.json ``effective``); None:
        not recorded. Default: None."""
        return None

    def shared_prefix(self, info: FederationInfo, method_cfg: dict) -> tuple[int, dict] | None:
        """``(rounds, method_cfg')``: the first ``rounds`` rounds depend on the method's config only
        through ``method_cfg'`` (FedCorr: its config without ``stage3``), so runs of equal
        ``method_cfg'`` (other config, code and device identity equal) start after those rounds from
        the state the first of them saved (``reuse_prefix``). Default: None (no shared prefix)."""
        return None

    def plan_clients(self, ctx: RoundContext) -> list[int] | Planned:
        """Round ``ctx.round``'s clients for a plan (``dry_run=true``), without training: the code
        ``sample_clients`` uses. Default: ``sample_clients(None, ctx)``; a method whose sampling reads
        ``state`` overrides it (a ``Planned`` with ``exact=False`` where training decides)."""
        return self.sample_clients(None, ctx)

    def plan_update(self, ctx: RoundContext, k: int, info: FederationInfo, model: nn.Module) -> UpdatePlan:
        """Client ``k``'s optimiser steps and uploads in round ``ctx.round`` for a plan. Default: one
        ``engine.train_from_global`` of ``fl.local_epochs`` passes over its samples in batches of
        ``fl.batch_size``, uploading the model. Where training decides a figure, an override returns an
        upper bound marked inexact; the end-to-end tests compare every plan with its finished run."""
        return UpdatePlan(local_steps(client_size(info, k), self.fl.local_epochs, self.fl.batch_size))

    # ----------------------------------------------------------------- derived
    @property
    def noise_rate_key(self) -> str | None:
        """The rate field set to ``noise``, if any (preflight then needs a known noise rate)."""
        return next((f.name for f in dataclasses.fields(self.params)
                     if f.metadata.get("rate") and getattr(self.params, f.name) == NOISE), None)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__ and "Params" not in cls.__dict__:
            cls.__signature__ = None  # its own constructor's signature
            return
        fields = dataclasses.fields(cls.Params)
        derived = [name for name, obj in inspect.getmembers(cls.Params)
                   if isinstance(obj, (property, functools.cached_property)) and not name.startswith("_")]
        for name in [f.name for f in fields] + derived:
            if not hasattr(cls, name):
                setattr(cls, name, property(_reader(name)))
            elif not isinstance(getattr(cls, name), property):
                raise TypeError(f"{cls.__name__}.{name} is both a hyperparameter and a class attribute")
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        cls.__signature__ = inspect.Signature(
            [inspect.Parameter("fl", kind)]
            + [inspect.Parameter(f.name, kind, default=f.default if f.default is not dataclasses.MISSING
                                 else inspect.Parameter.empty) for f in fields])


def _reader(name: str):
    return lambda self: getattr(self.params, name)
