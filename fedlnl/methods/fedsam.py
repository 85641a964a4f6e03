"""FedSAM — sharpness-aware local training: Qu, Li, Duan, Liu, Tang, Lu, "Generalized Federated
Learning via Sharpness Aware Minimization", ICML 2022 (FedSAM), and Caldarola, Caputo,
Ciccone, "Improving Generalization in Federated Learning by Seeking Flat Minima", ECCV 2022 (FedSAM;
official code debcaldarola/fedsam at 64bbf93, ``models/clients/sam_client.py``, ``minimizers.py``).
Both define the same client: SAM (Foret et al., ICLR 2021) in place of SGD; the server averages as
FedAvg. FNBench declares ``--fedsam_rho 0.05`` but has no FedSAM client (its SAM optimiser is
commented out in ``main_fed_LNL.py`` and ``fedsam`` is no ``--method`` choice), so there is no
reference code to follow beyond Caldarola et al.'s (docs/methods/fedexp_fedsam.md §20.2).

Client step on each batch (Foret et al. Eq. 2-3):
    ε̂ = ρ ∇L(w) / ‖∇L(w)‖₂,   w ← w − η (∇L(w + ε̂) + weight decay and momentum at w)
(``common/optimizers.py::SAM``: the ascent uses the loss gradient alone, weight decay enters with
the descent step, as the official code's ``ascent_step`` / ``descent_step``).

Implementation notes
- ρ: 0.1 on CIFAR-10 (Caldarola et al.'s ``paper_experiments/cifar10.sh``, ``-rho 0.1``), 0.05
  elsewhere (FNBench's ``--fedsam_rho`` default; Foret et al.'s usual CIFAR value). Every other
  local-training value is the shared ``fl`` group (the official script's lr 0.01, weight decay
  4e-4, batch 64, 1 epoch are its own FedAvg setting too).
- Two forward/backward passes per batch (twice FedAvg's local compute); both in train mode, so
  BatchNorm statistics are updated twice per step, as in the official code. The logged training
  loss is the loss at w + ε̂.
- Qu et al.'s MoFedSAM (local momentum across rounds) and Caldarola et al.'s ASAM / SWA variants
  are not implemented. No fidelity switches: no code/paper difference was found in the client step.
"""
from __future__ import annotations

from dataclasses import dataclass

from fedlnl.conf.checks import number
from fedlnl.methods.common import engine, optimizers
from fedlnl.methods.common.params import Params, log_range, param, rule
from fedlnl.methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedSAMParams(Params):
    """FedSAM's own number (conf/method/fedsam.yaml)."""

    rho: float = param("SAM radius ρ of the ascent step (0 = FedAvg)",
                       rule(number, lambda v: v >= 0, "a SAM radius ρ >= 0 (0 = FedAvg)"),
                       search=log_range(0.01, 0.5, "our choice: a log range over the FedSAM codes' values (0.05 "
                                                   "FNBench, 0.1 the CIFAR-10 script; docs/methods/fedexp_fedsam.md §20.2)"))


class FedSAM(FedAvg):
    family = "FL baselines"

    Params = FedSAMParams

    def client_update(self, state, client, ctx):
        sam = optimizers.SAM(self.rho)
        update = engine.train_from_global(state, client, ctx, opt_fn=sam, loss_fn=sam.loss(engine.ce_loss),
                                          **self.fl.training())
        if sam.eps is not None:  # a non-finite loss at w + ε̂ took no step: back to w
            sam.restore()
            update.weights = engine.get_weights(state["model"])
        return update
