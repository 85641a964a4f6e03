"""Sums of values grouped by an index (per-class feature sums, per-class losses), deterministic on
every device.

``index_add_`` adds its rows one after another on the CPU (a fixed order, so fixed bits), but with
atomic additions on CUDA, whose order (hence the last bits of a float sum) changes from run to run.
``group_sum`` keeps ``index_add_`` on the CPU, so CPU numbers stay bit for bit what they were, and on
any other device sums through a one-hot matrix product, a fixed reduction order with no atomics. The
two agree to float rounding (tests/test_gpu_policy.py).
"""
from __future__ import annotations

import torch


def group_sum(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """out[g] = Σ_{i: index[i] = g} values[i], for g < ``size``; ``values`` is [n] or [n, d], the
    result [size] or [size, d] in ``values``' dtype."""
    if values.device.type == "cpu":
        out = torch.zeros(size, *values.shape[1:], dtype=values.dtype, device=values.device)
        return out.index_add_(0, index, values)
    return onehot_sum(values, index, size)


def onehot_sum(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """``group_sum`` as onehot(index)ᵀ · values: the formulation used off the CPU."""
    onehot = (index.long()[:, None] == torch.arange(size, device=index.device)).to(values.dtype)  # [n, size]
    return (onehot.T @ values.reshape(values.shape[0], -1)).reshape(size, *values.shape[1:])
