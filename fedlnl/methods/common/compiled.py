"""The compiled local step (``compile: true``): forward, loss and backward of the shared cross-entropy
step, and the SGD update of every method, compiled once per run with ``torch.compile`` and reused for
every client and round.

The units compiled, and why these:
- ``loss``: a batch loss function marked ``pure`` (``engine.ce_loss``, the loss of every method that
  trains with ``train_from_global`` / ``local_train`` without a loss of its own) is compiled as
  ``(model, xb, yb) -> loss``; AOTAutograd compiles its backward with it. One working model per run
  (the methods load each client's weights into it) keeps the guards valid across clients and rounds.
  A model with dropout (VGG-11) keeps an eager forward: its masks come from each client's generator.
  Shapes are static (``dynamic=False``): batches of ``batch_size`` run compiled, a client's shorter
  last batch runs eagerly, so a federation of uneven clients never recompiles per client. Loss
  functions of a method's own (mixup, proximal, SAM, label correction, ...) may draw from a generator,
  read the step number or keep state; they run eagerly.
- ``SGD``: the SGD update (``torch.optim.sgd.sgd``, torch's own formula) compiled over the lists of
  parameters, gradients and momentum buffers, so a fresh optimiser per local update and a learning
  rate that changes across rounds (floats are not specialised) reuse the same two graphs (first
  step without momentum buffers, later steps with them). Compiling ``optimizer.step`` itself would
  guard on the optimiser object and compile anew for every client. The subclass keeps the optimiser
  interface (state, ``state_dict``, step hooks), so wrappers (``common/optimizers.py``) and the replay
  of a diverged update work unchanged. Adam stays eager.

Modes: on CUDA ``reduce-overhead`` (CUDA graphs: a batch-10 step is launch-bound there) for the loss
step; its output is cloned, since a graph's next replay reuses its memory, and each step is marked as
a new graph step. The SGD update mutates its inputs in place, which CUDA graphs skip, so it uses the
default mode everywhere. On the CPU the default mode (inductor's C++ kernels; needs a C++ compiler).

Compiled numbers are not bit-identical to eager ones (fused kernels add in another order): ``compile``
is part of the config hash. ``begin``/``end`` bracket one run (``benchmark/runner.py``); outside a
run with ``compile: true`` everything here is the eager path.
"""
from __future__ import annotations

import importlib
import shutil
import weakref
from collections.abc import Callable

import torch
from torch import nn

_sgd = importlib.import_module("torch.optim.sgd").sgd  # the functional form torch.optim.SGD runs

#: torch.compile's mode per device type (default mode elsewhere)
MODES = {"cuda": "reduce-overhead"}


class _Run:
    """The compiled functions of one run."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.mode = mode(True, self.device)
        self.losses: dict[Callable, Callable] = {}
        self.draws: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> has random layers
        self.update = torch.compile(_sgd_update, dynamic=False)

    def loss(self, loss_fn: Callable) -> Callable:
        if loss_fn not in self.losses:
            def forward_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
                return loss_fn(model, xb, yb, 0, None)
            self.losses[loss_fn] = torch.compile(forward_loss, dynamic=False, mode=self.mode)
        return self.losses[loss_fn]

    def eager(self, model: nn.Module) -> bool:
        """A model with dropout keeps its eager forward: its masks come from the client's generator
        (``models/layers.py``), which compiled code would replace by inductor's own random stream."""
        if model not in self.draws:
            self.draws[model] = any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())
        return self.draws[model]


_RUN: _Run | None = None


def mode(enabled: bool, device: torch.device | str) -> str | None:
    """The torch.compile mode a run with ``compile: enabled`` uses on ``device`` (None = eager)."""
    return MODES.get(torch.device(device).type, "default") if enabled else None


def begin(enabled: bool, device: torch.device | str) -> str | None:
    """Start a run's compile policy; returns the torch.compile mode in use (None = eager). Clears
    dynamo's caches, so the run compiles its own graphs once (and no earlier run's model is kept)."""
    global _RUN
    end()
    if not enabled:
        return None
    torch._dynamo.reset()
    _RUN = _Run(device)
    return _RUN.mode


def end() -> None:
    global _RUN
    _RUN = None


def check(device: torch.device | str) -> str | None:
    """Why ``compile: true`` cannot run on ``device`` (one line), or None."""
    if torch.device(device).type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "compile=True is invalid on the CPU without a C++ compiler (inductor builds C++ kernels): allowed false"
    return None


def pure(loss_fn: Callable) -> Callable:
    """Mark a batch loss ``(model, xb, yb, step, gen)`` that depends on ``model, xb, yb`` only (no
    draws, no step number, no state): the compiled step may run it."""
    loss_fn.pure = True
    return loss_fn


def loss(loss_fn: Callable, batch_size: int) -> Callable:
    """``loss_fn`` compiled for full batches of ``batch_size`` where this run compiles and the function
    is ``pure``; else ``loss_fn`` itself."""
    if _RUN is None or not getattr(loss_fn, "pure", False):
        return loss_fn
    compiled, graphs = _RUN.loss(loss_fn), _RUN.mode == "reduce-overhead"

    def step_loss(model, xb, yb, step, gen):
        if xb.shape[0] != batch_size or _RUN.eager(model):  # a short last batch: eager, no graph per size
            return loss_fn(model, xb, yb, step, gen)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(model, xb, yb).clone()  # the graph's output memory is reused next step
        return compiled(model, xb, yb)
    return step_loss


def sgd_class() -> type[torch.optim.SGD]:
    """The SGD class a local update builds: ``SGD`` (compiled update) while a compiled run is on."""
    return SGD if _RUN is not None else torch.optim.SGD


def _sgd_update(params, grads, bufs, lr, weight_decay, momentum, dampening, nesterov, maximize):
    _sgd(params, grads, bufs, weight_decay=weight_decay, momentum=momentum, lr=lr, dampening=dampening,
         nesterov=nesterov, maximize=maximize, foreach=True)


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` whose update runs the run's compiled ``_sgd_update`` (eager outside a
    compiled run). State lives in ``self.state`` as in torch's, so ``state_dict`` and hooks hold."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("the compiled SGD step takes no closure")
        update = _RUN.update if _RUN is not None else _sgd_update
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            lr = self._lr(i, group["lr"], params[0]) if _RUN is not None else group["lr"]
            update(params, [p.grad for p in params], bufs, lr, group["weight_decay"], group["momentum"],
                   group["dampening"], group["nesterov"], group["maximize"])
            if group["momentum"] != 0:
                for p, buf in zip(params, bufs):
                    self.state[p]["momentum_buffer"] = buf
        return None

    def _lr(self, i: int, value: float, like: torch.Tensor) -> torch.Tensor:
        """Group ``i``'s learning rate as a 0-dim tensor on the parameters' device, made again only
        when its value changes: a graph input, so a schedule never recompiles the update (a float
        would be guarded as a constant)."""
        cache = self.__dict__.setdefault("_lr_tensors", {})
        if i not in cache or cache[i][0] != value:
            cache[i] = (value, torch.tensor(value, dtype=like.dtype, device=like.device))
        return cache[i][1]
