"""Client partitions of the training set: IID and FedCorr's Bernoulli-Dirichlet non-IID split.

Every function returns one sorted int64 array of global training indices per client; every index
is assigned to exactly one client. Randomness comes only from the ``rng`` passed in.
"""
from __future__ import annotations

import numpy as np

#: give up redrawing empty rows of Phi after this many rounds (p is then far too small)
_MAX_REDRAWS = 100_000


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random equal shards of ``range(n)``.

    Unlike the reference (which drops the remainder ``n mod N``), the remainder is spread: the first
    ``n mod N`` clients get one sample more, so every index is assigned exactly once and client
    sizes differ by at most one.
    """
    _check_num_clients(n, num_clients)
    shards = np.array_split(rng.permutation(n), num_clients)
    return [np.sort(s).astype(np.int64) for s in shards]


def noniid(
    labels: np.ndarray,
    num_clients: int,
    p: float,
    alpha: float,
    rng: np.random.Generator,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """FedCorr §3.1 non-IID split (methods.md §1.3).

    Phi ~ Bernoulli(p) (clients x classes) says which classes a client holds; for each class j a
    symmetric Dirichlet(alpha) over its holders gives q_j, and each sample of class j goes to a
    holder drawn independently from q_j (a multinomial draw, as the reference code does).
    """
    labels = np.asarray(labels, dtype=np.int64)
    _check_num_clients(len(labels), num_clients)
    if not 0.0 < p <= 1.0 or alpha <= 0.0:
        raise ValueError(f"noniid partition needs 0 < p <= 1 and alpha > 0 (got p={p}, alpha={alpha})")
    m = int(labels.max()) + 1 if num_classes is None else num_classes
    if labels.min() < 0 or labels.max() >= m:
        raise ValueError(f"labels must lie in 0..{m - 1} (got {labels.min()}..{labels.max()})")
    phi = class_assignment(num_clients, m, p, rng)
    owner = np.empty(len(labels), dtype=np.int64)
    for j in range(m):
        members = np.flatnonzero(labels == j)
        if len(members) == 0:
            continue
        holders = np.flatnonzero(phi[:, j])
        if len(holders) == 0:
            raise ValueError(
                f"class {j} ({len(members)} samples) is held by no client: Phi ~ Bernoulli(p={p}) "
                f"left its column empty for num_clients={num_clients}; raise partition.p or the "
                "number of clients"
            )
        q = rng.dirichlet(np.full(len(holders), float(alpha)))  # q_j ~ Dir(alpha * 1_{v_j})
        owner[members] = rng.choice(holders, size=len(members), p=q)
    shards = [np.flatnonzero(owner == k).astype(np.int64) for k in range(num_clients)]
    _check_nonempty(shards, f"noniid p={p}, alpha={alpha}, num_clients={num_clients}")
    return shards


def class_assignment(num_clients: int, num_classes: int, p: float, rng: np.random.Generator) -> np.ndarray:
    """Phi ~ Bernoulli(p) of shape (N, M); rows without any class are redrawn whole (FedCorr §3.1)."""
    phi = rng.random((num_clients, num_classes)) < p
    for _ in range(_MAX_REDRAWS):
        empty = np.flatnonzero(~phi.any(axis=1))
        if len(empty) == 0:
            return phi
        phi[empty] = rng.random((len(empty), num_classes)) < p
    raise ValueError(f"partition.p={p} is too small: some client holds no class after {_MAX_REDRAWS} redraws")


def make_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    kind: str,
    num_classes: int | None = None,
    **params,
) -> list[np.ndarray]:
    """Dispatch on the partition config's ``kind`` (``iid`` | ``noniid``); ``params`` are its other keys."""
    if kind == "iid":
        return iid(len(labels), num_clients, rng, **params)
    if kind == "noniid":
        return noniid(labels, num_clients, rng=rng, num_classes=num_classes, **params)
    raise ValueError(f"unknown partition kind {kind!r} (expected 'iid' or 'noniid')")


def _check_num_clients(n: int, num_clients: int) -> None:
    if not 1 <= num_clients <= n:
        raise ValueError(f"num_clients must be between 1 and the training set size {n}, got {num_clients}")


def _check_nonempty(shards: list[np.ndarray], setting: str) -> None:
    empty = [k for k, s in enumerate(shards) if len(s) == 0]
    if empty:
        raise ValueError(
            f"{len(empty)} client(s) received 0 samples (first: client {empty[0]}) with {setting}; "
            "raise alpha or p, or use fewer clients"
        )
