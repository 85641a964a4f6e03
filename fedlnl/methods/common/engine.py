"""Shared mechanics every method builds on: plain functions, no base class.

Data stay resident as uint8 tensors on the run's device; a batch is an index gather, converted to
float, augmented on the whole batch at once (random crop with zero padding, horizontal flip) and
normalised. One working model is trained per client by loading the global weights into it, so no
per-client deep copy of the network is made.

Speed notes:
- Evaluation reads a test set normalised once per run (``TensorData.plain``) under inference mode;
  scoring passes over client data normalise per chunk (a cache of 50k CIFAR images in float would
  cost 614 MB for a pass that is a small share of a run).
- Images reach the model in the memory format it declares faster on the device
  (``memory_format``: a model's ``channels_last_on`` device types, measured in
  ``benchmarks/formats.py``); the parameters keep their layout.
- Training never reads a loss on the host per step: the batch losses stay on the device and are read
  once per local update (``train_steps``); a non-finite one then replays the update with the per-step
  check, so a diverged update ends with exactly the weights it had before (see ``train_steps``).
- Nor does a step copy anything from the host: crop offsets, flip coins, shuffles and mixup
  permutations are drawn on the data's device (``device_generator``: on the CPU the client's own
  generator, so the CPU draw sequence is the client's stream; elsewhere a device generator seeded
  once per local update from it). Per-batch scalars a method needs on the host (mixup's λ, FedLSR's
  ω) come from the host generator (``host_draw``), which never waits for the device.
- Per-parameter terms (the proximal term, FedDyn's linear term) run fused across the parameter
  tensors (``torch._foreach_*``): one sum per tensor into a reused buffer, added in order by one op
  (``sums_in_order``), and the gradient added to ``.grad`` after the backward pass by one op
  (``_add_to_grads_after_backward``), so their values and gradients equal the per-tensor
  expressions bit for bit (``prox_penalty``, ``prox_sq``, ``linear_term``) at about n + 10 ops a
  step for n parameter tensors (a sum each), not 3 per tensor (+ an in-order add, + autograd's
  accumulation of a second gradient).
  ``benchmarks/steps.py`` counts host reads, device moves and dispatched ops per step of every method.
"""
from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.methods.common import compiled, placement
from fedlnl.methods.common.protocol import OPTIMIZERS, ClientUpdate, Optim
from fedlnl.models import layers


# --------------------------------------------------------------------------------------- data
@dataclass
class TensorData:
    """Training images of the whole federation, resident on the run's device, or in host memory with
    each batch copied to the device (``placement.py``, ``data_placement``): the same values either way."""

    x: torch.Tensor  # uint8 [n, C, H, W], on the device or (host placement) in host memory
    mean: torch.Tensor  # [1, C, 1, 1] float, on the device
    std: torch.Tensor  # [1, C, 1, 1] float, on the device
    augment: dict | None = None  # {"crop": int, "pad": int, "flip": bool}; None = no augmentation
    #: {memory format: all images normalised}, built by ``plain`` on first use (one format at a time)
    _plain: dict = field(default_factory=dict, repr=False, compare=False)
    #: host placement: gathers batches of ``x`` and copies them to the device; None = ``x`` is there
    host: placement.HostImages | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, x: torch.Tensor, mean, std, augment, device, where: str = "device") -> "TensorData":
        """``where``: ``device`` or ``host`` (``placement.choose`` resolves ``data_placement=auto``)."""
        shape = (1, len(mean), 1, 1)
        kept = placement.host_copy(x) if where == "host" else x.to(device)
        return cls(
            x=kept,
            mean=torch.tensor(mean, dtype=torch.float32, device=device).view(shape),
            std=torch.tensor(std, dtype=torch.float32, device=device).view(shape),
            augment=dict(augment) if augment else None,
            host=placement.HostImages(kept, torch.device(device)) if where == "host" else None,
        )

    @property
    def device(self) -> torch.device:
        """Where the images are computed on (the run's device), whatever the placement."""
        return self.mean.device

    def uint8(self, idx: torch.Tensor) -> torch.Tensor:
        """The raw images ``idx`` on the device."""
        return self.host.gather(idx) if self.host is not None else self.x[idx]

    def images(self, idx: torch.Tensor, augment: bool = False, gen: torch.Generator | None = None,
               memory_format: torch.memory_format = torch.contiguous_format, raw: torch.Tensor | None = None):
        """Normalised float images for global indices ``idx``; augmented if asked and configured.
        ``raw``: their uint8 images already on the device (``stream_images``)."""
        raw = self.uint8(idx) if raw is None else raw
        return self.finish(raw, self.draws(raw, gen) if augment else None, memory_format)

    def draws(self, raw: torch.Tensor, gen: torch.Generator | None) -> tuple | None:
        """The crop+flip draws of the batch ``raw`` (``crop_flip_draws``), or None without augmentation."""
        return crop_flip_draws(raw.shape, gen, raw.device, **self.augment) if self.augment else None

    def finish(self, raw: torch.Tensor, draws: tuple | None, memory_format: torch.memory_format) -> torch.Tensor:
        """The normalised images of the uint8 batch ``raw``, cropped and flipped by ``draws`` if given."""
        xb = raw.float().div_(255.0)
        if draws is not None:  # NHWC-strided: channels-last needs no copy
            xb = crop_flip_apply(xb, *draws, self.augment["crop"], self.augment.get("pad", 4),
                                 *_aranges(raw.shape[0], self.augment["crop"], xb.device))
        return ((xb - self.mean) / self.std).contiguous(memory_format=memory_format)

    def stream_uint8(self, batches) -> Iterator[torch.Tensor]:
        """The raw images of each index batch on the device, in order. Under host placement the next
        batch's gather and copy are issued before a batch is handed out (``HostImages.stream``: one
        batch in flight while the caller trains on this one), and the indices are read to the host
        once for all ``batches`` (``placement.on_host``), not once per batch."""
        batches = list(batches)
        if self.host is None:
            return (self.x[idx] for idx in batches)
        return self.host.stream(placement.on_host(batches))

    def stream_images(self, batches, augment: bool = False, gen: torch.Generator | None = None,
                      memory_format: torch.memory_format = torch.contiguous_format):
        """``images`` of each index batch in turn, for a loop that knows its batches ahead: under host
        placement the next batch's copy is in flight while one is used (the random draws stay in
        batch order: only the uint8 copy runs ahead)."""
        batches = list(batches)
        for idx, raw in zip(batches, self.stream_uint8(batches)):
            yield self.images(idx, augment, gen, memory_format, raw=raw)

    def plain(self, memory_format: torch.memory_format = torch.contiguous_format,
              chunk: int = 2048) -> torch.Tensor:
        """Every image normalised, un-augmented, in ``memory_format``: computed once (in chunks, so
        no full-size temporaries) and kept; the values equal ``images(all indices)`` bit for bit."""
        if memory_format not in self._plain:
            self._plain.clear()  # one model per run: keep one layout only
            with torch.inference_mode(False), torch.no_grad():  # a normal tensor, usable in training
                out = torch.empty(self.x.shape, dtype=torch.float32, device=self.device,
                                  memory_format=memory_format)
                starts = range(0, self.x.shape[0], chunk)
                chunks = [torch.arange(s, min(s + chunk, self.x.shape[0]), device=self.x.device) for s in starts]
                for s, xb in zip(starts, self.stream_images(chunks)):
                    out[s:s + chunk] = xb
            self._plain[memory_format] = out
        return self._plain[memory_format]


def memory_format(model: nn.Module, device: torch.device | str) -> torch.memory_format:
    """Channels-last on the device types a model lists in ``channels_last_on`` (where it was
    measured faster, ``benchmarks/formats.py``), else the default NCHW layout. A fixed choice, not a
    timing at run time, so the numbers of a config never depend on the machine's load."""
    kinds = getattr(model, "channels_last_on", ())
    return torch.channels_last if torch.device(device).type in kinds else torch.contiguous_format


def augment_batch(
    x: torch.Tensor, gen: torch.Generator | None, crop: int, pad: int = 4, flip: bool = True
) -> torch.Tensor:
    """Random crop of size ``crop`` from the zero-padded image and a random horizontal flip,
    one independent draw per image, done for the whole batch with one gather."""
    return _crop_flip(x, gen, crop, pad, flip).contiguous()


@lru_cache(maxsize=16)
def _aranges(b: int, crop: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather's constant index tensors, made once per (batch, crop, device) (as normal tensors,
    even when first asked for inside inference mode)."""
    with torch.inference_mode(False):
        return torch.arange(b, device=device)[:, None, None], torch.arange(crop, device=device)


def _crop_flip(x: torch.Tensor, gen: torch.Generator | None, crop: int, pad: int = 4, flip: bool = True):
    """``augment_batch`` without the final copy: an NCHW-shaped view with NHWC (channels-last) strides.
    The draws (per image: y offset, x offset, flip coin) are the same, in the same order."""
    oy, ox, flipped = crop_flip_draws(x.shape, gen, x.device, crop, pad, flip)
    return crop_flip_apply(x, oy, ox, flipped, crop, pad, *_aranges(x.shape[0], crop, x.device))


def crop_flip_draws(shape, gen: torch.Generator | None, device: torch.device, crop: int, pad: int = 4,
                    flip: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One batch's crop+flip draws for images of ``shape`` [b, C, H, W], made where the images are (no
    host->device copy): y offsets, x offsets, then flip coins (None without flips)."""
    b, (hp, wp) = shape[0], (shape[-2] + 2 * pad, shape[-1] + 2 * pad)
    g = device_generator(gen, device)
    oy = torch.randint(0, hp - crop + 1, (b,), generator=g, device=device)
    ox = torch.randint(0, wp - crop + 1, (b,), generator=g, device=device)
    flipped = torch.rand(b, generator=g, device=device) < 0.5 if flip else None
    return oy, ox, flipped


def crop_flip_apply(x: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, flipped: torch.Tensor | None,
                    crop: int, pad: int, bi: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """The crop+flip of ``crop_flip_draws`` done with one gather; ``bi, ar``: ``_aranges``."""
    if pad:
        x = F.pad(x, (pad, pad, pad, pad))
    rows = (oy[:, None] + ar[None, :])  # [b, crop]
    cols = (ox[:, None] + ar[None, :])
    if flipped is not None:
        cols = torch.where(flipped[:, None], cols.flip(1), cols)
    # x[b, :, rows[b, i], cols[b, j]] for every image b
    out = x.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]
    return out.permute(0, 3, 1, 2)


def prepare(raw: torch.Tensor, oy: torch.Tensor | None, ox: torch.Tensor | None, flipped: torch.Tensor | None,
            mean: torch.Tensor, std: torch.Tensor, crop: int, pad: int, channels_last: bool) -> torch.Tensor:
    """``TensorData.images`` from the uint8 images and the batch's draws (``oy`` None: no augmentation),
    as traced inside the compiled whole step (``Batch``), where scaling, crop+flip and normalisation
    fuse with the forward. The crop+flip is two batched products with one-hot selection matrices,
    rows then columns (an all-zero row or column is the zero padding), on the integer pixel values:
    exact, since each output is one pixel times 1 plus zeros (also where TF32 products round their
    inputs to 11 bits: integers to 255 pass), so the images equal the gather's bit for bit (a test). Inductor
    turns the gather into a scalar loop over the 3 channels: 0.22 ms per batch of 10 on this CPU,
    the products 0.11 ms (``benchmarks/speed.py`` measures the step)."""
    xb = raw.float()  # the pixel values 0..255 are selected, then scaled: exact under TF32 products too
    if oy is not None:
        (h, w), at = raw.shape[-2:], torch.arange(crop, device=raw.device)
        rows = oy[:, None] + at[None, :] - pad  # [b, crop]: each output row's source row
        cols = ox[:, None] + at[None, :] - pad
        if flipped is not None:
            cols = torch.where(flipped[:, None], cols.flip(1), cols)
        pick_rows = (rows[:, :, None] == torch.arange(h, device=raw.device)).to(xb.dtype)  # [b, crop, h]
        pick_cols = (cols[:, None, :] == torch.arange(w, device=raw.device)[:, None]).to(xb.dtype)  # [b, w, crop]
        xb = pick_rows[:, None] @ xb @ pick_cols[:, None]
    xb = (xb / 255.0 - mean) / std
    return xb.contiguous(memory_format=torch.channels_last) if channels_last else xb


@dataclass(frozen=True, eq=False)
class Batch:
    """A batch's images not computed yet: its uint8 images and augmentation draws (drawn when the batch
    was handed out, in ``images``' order). The compiled whole step computes them inside its graph
    (``prepare``); ``images()`` computes them eagerly, equal to ``TensorData.images`` bit for bit."""
    data: TensorData
    raw: torch.Tensor
    draws: tuple | None  # (oy, ox, flipped) or None (no augmentation)
    memory_format: torch.memory_format

    @property
    def n(self) -> int:
        return self.raw.shape[0]

    def images(self) -> torch.Tensor:
        return self.data.finish(self.raw, self.draws, self.memory_format)

    def graph_inputs(self) -> tuple[Callable, tuple, tuple]:
        """``prepare`` (what the compiled whole step traces), its tensors and its static values."""
        a = self.data.augment or {}
        draws = self.draws if self.draws is not None else (None, None, None)
        tensors = (self.raw, *draws, self.data.mean, self.data.std)
        return prepare, tensors, (a.get("crop", 0), a.get("pad", 4), self.memory_format == torch.channels_last)


def epoch_batches(data: TensorData, idx: torch.Tensor, batch_size: int, gen: torch.Generator, *, augment: bool,
                  memory_format: torch.memory_format, deferred: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(positions, their images) for each shuffled mini-batch of one pass over ``idx``: what a
    local-training loop iterates. The shuffle is drawn first, then each batch's augmentation when
    the batch is handed out, so the draws are those of a loop calling ``batches`` and ``images``
    in turn; under host placement batch k+1's copy is issued before batch k is handed out, so it
    runs while batch k trains (``TensorData.stream_uint8``). A pass's first batch is not prefetched
    during the previous pass: its shuffle is not drawn yet. ``deferred``: a ``Batch`` (uint8 images and
    the same draws) instead of the images, for the compiled whole step to compute them in its graph."""
    positions = list(batches(idx.numel(), batch_size, gen, device=idx.device))
    rows = [idx[pos] for pos in positions]
    for pos, row, raw in zip(positions, rows, data.stream_uint8(rows)):
        if deferred:
            yield pos, Batch(data, raw, data.draws(raw, gen) if augment else None, memory_format)
        else:
            yield pos, data.images(row, augment, gen, memory_format, raw=raw)


def batches(n: int, batch_size: int, gen: torch.Generator, shuffle: bool = True,
            device: torch.device | str | None = None) -> Iterator[torch.Tensor]:
    """Positions 0..n-1 in shuffled mini-batches (the last one may be short, like drop_last=False),
    made on ``device`` (default CPU) with ``gen``'s stream there (``device_generator``)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    order = (torch.randperm(n, generator=device_generator(gen, device), device=device) if shuffle
             else torch.arange(n, device=device))
    yield from order.split(batch_size)


#: the generator on another device each host generator stands for, while a local update runs
_DEVICE_GENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def device_generator(gen: torch.Generator | None, device: torch.device | str,
                     fresh: bool = False) -> torch.Generator | None:
    """The generator a draw on ``device`` uses in place of the client's ``gen``: ``gen`` itself where
    it lives on ``device`` (on the CPU the draw sequence is the client's stream, unchanged), else a
    generator on ``device`` seeded from ``gen`` (one draw of a host generator: no device sync), made
    once per local update (``fresh``, at its start) and reused by every draw of the update, so no
    augmentation offset, flip coin, shuffle or mixup permutation is copied from the host per step."""
    device = torch.device(device)
    if gen is None or _same_device(gen.device, device):
        return gen
    held = _DEVICE_GENS.get(gen)
    if fresh or held is None or not _same_device(held.device, device):
        held = _DEVICE_GENS[gen] = torch.Generator(device=device).manual_seed(child_seed(gen))
    return held


# ------------------------------------------------------------------------------- local training
def optimizer(model: nn.Module, optim: Optim) -> torch.optim.Optimizer:
    """The optimiser of every method's local training, from its ``FLSettings`` (``fl.optim(...)``,
    with a method's stage-specific values as overrides): SGD with momentum, or Adam with betas, both
    with coupled (L2) weight decay. A fresh one per local update unless a method keeps it (the
    reference codes keep no optimiser state across rounds)."""
    params = model.parameters()
    if optim.name == "sgd":
        return compiled.sgd_class()(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
    if optim.name == "adam":
        return torch.optim.Adam(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    raise ValueError(f"optimizer {optim.name!r} is unknown: allowed {', '.join(OPTIMIZERS)}")


def mixup(x: torch.Tensor, y: torch.Tensor, alpha: float, gen: torch.Generator):
    """Mixup (Zhang et al. 2018): x~ = λx + (1−λ)x[perm], one λ ~ Beta(α, α) per batch."""
    lam = float(np.random.default_rng(child_seed(gen)).beta(alpha, alpha))
    perm = torch.randperm(x.shape[0], generator=device_generator(gen, x.device), device=x.device)
    return lam * x + (1.0 - lam) * x[perm], y, y[perm], lam


def child_seed(gen: torch.Generator) -> int:
    """A seed drawn from ``gen``, to feed a numpy sampler torch lacks a generator-aware form of."""
    return int(host_draw(torch.randint(0, 2**62, (1,), generator=gen)))


#: > 0 while ``host_draw`` reads: a step counter (benchmarks/steps.py) tells these reads apart
HOST_DRAWS = {"depth": 0}


def host_draw(t: torch.Tensor) -> float | int:
    """The value of a one-element draw of a host (CPU) generator, e.g. a per-batch scalar (mixup's
    λ seed, FedLSR's ω). A host read that never waits for a device: ``t`` must be on the CPU."""
    if t.device.type != "cpu" or t.numel() != 1:
        raise ValueError(f"host_draw reads one value drawn on the host, got {tuple(t.shape)} on {t.device}")
    HOST_DRAWS["depth"] += 1
    try:
        return t.item()
    finally:
        HOST_DRAWS["depth"] -= 1


def mixup_ce(logits: torch.Tensor, ya: torch.Tensor, yb: torch.Tensor, lam: float) -> torch.Tensor:
    """λ·CE(f(x~), y) + (1−λ)·CE(f(x~), y[perm])."""
    return lam * F.cross_entropy(logits, ya) + (1.0 - lam) * F.cross_entropy(logits, yb)


def prox_sq(model: nn.Module, anchor: list[torch.Tensor]) -> torch.Tensor:
    """Σ_params ‖w − w_g‖² over trainable parameters (buffers excluded)."""
    return _prox(model, anchor, half=False, mu=1.0)


def linear_term(params: list[torch.Tensor], coef: list[torch.Tensor]) -> torch.Tensor:
    """Σ_i ⟨p_i, c_i⟩ over parameter tensors with constant coefficients ``coef`` (FedDyn's linear term)."""
    if torch.compiler.is_compiling():  # the compiler fuses the plain expression itself
        return ordered_sum(p.mul(c).sum() for p, c in zip(params, coef))
    return _Linear.apply(coef, *params)


def ordered_sum(ts) -> torch.Tensor:
    """0 + Σ_i sum(t_i), tensor by tensor in order: the value of the per-tensor expression bit for bit
    (one flat sum would add in another order and change the last bits). Two ops per tensor: the
    reference form (``sums_in_order`` gives the same value in n + 2)."""
    total = 0
    for t in ts:
        total = total + t.sum()
    return total


_SUM_SLOTS: dict = {}


def sums_in_order(ts: list[torch.Tensor]) -> torch.Tensor:
    """``ordered_sum(ts)`` bit for bit in len(ts) + 2 dispatched ops instead of 2·len(ts): each
    tensor's sum (the same reduction kernel) written into a slot of one reused buffer, and the slots
    added in order onto 0 by one ``index_add`` with every index 0. On the CPU ``index_add`` into one
    element accumulates serially in the tensor's dtype, exactly 0 + s_1 + s_2 + … (tested against
    ``ordered_sum``); on CUDA it adds with atomics (deterministic under ``determinism=strict``, else
    the value's last bits may vary). No autograd (``out=``): for the terms' ``forward``."""
    t0 = ts[0]
    key = (t0.device, t0.dtype, len(ts), threading.get_ident())  # a buffer per thread: no shared writes
    if key not in _SUM_SLOTS:
        buf = torch.zeros(len(ts), dtype=t0.dtype, device=t0.device)
        _SUM_SLOTS[key] = (buf, buf.unbind(), torch.zeros(1, dtype=t0.dtype, device=t0.device),
                           torch.zeros(len(ts), dtype=torch.long, device=t0.device))
    buf, slots, zero, index = _SUM_SLOTS[key]
    for t, slot in zip(ts, slots):
        torch.sum(t, dim=(), out=slot)
    return torch.index_add(zero, 0, index, buf).view(())


def _accumulates(ctx) -> bool:
    """Whether the running backward pass accumulates into the ``.grad`` of every tensor input of
    ``ctx`` (the parameters: a term's only tensor inputs), i.e. runs all their AccumulateGrad nodes."""
    try:
        return all(node is not None and torch._C._will_engine_execute_node(node)
                   for node, _ in ctx.next_functions)
    except RuntimeError:  # torch refuses the question for a leaf under autograd.grad: no accumulation
        return False


def _add_to_grads_after_backward(ctx, params, grads) -> tuple:
    """The gradients of a term's parameter inputs, as ``backward`` returns them. Where this backward
    pass accumulates into every parameter's ``.grad`` (``loss.backward()``), they are instead added
    to the ``.grad`` tensors once the pass has ended, with one ``_foreach_add_``: returned, autograd
    would add each one to the loss's other gradient with an op per tensor. Float addition of two
    terms is commutative, so ``.grad`` gets the same bits either way. Under ``autograd.grad`` or
    ``backward(inputs=…)`` (no accumulation into every ``.grad``) they are returned as usual."""
    if torch.compiler.is_compiling() or not _accumulates(ctx):
        return tuple(grads)

    def add():
        fresh = [p.grad is None for p in params]
        have = [(p.grad, g) for p, g, f in zip(params, grads, fresh) if not f]
        if have:
            torch._foreach_add_([a for a, _ in have], [g for _, g in have])
        for p, g, f in zip(params, grads, fresh):
            if f:  # a parameter the rest of the loss does not reach
                p.grad = g

    torch.autograd.Variable._execution_engine.queue_callback(add)
    return (None,) * len(grads)


def _as_f32(x: float) -> float:
    """``x`` rounded to float32, as a float32 tensor op rounds a Python scalar operand."""
    return float(np.float32(x))


class _ProxSq(torch.autograd.Function):
    """μ·s·Σ_i ‖p_i − a_i‖² (s = ½ or 1) with its differences, squares and gradient fused across the
    parameter tensors (``torch._foreach_*``): a few ops, not several per tensor. Equal bit for bit to
    the per-tensor expression μ * (½ * Σ_i ((p_i − a_i) ** 2).sum()) and its autograd gradient:

    - value: the same squares summed in the same order (``sums_in_order``), then × ½ and × μ;
    - gradient: autograd forms g·μ, then ×½, then × 2(p_i − a_i) (pow's backward); ½ and 2 are exact
      scalings, so that is (p_i − a_i)·(g·μ) with one rounding, formed here as such (for s = 1:
      (p_i − a_i)·(g·2μ)). The identity needs g·μ·s to be a normal float32 (> 1.2e-38), true for any
      μ in use; it is added to ``.grad`` after the backward pass (``_add_to_grads_after_backward``)."""

    @staticmethod
    def forward(ctx, anchor, half, mu, *params):
        diffs = torch._foreach_sub(params, anchor)
        value = sums_in_order(torch._foreach_pow(diffs, 2))
        if half:
            value = value * 0.5
        if mu != 1.0:
            value = value * mu
        ctx.diffs, ctx.params = diffs, params
        ctx.scale = _as_f32(mu) * (1.0 if half else 2.0)
        return value

    @staticmethod
    def backward(ctx, g):
        coef = g if ctx.scale == 1.0 else g * ctx.scale
        grads = torch._foreach_mul(ctx.diffs, coef)
        return (None, None, None, *_add_to_grads_after_backward(ctx, ctx.params, grads))


class _Linear(torch.autograd.Function):
    """Σ_i ⟨p_i, c_i⟩ fused across tensors, summed in order (``sums_in_order``); gradient g·c_i, as
    autograd forms it for the per-tensor expression, added to ``.grad`` after the backward pass."""

    @staticmethod
    def forward(ctx, coef, *params):
        ctx.coef, ctx.params = coef, params
        return sums_in_order(torch._foreach_mul(params, coef))

    @staticmethod
    def backward(ctx, g):
        return (None, *_add_to_grads_after_backward(ctx, ctx.params, torch._foreach_mul(ctx.coef, g)))


PROX_FORMS = ("half_squared", "squared", "norm")


def _prox(model: nn.Module, anchor: list[torch.Tensor], half: bool, mu: float) -> torch.Tensor:
    params = list(model.parameters())
    if torch.compiler.is_compiling():  # the compiler fuses the plain expression itself
        sq = ordered_sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
        value = 0.5 * sq if half else sq
        return value if mu == 1.0 else mu * value
    return _ProxSq.apply(anchor, half, mu, *params)


def prox_penalty(model: nn.Module, anchor: list[torch.Tensor], form: str, mu: float = 1.0) -> torch.Tensor:
    """μ times the proximal distance to the global parameters in one of its published forms:
    ``half_squared`` ½‖w − w_g‖² (FedProx, Li et al. 2020, Eq. 2), ``squared`` ‖w − w_g‖²
    (FedCorr Eq. 5), ``norm`` ‖w − w_g‖ (the FedCorr reference code, docs/methods/setup.md §1.2).
    Equal bit for bit to ``mu * prox_penalty(model, anchor, form)``; passing μ in saves an op per
    step forward and backward."""
    if form == "half_squared":
        return _prox(model, anchor, True, mu)
    if form == "squared":
        return _prox(model, anchor, False, mu)
    if form == "norm":
        norm = prox_sq(model, anchor).clamp_min(1e-24).sqrt()
        return norm if mu == 1.0 else mu * norm
    raise ValueError(f"prox form must be one of {PROX_FORMS}, got {form!r}")


def param_anchor(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the current parameters, the w_g of a proximal term."""
    return [p.detach().clone() for p in model.parameters()]


def sgd_step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> float:
    """One optimiser step on ``loss``; returns its value, or the non-finite value without stepping
    (the caller then reports divergence). Reads the loss on the host: the per-step check that
    ``train_steps`` only runs when replaying a diverged update."""
    value = float(loss.detach())
    if math.isfinite(value):
        _step(opt, loss)
    return value


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
                losses: Callable[[], Iterator[torch.Tensor]],
                stepping: Callable[[], Iterator[torch.Tensor]] | None = None) -> list[float]:
    """Step ``opt`` on every batch loss the generator ``losses()`` yields; return the losses.
    ``stepping()``, if given, is ``losses()`` that takes each step itself as it yields the loss (the
    compiled whole step, ``compiled.whole_step``); a diverged pass is replayed through ``losses()``.

    No host read per step (on a GPU one would stall the launch queue every batch): the losses stay on
    the device and are read once at the end. Divergence (a non-finite loss) is thus seen after the
    pass; the model (weights and buffers), the optimiser state, ``gen`` and the generators dropout
    draws from (``layers.random_source``) are then restored and the pass replayed with the per-step
    check (``sgd_step``), which stops before stepping on the first non-finite loss and returns the
    losses up to and including it: the weights, losses and random draws (shuffles, augmentation,
    dropout masks) of a pass that checked every step. ``losses()`` must therefore be repeatable from
    those generators alone (every loss function here is; one that keeps state across batches outside
    them would see its state advanced twice).
    """
    start = (get_weights(model), copy.deepcopy(opt.state_dict()), gen.get_state(), layers.source_state())
    _DEVICE_GENS.pop(gen, None)  # a device generator for ``gen`` is made anew from ``gen`` in each pass
    kept = []
    for loss in (stepping or losses)():
        kept.append(loss.detach())
        if stepping is None:
            _step(opt, loss)
    values = torch.stack(kept).tolist() if kept else []  # the one host read
    if all(math.isfinite(v) for v in values):
        return values
    set_weights(model, start[0])
    opt.load_state_dict(start[1])
    gen.set_state(start[2])
    layers.restore_source(start[3])  # the dropout masks of the first pass again
    _DEVICE_GENS.pop(gen, None)
    values = []
    for loss in losses():
        values.append(sgd_step(opt, loss))
        if not math.isfinite(values[-1]):
            break
    return values


LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, int, torch.Generator], torch.Tensor]


@compiled.pure
def ce_loss(model, xb, yb, step, gen):
    return F.cross_entropy(model(xb), yb)


def local_train(
    model: nn.Module,
    data: TensorData,
    idx: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optim: Optim,
    gen: torch.Generator,
    loss_fn: LossFn = ce_loss,
    augment: bool = True,
    opt_fn: Callable[..., torch.optim.Optimizer] | None = None,
    begin: Callable[[], None] | None = None,
) -> float:
    """Local training over one client's samples with a fresh ``optim`` optimiser (``FLSettings.optim``);
    returns the mean batch loss (nan if diverged).

    ``loss_fn(model, xb, yb, step, gen)`` gives the batch loss, so a method adds mixup, proximal or
    regularisation terms without rewriting the loop; ``step`` counts batches within the epoch.
    ``opt_fn(model, optim)`` builds the optimiser (default ``optimizer``): a method wraps the
    optimiser's step (gradient clipping, sharpness-aware steps: ``common/optimizers.py``) without
    rewriting the loop either. ``begin()`` runs before every pass over the batches (the first, and the
    replay of a diverged update, ``train_steps``): a loss that keeps state across batches resets it
    there, so the replay does not see it advanced by the first pass.
    """
    model.train()
    fmt = memory_format(model, data.device)
    opt = (opt_fn or optimizer)(model, optim)
    # ``compile: true``: forward, loss, backward and update as one compiled function where the loss and
    # optimiser allow (``whole``), else the compiled loss where the loss allows (``loss_fn``)
    whole = compiled.whole_step(loss_fn, opt, batch_size)
    loss_fn = compiled.loss(loss_fn, batch_size)

    def losses(stepping=False):
        device_generator(gen, idx.device, fresh=True)  # replayed from ``gen`` alone (train_steps)
        if begin is not None:
            begin()
        for _ in range(epochs):
            for step, (pos, xb) in enumerate(epoch_batches(data, idx, batch_size, gen, augment=augment,
                                                           memory_format=fmt, deferred=stepping)):
                yield whole(model, xb, labels[pos]) if stepping else loss_fn(model, xb, labels[pos], step, gen)

    values = train_steps(model, opt, gen, losses, stepping=whole and (lambda: losses(stepping=True)))
    if values and not math.isfinite(values[-1]):
        return float("nan")
    total = 0.0
    for v in values:  # Python floats summed in order (np.mean's pairwise sum can differ in the last bit)
        total += v
    return total / max(len(values), 1)


#: loss_fn(model, xb, pos) -> loss; ``pos`` are positions within the index array being trained on
PosLossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def epoch_loop(model: nn.Module, opt: torch.optim.Optimizer, data: TensorData, idx: torch.Tensor,
               *, batch_size: int, gen: torch.Generator, augment: bool, loss_fn: PosLossFn) -> list[float]:
    """One shuffled pass over ``idx`` with an optimiser that lives longer than the pass (momentum
    kept across epochs, as the reference codes do within a run). Returns the batch losses; stops at
    the first non-finite one and returns it last (the caller reports nan)."""
    model.train()
    fmt = memory_format(model, data.device)

    def losses():
        device_generator(gen, idx.device, fresh=True)
        for pos, xb in epoch_batches(data, idx, batch_size, gen, augment=augment, memory_format=fmt):
            yield loss_fn(model, xb, pos)

    return train_steps(model, opt, gen, losses)


def train_from_global(state: dict, client, ctx, *, epochs: int, batch_size: int, optim: Optim,
                      augment: bool, loss_fn: LossFn = ce_loss,
                      opt_fn: Callable[..., torch.optim.Optimizer] | None = None):
    """The usual FedAvg-style client step: load the global weights into the one working model
    (``state["model"]``, ``state["global"]``), run ``local_train`` with the client's seeded
    generator, and return the trained weights as a ``ClientUpdate``."""
    model = state["model"]
    set_weights(model, state["global"])
    loss = local_train(model, client.data, client.indices, client.labels, epochs=epochs,
                       batch_size=batch_size, optim=optim, augment=augment,
                       gen=ctx.generator("train", client.id), loss_fn=loss_fn, opt_fn=opt_fn)
    return ClientUpdate(client.id, get_weights(model), client.size, train_loss=loss)


# ------------------------------------------------------------------------------- inference
@torch.no_grad()
def predict(
    model: nn.Module, data: TensorData, idx: torch.Tensor, batch_size: int = 1000,
    augment: bool = False, gen: torch.Generator | None = None, features: bool = False,
):
    """Logits (and penultimate features if asked) of ``model`` on samples ``idx``, in eval mode.
    The forward passes run in inference mode; the results are ordinary tensors (a method may edit
    them in place)."""
    was_training = model.training
    model.eval()
    fmt = memory_format(model, data.device)
    logits, feats = [], []
    with torch.inference_mode():
        for chunk in idx.split(batch_size):
            xb = data.images(chunk, augment=augment, gen=gen, memory_format=fmt)
            if features:
                f = model.features(xb)
                feats.append(f)
                logits.append(model.head(f))
            else:
                logits.append(model(xb))
    model.train(was_training)
    out = torch.cat(logits) if logits else torch.empty(0)  # cat outside inference mode: a normal tensor
    return (out, torch.cat(feats)) if features else out


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sample, no reduction."""
    return F.cross_entropy(logits, labels, reduction="none")


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
    correct = predict(model, data, idx, batch_size).argmax(1) == labels
    # an unweighted bincount of the correct samples' groups: exact and deterministic on every device
    return torch.bincount(owner[correct], minlength=num_groups)[:num_groups].tolist()


# ------------------------------------------------------------------------------- weights
def get_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the full state dict (parameters and buffers)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    model.load_state_dict(weights, strict=True)


def weighted_average(
    weights: list[dict[str, torch.Tensor]], counts: list[float] | np.ndarray
) -> dict[str, torch.Tensor]:
    """w = Σ_k n_k w_k / Σ_k n_k over every state-dict entry (FedAvg, McMahan et al. 2017, Eq. 1).

    Integer buffers (BatchNorm's num_batches_tracked) are averaged in float and rounded back.
    """
    if not weights:
        raise ValueError("weighted_average needs at least one client update")
    c = torch.as_tensor(np.asarray(counts, dtype=np.float64))
    if (c < 0).any() or c.sum() <= 0:
        raise ValueError(f"weighted_average: counts must be >= 0 with a positive sum, got {c.tolist()}")
    c = c / c.sum()
    out = {}
    for key, ref in weights[0].items():
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for w, ck in zip(weights, c):
            acc.add_(w[key].to(torch.float64), alpha=float(ck))
        out[key] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


def payload_bytes(obj) -> int:
    """Bytes a client uploads for ``obj`` (tensors, arrays, numbers, nested dicts/lists)."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (int, float, bool, np.number)):
        return 4
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    return 0


# ------------------------------------------------------------------------------- sampling
def cohort_size(frac: float, num_clients: int) -> int:
    """m = max(⌊frac·N⌋, 1): the clients a round trains (``fl.frac`` of the N clients, at least one)."""
    return max(int(frac * num_clients), 1)


def uniform_clients(num_clients: int, frac: float, rng: np.random.Generator) -> list[int]:
    """m = :func:`cohort_size` clients uniformly without replacement (sorted)."""
    return sorted(rng.choice(num_clients, size=cohort_size(frac, num_clients), replace=False).tolist())


# ------------------------------------------------------------------------------- robust aggregation
#: entries per temporary block in the coordinate-wise aggregators: bounds their extra memory
#: (an 11M-parameter model never needs a full [clients x parameters] copy); results do not depend on it.
CHUNK_ELEMENTS = 1 << 22


def median_lastdim(x: torch.Tensor) -> torch.Tensor:
    """Median along the last dimension. An even count gives the mean of the two middle values
    (ARFL's ``median_opt``, docs/methods/median.md §8), not ``torch.median``'s lower middle value."""
    n = x.shape[-1]
    s = x.sort(dim=-1).values
    if n % 2:
        return s[..., n // 2]
    return 0.5 * (s[..., n // 2 - 1] + s[..., n // 2])


def client_columns(weights: list[dict[str, torch.Tensor]], key: str, chunk: int = CHUNK_ELEMENTS):
    """Yield (start, block) over entry ``key`` of every client: ``block`` is [coords, clients] float32
    for at most ``chunk // clients`` coordinates, so a coordinate-wise rule runs on bounded memory."""
    n = len(weights)
    flat = [w[key].reshape(-1) for w in weights]
    step = max(1, chunk // max(n, 1))
    for s in range(0, flat[0].numel(), step):
        yield s, torch.stack([f[s:s + step].float() for f in flat], 1)


def coordinate_median(weights: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Coordinate-wise median over clients (Yin et al. 2018; ARFL's ``simple_median``) of every
    state-dict entry with >= 1 dimension, BatchNorm statistics included; even counts take the mean
    of the two middle values. 0-dim entries (``num_batches_tracked``) are copied from the first
    client, as the reference does. Unweighted: client sizes play no part."""
    if not weights:
        raise ValueError("coordinate_median needs at least one client update")
    out = {}
    for key, ref in weights[0].items():
        if ref.dim() == 0:
            out[key] = ref.clone()
            continue
        med = torch.cat([median_lastdim(block) for _, block in client_columns(weights, key)])
        med = med if ref.is_floating_point() else med.round()
        out[key] = med.to(ref.dtype).view_as(ref)
    return out
