"""Noise-detection scores: a method's relabels and noisy/clean decisions held against the oracle.

Only the runner holds an ``OracleScorer``; a method reports through ``ctx.relabel``,
``ctx.report_clients`` and ``ctx.report_samples`` and never sees the clean labels.
"""
from __future__ import annotations

import numpy as np
import torch


def binary_scores(pred: np.ndarray, truth: np.ndarray, prefix: str) -> dict[str, float]:
    """Precision, recall and F1 of boolean predictions (positive = noisy). Empty denominators
    give nan so a run with nothing flagged is not mistaken for a perfect one."""
    pred, truth = np.asarray(pred, bool), np.asarray(truth, bool)
    tp = float(np.sum(pred & truth))
    p = tp / pred.sum() if pred.sum() else float("nan")
    r = tp / truth.sum() if truth.sum() else float("nan")
    f1 = 2 * p * r / (p + r) if p + r > 0 else float("nan")
    return {f"{prefix}_precision": p, f"{prefix}_recall": r, f"{prefix}_f1": f1}


class OracleScorer:
    """Scores a method's noise decisions against the oracle; only the runner holds one.

    Samples whose clean label is unknown (-1 in the oracle; most of Clothing1M) are left out of
    every score: relabel counts and accuracy, sample detection, noise after correction, confusion;
    so are the clients' validation samples (``held_out``): no method trains on or relabels them.
    """

    def __init__(self, oracle, client_indices, labels: torch.Tensor, held_out: torch.Tensor | None = None):
        self.oracle = oracle
        self.client_indices = client_indices
        self.labels = labels  # the run's observed labels (mutated by relabels)
        self.num_relabels = 0
        self.num_correct_relabels = 0
        self.latest: dict[str, float] = {}
        self.mu_hat: dict[int, float] = {}  # latest estimate per client
        self.flagged: dict[int, bool] = {}  # latest noisy/clean decision per client
        self.initial_labels = labels.clone()
        self.known = oracle.clean_labels >= 0  # clean label given (always, except real-noise data)
        if held_out is not None:
            self.known[held_out] = False

    # --- decisions reported by methods through the round context
    def relabel(self, idx: torch.Tensor, new: torch.Tensor, apply: bool = True) -> None:
        """Apply label corrections and count how many now equal the clean label. ``apply=False``
        only scores them: relabels a method uses for one round without changing the observed labels
        (FedDiv's per-round relabels); each call then counts again."""
        idx = idx.to(self.labels.device).long()
        new = new.to(self.labels.device).long()
        changed = self.labels[idx] != new
        idx, new = idx[changed], new[changed]
        if apply:
            self.labels[idx] = new
        clean = self.oracle.clean_labels.to(self.labels.device)[idx]
        known = clean >= 0
        self.num_relabels += int(known.sum())
        self.num_correct_relabels += int((clean == new)[known].sum())
        self._label_scores()

    def clients(self, is_noisy: dict[int, bool] | None = None, mu_hat: dict[int, float] | None = None):
        """Client-level decisions: flagged noisy clients and estimated noise levels μ̂_k."""
        if is_noisy:
            self.flagged.update({int(k): bool(v) for k, v in is_noisy.items()})
            ks = sorted(is_noisy)
            pred = np.array([is_noisy[k] for k in ks])
            self.latest.update(binary_scores(pred, self.oracle.noisy_client[ks], "client"))
        if mu_hat:
            self.mu_hat.update({int(k): float(v) for k, v in mu_hat.items()})
            ks = sorted(mu_hat)
            est = np.array([mu_hat[k] for k in ks], dtype=float)
            err = np.abs(est - self.oracle.realized_rate[ks])  # nan: no known clean label
            self.latest["mu_mae"] = float(np.nanmean(err)) if np.isfinite(err).any() else float("nan")

    def samples(self, idx: torch.Tensor, flagged: torch.Tensor) -> None:
        """Sample-level decisions on the given global indices (flagged = believed noisy)."""
        idx = idx.long().cpu()
        known = self.known[idx].numpy()
        truth = self.oracle.noisy_mask[idx].numpy()
        self.latest.update(binary_scores(flagged.cpu().numpy()[known], truth[known], "sample"))

    def _label_scores(self) -> None:
        clean = self.oracle.clean_labels.to(self.labels.device)
        known = self.known.to(self.labels.device)
        self.latest["noise_after_correction"] = float((self.labels != clean)[known].float().mean())
        self.latest["relabels"] = float(self.num_relabels)
        if self.num_relabels:
            self.latest["relabel_acc"] = self.num_correct_relabels / self.num_relabels

    def diagnostics(self, num_classes: int) -> dict:
        """Per-client truth vs estimates, class counts and label confusion before/after correction
        (rows = clean class, columns = observed class), for the report's figures."""
        known = self.known.cpu()
        clean = self.oracle.clean_labels.cpu().long()
        def confusion(labels):
            cells = (clean * num_classes + labels.cpu().long())[known]
            m = torch.bincount(cells, minlength=num_classes * num_classes)  # integer counts: exact anywhere
            return m.view(num_classes, num_classes).tolist()
        # class counts of the clean labels (the given label where the clean one is unknown)
        shown = torch.where(known, clean, self.initial_labels.cpu().long()).numpy()
        counts = [np.bincount(shown[ix], minlength=num_classes).tolist() for ix in self.client_indices]
        n = len(self.client_indices)
        return {
            "clients": {
                "true_rate": self.oracle.realized_rate.tolist(), "mu": self.oracle.mu.tolist(),
                "noisy_client": self.oracle.noisy_client.tolist(),
                "mu_hat": [self.mu_hat.get(k) for k in range(n)],
                "flagged": [self.flagged.get(k) for k in range(n)],
                "size": [int(len(ix)) for ix in self.client_indices],
                "kind": list(self.oracle.client_kind) or None,  # noise kind per client (mixed: its group's)
            },
            "class_counts": counts,
            "confusion_before": confusion(self.initial_labels),
            "confusion_after": confusion(self.labels),
        }
