"""Closed-form checks of the shared mechanics in fedlnl.methods.common.engine."""
import numpy as np
import pytest
import torch
from torch import nn

from fedlnl.compute import data as compute_data, evaluation
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import Optim, RoundContext


def test_weighted_average_matches_closed_form():
    w1 = {"a": torch.tensor([1.0, 2.0]), "n": torch.tensor(4)}
    w2 = {"a": torch.tensor([3.0, 6.0]), "n": torch.tensor(8)}
    out = engine.weighted_average([w1, w2], [1, 3])
    # (1·[1,2] + 3·[3,6]) / 4 = [2.5, 5]
    assert torch.allclose(out["a"], torch.tensor([2.5, 5.0]))
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 7  # (4 + 24) / 4
    assert out["a"].dtype == torch.float32


def test_weighted_average_single_client_is_a_copy_and_rejects_bad_counts():
    w = {"a": torch.randn(3, 3)}
    assert torch.equal(engine.weighted_average([w], [17])["a"], w["a"])
    with pytest.raises(ValueError):
        engine.weighted_average([w], [0])
    with pytest.raises(ValueError):
        engine.weighted_average([], [])


def test_augment_batch_is_crop_of_padded_image_or_its_mirror():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, 3, 8, 8)
    out = compute_data.augment_batch(x, g, crop=8, pad=2, flip=True)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    flips = 0
    for b in range(64):
        ok = False
        for oy in range(5):
            for ox in range(5):
                win = padded[b, :, oy:oy + 8, ox:ox + 8]
                if torch.equal(out[b], win):
                    ok = True
                elif torch.equal(out[b], win.flip(-1)):
                    ok, flips = True, flips + 1
        assert ok, f"image {b} is not a crop of its padded image"
    assert 10 < flips < 54  # about half are mirrored


def test_prox_forms():
    model = nn.Linear(2, 1, bias=False)
    anchor = [torch.zeros_like(p) for p in model.parameters()]
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 4.0]]))
    assert engine.prox_penalty(model, anchor, "squared").item() == pytest.approx(25.0)
    assert engine.prox_penalty(model, anchor, "half_squared").item() == pytest.approx(12.5)
    assert engine.prox_penalty(model, anchor, "norm").item() == pytest.approx(5.0)
    with pytest.raises(ValueError):
        engine.prox_penalty(model, anchor, "cubed")


def test_mixup_uses_one_lambda_and_a_permutation():
    g = torch.Generator().manual_seed(1)
    x = torch.eye(4)
    y = torch.arange(4)
    xm, ya, yb, lam = engine.mixup(x, y, 1.0, g)
    assert 0.0 <= lam <= 1.0 and torch.equal(ya, y)
    assert sorted(yb.tolist()) == [0, 1, 2, 3]
    assert torch.allclose(xm, lam * x + (1 - lam) * x[yb])


def test_uniform_clients_and_context_rng_are_order_independent():
    ctx = RoundContext(round=3, total_rounds=10, seed=7, device=torch.device("cpu"), num_clients=10,
                       client_sizes=(1,) * 10)
    a = engine.uniform_clients(10, 0.3, ctx.rng("sample"))
    b = engine.uniform_clients(10, 0.3, ctx.rng("sample"))
    assert a == b and len(a) == 3 and len(set(a)) == 3
    # a client's generator does not depend on which other generators were drawn before it
    g1 = ctx.generator("train", 4)
    _ = ctx.generator("train", 2).manual_seed(0)
    g2 = ctx.generator("train", 4)
    assert torch.equal(torch.rand(5, generator=g1), torch.rand(5, generator=g2))
    assert engine.uniform_clients(10, 0.01, np.random.default_rng(0)).__len__() == 1


def test_local_train_reduces_loss_and_evaluate_counts():
    torch.manual_seed(0)
    n = 200
    x = torch.randint(0, 256, (n, 1, 4, 4), dtype=torch.uint8)
    y = (x.float().mean((1, 2, 3)) > 127).long()
    data = engine.TensorData.build(x, (0.5,), (0.25,), None, "cpu")
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    idx = torch.arange(n)
    before = evaluation.evaluate(model, data, y).loss
    engine.local_train(model, data, idx, y, epochs=20, batch_size=20, optim=Optim("sgd", 0.1, 0.0, 0.5),
                       gen=torch.Generator().manual_seed(0))
    ev = evaluation.evaluate(model, data, y)
    acc, after = ev.acc, ev.loss
    assert after < before and acc > 0.9


def test_payload_bytes():
    assert engine.payload_bytes({"w": torch.zeros(10), "lid": 1.0, "g": np.zeros(3, np.float64)}) == 40 + 4 + 24


class _Fixed(nn.Module):
    """A 'model' whose logits are a fixed table, row i for image i (images carry their index)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits[x.reshape(x.shape[0], -1)[:, 0].round().long()]


def test_evaluate_balanced_accuracy_is_mean_per_class_recall():
    # 8 test images, 4 classes; class 3 absent. Predictions: class 0: 3 of 4 right, class 1: 1 of 2,
    # class 2: 0 of 2 -> accuracy 4/8, recalls (0.75, 0.5, 0), balanced (0.75 + 0.5 + 0) / 3.
    y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 0, 3])
    x = torch.arange(8, dtype=torch.uint8).view(8, 1, 1, 1)
    data = engine.TensorData.build(x, (0.0,), (1 / 255,), None, "cpu")  # normalised pixel = index
    ev = evaluation.evaluate(_Fixed(torch.nn.functional.one_hot(pred, 4).float() * 5), data, y, batch_size=3)
    assert ev.acc == pytest.approx(0.5)
    assert ev.balanced_acc == pytest.approx((0.75 + 0.5 + 0.0) / 3)
    assert ev.class_acc == [pytest.approx(0.75), pytest.approx(0.5), 0.0, None]
    assert ev.loss == pytest.approx(torch.nn.functional.cross_entropy(
        torch.nn.functional.one_hot(pred, 4).float() * 5, y).item())
    # num_classes beyond the model's outputs only lengthens class_acc with absent classes
    assert evaluation.evaluate(_Fixed(torch.nn.functional.one_hot(pred, 4).float()), data, y,
                           num_classes=6).class_acc[4:] == [None, None]


def test_accuracy_summary_and_cost_cover_both_curves():
    from fedlnl.benchmark.metrics import accuracy_summary, cost_to_target

    rows = [{"round": r + 1, "comm_cost": 10 * (r + 1), "acc": a, "balanced_acc": b}
            for r, (a, b) in enumerate([(0.2, 0.1), (0.6, 0.4), (0.5, 0.55), (float("nan"), None)])]
    s = accuracy_summary(rows, last_k=2)
    assert (s["best_acc"], s["final_acc"], s["last2_acc"]) == (0.6, 0.5, pytest.approx(0.55))
    assert (s["best_balanced_acc"], s["final_balanced_acc"]) == (0.55, 0.55)
    assert s["last2_balanced_acc"] == pytest.approx(0.475)
    assert cost_to_target(rows, [0.5, 0.9]) == {"0.5": 20, "0.9": None}
    assert cost_to_target(rows, [0.5], key="balanced_acc") == {"0.5": 30}
    # rows written before balanced accuracy existed: None, not an error
    old = accuracy_summary([{"acc": 0.3}])
    assert old["best_acc"] == 0.3 and old["best_balanced_acc"] is None
