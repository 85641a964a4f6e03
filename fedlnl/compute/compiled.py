"""The compiled local step (``compile: true``): the whole step of the shared cross-entropy loss with
the run's SGD as one graph, else the loss and the SGD update apart, compiled once per run with
``torch.compile`` and reused for every client and round.

The units compiled, and why these:
- ``whole_step``: where the loss is ``pure`` and the optimiser is this module's plain ``SGD`` (no
  wrapper, no dampening, Nesterov or maximize), one local step — forward, loss, backward (``torch.func``
  gradients of the weights) and torch's SGD update with momentum and coupled weight decay — is one
  function of the weights, compiled as one graph. It returns the new weights and momentum buffers,
  which are copied into the model and the optimiser's state (one ``_foreach_copy_`` each): a pure
  graph, which CUDA graphs can replay (outputs reused next replay, hence the copies). It runs inside
  ``SGD.step``, so the optimiser's step hooks (the runner counts local steps with them) fire as
  eagerly. Given an ``data.Batch``, the graph also makes the images from the uint8 batch and its
  crop+flip draws (``data.prepare``; drawn outside, in the eager order). On this CPU a client
  epoch runs 1.17–1.33x faster than eager (``make bench``, README); the two units below, compiled
  apart, were slower than eager here (0.7–0.9x): the autograd engine and the optimiser's Python ran
  between them. A model's buffers (batch-norm statistics) are updated in place inside the graph.
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

Modes: on CUDA ``reduce-overhead`` (CUDA graphs: a batch-10 step is launch-bound there) for the whole
step and the loss; their outputs are copied or cloned, since a graph's next replay reuses its memory,
and each step is marked as a new graph step. A model with batch norm has the whole step mutate its
buffer inputs, which CUDA graphs may decline (it then runs in the default mode; not run on a GPU
yet). The SGD update alone mutates its inputs in place, which CUDA graphs skip, so it uses the
default mode everywhere. On the CPU the default mode (inductor's C++ kernels; needs a C++ compiler).

Compiled numbers are not bit-identical to eager ones (fused kernels add in another order): ``compile``
is part of the config hash. The runner makes one ``Run`` per run with ``compile: true`` (``start``) and
passes it down as a parameter: it rides on the training data (``TensorData.compiled``), which every
local-training loop receives, and ``engine.optimizer(..., run=...)`` takes it; ``None`` everywhere
is the eager path. No module state: two runs in one process never share compiled functions.
"""
from __future__ import annotations

import functools
import importlib
import shutil
import weakref
from collections.abc import Callable

import torch
from torch import nn

_sgd = importlib.import_module("torch.optim.sgd").sgd  # the functional form torch.optim.SGD runs

#: torch.compile's mode per device type (default mode elsewhere)
MODES = {"cuda": "reduce-overhead"}


class Run:
    """The compiled functions of one run (``start``)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.mode = mode(True, self.device)
        self.losses: dict[Callable, Callable] = {}
        self.draws: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> has random layers
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (names, buffers)
        self.update = torch.compile(_sgd_update, dynamic=False)
        self.wholes: dict[Callable, Callable] = {}

    def __reduce__(self):
        """A checkpoint keeps the device only (an optimiser in a method's state holds its run): loaded,
        the run compiles its functions anew."""
        return Run, (str(self.device),)

    def whole(self, loss_fn: Callable) -> Callable:
        if loss_fn not in self.wholes:
            self.wholes[loss_fn] = torch.compile(functools.partial(_whole_step, loss_fn), dynamic=False,
                                                 mode=self.mode)
        return self.wholes[loss_fn]

    def loss(self, loss_fn: Callable) -> Callable:
        if loss_fn not in self.losses:
            def forward_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
                return loss_fn(model, xb, yb, 0, None)
            self.losses[loss_fn] = torch.compile(forward_loss, dynamic=False, mode=self.mode)
        return self.losses[loss_fn]

    def named(self, model: nn.Module) -> tuple[tuple[str, ...], dict]:
        """``model``'s parameter names (in ``parameters()`` order) and its buffers by name."""
        if model not in self.names:
            self.names[model] = tuple(n for n, _ in model.named_parameters()), dict(model.named_buffers())
        return self.names[model]

    def eager(self, model: nn.Module) -> bool:
        """A model with dropout keeps its eager forward: its masks come from the client's generator
        (``models/layers.py``), which compiled code would replace by inductor's own random stream."""
        if model not in self.draws:
            self.draws[model] = any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())
        return self.draws[model]


def mode(enabled: bool, device: torch.device | str) -> str | None:
    """The torch.compile mode a run with ``compile: enabled`` uses on ``device`` (None = eager)."""
    return MODES.get(torch.device(device).type, "default") if enabled else None


def start(enabled: bool, device: torch.device | str) -> Run | None:
    """A run's compiled functions (None = eager). Clears dynamo's caches, so the run compiles its own
    graphs once (and no earlier run's model is kept)."""
    if not enabled:
        return None
    torch._dynamo.reset()
    return Run(device)


def check(device: torch.device | str) -> str | None:
    """Why ``compile: true`` cannot run on ``device`` (one line), or None."""
    if torch.device(device).type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "compile=true is invalid on the CPU without a C++ compiler (inductor builds C++ kernels): allowed false"
    return None


def pure(loss_fn: Callable) -> Callable:
    """Mark a batch loss ``(model, xb, yb, step, gen)`` that depends on ``model, xb, yb`` only (no
    draws, no step number, no state): the compiled step may run it."""
    loss_fn.pure = True
    return loss_fn


def loss(run: Run | None, loss_fn: Callable, batch_size: int) -> Callable:
    """``loss_fn`` compiled for full batches of ``batch_size`` where the run compiles (``run`` not None)
    and the function is ``pure``; else ``loss_fn`` itself."""
    if run is None or not getattr(loss_fn, "pure", False):
        return loss_fn
    compiled, graphs = run.loss(loss_fn), run.mode == "reduce-overhead"

    def step_loss(model, xb, yb, step, gen):
        if xb.shape[0] != batch_size or run.eager(model):  # a short last batch: eager, no graph per size
            return loss_fn(model, xb, yb, step, gen)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(model, xb, yb).clone()  # the graph's output memory is reused next step
        return compiled(model, xb, yb)
    return step_loss


def whole_step(run: Run | None, loss_fn: Callable, opt: torch.optim.Optimizer, batch_size: int) -> Callable | None:
    """``step(model, xb, yb) -> loss``, which takes one whole local step of ``opt`` on ``loss_fn``
    (``xb``: the images, or an ``data.Batch`` whose images the graph computes from its uint8 images)
    (compiled for full batches of ``batch_size``, eager for a short last batch or a model with dropout),
    where the run compiles (``run`` not None), ``loss_fn`` is ``pure`` and ``opt`` is a plain momentum SGD
    over one group of parameters; else None (the caller steps on ``loss(run, loss_fn, ...)`` itself)."""
    if run is None or not getattr(loss_fn, "pure", False) or type(opt) is not SGD or len(opt.param_groups) != 1:
        return None
    group = opt.param_groups[0]
    if group["dampening"] or group["nesterov"] or group["maximize"]:
        return None

    def step(model: nn.Module, xb, yb: torch.Tensor) -> torch.Tensor:
        n = xb.shape[0] if isinstance(xb, torch.Tensor) else xb.n
        opt.batch = (model, loss_fn, xb, yb, n == batch_size and not run.eager(model))
        try:
            opt.step()  # the step hooks fire around the whole step
            return opt.loss
        finally:
            opt.batch = opt.loss = None
    return step


def _whole_step(loss_fn, model, names, params, buffers, bufs, xb, yb, lr, weight_decay: float, momentum: float,
                prepare=None, static=()):
    """One local step as a function of the weights ``params`` (named ``names`` in ``model``) and the
    momentum buffers ``bufs``: the new weights, the new buffers and the loss. torch's SGD update
    (``torch.optim.sgd``, dampening 0): d = g + λw; b = μb + d; w = w − η·b. ``prepare``: ``xb`` is
    the tuple of tensors ``prepare(*xb, *static)`` makes the images from (``data.prepare``)."""
    if prepare is not None:
        xb = prepare(*xb, *static)
    def loss_of(weights, buffers):  # the buffers an argument: batch norm updates them in place
        return loss_fn(_Bound(model, {**buffers, **dict(zip(names, weights))}), xb, yb, 0, None)

    grads, loss = torch.func.grad_and_value(loss_of)(params, buffers)
    if weight_decay:
        grads = torch._foreach_add(grads, params, alpha=weight_decay)
    if momentum:
        bufs = grads = torch._foreach_add(torch._foreach_mul(bufs, momentum), grads)
    return torch._foreach_sub(params, torch._foreach_mul(grads, lr)), bufs, loss


class _Bound:
    """``model`` called with the given weights and buffers (``torch.func.functional_call``): what a
    pure loss calls as ``model(xb)`` inside the whole step."""

    def __init__(self, model: nn.Module, tensors: dict):
        self.model, self.tensors = model, tensors

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.model, self.tensors, (x,))


def sgd(run: Run | None, params, **hyper) -> torch.optim.SGD:
    """The SGD optimiser a local update builds: ``SGD`` (the run's compiled update) where the run
    compiles, else ``torch.optim.SGD``."""
    return SGD(params, run, **hyper) if run is not None else torch.optim.SGD(params, **hyper)


def _sgd_update(params, grads, bufs, lr, weight_decay, momentum, dampening, nesterov, maximize):
    _sgd(params, grads, bufs, weight_decay=weight_decay, momentum=momentum, lr=lr, dampening=dampening,
         nesterov=nesterov, maximize=maximize, foreach=True)


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` whose update runs the compiled ``_sgd_update`` of ``run`` (eager with None).
    State lives in ``self.state`` as in torch's, so ``state_dict`` and hooks hold."""

    batch = loss = None  # ``whole_step``'s batch while it steps, and the loss it gives back

    def __init__(self, params, run: Run | None = None, **hyper):
        super().__init__(params, **hyper)
        self.run = run

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("the compiled SGD step takes no closure")
        if self.batch is not None:
            self.loss = self._whole(*self.batch)
        else:
            self._update()
        return None

    def _update(self) -> None:
        update = self.run.update if self.run is not None else _sgd_update
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            lr = self._lr(i, group["lr"], params[0]) if self.run is not None else group["lr"]
            update(params, [p.grad for p in params], bufs, lr, group["weight_decay"], group["momentum"],
                   group["dampening"], group["nesterov"], group["maximize"])
            if group["momentum"] != 0:
                for p, buf in zip(params, bufs):
                    self.state[p]["momentum_buffer"] = buf

    def _whole(self, model: nn.Module, loss_fn: Callable, xb: torch.Tensor, yb: torch.Tensor,
               full: bool) -> torch.Tensor:
        if full and self.__dict__.get("_covers") is not model:  # asked once per optimiser and model
            mine, theirs = self.param_groups[0]["params"], list(model.parameters())
            if len(mine) != len(theirs) or any(p is not q or not p.requires_grad for p, q in zip(mine, theirs)):
                full = False  # trains a subset of the model's weights: the eager gradients
            else:
                self._covers = model
        deferred = not isinstance(xb, torch.Tensor)  # an ``data.Batch``
        if not full:  # eager forward and backward, then the compiled update
            xb = xb.images() if deferred else xb
            with torch.enable_grad():
                loss = loss_fn(model, xb, yb, 0, None)
                self.zero_grad(set_to_none=True)
                loss.backward()
            self._update()
            self.zero_grad(set_to_none=True)  # the whole step leaves no gradient: nor does this one
            return loss.detach()
        group = self.param_groups[0]
        params = group["params"]
        bufs = [self.state[p].get("momentum_buffer") for p in params] if group["momentum"] else []
        first = bool(bufs) and bufs[0] is None
        if first:  # torch's first step sets b = d, the same as μ·0 + d
            bufs = [torch.zeros_like(p) for p in params]
        graphs = self.run.mode == "reduce-overhead"
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        names, buffers = self.run.named(model)
        prepare, inputs, static = xb.graph_inputs() if deferred else (None, xb, ())
        weights, new, loss = self.run.whole(loss_fn)(model, names, params, buffers, bufs, inputs, yb,
                                                 self._lr(0, group["lr"], params[0]),
                                                 group["weight_decay"], group["momentum"],
                                                 prepare, static)
        torch._foreach_copy_(params, weights)
        if bufs:
            torch._foreach_copy_(bufs, new)
        if first:
            for p, buf in zip(params, bufs):
                self.state[p]["momentum_buffer"] = buf
        return loss.clone() if graphs else loss  # a graph's next replay reuses its output memory

    def _lr(self, i: int, value: float, like: torch.Tensor) -> torch.Tensor:
        """Group ``i``'s learning rate as a 0-dim tensor on the parameters' device, made again only
        when its value changes: a graph input, so a schedule never recompiles the update (a float
        would be guarded as a constant)."""
        cache = self.__dict__.setdefault("_lr_tensors", {})
        if i not in cache or cache[i][0] != value:
            cache[i] = (value, torch.tensor(value, dtype=like.dtype, device=like.device))
        return cache[i][1]
