"""What a run will do, planned before training (``dry_run=true``): a round's participants and a
client update's optimiser steps and uploads. Torch-free: the base class ``params.Method`` uses these
types in its default ``plan_clients`` / ``plan_update`` hooks."""
from __future__ import annotations

from dataclasses import dataclass

#: a client id meaning "the pooled training set" (centralized references: one update of all data)
ALL_CLIENTS = -1


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


def planned_clients(method, ctx) -> Planned:
    """The clients of round ``ctx.round`` from the method's own schedule code (``Method.plan_clients``;
    its default: ``sample_clients(None, ctx)``, for sampling that needs no state)."""
    drawn = method.plan_clients(ctx)
    if isinstance(drawn, Planned):
        return drawn
    drawn = [int(k) for k in drawn]
    return Planned(drawn, sum(1 for k in drawn if k != ALL_CLIENTS))


def planned_update(method, ctx, k: int, info, model) -> UpdatePlan:
    """Client ``k``'s update in round ``ctx.round``: the method's ``plan_update(ctx, k, info, model)``
    (its default: one local training of ``fl.local_epochs`` passes over the client's samples in
    batches of ``fl.batch_size``, uploading the model; ``engine.train_from_global``)."""
    return method.plan_update(ctx, k, info, model)


def client_size(info, k: int) -> int:
    """n_k, or the pooled training set for ``ALL_CLIENTS``."""
    return int(sum(info.client_sizes)) if k == ALL_CLIENTS else int(info.client_sizes[k])
