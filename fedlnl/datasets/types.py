"""The data layer's shared types: what a loader returns (Source), the ground truth the runner scores
with (Oracle), the built federation, and the one exception type of every data problem (DataError).

Every other module of ``fedlnl.datasets`` imports from here and nothing here imports them back, so the
imports of the package run one way: types <- {sources, partition, noise} <- federation <- options.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: the report reads the kinds registry without importing torch
    import torch

#: a clean label the dataset does not give (Clothing1M: most of the training set)
UNKNOWN_LABEL = -1


class DataError(ValueError):
    """Missing, incomplete or unusable data (files, folders, annotation sets). The message is one line
    for the user, naming the path and what to set or fetch; the runner prints it as
    ``fedlnl-run: error: ...`` and exits 2 before anything is written."""


class DatasetUnavailable(DataError):
    """The dataset files are missing and could not be downloaded."""


def one_line(err: BaseException | str) -> str:
    """The first line of an error message (loaders' and libraries' messages may span lines)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@dataclass
class Source:
    """A dataset loaded once into memory (images as uint8 NCHW, labels int64)."""

    name: str
    x_train: torch.Tensor  # uint8 [n, C, H, W]
    y_train: torch.Tensor  # int64 [n] clean (or, for real-noise datasets, the given noisy) labels
    x_test: torch.Tensor  # uint8 [m, C, H, W]
    y_test: torch.Tensor  # int64 [m] clean test labels
    num_classes: int
    mean: tuple[float, ...]  # per-channel normalisation, in [0, 1] pixel units
    std: tuple[float, ...]
    augment: dict | None = None  # e.g. {"crop": 32, "pad": 4, "flip": True}; None = no augmentation
    classes: tuple[str, ...] = ()
    #: for datasets with real label noise (CIFAR-10N, Clothing1M): the clean training labels where
    #: known (else None); y_train then holds the noisy labels and synthetic noise is not applied.
    y_train_clean: torch.Tensor | None = None


@dataclass
class Oracle:
    """Ground truth the runner uses to score methods. Never handed to a method."""

    clean_labels: torch.Tensor  # int64 [n_train]
    mu: np.ndarray  # float [N] sampled noise level per client (0 for clean clients)
    noisy_client: np.ndarray  # bool [N] client was chosen as noisy (gamma_k = 1)
    noisy_mask: torch.Tensor  # bool [n_train] observed label != clean label
    realized_rate: np.ndarray  # float [N] share of the client's samples whose label is wrong
    #: per client, the noise kind it received ("clean" for clean clients; the group's under mixed)
    client_kind: tuple[str, ...] = ()


@dataclass
class Federation:
    source: Source
    #: per client, sorted int64 global indices of its training samples (its validation samples are not here)
    client_indices: list[np.ndarray]
    labels: torch.Tensor  # int64 [n_train] observed (noisy) training labels
    oracle: Oracle
    hash: str  # content hash of (data identity, partition, labels, validation indices)
    meta: dict = field(default_factory=dict)  # partition / noise settings, for the summary
    #: per client, sorted global indices of its held-out validation samples (``selection.val_share``;
    #: empty arrays without a validation set); their labels are the observed ones in ``labels``. Only
    #: the runner reads them, never a method.
    client_val: list[np.ndarray] = field(default_factory=list)
    #: per client, positions in the test set of its local test set (``selection.client_test_size``
    #: images sampled to its training class proportions); only the runner reads them
    client_test: list[np.ndarray] = field(default_factory=list)

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def num_classes(self) -> int:
        return self.source.num_classes

    @property
    def client_sizes(self) -> tuple[int, ...]:
        return tuple(int(len(ix)) for ix in self.client_indices)

    @property
    def val_sizes(self) -> tuple[int, ...]:
        """Each client's number of validation samples (zeros without a validation set)."""
        return tuple(int(len(ix)) for ix in self.client_val) or (0,) * self.num_clients
