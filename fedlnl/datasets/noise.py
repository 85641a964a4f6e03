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
"""
from __future__ import annotations

import numpy as np
import torch

from .federation import Oracle

KINDS = ("symmetric", "pairflip")
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
) -> tuple[torch.Tensor, Oracle]:
    """Corrupt ``labels`` client by client; returns (observed labels, oracle).

    ``clean`` is given for datasets with real label noise (``labels`` are then already noisy): no
    synthetic noise is added (rho must be 0) and the oracle reports the real per-client noise.
    """
    labels = _as_numpy(labels)
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
    mask = observed != clean
    return Oracle(
        clean_labels=torch.from_numpy(clean.copy()),
        mu=np.asarray(mu, dtype=np.float64),
        noisy_client=np.asarray(gamma, dtype=bool),
        noisy_mask=torch.from_numpy(mask),
        realized_rate=np.array([mask[ix].mean() for ix in client_indices], dtype=np.float64),
    )


def _real_noise(noisy, clean, client_indices, rho) -> tuple[torch.Tensor, Oracle]:
    """Real label noise: mu and the noisy-client flag are the realized per-client values."""
    if rho != 0:
        raise ValueError(
            f"this dataset has real label noise, synthetic noise must be off: set noise.rho=0 (got {rho})"
        )
    rate = np.array([(noisy[ix] != clean[ix]).mean() for ix in client_indices], dtype=np.float64)
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
