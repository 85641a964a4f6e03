"""Server- and client-side memories a method keeps across rounds, in its own state.

- ``ModelCache``: the server's copy of the latest model each client uploaded, with any per-client
  records that came with it (e.g. FedRN's expertise and output signature, docs/methods/fedlsr_fedrn_fedelc.md §22.2). The
  server already receives these models; keeping them costs server memory only. Sending a cached model
  to another client is a download the method has to count itself (``bytes_of``): the runner's
  ``bytes_up`` counts uploads only.
- ``SampleStore``: one row of ``width`` numbers per training sample, keyed by the sample's global
  index (``ClientView.indices``), created on first use by a function of those indices (e.g. FedELC's
  learnable label distributions, initialised from the observed labels, docs/methods/fedlsr_fedrn_fedelc.md §22.3). It lives in
  the method's state, so it survives rounds and checkpoints; rows of a client stand for what that
  client keeps locally between its participations.

Both are plain containers (picklable, so checkpoints hold them) with no training logic.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fedlnl.methods.common import engine


class ModelCache:
    """{client: latest uploaded weights} plus {client: {key: record}}."""

    def __init__(self):
        self._weights: dict[int, dict[str, torch.Tensor]] = {}
        self._records: dict[int, dict] = {}

    def put(self, client: int, weights: dict[str, torch.Tensor], **records) -> None:
        """Keep ``weights`` (stored as given: pass a copy the caller no longer changes)."""
        self._weights[int(client)] = weights
        self._records.setdefault(int(client), {}).update(records)

    def __contains__(self, client) -> bool:
        return int(client) in self._weights

    def __len__(self) -> int:
        return len(self._weights)

    def clients(self) -> list[int]:
        """Clients with a cached model, ascending."""
        return sorted(self._weights)

    def weights(self, client: int) -> dict[str, torch.Tensor]:
        return self._weights[int(client)]

    def record(self, client: int, key: str, default=None):
        return self._records.get(int(client), {}).get(key, default)

    def bytes_of(self, client: int) -> int:
        """Bytes of sending this client's cached model to someone (the state dict's tensors)."""
        return engine.payload_bytes(self._weights[int(client)])


class SampleStore:
    """Rows [n, width] addressed by global sample index; missing rows are made by ``init``."""

    def __init__(self, width: int):
        self.width = int(width)
        self.values = torch.zeros(0, self.width)
        self.known = torch.zeros(0, dtype=torch.bool)

    def _grow(self, size: int, device) -> None:
        if size > self.values.shape[0]:
            pad = size - self.values.shape[0]
            self.values = torch.cat([self.values.to(device), torch.zeros(pad, self.width, device=device)])
            self.known = torch.cat([self.known.to(device), torch.zeros(pad, dtype=torch.bool, device=device)])
        elif self.values.device != torch.device(device):
            self.values, self.known = self.values.to(device), self.known.to(device)

    def get(self, idx: torch.Tensor, init: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The rows of ``idx`` (a copy); rows never set are first filled with ``init(those idx)``."""
        self._grow(int(idx.max()) + 1 if idx.numel() else 0, idx.device)
        missing = idx[~self.known[idx]]
        if missing.numel():
            self.values[missing] = init(missing).to(self.values.dtype)
            self.known[missing] = True
        return self.values[idx].clone()

    def set(self, idx: torch.Tensor, rows: torch.Tensor) -> None:
        self._grow(int(idx.max()) + 1 if idx.numel() else 0, idx.device)
        self.values[idx] = rows.detach().to(self.values.dtype)
        self.known[idx] = True

    def has(self, idx: torch.Tensor) -> torch.Tensor:
        """Boolean mask: which of ``idx`` have a row."""
        out = torch.zeros(idx.numel(), dtype=torch.bool, device=idx.device)
        inside = idx < self.known.shape[0]
        out[inside] = self.known.to(idx.device)[idx[inside]]
        return out
