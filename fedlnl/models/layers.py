"""Layers whose behaviour off the CPU needs care: reproducible on a GPU, unchanged on the CPU.

- ``AdaptiveAvgPool2d``: torch's adaptive average pooling has no deterministic backward on CUDA
  (``torch.use_deterministic_algorithms(True)`` refuses it; its gradient adds with atomics) unless
  the output is 1x1 (torch computes that as a mean). On the CPU this layer is torch's (the same
  bits as before); elsewhere the pooling is two products with fixed averaging matrices,
  out = P_h · x · P_wᵀ with P[i, j] = 1/|window i| for j in window i = [⌊iH/h⌋, ⌈(i+1)H/h⌉)
  (torch's windows), whose gradient is deterministic. The two agree to float rounding.
- ``ClientDropout``: dropout whose masks come from the generator bound by ``random_source`` (the
  runner binds one per client update, seeded from the client's stream, and one for the server's
  steps), not from torch's global RNG, so a run does not depend on the order clients are trained
  in. Outside ``random_source`` (a model used on its own) it falls back to the global RNG. A
  diverged local update replayed with the per-step check restores them first (``source_state``),
  so the replay draws the masks of the first pass.
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import torch
import torch.nn.functional as F
from torch import nn

#: {"cpu": the bound CPU generator, device: a generator on that device seeded from it}
_SOURCE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("fedlnl_random_source", default=None)


@contextlib.contextmanager
def random_source(gen: torch.Generator):
    """``ClientDropout`` layers draw from ``gen`` inside (on another device: from a generator there,
    seeded by one draw of ``gen`` when first needed)."""
    token = _SOURCE.set({"cpu": gen})
    try:
        yield
    finally:
        _SOURCE.reset(token)


def source_state() -> dict | None:
    """The states of the generators ``random_source`` bound (None outside it): ``restore_source``
    returns them to it, so a replayed pass (``engine.train_steps``) draws the same dropout masks."""
    source = _SOURCE.get()
    return None if source is None else {key: gen.get_state() for key, gen in source.items()}


def restore_source(saved: dict | None) -> None:
    """The bound generators as ``source_state`` saw them; one made since (on another device, seeded by
    a draw of the bound one) is dropped and made again, from the same draw, when next needed."""
    source = _SOURCE.get()
    if source is None or saved is None:
        return
    for key in [k for k in source if k not in saved]:
        del source[key]
    for key, state in saved.items():
        source[key].set_state(state)


def _generator(device: torch.device) -> torch.Generator | None:
    source = _SOURCE.get()
    if source is None:
        return None
    key = str(device) if device.type != "cpu" else "cpu"
    if key not in source:
        seed = int(torch.randint(0, 2**62, (1,), generator=source["cpu"]))
        source[key] = torch.Generator(device=device).manual_seed(seed)
    return source[key]


class ClientDropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same scaling by 1/(1 − p)) with its mask drawn from the bound
    generator (``random_source``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gen = _generator(x.device) if self.training and self.p > 0 else None
        if gen is None:
            return super().forward(x)
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=gen)
        return x * keep / (1.0 - self.p) if not self.inplace else x.mul_(keep).div_(1.0 - self.p)


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` (no parameters, same state dict) with a deterministic gradient off the CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            return super().forward(x)
        return pool_by_products(x, self.output_size)


def pool_by_products(x: torch.Tensor, output_size) -> torch.Tensor:
    """Adaptive average pooling of [N, C, H, W] as P_h · x · P_wᵀ (see the module docstring)."""
    h_out, w_out = (output_size, output_size) if isinstance(output_size, int) else output_size
    H, W = x.shape[-2:]
    ph = _averaging(H, H if h_out is None else h_out, x)
    pw = _averaging(W, W if w_out is None else w_out, x)
    return ph @ x @ pw.T


def _averaging(size: int, out: int, like: torch.Tensor) -> torch.Tensor:
    """[out, size]: row i averages torch's adaptive window i."""
    m = torch.zeros(out, size, dtype=like.dtype)
    for i in range(out):
        lo, hi = (i * size) // out, math.ceil((i + 1) * size / out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m.to(like.device)
