"""The run's images on its device: where they live, how a batch becomes model input, and the draws
that make it (the runner owns these; the methods read batches through ``TensorData`` and the loops of
``methods/common/engine.py``).

Data stay resident as uint8 tensors on the run's device, or in host memory (``placement.py``); a batch
is an index gather, converted to float, augmented on the whole batch at once (random crop with zero
padding, horizontal flip) and normalised.

- Evaluation reads a test set normalised once per run (``TensorData.plain``) under inference mode;
  scoring passes over client data normalise per chunk (a cache of 50k CIFAR images in float would
  cost 614 MB for a pass that is a small share of a run).
- Images reach the model in the memory format it declares faster on the device
  (``memory_format``: a model's ``channels_last_on`` device types, measured in
  ``benchmarks/formats.py``); the parameters keep their layout.
- No step copies anything from the host: crop offsets, flip coins, shuffles and mixup permutations
  are drawn on the data's device (``device_generator``: on the CPU the client's own generator, so
  the CPU draw sequence is the client's stream; elsewhere a device generator seeded once per local
  update from it). Per-batch scalars a method needs on the host (mixup's λ, FedLSR's ω) come from the
  host generator (``host_draw``), which never waits for the device.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.compute import compiled, placement

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
    #: the run's compiled local step (``compile: true``; ``compiled.start``), set by the runner on the
    #: training data and passed on by every local-training loop; None = eager
    compiled: compiled.Run | None = field(default=None, repr=False, compare=False)

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


def forget_device_generator(gen: torch.Generator) -> None:
    """Drop the device generator ``gen`` stands for: the next draw seeds one anew from ``gen``."""
    _DEVICE_GENS.pop(gen, None)


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
