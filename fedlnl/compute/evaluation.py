"""Scores of a model on the run's held-out data: the test set the runner evaluates after every round
(``evaluate``) and the clients' validation sets (``count_correct``, ``benchmark/heldout.py``). The
runner's concern: no method evaluates on the test set."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.compute.data import TensorData, memory_format


@dataclass(frozen=True)
class Evaluation:
    """Test-set scores of one model: accuracy, mean cross-entropy, balanced accuracy (the mean
    per-class recall over the classes the labels hold, the metric FedNoRo reports), the recall of
    each class (None for a class absent from the labels) and, when groups were given, each group's
    number of correct predictions."""

    acc: float
    loss: float
    balanced_acc: float
    class_acc: list
    group_correct: list | None = None


@torch.inference_mode()
def evaluate(model: nn.Module, data: TensorData, labels: torch.Tensor, batch_size: int = 1000,
             num_classes: int | None = None, groups: torch.Tensor | None = None) -> Evaluation:
    """Scores of ``model`` on the whole of ``data`` (a test set), read from the images normalised
    once (``data.plain``) in the model's memory format, with one host read. ``num_classes`` sets the
    length of ``class_acc`` (default: the model's number of outputs). ``groups`` [G, s]: positions in
    the test set (repeats allowed: the clients' local test sets); each row's count of correct
    predictions comes back in ``group_correct``, from the same pass and the same host read."""
    was_training = model.training
    model.eval()
    x = data.plain(memory_format(model, data.device))
    logits = torch.cat([model(xb) for xb in x.split(batch_size)])
    model.train(was_training)
    c = int(num_classes or logits.shape[1])
    loss = F.cross_entropy(logits, labels, reduction="mean")
    correct = logits.argmax(1) == labels
    # counts of (class, correct) pairs in one unweighted bincount (deterministic on every device)
    pairs = torch.bincount(labels * 2 + correct.long(), minlength=2 * c)[:2 * c].view(c, 2)
    count = pairs.sum(1)
    recall = pairs[:, 1] / count.clamp_min(1)
    present = (count > 0).float()
    balanced = (recall * present).sum() / present.sum().clamp_min(1)
    values = torch.cat([torch.stack([correct.float().mean(), loss, balanced]), recall, present])
    if groups is not None:  # float64: the float32 scores convert exactly, counts stay exact integers
        values = torch.cat([values.double(), correct[groups].sum(1).double()])
    values = values.tolist()
    acc, loss, balanced = values[:3]
    class_acc = [r if p else None for r, p in zip(values[3:3 + c], values[3 + c:3 + 2 * c])]
    counts = [int(v) for v in values[3 + 2 * c:]] if groups is not None else None
    return Evaluation(acc, loss, balanced, class_acc, counts)


@torch.no_grad()
def count_correct(model: nn.Module, data: TensorData, idx: torch.Tensor, labels: torch.Tensor,
                  owner: torch.Tensor, num_groups: int, batch_size: int = 1000) -> list[int]:
    """Per group, how many of the samples ``idx`` of ``data`` (eval mode, no augmentation) ``model``
    predicts as ``labels``; ``owner`` gives each sample's group. One forward pass, one host read."""
    was_training = model.training
    model.eval()
    fmt = memory_format(model, data.device)
    with torch.inference_mode():
        logits = [model(data.images(chunk, memory_format=fmt)) for chunk in idx.split(batch_size)]
    model.train(was_training)
    correct = torch.cat(logits).argmax(1) == labels
    # an unweighted bincount of the correct samples' groups: exact and deterministic on every device
    return torch.bincount(owner[correct], minlength=num_groups)[:num_groups].tolist()
