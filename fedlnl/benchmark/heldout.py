"""The runner's held-out evaluation (``benchmark/selection.py``): the clients' validation counts and
their local test accuracies, at each evaluation of the global model.

Only the runner holds one; a method never sees a validation or test sample (its client views and its
pooled view hold training samples only).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedlnl.benchmark.selection import REPORT_BYTES, Reported, SelectionSettings, client_stats
from fedlnl.compute.evaluation import count_correct


class HeldOut:
    """Validation samples (observed labels as built: a run's relabels never reach them), local test
    sets as one [N, s] position matrix, and the per-client accuracies of the reported evaluation."""

    def __init__(self, fed, settings: SelectionSettings, device: torch.device):
        self.settings = settings
        self.num_clients = fed.num_clients
        self.val_sizes = fed.val_sizes
        self.reporters = sum(1 for n in self.val_sizes if n)  # clients that report counts
        idx = np.concatenate([np.zeros(0, dtype=np.int64), *fed.client_val])
        self.val_idx = torch.as_tensor(idx, dtype=torch.long, device=device)
        self.val_labels = fed.labels[torch.as_tensor(idx, dtype=torch.long)].to(device)
        self.owner = torch.as_tensor(np.repeat(np.arange(self.num_clients), self.val_sizes), dtype=torch.long,
                                     device=device)
        self.tests = torch.as_tensor(np.stack(fed.client_test), dtype=torch.long, device=device)
        self.noisy, self.noise_rate = fed.oracle.noisy_client, fed.oracle.realized_rate  # reporting only
        self.reported = Reported("val_acc" if self.reporters else "acc",
                                 last_stage=bool(self.reporters) and settings.stage == "last")

    @property
    def validated(self) -> bool:
        return self.reporters > 0

    def upload(self) -> int:
        """Bytes of one evaluation's validation reports: correct and total counts of every client that has a set."""
        return REPORT_BYTES * self.reporters

    def val_acc(self, model, data, batch_size: int) -> float | None:
        """Σ correct / Σ total of the clients' validation counts for ``model`` (None without validation)."""
        if not self.validated:
            return None
        correct = count_correct(model, data, self.val_idx, self.val_labels, self.owner, self.num_clients,
                                       batch_size)
        return sum(correct) / sum(self.val_sizes)

    def observe(self, row: dict, group_correct: list[int], val: float | None, stage=None) -> dict:
        """The row keys of this evaluation (``val_acc``; the client figures under ``client_every_eval``),
        and the reported evaluation moved here if this one is better (``stage``: the method's training
        stage at this evaluation, None when it names none; ``selection.stage``)."""
        acc = [c / self.tests.shape[1] for c in group_correct]
        ok = row["acc"] is not None  # a diverged model: no figure of its own
        out = {} if val is None else {"val_acc": val if ok else None}
        if self.settings.client_every_eval:
            out.update(client_stats(acc if ok else None, self.noisy))
        self.reported.offer({**row, **out, "stage": stage}, acc)
        return out

    def summary(self) -> dict:
        """The summary's per-client keys and the settings (``selection``)."""
        return {**self.reported.summary(self.noise_rate, self.noisy),
                "selection": {**dataclasses.asdict(self.settings), "val_samples": int(sum(self.val_sizes)),
                              "selected_by": self.reported.key}}
