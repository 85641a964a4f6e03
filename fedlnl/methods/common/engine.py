"""Shared mechanics every method builds on: plain functions, no base class.

One working model is trained per client by loading the global weights into it, so no per-client deep
copy of the network is made. The images, their placement and augmentation (``TensorData``), the
compiled step and the evaluation are the runner's (``fedlnl/compute/``); the loops here read batches
from them.

Speed notes:
- Training never reads a loss on the host per step: the batch losses stay on the device and are read
  once per local update (``train_steps``); a non-finite one then replays the update with the per-step
  check, so a diverged update ends with exactly the weights it had before (see ``train_steps``).
- Nor does a step copy anything from the host: draws are made on the data's device
  (``compute.data.device_generator``); per-batch scalars a method needs on the host come from
  ``host_draw``, which never waits for the device.
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
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.compute import compiled
from fedlnl.compute.data import (HOST_DRAWS, Batch, TensorData, child_seed, device_generator,  # noqa: F401
                                 forget_device_generator, host_draw, memory_format)
from fedlnl.methods.common.protocol import OPTIMIZERS, ClientUpdate, Optim
from fedlnl.models import layers


# ------------------------------------------------------------------------------- batches
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


# ------------------------------------------------------------------------------- local training
def optimizer(model: nn.Module, optim: Optim, run: compiled.Run | None = None) -> torch.optim.Optimizer:
    """The optimiser of every method's local training, from its ``FLSettings`` (``fl.optim(...)``,
    with a method's stage-specific values as overrides): SGD with momentum, or Adam with betas, both
    with coupled (L2) weight decay. A fresh one per local update unless a method keeps it (the
    reference codes keep no optimiser state across rounds). ``run``: the run's compiled step
    (``data.compiled`` of the data it trains on; None = eager), whose SGD update it then uses."""
    params = model.parameters()
    if optim.name == "sgd":
        return compiled.sgd(run, params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
    if optim.name == "adam":
        return torch.optim.Adam(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay)
    raise ValueError(f"optimizer {optim.name!r} is unknown: allowed {', '.join(OPTIMIZERS)}")


def mixup(x: torch.Tensor, y: torch.Tensor, alpha: float, gen: torch.Generator):
    """Mixup (Zhang et al. 2018): x~ = λx + (1−λ)x[perm], one λ ~ Beta(α, α) per batch."""
    lam = float(np.random.default_rng(child_seed(gen)).beta(alpha, alpha))
    perm = torch.randperm(x.shape[0], generator=device_generator(gen, x.device), device=x.device)
    return lam * x + (1.0 - lam) * x[perm], y, y[perm], lam


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
    forget_device_generator(gen)  # a device generator for ``gen`` is made anew from ``gen`` in each pass
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
    forget_device_generator(gen)
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
    ``opt_fn(model, optim, run=data.compiled)`` builds the optimiser (default ``optimizer``): a method wraps the
    optimiser's step (gradient clipping, sharpness-aware steps: ``common/optimizers.py``) without
    rewriting the loop either. ``begin()`` runs before every pass over the batches (the first, and the
    replay of a diverged update, ``train_steps``): a loss that keeps state across batches resets it
    there, so the replay does not see it advanced by the first pass.
    """
    model.train()
    fmt = memory_format(model, data.device)
    run = data.compiled
    opt = (opt_fn or optimizer)(model, optim, run=run)
    # ``compile: true``: forward, loss, backward and update as one compiled function where the loss and
    # optimiser allow (``whole``), else the compiled loss where the loss allows (``loss_fn``)
    whole = compiled.whole_step(run, loss_fn, opt, batch_size)
    loss_fn = compiled.loss(run, loss_fn, batch_size)

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
