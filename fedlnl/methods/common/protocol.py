"""The method plugin contract: what the runner hands a method and what it gets back.

A method is one class (one file in ``fedlnl/methods/``) with these hooks; the runner owns the loop::

    method = Method(fl=FLSettings(...), **its own hyperparameters)
    state = method.init(model, info, ctx0)
    for round in range(method.total_rounds(info, fl.rounds)):   # or fl.rounds without the hook
        ids = method.sample_clients(state, ctx)
        updates = [method.client_update(state, view(k), ctx) for k in ids]
        state, metrics = method.aggregate(state, updates, ctx)
        evaluate(method.eval_model(state))

Every method class names its ``family`` (a class attribute, one of ``FAMILIES``): the group the
report shows it in.

Rules: a method never sees clean labels (a ``ClientView`` carries observed labels only), never
touches the filesystem or W&B, and draws every random number from ``ctx.generator(...)`` so that
results do not depend on the order in which clients are executed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from fedlnl.methods.common.families import FAMILIES  # noqa: F401 (torch-free for the report)

#: ``sample_clients`` may return ``[ALL_CLIENTS]`` to train on the pooled data of every client
#: (the centralized references); the runner then builds one view over all training samples.
ALL_CLIENTS = -1


#: the local optimisers ``fl.optimizer`` names, and the keys each reads besides ``lr`` and
#: ``weight_decay``; the other optimiser's key is inapplicable (null in its FLSettings, refused when typed)
OPTIMIZERS = {"sgd": "momentum", "adam": "betas"}


def unread_key(optimizer: str) -> str | None:
    """The optimiser key ``optimizer`` does not read (None for a name not in OPTIMIZERS)."""
    if optimizer not in OPTIMIZERS:
        return None
    return next(key for name, key in OPTIMIZERS.items() if name != optimizer)


#: the shared local-training settings (the ``fl`` group) a method YAML may pin per dataset
FL_FIELDS = ("frac", "local_epochs", "batch_size", "optimizer", "lr", "momentum", "betas", "weight_decay",
             "augment", "eval_batch_size")


@dataclass(frozen=True)
class Optim:
    """One local optimiser: ``sgd`` = ``torch.optim.SGD(lr, momentum, weight_decay)``, ``adam`` =
    ``torch.optim.Adam(lr, betas, weight_decay)`` (torch's coupled L2 decay, eps 1e-8; the form of
    FedNoRo's code). ``momentum`` is None for adam, ``betas`` None for sgd."""

    name: str
    lr: float
    weight_decay: float
    momentum: float | None = None
    betas: tuple[float, float] | None = None


@dataclass(frozen=True)
class FLSettings:
    """The local-training settings every method shares, built once by the runner from the ``fl``
    group with the values the method's own YAML pins for the dataset (e.g. FedProx's lr 0.01 on
    CIFAR-10) applied, and handed to the method's constructor (pfl-research's central training
    parameters). A method keeps only its own hyperparameters; ``fl.rounds`` and the evaluation
    cadence stay with the runner. The key the optimiser does not read (``momentum`` of adam,
    ``betas`` of sgd) is None."""

    frac: float  # γ: share of clients per round
    local_epochs: int
    batch_size: int
    optimizer: str  # a key of OPTIMIZERS
    lr: float
    momentum: float | None  # sgd only
    betas: tuple[float, float] | None  # adam only
    weight_decay: float
    augment: bool  # batched crop + flip where the dataset defines it
    eval_batch_size: int  # batch of inference passes (evaluation, LID, per-sample losses)

    def optim(self, **overrides) -> Optim:
        """The local optimiser of these settings. A method's stage-specific values (``lr``,
        ``momentum``, ``betas``, ``weight_decay``: JointOpt's ``train_lr``, FedDyn's decayed lr and
        α term) replace the shared ones; a value the optimiser does not read is dropped."""
        values = {"lr": self.lr, "weight_decay": self.weight_decay, "momentum": self.momentum, "betas": self.betas}
        unknown = sorted(set(overrides) - set(values))
        if unknown:
            raise TypeError(f"FLSettings.optim: no optimiser value {unknown[0]!r} (allowed: {', '.join(values)})")
        values.update(overrides)
        if unread_key(self.optimizer) is not None:
            values[unread_key(self.optimizer)] = None
        if values["betas"] is not None:
            values["betas"] = tuple(values["betas"])
        return Optim(self.optimizer, **values)

    def training(self) -> dict:
        """Keyword arguments of ``engine.local_train`` / ``engine.train_from_global``."""
        return {"epochs": self.local_epochs, "batch_size": self.batch_size, "optim": self.optim(),
                "augment": self.augment}


@dataclass(frozen=True)
class FederationInfo:
    """What a method may know about the federation before training (no labels, no oracle)."""

    num_clients: int
    num_classes: int
    client_sizes: tuple[int, ...]
    input_shape: tuple[int, ...]
    seed: int
    #: the noise rate the configuration implies (expected share of wrong labels from the noise
    #: settings, or a real label set's published rate; never measured on labels), for methods
    #: that take it as a known hyperparameter; None when unknown
    noise_rate: float | None = None
    #: the share of clients the noise configuration makes noisy (rho, a mixed config's noisy groups,
    #: 1 for real label noise; never counted on labels), for methods that assume a known share of
    #: Byzantine clients (Krum, trimmed mean); None when unknown
    noisy_client_share: float | None = None


@dataclass
class ClientView:
    """One client's local dataset as the client itself would see it.

    ``indices`` are global positions in the training tensors; ``labels`` are the *observed* (noisy,
    possibly server-corrected) labels of those samples. ``data`` gives batches of images.
    """

    id: int
    indices: torch.Tensor  # int64, on the run's device
    labels: torch.Tensor  # int64, observed labels, aligned with indices
    data: Any  # engine.TensorData

    @property
    def size(self) -> int:
        return int(self.indices.numel())


@dataclass
class ClientUpdate:
    """What a client sends back after local training. Label corrections and noise decisions go
    through ``ctx.relabel`` / ``ctx.report_*`` so the runner applies and scores them."""

    client: int
    weights: dict[str, torch.Tensor] | None  # model state dict (None if the client sends none)
    num_samples: int
    #: extra upload payload (LID scalar, GMM parameters, centroids, ...); its bytes are counted.
    payload: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    train_loss: float = float("nan")


def _ignore(*args, **kwargs) -> None:
    return None


@dataclass
class RoundContext:
    """Per-round information and the seeded randomness a method may use."""

    round: int  # 0-based round index
    total_rounds: int
    seed: int
    device: torch.device
    num_clients: int
    client_sizes: tuple[int, ...]
    data: Any = None  # engine.TensorData: lets the server evaluate/score samples of any client
    views: Callable[[int], ClientView] | None = None  # k -> ClientView, for server-side steps
    #: decisions a method announces; the runner applies relabels and scores all of them against
    #: the oracle the method never sees.
    relabel: Callable[[torch.Tensor, torch.Tensor], None] = _ignore  # (global idx, new labels)
    report_clients: Callable[..., None] = _ignore  # (is_noisy={k: bool}, mu_hat={k: float})
    report_samples: Callable[[torch.Tensor, torch.Tensor], None] = _ignore  # (idx, flagged mask)
    #: diagnostics for plots (e.g. FedCorr's cumulative LID and its GMM): the runner keeps the
    #: latest value per key and writes them to the run's diagnostics.json; plain numbers/lists.
    record: Callable[[str, Any], None] = _ignore

    def _seed(self, *keys: Any) -> int:
        text = "/".join(str(k) for k in (self.seed, self.round, *keys))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1

    def generator(self, *keys: Any) -> torch.Generator:
        """A CPU torch generator seeded by (seed, round, *keys): independent of execution order."""
        g = torch.Generator()
        g.manual_seed(self._seed(*keys))
        return g

    def rng(self, *keys: Any) -> np.random.Generator:
        """A numpy generator seeded by (seed, round, *keys)."""
        return np.random.default_rng(self._seed(*keys))


class Method(Protocol):
    """The hooks every method implements (structural typing: no base class to inherit).

    Optional: ``total_rounds(info, rounds) -> int`` for a method with its own schedule (stages),
    given ``rounds`` = ``fl.rounds`` (the FedAvg-equivalent budget); without it the runner runs
    ``fl.rounds`` rounds. ``fl_unused: dict[str, str]`` names the shared ``fl`` keys the method does
    not read, with the reason (a command-line override of one is refused rather than ignored).
    ``noise_rate_key: str | None`` names the hyperparameter set to ``noise`` (= ``info.noise_rate``), so
    that preflight refuses a noise config without a known rate before any cell trains.
    ``shared_prefix(info, method_cfg) -> (rounds, method_cfg') | None`` declares that the first
    ``rounds`` rounds depend on the method's config only through ``method_cfg'`` (FedCorr: its config
    without ``stage3``): runs of equal ``method_cfg'``, other config, code and device identity start
    after those rounds from the state the first of them saved (``reuse_prefix``, benchmark/runner.py).

    Plans (``dry_run=true``, ``fedlnl.benchmark.plan``) walk the same schedule without training:
    ``plan_clients(ctx) -> list[int] | Planned`` gives a round's clients from the code
    ``sample_clients`` uses (a method whose ``sample_clients`` reads ``state`` must provide it; the
    planner otherwise calls ``sample_clients(None, ctx)``); ``plan_update(ctx, k, info, model) ->
    UpdatePlan`` gives client k's optimiser steps and uploads (default: one ``engine.local_train`` of
    ``fl.local_epochs`` passes over its samples, uploading the model). Where training decides a
    figure, the hook returns an upper bound marked inexact. The end-to-end tests compare every
    method's plan with its finished run."""

    fl: FLSettings

    def init(self, model: nn.Module, info: FederationInfo, ctx: RoundContext) -> Any: ...

    def sample_clients(self, state: Any, ctx: RoundContext) -> list[int]: ...

    def client_update(self, state: Any, client: ClientView, ctx: RoundContext) -> ClientUpdate: ...

    def aggregate(
        self, state: Any, updates: list[ClientUpdate], ctx: RoundContext
    ) -> tuple[Any, dict[str, float]]: ...

    def eval_model(self, state: Any) -> nn.Module: ...


# ------------------------------------------------------------------------------------ plans
@dataclass(frozen=True)
class Planned:
    """A round's participants as the schedule decides them before training (``dry_run`` plans).

    ``clients`` lists them where the schedule alone decides (seeded draws, fixed orders); where
    training decides who participates (PoC's highest losses, FedCorr's estimated-clean clients)
    it is None and ``count`` of the clients in ``among`` (None: any client) take part. ``exact``
    is False when ``count`` is only an upper bound (training may pick fewer)."""

    clients: list[int] | None
    count: int
    exact: bool = True
    among: list[int] | None = None


@dataclass(frozen=True)
class UpdatePlan:
    """One client update as planned before training: optimiser ``steps``, the number of model
    state dicts uploaded (``models``: 1 for the usual update, 2 for DivideMix's two networks, 0 for
    a centralized step that sends nothing) and the other uploaded bytes (``payload``). ``exact`` is
    False when ``steps`` is an upper bound (training on samples that training selects)."""

    steps: int
    models: int = 1
    payload: int = 0
    exact: bool = True


def local_steps(num_samples: int, epochs: int, batch_size: int) -> int:
    """Optimiser steps of ``epochs`` shuffled passes over ``num_samples`` in mini-batches of
    ``batch_size`` with the last one short (``engine.batches``): epochs x ceil(n / B)."""
    return int(epochs) * -(-int(num_samples) // int(batch_size))


def planned_clients(method, ctx: "RoundContext") -> Planned:
    """The clients of round ``ctx.round`` from the method's own schedule code: its
    ``plan_clients(ctx)``, or its ``sample_clients(None, ctx)`` when sampling needs no state."""
    hook = getattr(method, "plan_clients", None)
    drawn = hook(ctx) if hook is not None else method.sample_clients(None, ctx)
    if isinstance(drawn, Planned):
        return drawn
    drawn = [int(k) for k in drawn]
    return Planned(drawn, sum(1 for k in drawn if k != ALL_CLIENTS))


def planned_update(method, ctx: "RoundContext", k: int, info: FederationInfo, model: nn.Module) -> UpdatePlan:
    """Client ``k``'s update in round ``ctx.round``: the method's ``plan_update(ctx, k, info,
    model)``, or by default one local training of ``fl.local_epochs`` passes over the client's
    samples in batches of ``fl.batch_size`` uploading the model (``engine.train_from_global``)."""
    hook = getattr(method, "plan_update", None)
    if hook is not None:
        return hook(ctx, k, info, model)
    return UpdatePlan(local_steps(client_size(info, k), method.fl.local_epochs, method.fl.batch_size))


def client_size(info: FederationInfo, k: int) -> int:
    """n_k, or the pooled training set for ``ALL_CLIENTS``."""
    return int(sum(info.client_sizes)) if k == ALL_CLIENTS else int(info.client_sizes[k])
