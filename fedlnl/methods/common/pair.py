"""Two networks per client trained jointly on the same mini-batches with a per-batch selection rule
(Co-teaching, Co-teaching+; docs/methods/local_lnl.md §21), federated as two global models.

- ``init`` / ``load``: the method state of a pair: the working network and an independently
  initialised twin (``semisup.fresh_copy``), with one global weight set for each.
- ``train``: local training of both networks over one client's samples: each batch is drawn (and
  augmented) once, both networks see it, and ``rule(logits1, logits2, labels, pos)`` returns the two
  batch losses, or ``None`` to skip the batch (no step). Both networks are stepped by one optimiser
  (``fl.optimizer``) over the union of their parameters: SGD and Adam act per parameter and the two
  parameter sets are disjoint, so this equals two optimisers with the same settings, and a loss of network 1 that was
  selected with network 2's scores only reaches network 1 (a selection is an index, not a gradient).
- ``client_update`` / ``aggregate``: the FedAvg client step of a pair (network 2 travels in
  ``payload["weights2"]``, so its bytes are counted) and the n_k-weighted average of each network.
- ``exchange`` / ``coteaching_losses`` / ``disagreement``: the cross-update of Co-teaching (each
  network trains on its peer's small-loss samples) and the disagreement filter of Co-teaching+.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.conf.checks import choice, number
from fedlnl.methods.common import engine, lnl, semisup
from fedlnl.methods.common.params import Params, linear, param, rate, rule
from fedlnl.methods.common.protocol import ClientUpdate, Optim

@dataclass(frozen=True)
class ForgettingParams(Params):
    """The numbers Co-teaching and Co-teaching+ share (their YAML files; docs/methods/local_lnl.md §21, L-numbers)."""

    forget_rate: float | str = rate("final forget rate τ: a share, or noise (the federation's nominal rate)")
    gradual_share: float = param("share of the rounds T_k in which the forget rate rises to τ",
                                 rule(number, lambda v: 0.0 <= v <= 1.0,
                                      "a share of the rounds in [0, 1] (T_k = max(1, share·rounds))"),
                                 search=linear(0.05, 0.5, "our choice: from the Co-teaching paper's T_k = 10 of 200 "
                                                          "epochs (0.05) to half the rounds (FNBench 0.2; docs/methods/local_lnl.md "
                                                          "§21.5)"))
    schedule: str = param("L2: the rise min(t/T_k·τ, τ) (paper) | linspace(0, τ, T_k)[t] (codes)",
                          rule(choice, lnl.SCHEDULES))
    keep_rounding: str = param("L3: kept samples per batch ⌈R·B⌉ (ceil) | int(R·B) (floor)",
                               rule(choice, lnl.ROUNDINGS))
    second_init: str = param("network 2: all = independent initialisation, head = new classifier only",
                             rule(choice, ("all", "head")))


#: rule(logits1, logits2, labels, pos) -> (loss of network 1, loss of network 2), or None: no step
PairRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor] | None"]


def init(model: nn.Module, seed: int, scope: str) -> dict:
    """State entries of a pair: ``model`` / ``model2`` (the working networks) and ``global`` /
    ``global2`` (their global weights); network 2 is ``model`` re-initialised from ``seed``
    (``scope``: ``all`` layers, or the ``head`` only to keep a pre-trained backbone)."""
    model2 = semisup.fresh_copy(model, seed, scope)
    return {"model": model, "model2": model2, "global": engine.get_weights(model),
            "global2": engine.get_weights(model2)}



def init_forgetting(model: nn.Module, info, ctx, scope: str, forget_rate) -> dict:
    """A pair's state (network 2 seeded from the run's ``init/net2`` stream) plus ``tau``, the
    forget rate the configuration gives (a number, or ``noise``: the nominal noise rate)."""
    state = init(model, engine.child_seed(ctx.generator("init", "net2")), scope)
    state["tau"] = lnl.rate_value("forget_rate", forget_rate, info)
    return state

def load(state: dict) -> tuple[nn.Module, nn.Module]:
    """The two working networks with the current global weights."""
    engine.set_weights(state["model"], state["global"])
    engine.set_weights(state["model2"], state["global2"])
    return state["model"], state["model2"]


def train(nets: tuple[nn.Module, nn.Module], data, idx: torch.Tensor, labels: torch.Tensor, *, epochs: int,
          batch_size: int, optim: Optim, augment: bool, gen: torch.Generator, rule: PairRule) -> float:
    """Joint local training of two networks (see the module notes); returns the mean over stepped batches
    of (loss1 + loss2) / 2, nan if the update diverged (both networks then keep their weights from
    before the diverging step, as ``engine.train_steps`` guarantees), 0 if no batch was stepped."""
    pair = nn.ModuleList(nets)
    pair.train()
    fmt = engine.memory_format(nets[0], data.device)

    def losses():
        for _ in range(epochs):
            for pos, xb in engine.epoch_batches(data, idx, batch_size, gen, augment=augment, memory_format=fmt):
                out = rule(nets[0](xb), nets[1](xb), labels[pos], pos)
                if out is not None:
                    yield out[0] + out[1]

    values = engine.train_steps(pair, engine.optimizer(pair, optim, run=data.compiled), gen, losses)
    if values and not math.isfinite(values[-1]):
        return float("nan")
    return sum(values) / (2 * len(values)) if values else 0.0


def client_update(state: dict, client, ctx, training: dict, rule: PairRule) -> ClientUpdate:
    """Both networks start from their global weights and train on the client's observed labels."""
    nets = load(state)
    loss = train(nets, client.data, client.indices, client.labels, **training, gen=ctx.generator("train", client.id),
                 rule=rule)
    return ClientUpdate(client.id, engine.get_weights(nets[0]), client.size,
                        payload={"weights2": engine.get_weights(nets[1])}, train_loss=loss)


def aggregate(state: dict, updates: list[ClientUpdate]) -> None:
    """Each global network is the n_k-weighted average of its client copies (FedAvg Eq. 1)."""
    counts = [u.num_samples for u in updates]
    state["global"] = engine.weighted_average([u.weights for u in updates], counts)
    state["global2"] = engine.weighted_average([u.payload["weights2"] for u in updates], counts)


# ------------------------------------------------------------------------------ selection rules
def exchange(loss1: torch.Tensor, loss2: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Co-teaching's cross-update (Alg. 1): D̄_f, D̄_g = the ``keep`` smallest-loss samples of
    network f (1) and g (2); network 1 is updated on D̄_g and network 2 on D̄_f. Returns (positions
    network 1 trains on, positions network 2 trains on)."""
    return lnl.small_loss(loss2, keep), lnl.small_loss(loss1, keep)


def coteaching_losses(out1: torch.Tensor, out2: torch.Tensor, labels: torch.Tensor, keep: int):
    """(loss of network 1, loss of network 2) of Co-teaching's cross-update on one batch: each network's
    per-sample cross-entropy of its outputs ``out`` ranks the batch, and each network's loss is its
    mean cross-entropy over the ``keep`` samples its peer ranked smallest (``exchange``)."""
    loss1 = F.cross_entropy(out1, labels, reduction="none")
    loss2 = F.cross_entropy(out2, labels, reduction="none")
    for_1, for_2 = exchange(loss1, loss2, keep)
    return lnl.mean_ce(out1, labels, for_1), lnl.mean_ce(out2, labels, for_2)


def disagreement(logits1: torch.Tensor, logits2: torch.Tensor) -> torch.Tensor:
    """Co-teaching+'s filter (Alg. 1): positions whose predicted classes differ."""
    return (logits1.argmax(1) != logits2.argmax(1)).nonzero().flatten()
