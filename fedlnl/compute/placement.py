"""Where the training images live (``data_placement``): on the device, or in host memory with each
batch copied to the device.

- ``device``: the whole uint8 training set on the run's device (fastest; the default where it fits).
- ``host``: the set stays in host memory, pinned when CUDA is present; each batch is gathered on
  the host and copied with ``non_blocking`` on a side CUDA stream, the compute stream waiting for
  the copy (no host wait). ``HostImages.stream`` keeps one batch in flight: batch t+1's gather and
  copy are issued before batch t is handed out, so the copy runs while batch t trains. Every
  local-training loop takes its batches that way (``engine.epoch_batches``, ``TensorData.stream_uint8``:
  the indices of a pass read to the host once); other reads (scoring passes, a loss's extra
  samples) gather a batch when asked (``HostImages.gather``). The images are the same bytes, so the
  numbers equal device placement's (on the CPU the two hold the same tensor; the tests run the host
  code path there, the copy on a side stream only with CUDA).
- ``auto``: on the CPU ``device``; elsewhere ``host`` when the set is larger than ``HOST_ABOVE``
  whatever the device reports (full-size Clothing1M: ~196 GB as uint8 at 256x256, more than any
  card) or would take more than ``DEVICE_SHARE`` of a CUDA device's free memory
  (``torch.cuda.mem_get_info``); ``device`` otherwise. The rule reads the training set's size in
  bytes, never the dataset's name.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

PLACEMENTS = ("auto", "device", "host")
#: the share of the device's free memory the training set may take under ``auto``: the rest is for
#: the model, optimiser state, activations and the methods' per-sample stores
DEVICE_SHARE = 0.5
#: a training set above this many bytes stays in host memory on any device (no card holds it beside
#: the model; full-size Clothing1M is ~196 GB, its 32x32 form ~3 GB)
HOST_ABOVE = 100 * 10**9


def choose(placement: str, nbytes: int, device: torch.device) -> str:
    """``device`` or ``host`` for a training set of ``nbytes`` on ``device`` (see the module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"data_placement={placement!r} is invalid: allowed {', '.join(PLACEMENTS)}")
    if placement != "auto":
        return placement
    if device.type == "cpu":
        return "device"
    if nbytes > HOST_ABOVE:
        return "host"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return "host" if nbytes > DEVICE_SHARE * free else "device"
    return "device"


def host_copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` in host memory, pinned when CUDA is present (pinned pages make the copies asynchronous)."""
    x = x.cpu()
    return x.pin_memory() if torch.cuda.is_available() else x


def on_host(batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Index batches on the host. Made on a device (the shuffle is drawn there), they are read in
    one copy for all of them: a read per batch would make the host wait for the device every step,
    and the prefetch could not run ahead of the step in progress."""
    if not batches or all(b.device.type == "cpu" for b in batches):
        return batches
    return list(torch.cat(batches).cpu().split([b.numel() for b in batches]))


class HostImages:
    """Gathers batches of host-resident images and copies them to ``device``."""

    def __init__(self, x: torch.Tensor, device: torch.device):
        self.x, self.device = x, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.side = torch.cuda.Stream(self.device) if self.cuda else None

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """uint8 images ``idx`` on the device."""
        return self._ready(self._issue(idx))

    def stream(self, batches: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
        """uint8 images of each index batch on the device, with the next batch's copy in flight."""
        pending = None
        for idx in batches:
            issued = self._issue(idx)
            if pending is not None:
                yield self._ready(pending)
            pending = issued
        if pending is not None:
            yield self._ready(pending)

    def _issue(self, idx: torch.Tensor) -> tuple[torch.Tensor, object]:
        rows = idx.to("cpu")  # indices made on the device: read once per batch
        # gathered by indexing, as device placement does: the same values *and strides* (a size-1
        # channel dimension gets an unusual stride, and kernels choose their path by strides)
        gathered = self.x[rows]
        if not self.cuda:
            return gathered, None
        staged = torch.empty_strided(gathered.shape, gathered.stride(), dtype=gathered.dtype, pin_memory=True)
        staged.copy_(gathered)
        done = torch.cuda.Event()
        with torch.cuda.stream(self.side):  # the pinned block is not reused before this copy ends
            out = staged.to(self.device, non_blocking=True)
            done.record(self.side)
        return out, done

    def _ready(self, issued: tuple[torch.Tensor, object]) -> torch.Tensor:
        out, done = issued
        if done is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)  # the device waits for this batch's copy only; the host does not
            out.record_stream(current)  # freed only after the compute stream is done with it
        return out
