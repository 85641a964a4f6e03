"""The method plugin contract: what the runner hands a method and what it gets back.

A method is one class (one file in ``fedlnl/methods/``) derived from ``fedlnl.methods.common.params.Method``,
the one base class, whose optional hooks have documented defaults there; the runner owns the loop::

    method = Method(fl=FLSettings(...), **its own hyperparameters)
    state = method.init(model, info, ctx0)
    for round in range(method.total_rounds(info, fl.rounds)):   # the base's default: fl.rounds
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
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from fedlnl.conf.checks import choice, fail, flag, integer, is_number, key, number, rule
from fedlnl.methods.common.families import FAMILIES  # noqa: F401 (torch-free for the report)
# ``sample_clients`` may return ``[ALL_CLIENTS]`` to train on the pooled data of every client (the
# centralized references; the runner then builds one view over all training samples). The plans'
# types live torch-free in ``plans`` (the base class's default hooks use them), re-exported here.
from fedlnl.methods.common.plans import (  # noqa: F401
    ALL_CLIENTS, Planned, UpdatePlan, client_size, local_steps, planned_clients, planned_update)


#: the local optimisers ``fl.optimizer`` names, and the keys each reads besides ``lr`` and
#: ``weight_decay``; the other optimiser's key is inapplicable (null in its FLSettings, refused when typed)
OPTIMIZERS = {"sgd": "momentum", "adam": "betas"}


def unread_key(optimizer: str) -> str | None:
    """The optimiser key ``optimizer`` does not read (None for a name not in OPTIMIZERS)."""
    if optimizer not in OPTIMIZERS:
        return None
    return next(key for name, key in OPTIMIZERS.items() if name != optimizer)


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


def _betas(key: str, value, optional: bool = True) -> None:
    """Adam's (β1, β2): two numbers in [0, 1) (``optional``: or null)."""
    if optional and value is None:
        return
    items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or len(items) != 2 or not all(is_number(v) and 0.0 <= v < 1.0 for v in items):
        fail(key, items if items is not None else value, "a pair [β1, β2] of numbers in [0, 1)")


@dataclass(frozen=True)
class FLSettings:
    """The local-training settings every method shares, built once by the runner from the ``fl``
    group with the values the method's own YAML pins for the dataset (e.g. FedProx's lr 0.01 on
    CIFAR-10) applied, and handed to the method's constructor (pfl-research's central training
    parameters). A method keeps only its own hyperparameters; ``fl.rounds`` and the evaluation
    cadence stay with the runner (``benchmark/runkeys.py``). The key the optimiser does not read
    (``momentum`` of adam, ``betas`` of sgd) is None. Each field is the one declaration of its ``fl``
    key (type, check, doc), which the validator walks and the docs' key table lists."""

    frac: float = key("γ: share of clients sampled per round", rule(number, lambda v: 0.0 < v <= 1.0,
                                                                       "a fraction in (0, 1]"))
    local_epochs: int = key("local epochs per round", rule(integer, 1))
    batch_size: int = key("local mini-batch size", rule(integer, 1))
    optimizer: str = key("local optimiser of every method (a method's stage values override lr / weight_decay)",
                         rule(choice, OPTIMIZERS))
    lr: float = key("local learning rate", rule(number, lambda v: v > 0, "a learning rate > 0"))
    momentum: float | None = key("SGD momentum (sgd only: null with adam)", rule(
        number, lambda v: 0.0 <= v < 1.0, "a momentum in [0, 1)", optional=True))
    betas: tuple[float, float] | None = key("Adam's (β1, β2) (adam only: null with sgd)", rule(_betas))
    weight_decay: float = key("L2 added to the gradient (coupled, as torch's SGD and Adam)",
                              rule(number, lambda v: v >= 0, "a weight decay >= 0"))
    augment: bool = key("batched random crop + flip where the dataset defines it", rule(flag))
    eval_batch_size: int = key("batch of inference passes (evaluation, LID, per-sample losses)", rule(integer, 1))

    @staticmethod
    def relations(node, prefix: str) -> None:
        """The key the chosen optimiser reads may not be null (the other one may)."""
        read = OPTIMIZERS.get(node.get("optimizer"))
        if read in node and node[read] is None:
            rule_of = {f.name: f.metadata["check"] for f in fields(FLSettings)}[read]
            rule_of.required(prefix + read, None)

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


#: the shared local-training settings (the ``fl`` group) a method YAML may pin per dataset
FL_FIELDS = tuple(f.name for f in fields(FLSettings))


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
