"""JointOpt, centralized reference — Tanaka et al., "Joint Optimization Framework for Learning with
Noisy Labels", CVPR 2018 (official code, Chainer: https://github.com/DaikiTanaka-UT/JointOptimization),
trained on the pooled noisy training set of the federation (FedCorr's "JointOpt (CL)" rows,
docs/methods/jointopt.md §11 and Table 8).

The runner gives this method one view over every training sample with the observed noisy labels
(``sample_clients`` returns ``[ALL_CLIENTS]``), the same labels the federated runs of the same seed
see (same federation hash), and counts no communication cost. One runner round is
``epochs_per_round`` epochs, so the test accuracy is evaluated during training.

Algorithm (paper §3, two steps as the reference code):
- First step, ``epochs`` = 200 epochs: loss L_c + α·L_p + β·L_e (``semisup.jointopt_terms``) with the
  soft labels, momentum SGD 0.9, weight decay 1e-4, constant lr, batch 128. The softmax outputs of
  the training passes are stored every epoch; from epoch ``begin`` = 70 on, after every epoch the soft
  labels become the mean of the last ``window`` = 10 epochs of outputs.
- Second step, ``second_epochs`` = 120 epochs: the network restarts from its initial weights and
  trains with soft-label cross-entropy on the final soft labels, lr ``fl.lr × second_lr_factor``
  (0.1 × 2 = the reference code's 0.2) divided by 10 (``second_decay``) after ⌊E/3⌋ and ⌊2E/3⌋
  epochs (reference code). ``second_epochs: 0`` skips it.
- α, β and lr per noise group (FedCorr Table 8, ``semisup.noise_group``): low noise β 1.5, lr 0.1;
  high noise β 0.8, lr 0.2; α 1.2 for both. Table 8's lr is taken as the first step's: ``fl.lr``
  (pinned to 0.1 in the YAML) in the low group, ``fl.lr × lr_high_factor`` (2) in the high one; β is
  ``beta`` (0.8) in the high group and ``beta × beta_low_factor`` (1.875) in the low one. One key per
  quantity for both groups, so that the equal-budget tuning (run at the noisy cell, high group) sets
  the clean cell's values too; the second step's lr follows the first's, because the tuning's
  objective (noisy-validation accuracy at the selected round) lies in the first step whenever the
  second ends lower and so never sees it (docs/methods/jointopt.md §11, "clean-data control").

Implementation notes
- The optimiser (and its momentum) persists across rounds in the state, as one centralized run.
- "Initial weights" of the second step = the run's seeded initial model (the reference builds a new
  randomly initialised network).
- Hard labels (argmax of the soft labels) go through ``ctx.relabel`` after every round in which
  they were updated; samples whose hard label differs from the observed one are reported noisy.
- No fidelity switches (the KL and cross-entropy forms of L_c and L_p differ by constants only).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from fedlnl.conf.checks import integer, nonnegative, positive, unit
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.params import Method, Params, around, param, rule
from fedlnl.methods.common.protocol import ALL_CLIENTS, ClientUpdate, UpdatePlan, client_size, local_steps


@dataclass(frozen=True)
class JointOptCentralParams(Params):
    """The centralized JointOpt's two steps (conf/method/jointopt_central.yaml; docs/methods/jointopt.md §11)."""

    epochs: int = param("first step: epochs of L_c + α L_p + β L_e", rule(integer, 1))
    epochs_per_round: int = param("epochs one runner round trains", rule(integer, 1))
    begin: int = param("labels are updated from this epoch on", rule(integer, 1))
    window: int = param("soft label = mean prediction over the last `window` epochs", rule(integer, 1))
    alpha: float = param("α: weight of L_p", rule(nonnegative),
                         search=around(3, "our choice: ×/÷ 3 around JointOpt's α = 1.2 (Tanaka et al., CVPR 2018)"))
    beta: float = param("β of the high-noise group (the tuning cell's; FedCorr Table 8: 0.8)", rule(nonnegative),
                        search=around(3, "our choice: ×/÷ 3 around the code's β of the high-noise group"))
    beta_low_factor: float = param("the low-noise group's β is beta × this (FedCorr Table 8: 1.5 = 1.875 × 0.8)",
                                   rule(nonnegative))
    lr_high_factor: float = param("first step: the high-noise group's lr is fl.lr × this (FedCorr Table 8: 0.2 = 2 × 0.1)",
                                  rule(positive))
    high_noise_from: float = param("the group is high when ρ(1+τ)/2 >= it (semisup.noise_group)", rule(unit))
    noise_rho: float = param("ρ of the run's noise config (interpolated)", rule(unit))
    noise_tau: float = param("τ of the run's noise config (interpolated)", rule(unit))
    second_epochs: int = param("second step: epochs retraining from the initial weights on the soft labels; 0 skips it",
                               rule(integer, 0))
    second_lr_factor: float = param("second step: its lr is fl.lr × this (the reference code's 0.2 = 2 × Table 8's 0.1)",
                                    rule(positive))
    second_decay: float = param("second step: factor applied after 1/3 and 2/3 of its epochs", rule(positive))

    @functools.cached_property
    def high(self) -> bool:
        return semisup.noise_group(self.noise_rho, self.noise_tau, self.high_noise_from) == "high"

    def unread(self) -> frozenset[str]:
        """The other noise group's factor: β's in the high group, the lr's in the low group."""
        return frozenset({"beta_low_factor"} if self.high else {"lr_high_factor"})

    @property
    def group_beta(self) -> float:
        """β of the run's noise group."""
        return self.beta if self.high else self.beta * self.beta_low_factor

    def first_lr(self, lr: float) -> float:
        """The first step's learning rate of the run's noise group, from ``fl.lr`` (the low group's)."""
        return lr * self.lr_high_factor if self.high else lr


class JointOptCentral(Method):
    family = "centralized references"

    #: the shared `fl` keys this method does not read (a typed override of one is refused)
    fl_unused = {"rounds": "its schedule is method.epochs + method.second_epochs (one round = method.epochs_per_round epochs)",
                 "frac": "it trains on the pooled data, no client sampling",
                 "local_epochs": "its schedule is method.epochs"}

    Params = JointOptCentralParams

    def total_rounds(self, info, rounds=None):
        return math.ceil((self.epochs + self.second_epochs) / self.epochs_per_round)

    def init(self, model, info, ctx):
        return {"model": model, "init": engine.get_weights(model), "num_classes": info.num_classes,
                "opt": engine.optimizer(model, self.fl.optim(lr=self.params.first_lr(self.fl.lr)), run=ctx.data.compiled), "mem": None}

    def sample_clients(self, state, ctx):
        return [ALL_CLIENTS]

    def _epochs(self, ctx) -> range:
        start = ctx.round * self.epochs_per_round
        return range(start, min(start + self.epochs_per_round, self.epochs + self.second_epochs))

    def plan_update(self, ctx, k, info, model):
        """(dry_run) this round's epochs over the pooled data; nothing is uploaded."""
        return UpdatePlan(local_steps(client_size(info, k), len(self._epochs(ctx)), self.fl.batch_size), models=0)

    def _second_lr(self, j: int) -> float:
        """The second step's lr at its epoch ``j``: fl.lr × second_lr_factor, decayed at E/3 and 2E/3."""
        drops = sum(j >= m for m in (self.second_epochs // 3, 2 * self.second_epochs // 3))
        return self.fl.lr * self.second_lr_factor * self.second_decay ** drops

    def client_update(self, state, client, ctx):
        model = state["model"]
        if state["mem"] is None:
            state["mem"] = semisup.label_memory(client.indices, client.labels, state["num_classes"], self.window)
        mem, gen = state["mem"], ctx.generator("train")
        losses, updated = [], False
        for e in self._epochs(ctx):
            first = e < self.epochs
            if not first and e == self.epochs:  # second step: restart from the initial weights
                engine.set_weights(model, state["init"])
                state["opt"] = engine.optimizer(model, self.fl.optim(lr=self._second_lr(0)), run=client.data.compiled)
            if not first:
                for group in state["opt"].param_groups:
                    group["lr"] = self._second_lr(e - self.epochs)
            # the second step is L_c alone on the frozen final soft labels
            batch_losses, probs = semisup.jointopt_epoch(
                model, state["opt"], client.data, mem, alpha=self.alpha if first else 0.0,
                beta=self.params.group_beta if first else 0.0, batch_size=self.fl.batch_size, gen=gen,
                augment=self.fl.augment, record=first)
            losses += batch_losses
            if math.isnan(semisup.mean_or_nan(batch_losses)):  # diverged: the runner stops the run
                break
            if first:
                updated = semisup.push_predictions(mem, probs, self.begin) or updated
        if updated:
            hard = semisup.hard_labels(mem)
            ctx.relabel(mem["idx"], hard)
            mem["flagged"] = hard != mem["observed"]
        return ClientUpdate(client.id, None, client.size, train_loss=semisup.mean_or_nan(losses))

    def aggregate(self, state, updates, ctx):
        semisup.report_flags(ctx, [state["mem"]])
        last = self._epochs(ctx)[-1]
        return state, {"stage": "training" if last < self.epochs else "retraining", "epoch": last + 1}

    def eval_model(self, state):
        return state["model"]
