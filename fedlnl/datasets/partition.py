"""Client partitions of the training set.

- ``iid``: a random permutation cut into equal shards, or, with ``sizes=lognormal|dirichlet``, into
  shards of skewed sizes with IID labels (quantity skew: FedLab's log-normal "unbalance" split;
  Li et al., ICDE 2022 "NIID-Bench", Dirichlet quantity skew);
- ``noniid``: FedCorr §3.1, Bernoulli(p) class presence x Dirichlet(alpha) over the holders;
- ``shards``: McMahan et al., AISTATS 2017 §3: sort by label, cut into N*s shards, s per client;
- ``classes``: every client holds exactly k classes ("#C=k" of Li et al., ICDE 2022), a class's
  samples split evenly among its holders;
- ``dirichlet``: per class j, q_j ~ Dir(alpha 1_N) over all clients, class j cut in proportions q_j
  (the per-class form of Hsu et al., 2019 used by NIID-Bench, FedLab and Flower Datasets).

Every function returns one sorted int64 array of global training indices per client; every index
is assigned to exactly one client. Randomness comes only from the ``rng`` passed in. Each kind is
registered (``@partition_kind``, see ``kinds``) with its config keys, option checks, setting keys and
report label: a new kind is one such function here plus ``conf/partition/<kind>.yaml``.

Deviations: ``shards`` spreads the remainder n mod (N s) over the shards (sizes differ by one)
instead of dropping it; ``classes`` gives client i the class perm[i mod M] first (so every class
is held whenever N >= M, as NIID-Bench's i mod M) and, when N < M, hands the classes still unheld
out as the clients' other classes before drawing the rest at random (NIID-Bench would drop them);
``dirichlet`` redraws all of q until every client holds ``min_size`` samples (NIID-Bench: 10) and
uses no size-balancing trick; Hsu et al. draw a class mix per client with equal client sizes, the
benchmarks (and this module) a client mix per class.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from fedlnl.conf.checks import key, rule

from .kinds import KindOptions, partition_kind
from .kinds import partitions as _partitions
from .options import check_pair, integer, number, one_of, pair

#: give up redrawing empty rows of Phi after this many rounds (p is then far too small)
_MAX_REDRAWS = 100_000
#: give up redrawing a Dirichlet partition that leaves a client below min_size after this many
_MAX_DIRICHLET_DRAWS = 1000


#: ``sizes`` of the iid partition: equal shards, or quantity skew
SIZES = ("equal", "lognormal", "dirichlet")
_CONCENTRATION = "a Dirichlet concentration > 0"


def iid(
    n: int,
    num_clients: int,
    rng: np.random.Generator,
    sizes: str = "equal",
    sigma: float = 1.0,
    alpha: float = 1.0,
) -> list[np.ndarray]:
    """Uniformly random shards of ``range(n)``: equal sizes, or quantity skew with IID labels.

    ``equal``: unlike the reference (which drops the remainder ``n mod N``), the remainder is
    spread: the first ``n mod N`` clients get one sample more, so every index is assigned exactly
    once and client sizes differ by at most one. ``lognormal``/``dirichlet``: see
    :func:`quantity_sizes`; the permutation is cut at the cumulative sizes.
    """
    _check_num_clients(n, num_clients)
    perm = rng.permutation(n)
    if sizes == "equal":
        shards = np.array_split(perm, num_clients)
    else:
        shards = np.split(perm, np.cumsum(quantity_sizes(n, num_clients, sizes, sigma, alpha, rng))[:-1])
    return [np.sort(s).astype(np.int64) for s in shards]


def quantity_sizes(n: int, num_clients: int, sizes: str, sigma: float, alpha: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Client sizes summing to n, each >= 1, proportional to skewed weights w:

    - ``lognormal``: w_k ~ LogNormal(0, sigma^2) (FedLab's unbalanced split; the scale cancels);
    - ``dirichlet``: w ~ Dir(alpha 1_N) (NIID-Bench's quantity skew).

    Every client first gets one sample and the other n - N are cut at floor(n' cumsum(w / sum w)),
    so a size is within one sample of 1 + (n - N) w_k / sum w (no redraws: NIID-Bench redraws
    until every client has 10).
    """
    if sizes == "lognormal":
        if not sigma > 0:
            raise ValueError(f"partition.sigma={sigma} is invalid: allowed a log-normal sigma > 0")
        w = rng.lognormal(0.0, float(sigma), num_clients)
    elif sizes == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"partition.alpha={alpha} is invalid: allowed a Dirichlet concentration > 0")
        w = rng.dirichlet(np.full(num_clients, float(alpha)))
    else:
        raise ValueError(f"partition.sizes={sizes!r} is invalid: allowed {', '.join(SIZES)}")
    rest = n - num_clients
    cuts = np.floor(rest * np.cumsum(w / w.sum()) + 1e-9).astype(np.int64)
    cuts[-1] = rest  # float rounding must not lose a sample
    return 1 + np.diff(np.concatenate([[0], cuts]))


def _concentration(doc: str, **read_if):
    return key(doc, rule(number, lambda v: v > 0, _CONCENTRATION), required=True, **read_if)


@dataclass(frozen=True)
class IidOptions(KindOptions):
    sizes: str = key("client sizes: equal, or quantity skew (lognormal, dirichlet)", rule(one_of, SIZES))
    sigma: float | None = key("log-normal sigma of the sizes (read with sizes lognormal)", rule(
        number, lambda v: v > 0, "a log-normal sigma > 0"), required=True,
        read_if=lambda node: node.get("sizes") == "lognormal")
    alpha: float | None = _concentration("Dirichlet concentration of the sizes (read with sizes dirichlet)",
                                         read_if=lambda node: node.get("sizes") == "dirichlet")


def _iid_setting(part) -> dict:
    """Equal sizes have no options; skewed sizes name theirs (the size alpha is not a label-skew alpha)."""
    sizes = part.get("sizes")
    if sizes in (None, "equal"):
        return {}
    return {"sizes": sizes, **({"sigma": part.get("sigma")} if sizes == "lognormal" else {"size_alpha": part.get("alpha")})}


@partition_kind("iid", options=IidOptions,
                setting=("sizes", "sigma", "size_alpha"), setting_of=_iid_setting, label=lambda s, fmt: "IID")
def iid_partition(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **options) -> list[np.ndarray]:
    """:func:`iid` over the training set ``labels`` (only their number matters)."""
    return iid(len(labels), num_clients, rng, **options)


@dataclass(frozen=True)
class NoniidOptions(KindOptions):
    p_alpha: list[float] | None = key("optional pair [p, alpha] (zipped sweeps); null: p and alpha apply",
                                      pair(("p", "alpha")))
    p: float = key("class-presence probability p", rule(number, lambda v: 0 < v <= 1, "a probability in (0, 1]"),
                   required=True)
    alpha: float = _concentration("Dirichlet concentration α_Dir over the present classes")

    @staticmethod
    def relations(node, prefix: str) -> None:
        check_pair(node, prefix, "p_alpha", ("p", "alpha"))


@partition_kind("noniid", options=NoniidOptions, setting=("p", "alpha"),
                label=lambda s, fmt: f"non-IID ({fmt(s.get('p'))},{fmt(s.get('alpha'))})")
def noniid(
    labels: np.ndarray,
    num_clients: int,
    p: float,
    alpha: float,
    rng: np.random.Generator,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """FedCorr §3.1 non-IID split (docs/methods/setup.md §1.3).

    Phi ~ Bernoulli(p) (clients x classes) says which classes a client holds; for each class j a
    symmetric Dirichlet(alpha) over its holders gives q_j, and each sample of class j goes to a
    holder drawn independently from q_j (a multinomial draw, as the reference code does).
    """
    labels = np.asarray(labels, dtype=np.int64)
    _check_num_clients(len(labels), num_clients)
    if not 0.0 < p <= 1.0 or alpha <= 0.0:
        raise ValueError(f"noniid partition needs 0 < p <= 1 and alpha > 0 (got p={p}, alpha={alpha})")
    m = _num_classes(labels, num_classes)
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


@dataclass(frozen=True)
class ShardsOptions(KindOptions):
    s: int = key("label-sorted shards per client", rule(integer, 1), required=True)


@partition_kind("shards", options=ShardsOptions, setting=("s",))
def shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator, s: int = 2) -> list[np.ndarray]:
    """McMahan et al. 2017 §3 pathological non-IID: sort the indices by label (stable: original
    order within a class), cut them into N*s contiguous shards, give each client s random shards.

    Shard sizes are n // (N s) or one more (the remainder is spread, not dropped), so a client
    with s shards holds at most s classes when every class size is a multiple of the shard size.
    """
    labels = np.asarray(labels, dtype=np.int64)
    s = _positive_int("partition.s", s)
    _check_num_clients(len(labels), num_clients)
    if num_clients * s > len(labels):
        raise ValueError(f"partition.s={s} is invalid: num_clients * s = {num_clients * s} shards exceed "
                         f"the {len(labels)} training samples")
    by_label = np.argsort(labels, kind="stable")
    pieces = np.array_split(by_label, num_clients * s)
    order = rng.permutation(num_clients * s)  # shard order[k s + r] goes to client k
    return [np.sort(np.concatenate([pieces[j] for j in order[k * s:(k + 1) * s]])).astype(np.int64)
            for k in range(num_clients)]


@dataclass(frozen=True)
class ClassesOptions(KindOptions):
    k: int = key("classes per client", rule(integer, 1), required=True)


@partition_kind("classes", options=ClassesOptions, setting=("k",))
def classes(labels: np.ndarray, num_clients: int, rng: np.random.Generator, k: int = 2,
            num_classes: int | None = None) -> list[np.ndarray]:
    """Each client holds exactly k classes ("#C=k", Li et al., ICDE 2022 §4.1); the samples of a
    class, in random order, are split evenly among its holders (sizes differ by at most one)."""
    labels = np.asarray(labels, dtype=np.int64)
    m = _num_classes(labels, num_classes)
    k = _positive_int("partition.k", k)
    _check_num_clients(len(labels), num_clients)
    if k > m:
        raise ValueError(f"partition.k={k} is invalid: allowed an integer in [1, {m}] (the number of classes)")
    if num_clients * k < m:
        raise ValueError(f"partition.k={k} is invalid: {num_clients} clients x {k} classes cannot hold all "
                         f"{m} classes (need num_clients * k >= {m})")
    held = class_sets(num_clients, m, k, rng)
    owner = [[] for _ in range(num_clients)]
    for j in range(m):
        members = rng.permutation(np.flatnonzero(labels == j))
        holders = [c for c in range(num_clients) if j in held[c]]
        if 0 < len(members) < len(holders):
            raise ValueError(f"partition.k={k} is invalid: class {j} has {len(members)} samples for "
                             f"{len(holders)} holders; lower k or use fewer clients")
        for c, part in zip(holders, np.array_split(members, len(holders))):
            owner[c].append(part)
    out = [np.sort(np.concatenate(p)).astype(np.int64) for p in owner]
    _check_nonempty(out, f"classes k={k}, num_clients={num_clients}")
    return out


def class_sets(num_clients: int, num_classes: int, k: int, rng: np.random.Generator) -> list[set[int]]:
    """k distinct classes per client, every class held by someone (needs N k >= M, k <= M).

    Client i's first class is perm[i mod M]; the classes that are then still unheld (only when
    N < M) are dealt round-robin as the clients' further classes; the rest are drawn uniformly
    among the classes a client does not hold yet.
    """
    perm = rng.permutation(num_classes)
    held = [{int(perm[i % num_classes])} for i in range(num_clients)]
    unheld = [int(c) for c in perm[num_clients:]]  # empty when N >= M
    for t, c in enumerate(unheld):
        held[t % num_clients].add(c)
    for h in held:
        free = np.array(sorted(set(range(num_classes)) - h))
        h.update(int(c) for c in rng.choice(free, size=k - len(h), replace=False))
    return held


@dataclass(frozen=True)
class DirichletOptions(KindOptions):
    alpha: float = _concentration("Dirichlet concentration α: smaller is more skewed")
    min_size: int = key("fewest samples a client may hold (redrawn until met)", rule(integer, 0))


@partition_kind("dirichlet", options=DirichletOptions, setting=("alpha", "min_size"),
                label=lambda s, fmt: f"dirichlet (α={fmt(s.get('alpha'))})")
def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float = 0.5,
              min_size: int = 10, num_classes: int | None = None) -> list[np.ndarray]:
    """Per-class Dirichlet label skew: for each class j, q_j ~ Dir(alpha 1_N) over all N clients
    and the class's samples (random order) are cut at floor(n_j cumsum(q_j)) (Hsu et al. 2019's
    Dir(alpha) in the per-class form of NIID-Bench). Redrawn whole until every client holds at least
    ``min_size`` samples."""
    labels = np.asarray(labels, dtype=np.int64)
    m = _num_classes(labels, num_classes)
    _check_num_clients(len(labels), num_clients)
    if not alpha > 0:
        raise ValueError(f"partition.alpha={alpha} is invalid: allowed a Dirichlet concentration > 0")
    min_size = _positive_int("partition.min_size", min_size, lowest=0)
    if num_clients * min_size > len(labels):
        raise ValueError(f"partition.min_size={min_size} is invalid: {num_clients} clients x {min_size} "
                         f"exceed the {len(labels)} training samples")
    for _ in range(_MAX_DIRICHLET_DRAWS):
        owner = [[] for _ in range(num_clients)]
        for j in range(m):
            members = rng.permutation(np.flatnonzero(labels == j))
            q = rng.dirichlet(np.full(num_clients, float(alpha)))  # q_j ~ Dir(alpha 1_N)
            cuts = np.floor(len(members) * np.cumsum(q)[:-1] + 1e-9).astype(np.int64)
            for c, part in enumerate(np.split(members, np.minimum(cuts, len(members)))):
                owner[c].append(part)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in owner]
        if min(len(x) for x in out) >= max(min_size, 1):
            return out
    raise ValueError(f"partition.alpha={alpha} is invalid here: after {_MAX_DIRICHLET_DRAWS} draws some client "
                     f"still held fewer than min_size={min_size} samples; raise alpha, lower "
                     "partition.min_size or use fewer clients")


def make_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    kind: str,
    num_classes: int | None = None,
    **params,
) -> list[np.ndarray]:
    """Call the partition kind ``kind`` (registered, see ``kinds``); ``params`` are its other keys."""
    registered = _partitions()
    if kind not in registered:
        raise ValueError(f"unknown partition kind {kind!r} (expected one of {', '.join(registered)})")
    fn = registered[kind].fn
    if "num_classes" in inspect.signature(fn).parameters:
        params["num_classes"] = num_classes
    return fn(labels, num_clients, rng=rng, **params)


def _check_num_clients(n: int, num_clients: int) -> None:
    if not 1 <= num_clients <= n:
        raise ValueError(f"num_clients must be between 1 and the training set size {n}, got {num_clients}")


def _num_classes(labels: np.ndarray, num_classes: int | None) -> int:
    m = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.min() < 0 or labels.max() >= m:
        raise ValueError(f"labels must lie in 0..{m - 1} (got {labels.min()}..{labels.max()})")
    return m


def _positive_int(key: str, value, lowest: int = 1) -> int:
    if isinstance(value, bool) or not float(value).is_integer() or value < lowest:
        raise ValueError(f"{key}={value!r} is invalid: allowed an integer >= {lowest}")
    return int(value)


def _check_nonempty(shards: list[np.ndarray], setting: str) -> None:
    empty = [k for k, s in enumerate(shards) if len(s) == 0]
    if empty:
        raise ValueError(
            f"{len(empty)} client(s) received 0 samples (first: client {empty[0]}) with {setting}; "
            "raise alpha or p, or use fewer clients"
        )
