"""DivideMix as local training — Li, Socher & Hoi, "DivideMix: Learning with Noisy Labels as
Semi-supervised Learning", ICLR 2020 (https://github.com/LiJunnan1992/DivideMix), run on each
selected client as FedCorr (Xu et al., CVPR 2022) configured it (docs/methods/dividemix.md §12).

Schedule (FedCorr, CIFAR): ``warmup_rounds`` = 20 FedAvg rounds (``fl.local_epochs`` = 5, FedAvg's
optimiser, cross-entropy) for each of the two networks, then ``train_rounds`` = 80 rounds in which
every selected client runs ``local_epochs`` = 20 DivideMix epochs on its own data. Communication
budget 100 rounds × frac·N (1000 on CIFAR-10); each participation uploads both networks (the second
as ``payload["weights2"]``, counted in bytes_up). Clothing1M: no warm-up, 40 × 10 epochs,
λ_u = 25, lr 0.01 (the ``clothing1m`` entries of ``conf/method/dividemix.yaml``).

One local DivideMix epoch (paper Alg. 1, ``semisup``): each network's per-sample cross-entropy on the
client's un-augmented samples is min-max normalised and a 2-component GMM (max_iter 10, tol 1e-2,
reg_covar 5e-4) gives each sample's clean probability w (co-divide, §3.2). Network 1 then trains on
the division of network 2 (labeled: w > p_threshold = 0.5) and vice versa: MixMatch with label
co-refinement (w·y + (1−w)·p, sharpened with T = 0.5), co-guessing of the unlabeled samples by both
networks over two augmented views, mixup with λ' = max(λ, 1−λ), λ ~ Beta(4, 4), loss
L_X + λ_u·ramp·L_U + L_reg (§3.3). λ_u per noise group (FedCorr): CIFAR-10 0 (low) / 25 (high),
CIFAR-100 25 / 150 (the ``cifar100`` entries of ``conf/method/dividemix.yaml``); groups by ``semisup.noise_group``.

Implementation notes and decisions where docs/methods/dividemix.md §12 says "unspecified"
- Clean data is not free for it: the two-component GMM splits every client's losses, clean or not,
  into a labelled and an unlabelled part, so at (ρ, τ) = (0, 0) it trails FedAvg (FedCorr Table 2 on
  CIFAR-10: 77.96 vs 93.11; the digits quickstart: 86.5 vs 92.8, 2 seeds).
- Two global networks, each averaged n_k-weighted by the server on its own (as FNBench).
- Network 2 is initialised independently (``second_init: all``) from a seed of the run, since
  DivideMix trains two differently initialised networks; ``head`` re-initialises only the classifier
  (pre-trained backbones, Clothing1M).
- The GMM is fitted per client on its own losses, once per local epoch for each network;
  ``random_state`` from ``ctx.rng`` keyed by the client.
- The ramp-up of λ_u (16 epochs in the paper) counts the client's own DivideMix epochs, kept in
  its memory ``state["clients"][k]`` across rounds.
- Optimiser of the DivideMix stage: the paper's momentum 0.9, weight decay 5e-4 and lr 0.02 (FedCorr
  gives no CIFAR lr), fresh per round, batch ``fl.batch_size`` for both the labeled and unlabeled
  mini-batches.
- Noise decisions: after each client's round, samples whose mean clean probability over the two
  networks' GMMs (of the last local epoch) is ≤ p_threshold — DivideMix's unlabeled set — are
  reported noisy via ``ctx.report_samples`` (cumulative over the clients seen). No relabels.
- A client whose labeled set is empty skips that network's epoch; an empty unlabeled set trains on
  L_X + L_reg only. Asymmetric-noise extras of the reference (warm-up confidence penalty, loss
  averaged over 5 epochs) are not implemented: FedCorr's noise is symmetric.

Fidelity switch ``ensemble``: the paper tests with the average of both networks' predictions
(``softmax``: the eval model returns the log of the averaged softmax); the reference code sums the
two networks' logits (``logits``, ``fidelity=reference``). The eval model is used during warm-up too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.params import Method
from fedlnl.methods.common.protocol import ClientUpdate, UpdatePlan, local_steps


@dataclass(frozen=True)
class FedDivideMixParams(semisup.DivideMixParams, semisup.TwoStageParams):
    """DivideMix as local training (conf/method/dividemix.yaml): its schedule and DivideMix's numbers."""


class DivideMix(Method):
    family = "label-noise learning as local training"

    #: the shared `fl` keys this method does not read (a typed override of one is refused)
    fl_unused = {"rounds": "its schedule is method.warmup_rounds + method.train_rounds"}

    Params = FedDivideMixParams

    def total_rounds(self, info, rounds=None):
        return self.warmup_rounds + self.train_rounds

    def init(self, model, info, ctx):
        model2 = semisup.fresh_copy(model, engine.child_seed(ctx.generator("init", "net2")), self.second_init)
        return {"model": model, "model2": model2, "global": engine.get_weights(model),
                "global2": engine.get_weights(model2), "ensemble": semisup.Ensemble(model, model2, self.ensemble),
                "num_classes": info.num_classes, "clients": {}}

    def sample_clients(self, state, ctx):
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def plan_update(self, ctx, k, info, model):
        """(dry_run) both networks train and are uploaded. Warm-up: ``fl.local_epochs`` passes each;
        then ``train_local_epochs`` passes over the samples the peer's GMM labels clean (an upper bound)."""
        n = info.client_sizes[k]
        if self._warmup(ctx):
            return UpdatePlan(2 * local_steps(n, self.fl.local_epochs, self.fl.batch_size), models=2)
        return UpdatePlan(2 * local_steps(n, self.train_local_epochs, self.fl.batch_size), models=2, exact=False)

    def _warmup(self, ctx) -> bool:
        return ctx.round < self.warmup_rounds

    def client_update(self, state, client, ctx):
        nets = (state["model"], state["model2"])
        engine.set_weights(nets[0], state["global"])
        engine.set_weights(nets[1], state["global2"])
        if self._warmup(ctx):
            losses = [engine.local_train(
                net, client.data, client.indices, client.labels, **self.fl.training(),
                gen=ctx.generator(key, client.id)) for net, key in zip(nets, ("train", "train2"))]
        else:
            losses = self._local_dividemix(state, nets, client, ctx)
        return ClientUpdate(client.id, engine.get_weights(nets[0]), client.size,
                            payload={"weights2": engine.get_weights(nets[1])},
                            train_loss=semisup.mean_or_nan(losses))

    def _local_dividemix(self, state, nets, client, ctx) -> list[float]:
        mem = state["clients"].setdefault(client.id, {"idx": client.indices.clone(), "epochs": 0, "flagged": None})
        optim = self.fl.optim(lr=self.train_lr, momentum=self.train_momentum, weight_decay=self.train_weight_decay)
        opts = [engine.optimizer(net, optim, run=client.data.compiled) for net in nets]
        gen, rng = ctx.generator("train", client.id), ctx.rng("gmm", client.id)
        losses = []
        for _ in range(self.train_local_epochs):
            w = [semisup.clean_probability(semisup.sample_losses(net, client.data, client.indices, client.labels),
                                       int(rng.integers(2**31 - 1)), **self.gmm) for net in nets]
            for i in (0, 1):  # network i learns from the division of its peer (co-divide)
                batch_losses = semisup.dividemix_epoch(
                    nets[i], nets[1 - i], opts[i], client.data, client.indices, client.labels, w[1 - i],
                    p_threshold=self.p_threshold, T=self.T, alpha=self.alpha, lambda_u=self.lambda_u,
                    epochs_done=mem["epochs"], rampup_epochs=self.rampup_epochs, batch_size=self.fl.batch_size,
                    num_classes=state["num_classes"], gen=gen, augment=self.fl.augment)
                losses += batch_losses
                if math.isnan(semisup.mean_or_nan(batch_losses)):  # diverged: the runner stops the run
                    return losses
            mem["epochs"] += 1
            mem["flagged"] = (w[0] + w[1]) / 2 <= self.p_threshold
        return losses

    def aggregate(self, state, updates, ctx):
        counts = [u.num_samples for u in updates]
        state["global"] = engine.weighted_average([u.weights for u in updates], counts)
        state["global2"] = engine.weighted_average([u.payload["weights2"] for u in updates], counts)
        if not self._warmup(ctx):
            semisup.report_flags(ctx, state["clients"].values())
        return state, {"stage": "warmup" if self._warmup(ctx) else "training", "lambda_u": float(self.lambda_u)}

    def eval_model(self, state):
        engine.set_weights(state["model"], state["global"])
        engine.set_weights(state["model2"], state["global2"])
        return state["ensemble"]
