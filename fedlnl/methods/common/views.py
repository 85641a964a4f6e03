"""A second, mildly augmented view of a training batch, for consistency / self-distillation losses.

A method's loss function receives the batch the runner's local training drew (``xb``: normalised,
cropped and flipped where the dataset defines it); ``mild_view`` returns another view of the same
images, as the consistency methods (FedLSR, docs/methods/fedlsr_fedrn_fedelc.md §22.1) compare the model's outputs on the two.

Kinds (the ones FedLSR's official code uses; docs/methods/fedlsr_fedrn_fedelc.md §22.1):
- ``color``: horizontal flip (p = 0.5), colour jitter with p = 0.8 (brightness, contrast,
  saturation factors ~ U[0.2, 1.8], hue shift ~ U[−0.2, 0.2], i.e. torchvision's
  ``ColorJitter(0.8, 0.8, 0.8, 0.2)``), grayscale with p = 0.2. The jitter's four operations run in
  a fixed order (torchvision draws a random order per call). Saturation, hue and grayscale act on
  three-channel images only, as in torchvision.
- ``rotate``: a rotation by θ ~ U[−30°, 30°] about the centre, nearest-neighbour sampling, zero fill
  (torchvision's ``RandomRotation(30)`` defaults).
- ``none``: the batch itself.

``per_sample``: independent draws per image (usual augmentation semantics), or one draw shared by the
whole batch (what a torchvision transform does when called on a batch tensor). ``space``: the colour
operations act on pixel values in [0, 1] (``pixels``: the batch is de-normalised, changed and
normalised again) or directly on the normalised tensor with torchvision's clamping to [0, 1]
(``normalised``). Rotation acts on the tensor it is given in both spaces (zero fill: black in
``pixels``, the dataset mean in ``normalised``).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from fedlnl.methods.common import engine

KINDS = ("color", "rotate", "none")
SPACES = ("pixels", "normalised")
GRAY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, torchvision's rgb_to_grayscale


def _draw(n: int, per_sample: bool, gen: torch.Generator, device: torch.device, low: float = 0.0,
          high: float = 1.0) -> torch.Tensor:
    """n values ~ U[low, high) on ``device`` (``gen``'s stream there: no host->device copy per batch):
    independent, or one value repeated (``per_sample=False``)."""
    u = torch.rand(n if per_sample else 1, generator=engine.device_generator(gen, device), device=device)
    return (low + (high - low) * u).expand(n).clone()


@lru_cache(maxsize=8)
def _luma(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.tensor(GRAY, dtype=dtype, device=device).view(1, 3, 1, 1)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """[B, 1, H, W] luma of an RGB batch."""
    return (x * _luma(x.dtype, x.device)).sum(1, keepdim=True)


def _blend(x, other, factor, clamp=True):
    out = factor.view(-1, 1, 1, 1) * x + (1.0 - factor.view(-1, 1, 1, 1)) * other
    return out.clamp(0.0, 1.0) if clamp else out


def rgb_to_hsv(x):
    r, g, b = x.unbind(1)
    maxc, minc = x.max(1).values, x.min(1).values
    v, delta = maxc, maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp_min(1e-12), torch.zeros_like(maxc))
    safe = delta.clamp_min(1e-12)
    h = torch.where(maxc == r, ((g - b) / safe) % 6.0,
                    torch.where(maxc == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    h = torch.where(delta > 0, h / 6.0, torch.zeros_like(h))
    return h % 1.0, s, v


def hsv_to_rgb(h, s, v):
    k = torch.stack([(5.0 + h * 6.0) % 6.0, (3.0 + h * 6.0) % 6.0, (1.0 + h * 6.0) % 6.0], 1)
    f = torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)
    return v.unsqueeze(1) - v.unsqueeze(1) * s.unsqueeze(1) * f


def color_jitter(x: torch.Tensor, gen: torch.Generator, per_sample: bool, strength: float = 1.0) -> torch.Tensor:
    """Flip (p 0.5), jitter (p 0.8) and grayscale (p 0.2) of a [B, C, H, W] batch in [0, 1]
    (SimCLR's colour distortion with s = ``strength``, as FedLSR's code builds it)."""
    b, c = x.shape[:2]
    dev = x.device
    flip = _draw(b, per_sample, gen, dev) < 0.5
    x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
    apply = (_draw(b, per_sample, gen, dev) < 0.8).view(-1, 1, 1, 1)
    s = 0.8 * strength
    bright, contrast, sat = (_draw(b, per_sample, gen, dev, 1 - s, 1 + s) for _ in range(3))
    hue = _draw(b, per_sample, gen, dev, -0.2 * strength, 0.2 * strength)
    y = _blend(x, torch.zeros_like(x), bright)
    gray = _gray(y) if c == 3 else y
    y = _blend(y, gray.mean((1, 2, 3), keepdim=True).expand_as(y), contrast)
    if c == 3:
        y = _blend(y, _gray(y).expand_as(y), sat)
        h, sv, v = rgb_to_hsv(y)
        y = hsv_to_rgb((h + hue.view(-1, 1, 1)) % 1.0, sv, v)
    x = torch.where(apply, y, x)
    if c == 3:
        to_gray = (_draw(b, per_sample, gen, dev) < 0.2).view(-1, 1, 1, 1)
        x = torch.where(to_gray, _gray(x).expand_as(x), x)
    return x


def rotate(x: torch.Tensor, gen: torch.Generator, per_sample: bool, degrees: float = 30.0) -> torch.Tensor:
    """Rotation by θ ~ U[−degrees, degrees] about the centre, nearest sampling, zero fill."""
    theta = _draw(x.shape[0], per_sample, gen, x.device, -degrees, degrees) * (math.pi / 180.0)
    cos, sin = torch.cos(theta), torch.sin(theta)
    zero = torch.zeros_like(cos)
    mat = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(mat.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def mild_view(xb: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, gen: torch.Generator, *,
              kind: str, per_sample: bool, space: str) -> torch.Tensor:
    """The second view of a normalised batch ``xb`` (see the module notes), normalised like ``xb``."""
    if kind == "none":
        return xb
    if kind == "rotate":
        return rotate(xb, gen, per_sample).contiguous(memory_format=_fmt(xb))
    if kind != "color":
        raise ValueError(f"mild_view: kind must be one of {KINDS}, got {kind!r}")
    if space == "normalised":
        return color_jitter(xb, gen, per_sample).contiguous(memory_format=_fmt(xb))
    pixels = xb * std + mean
    return ((color_jitter(pixels, gen, per_sample) - mean) / std).contiguous(memory_format=_fmt(xb))


def _fmt(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
        and not x.is_contiguous() else torch.contiguous_format
