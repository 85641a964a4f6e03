"""Synthetic label noise per client: FedCorr Eq. 4 (methods.md §1.4), symmetric or pair-flip.

Client k is noisy with probability rho (gamma_k ~ Bernoulli(rho)) and gets the noise level
mu_k = gamma_k * (tau + (1 - tau) * u_k), u_k ~ U(0, 1). A mu_k share of a noisy client's samples
receive a new label. Switches (each a ``${fidelity:paper,reference}`` choice in the YAML):

- ``count``: ``exact`` picks round(mu_k * n_k) samples without replacement (the paper's text);
  ``bernoulli`` flips a coin per sample, noisy iff u <= mu_k (the reference code: Binomial count).
- ``label_range``: ``all`` draws the new label uniformly over the M classes (the paper);
  ``first10`` over classes 0..min(10, M)-1 (the reference's hard-coded randint(0, 10), which on
  CIFAR-100 puts every noisy label in classes 0..9).
- ``exclude_true``: draw only among the classes other than the true one (then every chosen sample
  is really wrong, so the realized rate is mu_k instead of about (1 - 1/M) mu_k).

``pairflip`` maps class c to (c + 1) mod M with the same per-client levels; ``label_range`` and
``exclude_true`` do not apply to it. Randomness comes only from the ``rng`` passed in.

``cifar10n`` is real human label noise (Wei et al., ICLR 2022): the training labels are replaced by
one of the CIFAR-10N annotation sets (``label_set``: aggre, worse, random1..3) read from ``file``,
aligned to the training order of ``dataset=cifar10`` / ``cifar10_jpeg`` (checked: the file's
``clean_label`` must equal the dataset's labels). No randomness; rho/tau do not apply.

Real noise and unknown clean labels: a clean label of ``UNKNOWN_LABEL`` (-1; most of Clothing1M)
is never counted as noisy and is left out of every realized rate (a client with no known clean
label gets rate nan, and is not a noisy client).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .federation import Oracle

#: a clean label the dataset does not give (Clothing1M: most of the training set)
UNKNOWN_LABEL = -1

KINDS = ("symmetric", "pairflip")
HUMAN_KINDS = ("cifar10n",)
COUNTS = ("exact", "bernoulli")
LABEL_RANGES = ("all", "first10")


def add_noise(
    labels: np.ndarray | torch.Tensor,
    client_indices: list[np.ndarray],
    num_classes: int,
    rng: np.random.Generator,
    kind: str,
    rho: float,
    tau: float,
    count: str = "exact",
    label_range: str = "all",
    exclude_true: bool = False,
    clean: np.ndarray | torch.Tensor | None = None,
    label_set: str | None = None,
    file: str | None = None,
) -> tuple[torch.Tensor, Oracle]:
    """Corrupt ``labels`` client by client; returns (observed labels, oracle).

    ``clean`` is given for datasets with real label noise (``labels`` are then already noisy): no
    synthetic noise is added (rho must be 0) and the oracle reports the real per-client noise.
    """
    labels = _as_numpy(labels)
    if kind in HUMAN_KINDS:
        return human_noise(labels, client_indices, file, label_set, rho, tau, clean)
    if clean is not None:
        return _real_noise(labels, _as_numpy(clean), client_indices, rho)
    _validate(kind, rho, tau, count, label_range)
    gamma, mu = client_noise_levels(len(client_indices), rho, tau, rng)
    observed = labels.copy()
    for k in np.flatnonzero(mu > 0):  # ascending client id, as the reference
        chosen = pick_noisy(client_indices[k], mu[k], count, rng)
        observed[chosen] = new_labels(labels[chosen], num_classes, kind, label_range, exclude_true, rng)
    return torch.from_numpy(observed), _oracle(labels, observed, client_indices, mu, gamma)


def client_noise_levels(num_clients: int, rho: float, tau: float, rng: np.random.Generator):
    """(gamma, mu): which clients are noisy and their noise levels, FedCorr Eq. 4."""
    gamma = rng.random(num_clients) < rho  # gamma_k ~ Bernoulli(rho)
    u = rng.random(num_clients)  # u_k ~ U(0, 1)
    mu = gamma * (tau + (1.0 - tau) * u)  # mu_k = gamma_k (tau + (1 - tau) u_k)
    return gamma, mu


def pick_noisy(indices: np.ndarray, mu: float, count: str, rng: np.random.Generator) -> np.ndarray:
    """The samples of one client that get a new label."""
    if count == "exact":
        k = int(np.floor(mu * len(indices) + 0.5))  # round(mu_k n_k), half up
        return rng.choice(indices, size=k, replace=False)
    return indices[rng.random(len(indices)) <= mu]  # reference: noisy iff U(0,1) <= mu_k


def new_labels(
    y: np.ndarray, num_classes: int, kind: str, label_range: str, exclude_true: bool, rng: np.random.Generator
) -> np.ndarray:
    """Replacement labels for the chosen samples (true labels ``y``)."""
    if kind == "pairflip":
        return (y + 1) % num_classes
    top = num_classes if label_range == "all" else min(10, num_classes)
    if not exclude_true:
        return rng.integers(0, top, size=len(y))
    inside = y < top  # the true class is one of the candidates: skip it
    r = rng.integers(0, top - inside.astype(np.int64))
    return r + (inside & (r >= y))


def _oracle(clean, observed, client_indices, mu, gamma) -> Oracle:
    mask = (observed != clean) & (clean != UNKNOWN_LABEL)
    return Oracle(
        clean_labels=torch.from_numpy(clean.copy()),
        mu=np.asarray(mu, dtype=np.float64),
        noisy_client=np.asarray(gamma, dtype=bool),
        noisy_mask=torch.from_numpy(mask),
        realized_rate=realized_rates(clean, observed, client_indices),
    )


def realized_rates(clean: np.ndarray, observed: np.ndarray, client_indices) -> np.ndarray:
    """Per client, the share of its samples with a known clean label whose label is wrong
    (nan for a client without any known clean label)."""
    known = clean != UNKNOWN_LABEL
    wrong = (observed != clean) & known
    rates = []
    for ix in client_indices:
        n = int(known[ix].sum())
        rates.append(wrong[ix].sum() / n if n else float("nan"))
    return np.array(rates, dtype=np.float64)


def _real_noise(noisy, clean, client_indices, rho) -> tuple[torch.Tensor, Oracle]:
    """Real label noise: mu and the noisy-client flag are the realized per-client values."""
    if rho != 0:
        raise ValueError(
            f"this dataset has real label noise, synthetic noise must be off: set noise.rho=0 (got {rho})"
        )
    rate = realized_rates(clean, noisy, client_indices)
    return torch.from_numpy(noisy.copy()), _oracle(clean, noisy, client_indices, rate, rate > 0)


def _validate(kind: str, rho: float, tau: float, count: str, label_range: str) -> None:
    choices = (("kind", kind, KINDS), ("count", count, COUNTS), ("label_range", label_range, LABEL_RANGES))
    for key, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"noise.{key}={value!r} is not one of {allowed}")
    if not (0.0 <= rho <= 1.0 and 0.0 <= tau <= 1.0):
        raise ValueError(f"noise.rho and noise.tau must lie in [0, 1] (got rho={rho}, tau={tau})")


def _as_numpy(y) -> np.ndarray:
    if isinstance(y, torch.Tensor):
        y = y.cpu().numpy()
    return np.asarray(y, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# real human noise: CIFAR-10N

#: ``label_set`` -> key in CIFAR-10_human.pt
CIFAR10N_SETS = {"aggre": "aggre_label", "worse": "worse_label", "random1": "random_label1",
                 "random2": "random_label2", "random3": "random_label3"}


def human_noise(labels, client_indices, file, label_set, rho=None, tau=None, clean=None):
    """CIFAR-10N labels as the observed labels; oracle: clean = the dataset's labels, mu and the
    noisy-client flag = each client's realized rate (> 0)."""
    if label_set not in CIFAR10N_SETS:
        raise ValueError(f"noise.label_set={label_set!r} is not one of {tuple(CIFAR10N_SETS)}")
    if rho or tau:
        raise ValueError(f"noise=cifar10n is real noise: noise.rho/noise.tau do not apply (got {rho}, {tau})")
    if clean is not None:
        raise ValueError("noise=cifar10n needs a dataset with clean labels (cifar10 or cifar10_jpeg)")
    noisy = cifar10n_labels(file, label_set, _as_numpy(labels))
    rate = realized_rates(_as_numpy(labels), noisy, client_indices)
    return torch.from_numpy(noisy), _oracle(_as_numpy(labels).copy(), noisy, client_indices, rate, rate > 0)


def cifar10n_labels(file, label_set: str, dataset_labels: np.ndarray) -> np.ndarray:
    """One CIFAR-10N annotation set, after checking the file's clean labels equal the dataset's."""
    from hydra.utils import to_absolute_path  # relative paths: from the launch directory

    path = Path(to_absolute_path(str(Path(str(file)).expanduser())))
    if not path.is_file():
        raise FileNotFoundError(
            f"CIFAR-10N file not found: {path}; download CIFAR-10_human.pt from "
            "https://github.com/UCSC-REAL/cifar-10-100n (data/) and set noise.file=<path>"
        )
    table = torch.load(path, map_location="cpu", weights_only=False)  # a dict of numpy arrays
    clean = np.asarray(table["clean_label"], dtype=np.int64).reshape(-1)
    if clean.shape != dataset_labels.shape or not np.array_equal(clean, dataset_labels):
        what = (f"{int(np.sum(clean != dataset_labels))} of {len(clean)} labels differ"
                if clean.shape == dataset_labels.shape else f"{len(clean)} vs {len(dataset_labels)} samples")
        raise ValueError(
            f"noise=cifar10n: the clean_label of {path} does not match the training labels ({what}): "
            "use dataset=cifar10 (torchvision order) or cifar10_jpeg in its original order (order_labels)"
        )
    return np.asarray(table[CIFAR10N_SETS[label_set]], dtype=np.int64).reshape(-1)
