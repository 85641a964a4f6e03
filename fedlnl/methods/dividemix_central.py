"""DivideMix, centralized reference — Li, Socher & Hoi, "DivideMix: Learning with Noisy Labels as
Semi-supervised Learning", ICLR 2020 (https://github.com/LiJunnan1992/DivideMix), trained on the
pooled noisy training set of the federation (FedCorr's "DivideMix (CL)" rows, docs/methods/dividemix.md §12).

The runner gives this method one view over every training sample with the observed noisy labels
(``sample_clients`` returns ``[ALL_CLIENTS]``), the same labels the federated runs of the same seed
see (same federation hash), and counts no communication cost. One runner round is
``epochs_per_round`` epochs, so the test accuracy is evaluated during training.

Algorithm (paper Alg. 1 and the reference's CIFAR settings): two independently initialised
networks; ``warmup_epochs`` = 10 (CIFAR-10; 30 for CIFAR-100) epochs of cross-entropy on all samples
(batch ``warmup_batch_size`` = 128), then DivideMix epochs up to ``epochs`` = 300 in total: for each
network, per-sample losses → min-max normalisation → 2-component GMM → clean probability w; each
network trains on its peer's division with MixMatch (label co-refinement and co-guessing, T = 0.5,
mixup α = 4, λ' = max(λ, 1−λ)), loss L_X + λ_u·ramp·L_U + L_reg, the ramp rising linearly over
``rampup_epochs`` = 16 epochs after warm-up (``semisup.dividemix_epoch``). SGD momentum 0.9, weight decay
5e-4, lr 0.02 divided by 10 (``lr_decay``) from epoch ``lr_decay_epoch`` = 150 on, batch 64.
λ_u per noise group (``semisup.noise_group``): CIFAR-10 0 / 25, CIFAR-100 25 / 150
(the per-dataset tables of ``conf/method/dividemix_central.yaml``), the grouping FedCorr uses in FL.

Implementation notes
- Both optimisers (and their momentum) persist across rounds in the state, as one centralized run;
  network 2's initialisation as in ``dividemix.py`` (``second_init``).
- The GMM of every epoch takes its ``random_state`` from ``ctx.rng``.
- Noise decisions: samples whose mean clean probability over the two GMMs is ≤ p_threshold (the
  unlabeled set) are reported noisy via ``ctx.report_samples`` after every DivideMix round.
- Asymmetric-noise extras of the reference (warm-up confidence penalty, 5-epoch loss averaging)
  are not implemented.

Fidelity switch ``ensemble``: test model = average of both networks' softmax (paper, ``softmax``) or
sum of their logits (reference code, ``logits``, ``fidelity=reference``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F

from fedlnl.conf.checks import fail, integer, positive
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.params import Method, param, rule
from fedlnl.methods.common.protocol import ALL_CLIENTS, ClientUpdate, UpdatePlan, client_size, local_steps


@dataclass(frozen=True)
class DivideMixCentralParams(semisup.DivideMixParams):
    """The centralized DivideMix: its epochs and learning-rate schedule besides DivideMix's numbers
    (conf/method/dividemix_central.yaml)."""

    warmup_batch_size: int = param("batch size of the cross-entropy warm-up", rule(integer, 1))
    epochs: int = param("epochs in all, warm-up included", rule(integer, 1))
    warmup_epochs: int = param("cross-entropy warm-up epochs of both networks", rule(integer, 0))
    epochs_per_round: int = param("epochs one runner round trains", rule(integer, 1))
    lr_decay_epoch: int = param("the learning rate is multiplied by lr_decay from this epoch on", rule(integer, 0))
    lr_decay: float = param("factor of the learning-rate step", rule(positive))

    def check(self) -> None:
        if not self.warmup_epochs < self.epochs:
            fail("method.warmup_epochs", self.warmup_epochs, f"an integer < method.epochs={self.epochs}")


class DivideMixCentral(Method):
    family = "centralized references"

    #: the shared `fl` keys this method does not read (a typed override of one is refused)
    fl_unused = {"rounds": "its schedule is method.epochs (one round = method.epochs_per_round epochs)",
                 "frac": "it trains on the pooled data, no client sampling", "local_epochs": "its schedule is method.epochs"}

    Params = DivideMixCentralParams

    def total_rounds(self, info, rounds=None):
        return math.ceil(self.epochs / self.epochs_per_round)

    def init(self, model, info, ctx):
        model2 = semisup.fresh_copy(model, engine.child_seed(ctx.generator("init", "net2")), self.second_init)
        nets = [model, model2]
        return {"nets": nets, "opts": [engine.optimizer(n, self.fl.optim(), run=ctx.data.compiled) for n in nets],
                "ensemble": semisup.Ensemble(model, model2, self.ensemble), "num_classes": info.num_classes,
                "mem": None}

    def sample_clients(self, state, ctx):
        return [ALL_CLIENTS]

    def _epochs(self, ctx) -> range:
        start = ctx.round * self.epochs_per_round
        return range(start, min(start + self.epochs_per_round, self.epochs))

    def client_update(self, state, client, ctx):
        nets, opts = state["nets"], state["opts"]
        if state["mem"] is None:
            state["mem"] = {"idx": client.indices.clone(), "flagged": None}
        gen, rng = ctx.generator("train"), ctx.rng("gmm")
        losses = []
        for e in self._epochs(ctx):
            for opt in opts:
                for group in opt.param_groups:
                    group["lr"] = self.fl.lr * (self.lr_decay if e >= self.lr_decay_epoch else 1.0)
            if e < self.warmup_epochs:
                batch_losses = self._warmup_epoch(nets, opts, client, gen)
            else:
                batch_losses = self._dividemix_epoch(state, nets, opts, client, gen, rng, e)
            losses += batch_losses
            if math.isnan(semisup.mean_or_nan(batch_losses)):  # diverged: the runner stops the run
                break
        return ClientUpdate(client.id, None, client.size, train_loss=semisup.mean_or_nan(losses))

    def plan_update(self, ctx, k, info, model):
        """(dry_run) this round's epochs of both networks over the pooled data: warm-up epochs in
        batches of ``warmup_batch_size``, DivideMix epochs over the samples labelled clean (an upper
        bound); nothing is uploaded."""
        n, epochs = client_size(info, k), self._epochs(ctx)
        warm = sum(1 for e in epochs if e < self.warmup_epochs)
        steps = 2 * (local_steps(n, warm, self.warmup_batch_size) + local_steps(n, len(epochs) - warm, self.fl.batch_size))
        return UpdatePlan(steps, models=0, exact=warm == len(epochs))

    def _warmup_epoch(self, nets, opts, client, gen) -> list[float]:
        labels = client.labels
        losses = []
        for net, opt in zip(nets, opts):
            losses += engine.epoch_loop(net, opt, client.data, client.indices, batch_size=self.warmup_batch_size,
                                     gen=gen, augment=self.fl.augment,
                                     loss_fn=lambda m, xb, pos: F.cross_entropy(m(xb), labels[pos]))
        return losses

    def _dividemix_epoch(self, state, nets, opts, client, gen, rng, e) -> list[float]:
        w = [semisup.clean_probability(semisup.sample_losses(net, client.data, client.indices, client.labels),
                                   int(rng.integers(2**31 - 1)), **self.gmm) for net in nets]
        losses = []
        for i in (0, 1):  # network i learns from the division of its peer (co-divide)
            losses += semisup.dividemix_epoch(
                nets[i], nets[1 - i], opts[i], client.data, client.indices, client.labels, w[1 - i],
                p_threshold=self.p_threshold, T=self.T, alpha=self.alpha, lambda_u=self.lambda_u,
                epochs_done=e - self.warmup_epochs, rampup_epochs=self.rampup_epochs,
                batch_size=self.fl.batch_size, num_classes=state["num_classes"], gen=gen, augment=self.fl.augment)
        state["mem"]["flagged"] = (w[0] + w[1]) / 2 <= self.p_threshold
        return losses

    def aggregate(self, state, updates, ctx):
        semisup.report_flags(ctx, [state["mem"]])
        last = self._epochs(ctx)[-1]
        return state, {"stage": "warmup" if last < self.warmup_epochs else "training", "epoch": last + 1,
                       "lambda_u": float(self.lambda_u)}

    def eval_model(self, state):
        return state["ensemble"]
