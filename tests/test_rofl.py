"""RoFL's correction phase in closed form (docs/rofl_small.md).

From round T_pl on, a kept sample whose centroid label disagrees with its given label trains on the
global model's own argmax, and λ_e·L_e (entropy minimisation) sharpens whatever the model predicts.
Both are the reference code's formulas (docs/methods/rofl.md §6); together they are a self-training loop that
collapsed ``experiment=reproduce_small`` to one class when T_pl = 8 started it on a 41 %-accurate
LeNet. These tests pin the single step that drives it, so a change to RoFL's targets or entropy term
cannot pass silently either way.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import make
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import ClientView, FederationInfo, RoundContext
from fedlnl.methods.rofl import RoFL

CPU = torch.device("cpu")
LR, LAMBDA_E, T_PL = 0.5, 0.8, 2


class Biased(nn.Module):
    """features = the 1-pixel input; head = Linear(1, 2) with weight 0 and bias (1, 0): the global
    model predicts class 0 for every sample, with p = softmax(1, 0)."""

    feature_dim = 1

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(1, 2)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.copy_(torch.tensor([1.0, 0.0]))

    def features(self, x):
        return x.flatten(1)

    def forward(self, x):
        return self.head(self.features(x))


def update(t: int, lambda_e: float = LAMBDA_E, n: int = 4, batch_size: int = 4, lr: float = LR):
    """Client 0's update in method-local round t (one local epoch); every given label is 1, every
    feature is positive and the global centroids are f_G = [[1], [-1]], so every centroid label is 0
    (cos = +1 with class 0) and disagrees with the given label."""
    px = torch.arange(10, 10 * (n + 1), 10, dtype=torch.uint8).view(n, 1, 1, 1)
    data = engine.TensorData.build(px, [0.0], [1.0], None, CPU)
    view = ClientView(0, torch.arange(n), torch.ones(n, dtype=torch.long), data)
    info = FederationInfo(1, 2, (n,), (1, 1, 1), 0)
    ctx = RoundContext(round=t, total_rounds=10, seed=0, device=CPU, num_clients=1, client_sizes=(n,),
                       data=data, views=lambda k: view)
    m = make(RoFL, frac=1.0, local_epochs=1, batch_size=batch_size, lr=lr, momentum=0.0, weight_decay=0.0,
             augment=False, T_pl=T_PL, forget_rate=0.0, num_gradual=1, lambda_cen=1.0, lambda_e=lambda_e,
             detach_cen=False, weighted_avg=True, pl_augment=False, cen_normalize=True)
    state = m.init(Biased(), info, RoundContext(round=0, total_rounds=10, seed=0, device=CPU, num_clients=1,
                                                client_sizes=(n,), data=data, views=lambda k: view))
    state["f_G"] = torch.tensor([[1.0], [-1.0]])
    up = m.client_update(state, view, ctx)
    assert up.metrics["agree"] == 0  # no kept sample's centroid label matches its given label
    return up


def one_step(t: int, lambda_e: float = LAMBDA_E) -> torch.Tensor:
    """The head's bias after client 0's single full-batch SGD step in method-local round t."""
    return update(t, lambda_e).weights["head.bias"]


# p = softmax(1, 0); for two logits dH/dz_0 = -p0 p1 (z0 - z1) = -p0 p1, dH/dz_1 = +p0 p1
P0 = 1.0 / (1.0 + math.exp(-1.0))
P1 = 1.0 - P0


@pytest.mark.parametrize("lambda_e", [LAMBDA_E, 0.0])
def test_after_T_pl_disagreeing_samples_train_on_the_global_argmax(lambda_e):
    # target = the global pseudo-label 0 (mask 0): dCE/dz = (p0 - 1, p1) = (-p1, p1); entropy adds
    # λ_e (-p0 p1, +p0 p1). L_cen is masked out. One step: b -= lr · grad, the margin b0 - b1 grows
    # by 2 lr p1 (1 + λ_e p0): the loop reinforces what the global model already predicts.
    b = one_step(T_PL, lambda_e)
    g0 = -P1 - lambda_e * P0 * P1
    assert b.tolist() == pytest.approx([1.0 - LR * g0, 0.0 + LR * g0], abs=1e-6)


def test_before_T_pl_the_given_label_trains_and_only_entropy_follows_the_model():
    # target = the given label 1: dCE/dz = (p0, p0 - 1); entropy still pushes towards class 0
    b = one_step(T_PL - 1)
    g0 = P0 - LAMBDA_E * P0 * P1
    assert b.tolist() == pytest.approx([1.0 - LR * g0, 0.0 + LR * g0], abs=1e-6)
    assert b[0] < 1.0  # the given labels win: the margin towards the predicted class shrinks


def test_a_diverged_update_replays_its_centroids_and_counts_from_the_start_of_the_update():
    """8 samples in batches of 2 with an infinite learning rate: the first step sends the weights to
    inf, so the second batch's loss is not finite and the update is replayed, stopping there
    (``engine.train_steps``): 2 batches of 2 kept samples (forget rate 0), and the centroids those 2
    batches give (finite). Before ``begin`` reset them, the replay counted on from the first pass's
    4 batches (12 kept) and moved its centroids from the first pass's non-finite ones."""
    up = update(T_PL, n=8, batch_size=2, lr=math.inf)
    assert math.isnan(up.train_loss)
    assert up.metrics["kept"] == 4
    assert torch.isfinite(up.payload["centroids"]).all()
