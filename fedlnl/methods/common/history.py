"""Per-sample prediction histories kept across rounds, keyed by global sample index.

A client's history of its own samples is client-side state that must outlive a round (SELFIE's last q
predictions, docs/methods/local_lnl.md §21). One table for the whole federation, indexed by the global positions a
``ClientView`` carries, holds every client's part: client k only ever reads and writes its own rows,
so the table is the union of the per-client histories, and it is plain tensors (checkpointed with the
method's state). Plain functions on a dict, as ``semisup.label_memory``.

- ``new``: an empty table of n samples × q slots (−1 = no prediction stored yet).
- ``push``: append one predicted class per sample, overwriting the oldest once q are stored (a ring).
- ``class_counts``: how often each class was predicted among the stored slots, optionally reading the
  empty slots as a given class (the zero-initialised histories of the reference codes).
- ``full``: whether a sample has q predictions; ``clear``: forget every prediction.
"""
from __future__ import annotations

import torch


def new(n: int, q: int, device: torch.device | str = "cpu") -> dict:
    """An empty history of ``n`` samples with ``q`` slots each."""
    if q < 1:
        raise ValueError(f"a prediction history needs q >= 1 slots, got {q}")
    return {"preds": torch.full((n, q), -1, dtype=torch.long, device=device),
            "count": torch.zeros(n, dtype=torch.long, device=device)}


def push(h: dict, idx: torch.Tensor, predicted: torch.Tensor) -> None:
    """Store ``predicted[i]`` as the newest prediction of sample ``idx[i]`` (distinct indices)."""
    q = h["preds"].shape[1]
    slot = h["count"][idx] % q
    h["preds"][idx, slot] = predicted.to(h["preds"].dtype)
    h["count"][idx] += 1


def class_counts(h: dict, idx: torch.Tensor, num_classes: int, empty_as: int | None = None) -> torch.Tensor:
    """[len(idx), num_classes] float counts of the stored predictions of each sample; empty slots are
    ignored, or counted as class ``empty_as``."""
    preds = h["preds"][idx]
    if empty_as is not None:
        preds = torch.where(preds < 0, torch.full_like(preds, int(empty_as)), preds)
    counts = torch.zeros(preds.shape[0], num_classes + 1, device=preds.device)
    counts.scatter_add_(1, torch.where(preds < 0, num_classes, preds), torch.ones_like(preds, dtype=counts.dtype))
    return counts[:, :num_classes]


def full(h: dict, idx: torch.Tensor) -> torch.Tensor:
    """Whether each sample has q predictions stored."""
    return h["count"][idx] >= h["preds"].shape[1]


def clear(h: dict) -> None:
    """Forget every stored prediction (SELFIE's restart)."""
    h["preds"].fill_(-1)
    h["count"].zero_()
