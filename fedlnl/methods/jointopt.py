"""JointOpt as local training — Tanaka et al., "Joint Optimization Framework for Learning with Noisy
Labels", CVPR 2018 (official code, Chainer: https://github.com/DaikiTanaka-UT/JointOptimization),
run on each selected client as FedCorr (Xu et al., CVPR 2022) configured it (docs/methods/jointopt.md §11).

Schedule (FedCorr, CIFAR): ``warmup_rounds`` = 20 FedAvg rounds (``fl.local_epochs`` = 5, FedAvg's
optimiser; identical draws to ``method=fedavg``, so the two curves coincide during warm-up), then
``train_rounds`` = 80 rounds in which every selected client runs ``local_epochs`` = 20 epochs of
JointOpt's first step on its own data (lr 0.01, α = 1.2, β = 0.8) and the server averages the
weights n_k-weighted (FedAvg, inferred). Communication budget 100 rounds × frac·N (1000 on CIFAR-10,
vs 10000 for the other methods); the cost column shows it. Clothing1M: no warm-up, 40 × 10 epochs,
lr 0.001 (the ``clothing1m`` entries of ``conf/method/jointopt.yaml``).

Local JointOpt step (paper §3; ``semisup.jointopt_terms``): loss L_c + α·L_p + β·L_e with soft-label
cross-entropy L_c, prior term L_p = KL(p ‖ batch-mean prediction) with the uniform prior p, and the
mean prediction entropy L_e. Every epoch the softmax outputs of the training forward passes are
stored (augmented, train mode, as the reference code); once a client has run ``begin`` JointOpt
epochs its soft labels become, after each epoch, the mean of its last ``window`` = 10 epochs of
predictions (the reference's label update), and the next epoch trains on them.

Implementation notes and decisions where docs/methods/jointopt.md §11 says "unspecified"
- Client memory: each client's soft labels, prediction ring buffer and epoch count persist across
  rounds in ``state["clients"][k]`` (created at its first JointOpt round from its observed labels).
  Label updating starts after the client's ``begin`` = 10 JointOpt epochs (the first moment its
  10-epoch window is full; the reference starts at epoch 70 of 200 centrally, a point the FedAvg
  warm-up plays the role of here).
- Optimiser of the JointOpt stage: the reference's momentum 0.9 and weight decay 1e-4, fresh per
  round (as every FedCorr local update), lr from FedCorr (0.01), batch ``fl.batch_size``.
- No second step (retraining on the final labels): FedCorr's budget has no room for it.
- Hard labels = argmax of the soft labels are label corrections: after each client's JointOpt round
  (once updating has begun) they go through ``ctx.relabel`` (scored as relabel accuracy /
  noise after correction). Training itself uses the client's soft labels, never the relabelled
  observed labels. Samples whose hard label differs from the originally observed label are
  reported as noisy via ``ctx.report_samples`` (cumulative over all clients seen).
- The prior p is uniform (the class distribution of CIFAR's training set, as in the paper); on
  non-IID clients this pulls predictions toward classes the client lacks, which is part of the method.
- No fidelity switches: the paper's KL forms of L_c and L_p and the code's cross-entropy forms
  differ by constants only (same gradients).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fedlnl.conf.checks import integer, nonnegative
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.params import around, param, rule
from fedlnl.methods.common.protocol import ClientUpdate, UpdatePlan, local_steps
from fedlnl.methods.fedavg import FedAvg


@dataclass(frozen=True)
class JointOptParams(semisup.TwoStageParams):
    """JointOpt as local training (conf/method/jointopt.yaml; docs/methods/jointopt.md §11): its schedule and JointOpt's numbers."""

    alpha: float = param("α_Jo: weight of L_p (KL from the uniform prior to the batch-mean prediction)",
                         rule(nonnegative),
                         search=around(3, "our choice: ×/÷ 3 around JointOpt's α = 1.2 (Tanaka et al., CVPR 2018, "
                                          "CIFAR-10 symmetric noise)"))
    beta: float = param("β_Jo: weight of L_e (mean prediction entropy)", rule(nonnegative),
                        search=around(3, "our choice: ×/÷ 3 around JointOpt's β = 0.8 (Tanaka et al., CVPR 2018)"))
    window: int = param("soft label = mean prediction over a client's last `window` JointOpt epochs", rule(integer, 1))
    begin: int = param("label updating starts once a client has run `begin` JointOpt epochs", rule(integer, 1))


class JointOpt(FedAvg):
    family = "label-noise learning as local training"

    #: the shared `fl` keys this method does not read (a typed override of one is refused)
    fl_unused = {"rounds": "its schedule is method.warmup_rounds + method.train_rounds"}

    Params = JointOptParams

    def total_rounds(self, info, rounds=None):
        return self.warmup_rounds + self.train_rounds

    def init(self, model, info, ctx):
        return {"model": model, "global": engine.get_weights(model), "num_classes": info.num_classes,
                "clients": {}}

    def plan_update(self, ctx, k, info, model):
        """(dry_run) warm-up: ``fl.local_epochs`` passes; then ``train_local_epochs`` JointOpt passes."""
        epochs = self.fl.local_epochs if self._warmup(ctx) else self.train_local_epochs
        return UpdatePlan(local_steps(info.client_sizes[k], epochs, self.fl.batch_size))

    def _warmup(self, ctx) -> bool:
        return ctx.round < self.warmup_rounds

    def client_update(self, state, client, ctx):
        model = state["model"]
        engine.set_weights(model, state["global"])
        gen = ctx.generator("train", client.id)
        if self._warmup(ctx):  # FedAvg with the shared FL settings
            loss = engine.local_train(
                model, client.data, client.indices, client.labels, **self.fl.training(), gen=gen)
            return ClientUpdate(client.id, engine.get_weights(model), client.size, train_loss=loss)

        mem = state["clients"].get(client.id)
        if mem is None:
            mem = semisup.label_memory(client.indices, client.labels, state["num_classes"], self.window)
            state["clients"][client.id] = mem
        opt = engine.optimizer(model, self.fl.optim(lr=self.train_lr, momentum=self.train_momentum,
                                                    weight_decay=self.train_weight_decay), run=client.data.compiled)
        losses, updated = [], False
        for _ in range(self.train_local_epochs):
            batch_losses, probs = semisup.jointopt_epoch(
                model, opt, client.data, mem, alpha=self.alpha, beta=self.beta,
                batch_size=self.fl.batch_size, gen=gen, augment=self.fl.augment, record=True)
            losses += batch_losses
            if math.isnan(semisup.mean_or_nan(batch_losses)):  # diverged: the runner stops the run
                break
            updated = semisup.push_predictions(mem, probs, self.begin) or updated
        if updated:
            hard = semisup.hard_labels(mem)
            ctx.relabel(mem["idx"], hard)
            mem["flagged"] = hard != mem["observed"]
        return ClientUpdate(client.id, engine.get_weights(model), client.size,
                            train_loss=semisup.mean_or_nan(losses))

    def aggregate(self, state, updates, ctx):
        state["global"] = engine.weighted_average(
            [u.weights for u in updates], [u.num_samples for u in updates])
        if not self._warmup(ctx):
            semisup.report_flags(ctx, state["clients"].values())
        return state, {"stage": "warmup" if self._warmup(ctx) else "training"}
