"""Optimiser wrappers a method hands to ``engine.local_train`` / ``train_from_global`` as ``opt_fn``.

Each is a factory with ``engine.optimizer``'s signature ``(model, optim, run)`` that builds the base
optimiser of the run (``fl.optimizer``: SGD or Adam) and returns itself: an object with the optimiser interface ``train_steps`` uses
(``zero_grad``, ``step``, ``state_dict``, ``load_state_dict``), so the shared loop, its single host
read per local update and its replay of a diverged update stay as they are.

- ``ClipGrad``: rescale the gradient to a total L2 norm <= ``max_norm`` before every step
  (``torch.nn.utils.clip_grad_norm_``; FNBench's ``clipping`` client, docs/methods/robust_aggregation.md §19.4).
- ``FusedDecay``: coupled weight decay added to every gradient in one op (FedDyn's local step).
- ``SAM``: sharpness-aware minimisation (Foret et al., ICLR 2021) as FedSAM's local step
  (docs/methods/fedexp_fedsam.md §20.2): the batch loss function moves the weights to w + ε̂ and returns the loss there;
  the backward pass then gives the SAM gradient, and ``step`` returns to w before the base step.
"""
from __future__ import annotations

import torch
from torch import nn

from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import Optim


class Wrapper:
    """The run's optimiser (``engine.optimizer``) behind the interface ``train_steps`` uses; a
    subclass changes the gradient in ``prepare`` before every base step."""

    def __init__(self):
        self.base: torch.optim.Optimizer | None = None
        self.params: list[nn.Parameter] = []

    def __call__(self, model: nn.Module, optim: Optim, run=None):
        self.base = engine.optimizer(model, optim, run=run)
        self.params = list(model.parameters())
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    def prepare(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        self.prepare()
        self.base.step()

    def state_dict(self) -> dict:
        return self.base.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state)


class ClipGrad(Wrapper):
    """The run's optimiser, every step of which first clips the gradient's total norm to ``max_norm``."""

    def __init__(self, max_norm: float):
        super().__init__()
        self.max_norm = float(max_norm)

    def prepare(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)


class FusedDecay(Wrapper):
    """The run's optimiser (built without weight decay) whose every step first adds the coupled
    weight decay λ·θ to the gradient in one ``_foreach_add_`` across the parameter tensors. The
    same op per tensor as ``torch.optim.SGD`` / ``Adam``'s own decay (grad + λ·θ, ``add`` with
    ``alpha``), so the step is the same bit for bit; on the CPU torch's optimisers decay tensor by
    tensor (one op each), on CUDA they fuse it as here."""

    def __init__(self, decay: float):
        super().__init__()
        self.decay = float(decay)

    def prepare(self) -> None:
        have = [p for p in self.params if p.grad is not None]
        if have and self.decay != 0.0:
            torch._foreach_add_([p.grad for p in have], have, alpha=self.decay)


def sam_perturbation(grads: list[torch.Tensor | None], rho: float) -> list[torch.Tensor | None]:
    """ε̂ = ρ ∇L(w) / ‖∇L(w)‖₂ over all parameters together (Foret et al. 2021, Eq. 2 with p = 2;
    FedSAM, Qu et al. 2022 / Caldarola et al. 2022: the local ascent step). 1e-12 keeps a zero
    gradient finite (it then gives ε̂ = 0)."""
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads if g is not None]))
    scale = rho / (norm + 1e-12)
    return [None if g is None else g * scale for g in grads]


class SAM(Wrapper):
    """SAM around the run's optimiser (SGD by default). ``loss(loss_fn)`` turns a batch loss function into the SAM one: it computes
    L(w) on the batch, moves the weights to w + ε̂ (``sam_perturbation``) and returns L(w + ε̂) on the
    same batch, whose backward gives ∇L(w)|_{w+ε̂}, the SAM gradient (Foret et al., Eq. 3); ``step``
    moves the weights back to w and takes the base step with that gradient (weight decay and
    momentum apply at w, as in ``torch.optim.SGD`` after the official FedSAM code's descent step).

    Both forward passes run in train mode, so BatchNorm running statistics are updated by both (the
    official FedSAM code, Caldarola et al., does the same). ``loss_fn`` must give the same loss for
    the same batch twice (no random draws of its own). After training, ``restore`` undoes a
    perturbation left pending by a batch whose loss was non-finite (no step is taken then)."""

    def __init__(self, rho: float):
        super().__init__()
        self.rho = float(rho)
        self.eps: list[torch.Tensor | None] | None = None
        self.w: list[torch.Tensor] | None = None  # the weights w while they sit at w + ε̂

    def __call__(self, model: nn.Module, optim: Optim, run=None):
        super().__call__(model, optim, run=run)
        self.params = [p for p in self.params if p.requires_grad]
        self.eps, self.w = None, None
        return self

    def ascend(self, loss: torch.Tensor) -> None:
        """Move the weights from w to w + ε̂ along the gradient of ``loss`` (taken at w)."""
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        self.eps = sam_perturbation(list(grads), self.rho)
        self.w = [p.detach().clone() for p in self.params]
        moved = [(p, e) for p, e in zip(self.params, self.eps) if e is not None]
        if moved:
            with torch.no_grad():  # one fused add over every parameter tensor
                torch._foreach_add_([p for p, _ in moved], [e for _, e in moved])

    def restore(self) -> None:
        """Back from w + ε̂ to w, exactly (a copy of w, not a subtraction of ε̂); nothing to do
        without a pending perturbation."""
        if self.eps is not None:
            with torch.no_grad():  # one fused device-side copy, not one per parameter tensor
                torch._foreach_copy_(self.params, self.w)
            self.eps, self.w = None, None

    def loss(self, loss_fn: engine.LossFn) -> engine.LossFn:
        def sam_loss(model, xb, yb, step, gen):
            self.ascend(loss_fn(model, xb, yb, step, gen))
            return loss_fn(model, xb, yb, step, gen)
        return sam_loss

    def prepare(self) -> None:
        self.restore()

    def load_state_dict(self, state: dict) -> None:
        # ``train_steps`` restores the weights before this: a pending ε̂ no longer applies
        self.eps, self.w = None, None
        super().load_state_dict(state)

