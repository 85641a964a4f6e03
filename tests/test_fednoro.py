"""FedNoRo: closed-form checks of its pieces (logit adjustment, KD, ramp-up, per-class losses, GMM
detection, DaAgg weights), its hyperparameter checks, and tiny end-to-end runs."""
import json
import math

import numpy as np
import pytest
import torch

from conftest import make, run_tiny
from fedlnl.methods import fednoro as fn
from fedlnl.methods.common.protocol import FederationInfo

NOISY = ["noise.rho=0.5", "noise.tau=0.5"]
OWN = dict(warmup_rounds=2, lambda_=0.8, lambda_rampup=True, rampup_begin=2, rampup_rounds=3, kd_temperature=0.8,
           la_tau=1.0, logit_adjust=True, kd=True, daagg=True, distance="l2", gmm_votes=1, gmm_seeds="fixed",
           kd_student="plain", detect_augment=False)


# ----------------------------------------------------------------------------- losses
def test_logit_adjustment_uses_the_observed_class_prior():
    labels = torch.tensor([0, 0, 0, 1])  # π = (3/4, 1/4, 0)
    adj = fn.adjustment(labels, 3, 1.0)
    assert torch.allclose(adj[:2], torch.log(torch.tensor([0.75, 0.25])))
    assert adj[2] == -math.inf
    # zero logits: softmax(log π) = π, so L_LA = −mean log π_y
    logits = torch.zeros(4, 3, requires_grad=True)
    loss = fn.la_loss(logits, labels, adj)
    assert loss.item() == pytest.approx(-(3 * math.log(0.75) + math.log(0.25)) / 4, rel=1e-6)
    loss.backward()  # a class the client lacks (−∞) leaves finite gradients, and none on it
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 2] == 0).all()
    # τ scales the adjustment; τ = 0 is plain CE (no 0·∞ = nan)
    assert torch.allclose(fn.adjustment(labels, 3, 2.0)[:2], 2 * adj[:2])
    assert (fn.adjustment(labels, 3, 0.0) == 0).all()


def test_kd_loss_closed_form_and_the_codes_adjusted_student():
    student = torch.tensor([[0.0, math.log(3.0)]])  # softmax = (1/4, 3/4)
    teacher = torch.tensor([[0.0, 0.0]])  # softmax = (1/2, 1/2) at any temperature
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert fn.kd_loss(student, teacher, 0.8).item() == pytest.approx(expected, rel=1e-6)
    assert fn.kd_loss(student, student, 1.0).item() == pytest.approx(0.0, abs=1e-7)
    # the temperature divides the teacher only: T = 0.5 sharpens (0, ln 3) to (1/10, 9/10)
    t = torch.softmax(student / 0.5, dim=1)[0]
    assert fn.kd_loss(teacher, student, 0.5).item() == pytest.approx(
        float((t * (t.log() - math.log(0.5))).sum()), rel=1e-6)
    # adjusted student (code's LA_KD): log softmax(f + log π), −∞ entries counted as log p = 0
    adj = torch.tensor([0.0, -math.inf])
    # student log-probs become (0, −∞) → (0, 0): KL = Σ t·(log t − 0) = −H(t)
    assert fn.kd_loss(student, teacher, 1.0, adj).item() == pytest.approx(2 * 0.5 * math.log(0.5), rel=1e-6)


def test_rampup_weight_follows_the_sigmoid_ramp():
    assert fn.rampup_weight(10, 10, 39, 0.8) == pytest.approx(0.8 * math.exp(-5))
    assert fn.rampup_weight(5, 10, 39, 0.8) == pytest.approx(0.8 * math.exp(-5))  # clipped before begin
    mid = 10 + 39 / 3
    assert fn.rampup_weight(mid, 10, 39, 0.8) == pytest.approx(0.8 * math.exp(-5 * (2 / 3) ** 2))
    assert fn.rampup_weight(49, 10, 39, 0.8) == pytest.approx(0.8)
    assert fn.rampup_weight(90, 10, 39, 0.8) == pytest.approx(0.8)
    assert fn.rampup_weight(10, 10, 0, 0.8) == 0.8  # no ramp: λ = a at once
    m = make(fn.FedNoRo, **{**OWN, "lambda_rampup": False})
    assert fn.kd_weight(m.params, 2) == 0.8


# ----------------------------------------------------------------------------- detection
def test_per_class_losses_and_column_normalisation():
    losses = torch.tensor([1.0, 3.0, 5.0, 0.5])
    labels = torch.tensor([0, 0, 1, 1])
    out = fn.per_class_losses(losses, labels, 3)
    assert out[:2].tolist() == [2.0, 2.75] and np.isnan(out[2])
    m = np.array([[2.0, 1.0, np.nan, 7.0],
                  [4.0, np.nan, np.nan, 7.0],
                  [3.0, 3.0, np.nan, 7.0]])
    got = fn.normalise_columns(m)
    # col 0: min-max; col 1: the missing entry takes the column min (1) → 0; all-nan and constant → 0
    assert np.allclose(got, [[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.0]])


def test_gmm_flags_the_clients_with_high_per_class_losses():
    rng = np.random.default_rng(0)
    clean = rng.normal(0.1, 0.03, size=(8, 5))
    noisy = rng.normal(0.9, 0.03, size=(4, 5))
    rows = np.concatenate([clean[:3], noisy[:2], clean[3:], noisy[2:]])
    truth = np.array([0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1], dtype=bool)
    for seeds in ([7], list(range(9))):
        mask, info = fn.gmm_noisy(rows, seeds)
        assert mask.tolist() == truth.tolist()
        assert len(info["votes"]) == len(seeds)
    assert fn.gmm_noisy(rows[:1], [0])[0].tolist() == [False]  # one client: nothing to split


def test_majority_vote_picks_the_most_frequent_set(monkeypatch):
    """Votes (a, b, b) → b; a tie (a, b) → the first seed's set, as the code's list.index."""
    outcomes = iter([[1, 0, 0], [0, 1, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]])

    class Fake:
        def __init__(self, n_components, random_state):
            pass

        def fit(self, x):
            self.means_ = np.array([[0.0], [1.0]])
            self.pred = np.array(next(outcomes))
            return self

        def predict(self, x):
            return self.pred

    import sklearn.mixture
    monkeypatch.setattr(sklearn.mixture, "GaussianMixture", Fake)
    x = np.zeros((3, 1))
    assert fn.gmm_noisy(x, [0, 1, 2])[0].tolist() == [False, True, True]
    assert fn.gmm_noisy(x, [0, 1])[0].tolist() == [True, True, False]


def _toy_federation(augment=None):
    """6 clients of 20 one-hot 2x2 images (pixel c lit = class c, C = 4); clients 1, 3, 4 have every
    label shifted by one. The model reads the class off the lit pixel. Returns (model, ctx, truth,
    reported decisions, records)."""
    from fedlnl.methods.common import engine
    from fedlnl.methods.common.protocol import ClientView, RoundContext

    C, per = 4, 20
    y = torch.arange(6 * per) % C
    x = torch.zeros(6 * per, 1, 4, dtype=torch.uint8)
    x[torch.arange(6 * per), 0, y] = 255
    data = engine.TensorData.build(x.view(-1, 1, 2, 2), [0.0], [1.0], augment, "cpu")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(C, C, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(10 * torch.eye(C))
    noisy_truth = [1, 3, 4]
    observed = y.clone()
    for k in noisy_truth:
        observed[k * per:(k + 1) * per] = (observed[k * per:(k + 1) * per] + 1) % C

    def view(k):
        idx = torch.arange(k * per, (k + 1) * per)
        return ClientView(k, idx, observed[idx], data)

    reported, records = {}, {}
    ctx = RoundContext(round=0, total_rounds=3, seed=0, device=torch.device("cpu"), num_clients=6,
                       client_sizes=(per,) * 6, data=data, views=view,
                       report_clients=lambda is_noisy, **kw: reported.update(is_noisy),
                       record=records.__setitem__)
    return model, ctx, noisy_truth, reported, records


def _detect(ctx, model, **kw):
    m = make(fn.FedNoRo, **{**OWN, "warmup_rounds": 1, **kw})
    state = m.init(model, FederationInfo(6, 4, (20,) * 6, (1, 2, 2), 0), ctx)
    return fn.detect_clients(m, state, ctx, "fednoro")


def test_detection_flags_the_mislabelled_clients_of_a_federation():
    """Server step on a toy: the global model is a class-perfect predictor, so the clients whose
    labels are all shifted have high per-class losses; the GMM flags exactly those."""
    model, ctx, noisy_truth, reported, records = _toy_federation()
    noisy = _detect(ctx, model)
    assert np.flatnonzero(noisy).tolist() == noisy_truth
    assert reported == {k: k in noisy_truth for k in range(6)}
    clean_rows = np.array(records["detection"]["per_class_loss"])[[0, 2, 5]]
    assert (clean_rows < 1e-3).all()  # plain images: the perfect predictor's loss on true labels


def test_detect_augment_scores_augmented_views_reproducibly():
    """``detect_augment`` (the code's training-transform pass): a horizontal flip moves the lit pixel
    of classes 0/1 and 2/3, so the clean clients' losses rise; the draws come from the seeded context."""
    flip = {"crop": 2, "pad": 0, "flip": True}
    model, ctx, _, _, plain = _toy_federation(flip)
    _detect(ctx, model, detect_augment=False)
    runs = []
    for _ in range(2):
        model, ctx, _, _, rec = _toy_federation(flip)
        _detect(ctx, model, detect_augment=True)
        runs.append(np.array(rec["detection"]["per_class_loss"]))
    np.testing.assert_array_equal(runs[0], runs[1])
    clean = [0, 2, 5]
    assert (np.array(plain["detection"]["per_class_loss"])[clean] < 1e-3).all()
    assert runs[0][clean].max() > 1.0  # some flipped images are misread


# ----------------------------------------------------------------------------- DaAgg
def _model(w, b):
    return {"w": torch.tensor(w, dtype=torch.float32), "b": torch.tensor([b], dtype=torch.float32),
            "num_batches_tracked": torch.tensor(5)}


def test_daagg_weights_on_hand_made_models():
    models = [_model([0.0, 0.0], 0.0),   # clean A
              _model([1.0, 0.0], 0.0),   # clean B
              _model([3.0, 0.0], 4.0),   # noisy: to A Δ = (3, 0 | 4) → ‖·‖₂ = 5, Σ‖·‖ = 7; to B (2, 0 | 4)
              _model([0.0, 6.0], 8.0)]   # noisy: to A (0, 6 | 8) → 10 / 14; to B (−1, 6 | 8)
    sizes = [10, 20, 30, 40]
    noisy = [False, False, True, True]
    # l2: D = (0, 0, min(5, √20), min(10, √101)) = (0, 0, √20, 10) → D̂ = (0, 0, √20/10, 1)
    d = np.array([0, 0, math.sqrt(20) / 10, 1.0])
    want = np.array(sizes) * np.exp(-d)
    assert np.allclose(fn.daagg_weights(models, sizes, noisy, "l2"), want / want.sum())
    # sum of per-entry norms: to B (2 + 4 = 6, √37 + 8) → D = (0, 0, 6, min(14, √37 + 8)) → D̂ = 6/14, 1
    d = np.array([0, 0, 6 / 14, 1.0])
    want = np.array(sizes) * np.exp(-d)
    assert np.allclose(fn.daagg_weights(models, sizes, noisy, "sum_of_norms"), want / want.sum())
    # no clean model in the round, or no noisy one: FedAvg weights
    fedavg = np.array(sizes) / sum(sizes)
    assert np.allclose(fn.daagg_weights(models, sizes, [True] * 4, "l2"), fedavg)
    assert np.allclose(fn.daagg_weights(models, sizes, [False] * 4, "l2"), fedavg)
    # a noisy model identical to a clean one: every D = 0, FedAvg weights (the code gives nan)
    assert np.allclose(fn.daagg_weights(models[:2] + [models[0]], sizes[:3], [False, False, True], "l2"),
                       np.array(sizes[:3]) / 60)


def test_model_distance_forms_and_integer_buffers():
    a, b = _model([0.0, 0.0], 0.0), _model([3.0, 0.0], 4.0)
    b["num_batches_tracked"] = torch.tensor(1000)  # integer buffers never count
    assert fn.model_distance(a, b, "l2") == pytest.approx(5.0)
    assert fn.model_distance(a, b, "sum_of_norms") == pytest.approx(7.0)


# ----------------------------------------------------------------------------- checks, schedule
@pytest.mark.parametrize("key, value", [
    ("warmup_rounds", 0), ("warmup_rounds", 1.5), ("lambda_", 1.2), ("lambda_", True), ("rampup_rounds", -1),
    ("kd_temperature", 0), ("la_tau", -1.0), ("kd", "yes"), ("distance", "l1"), ("gmm_votes", 0),
    ("kd_student", "soft"), ("daagg", 1), ("detect_augment", "yes"), ("rampup_begin", -1), ("rampup_begin", 2.5),
    ("gmm_seeds", "random"),
])
def test_constructor_refuses_bad_values(key, value):
    with pytest.raises(ValueError, match=rf"^method\.{key}=.* is invalid: allowed "):
        make(fn.FedNoRo, **{**OWN, key: value})


def test_total_rounds_is_the_budget_and_needs_a_second_stage():
    info = FederationInfo(4, 3, (5,) * 4, (1, 8, 8), 0)
    m = make(fn.FedNoRo, **OWN)
    assert m.total_rounds(info, 30) == 30
    with pytest.raises(ValueError, match=r"^method\.warmup_rounds=2 is invalid: allowed an integer < fl\.rounds=2"):
        m.total_rounds(info, 2)


# ----------------------------------------------------------------------------- end to end
def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fidelity", ["paper", "reference"])
def test_tiny_run_visits_both_stages_and_reports_detection(tmp_path, fidelity):
    s = run_tiny(tmp_path, [*NOISY, f"fidelity={fidelity}"], "fednoro")
    assert s["status"] == "complete" and s["total_rounds"] == 3
    assert {"client_precision", "client_recall", "client_f1"} <= set(s["detection"])
    stages = [r.get("stage") for r in _rows(tmp_path)]
    assert stages == ["warmup", "training", "training"], stages
    diag = json.loads((tmp_path / "diagnostics.json").read_text())
    det = diag["records"]["detection"]
    assert len(det["normalised"]) == 6 and len(det["votes"]) == 9  # the code's 9 fits in both fidelities


def test_tiny_run_is_deterministic(tmp_path):
    a = run_tiny(tmp_path / "a", NOISY, "fednoro")
    b = run_tiny(tmp_path / "b", NOISY, "fednoro")
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")
    assert a["final_acc"] == b["final_acc"] and a["detection"] == b["detection"]


# ----------------------------------------------------------------------------- the code's forms (audit rows)
# Each test re-derives the official code's formula (wnn2000/FedNoRo@6719ad7, docs/methods/fednoro.md §18) in plain
# NumPy / torch on fixed tensors and compares the function fedlnl runs by default.
def _code_la_kd(logits, teacher, labels, counts, w_kd, temperature):
    """``LA_KD`` (utils/losses.py): log p = log_softmax(f + log π), −∞ → 0; w·KL(q ‖ p) + (1 − w)·NLL."""
    with np.errstate(divide="ignore"):  # log 0 = −∞ for a class the client lacks, as torch.log
        x = logits.astype(np.float64) + np.log(counts / counts.sum())
    top = x.max(axis=1, keepdims=True)
    log_p = x - top - np.log(np.exp(x - top).sum(axis=1, keepdims=True))
    log_p[np.isinf(log_p)] = 0.0
    t = teacher.astype(np.float64) / temperature
    q = np.exp(t - t.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    kl = (q * (np.log(q) - log_p)).sum() / len(labels)  # kl_div(..., reduction="batchmean")
    nll = -log_p[np.arange(len(labels)), labels].mean()
    return w_kd * kl + (1 - w_kd) * nll


def test_default_kd_student_is_the_codes_la_kd():
    """kd_student (code: ``LA_KD``): the default stage-2 loss of a noisy client equals the code's on a
    batch where the client lacks class 2, and the plain student gives a different loss."""
    m = make(fn.FedNoRo, **{**OWN, "kd_student": "adjusted"})
    logits = np.array([[2.0, -1.0, 3.0], [0.5, 0.2, -0.3], [-2.0, 1.5, 0.0], [1.0, 1.0, 4.0]])
    teacher = np.array([[0.1, 0.3, 2.0], [1.0, -1.0, 0.5], [0.0, 2.0, 1.0], [-0.5, 0.2, 3.0]])
    labels = np.array([0, 1, 1, 0])
    lam = 0.37
    adj = fn.adjustment(torch.tensor(labels), 3, m.la_tau)
    ours = fn.distillation_loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(teacher, dtype=torch.float32),
                                torch.tensor(labels), adj, lam, m.kd_temperature, m.kd_student == "adjusted")
    want = _code_la_kd(logits, teacher, labels, np.bincount(labels, minlength=3).astype(float), lam, 0.8)
    assert ours.item() == pytest.approx(want, rel=1e-6)
    plain = fn.distillation_loss(torch.tensor(logits, dtype=torch.float32), torch.tensor(teacher, dtype=torch.float32),
                                 torch.tensor(labels), adj, lam, 0.8, False)
    assert abs(plain.item() - want) > 0.1  # the teacher's mass on class 2 counts only for the plain student


BORDERLINE = np.random.default_rng(1).uniform(size=(10, 3)).round(2)  # 10 clients × 3 classes, no clear split


def test_default_detection_votes_nine_gmms_with_seeds_0_to_8():
    """gmm_votes / gmm_seeds (code: ``GaussianMixture(2, random_state=i)`` for i in range(9), the noisy
    set of ``argmax(means_.sum(1))``, the most frequent set with ties to the first)."""
    import warnings

    from sklearn.mixture import GaussianMixture

    m = make(fn.FedNoRo, **{**OWN, "gmm_votes": 9, "gmm_seeds": "fixed"})
    vote = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(9):
            gmm = GaussianMixture(n_components=2, random_state=i).fit(BORDERLINE)
            vote.append(set(np.where(gmm.predict(BORDERLINE) == np.argmax(gmm.means_.sum(1)))[0].tolist()))
    cnt = [vote.count(v) for v in vote]
    winner = vote[cnt.index(max(cnt))]
    assert len({frozenset(v) for v in vote}) > 1 and winner != vote[0]  # the fits disagree: the vote decides
    seeds = fn.gmm_seed_list(m.gmm_votes, m.gmm_seeds, np.random.default_rng(123))
    assert seeds == list(range(9))  # whatever the run's stream
    mask, info = fn.gmm_noisy(BORDERLINE, seeds)
    assert set(np.flatnonzero(mask).tolist()) == winner
    assert [set(v) for v in info["votes"]] == vote
    drawn = fn.gmm_seed_list(9, "run", np.random.default_rng(123))
    assert drawn == fn.gmm_seed_list(9, "run", np.random.default_rng(123)) and drawn != seeds


def _code_model_dist(w1, w2):
    """``model_dist`` (utils/FedAvg.py): Σ over entries whose dtype is not an integer of torch.norm(Δ)."""
    total = torch.zeros(1).float()
    for key in w1:
        if "int" in str(w1[key].dtype):
            continue
        total += torch.norm(w1[key] - w2[key]).cpu()
    return total.item()


def _code_daagg_weights(w, sizes, clean, noisy):
    """``DaAgg``'s client weights (utils/FedAvg.py)."""
    weight = np.array(sizes) / np.sum(sizes)
    distance = np.zeros(len(sizes))
    for n in noisy:
        distance[n] = min(_code_model_dist(w[n], w[c]) for c in clean)
    distance = distance / distance.max()
    weight = weight * np.exp(-distance)
    return weight / weight.sum()


def test_default_distance_is_the_codes_sum_of_norms_with_bn_statistics():
    """distance (code: ``model_dist`` over every float state-dict entry, BatchNorm statistics included)
    and the DaAgg weights built on it, on four trained-looking BN models."""
    from fedlnl.methods.common import engine

    states = []
    for seed in range(4):
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                                  torch.nn.Linear(12, 2))
        net(torch.randn(5, 1, 4, 4) * (seed + 1))  # train-mode pass: running stats and num_batches_tracked move
        states.append(engine.get_weights(net))
    m = make(fn.FedNoRo, **{**OWN, "distance": "sum_of_norms"})
    want = _code_model_dist(states[0], states[3])
    assert fn.model_distance(states[0], states[3], m.distance) == pytest.approx(want, rel=1e-6)
    sizes, noisy = [10, 25, 15, 30], [False, True, False, True]
    ours = fn.daagg_weights(states, sizes, noisy, m.distance)
    np.testing.assert_allclose(ours, _code_daagg_weights(states, sizes, [0, 2], [1, 3]), rtol=1e-6)
    assert not np.allclose(ours, fn.daagg_weights(states, sizes, noisy, "l2"), rtol=1e-3)  # the forms differ


def test_default_detection_pass_scores_augmented_views_in_eval_mode():
    """detect_augment (code: ``get_output`` over the training dataset object, i.e. through the training
    transform, with the model in eval mode): the recorded normalised matrix equals per-class losses of
    the eval-mode model on the augmented views drawn from the seeded context, then nanmin + min-max."""
    from fedlnl.methods.common import engine

    flip = {"crop": 2, "pad": 0, "flip": True}
    model, ctx, _, _, rec = _toy_federation(flip)
    model = torch.nn.Sequential(torch.nn.Dropout(0.9), *model)  # eval mode or not shows in the losses
    _detect(ctx, model, detect_augment=True, gmm_votes=9)
    model.eval()
    metrics = np.zeros((6, 4))
    for k in range(6):
        view = ctx.views(k)
        x = view.data.images(view.indices, augment=True, gen=ctx.generator("fednoro_detect", k))
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(model(x), view.labels, reduction="none").double().numpy()
        for c in range(4):  # the code's metrics[id, c]: mean loss of the client's samples labelled c
            metrics[k, c] = loss[view.labels.numpy() == c].mean()
    metrics = (metrics - metrics.min(0)) / (metrics.max(0) - metrics.min(0))  # every client holds every class
    np.testing.assert_allclose(np.array(rec["detection"]["normalised"]), metrics, rtol=1e-9, atol=1e-12)


def _code_sigmoid_rampup(current, begin, end):
    """``sigmoid_rampup`` (utils/utils.py)."""
    current = np.clip(current, begin, end)
    phase = 1.0 - (current - begin) / (end - begin)
    return float(np.exp(-5.0 * phase * phase))


def test_lambda_ramp_starts_at_its_own_key_as_the_codes_begin():
    """rampup_begin (code: ``--begin``, independent of the warm-up ``--s1``): λ(t) = a·sigmoid_rampup(t,
    begin, end) for every round, with begin ≠ T₁."""
    m = make(fn.FedNoRo, **{**OWN, "warmup_rounds": 2, "rampup_begin": 5, "rampup_rounds": 4})
    for t in range(15):
        assert fn.kd_weight(m.params, t) == pytest.approx(0.8 * _code_sigmoid_rampup(t, 5, 9), rel=1e-12), t
    tied = make(fn.FedNoRo, **{**OWN, "warmup_rounds": 2, "rampup_begin": 2, "rampup_rounds": 4})
    assert fn.kd_weight(m.params, 4) < fn.kd_weight(tied.params, 4)  # a ramp tied to T₁ would already have risen


def _adam_steps(w, grads, lr, betas, wd, eps=1e-8):
    """torch.optim.Adam with coupled L2 decay, as Kingma & Ba's Algorithm 1 on g + wd·w."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = g + wd * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        w = w - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return w


def test_reference_local_training_is_the_codes_adam():
    """Local optimiser (code: ``torch.optim.Adam(lr=3e-4, betas=(0.9, 0.999), weight_decay=5e-4)``, batch
    16, 5 local epochs, every client of its datasets every round): the settings FedNoRo gets, and two
    steps of the optimiser the engine builds from them against Adam's update rule."""
    from conftest import build_method, compose_cfg
    from fedlnl.methods.common import engine

    ref = build_method(compose_cfg(["method=fednoro", "fidelity=reference", "fl.frac=0.25"]), ["fl.frac=0.25"])
    fl = ref.fl
    assert (fl.optimizer, fl.lr, fl.betas, fl.weight_decay, fl.batch_size, fl.local_epochs, fl.momentum) == (
        "adam", 3e-4, (0.9, 0.999), 5e-4, 16, 5, None)
    assert fl.frac == 0.25  # the suite's participation budget on its own datasets
    paper = build_method(compose_cfg(["method=fednoro"])).fl
    assert (paper.optimizer, paper.betas, paper.momentum) == ("sgd", None, 0.5)
    ich = ["method=fednoro", "dataset=folder", "dataset.root=/nonexistent", "dataset.family=ich"]
    for fidelity in ("paper", "reference"):  # the code's own datasets: its values in both fidelities
        code = build_method(compose_cfg([*ich, f"fidelity={fidelity}"])).fl
        assert (code.optimizer, code.lr, code.betas, code.weight_decay, code.batch_size, code.frac) == (
            "adam", 3e-4, (0.9, 0.999), 5e-4, 16, 1.0)
    w0 = np.array([0.5, -1.0, 2.0])
    grads = [np.array([0.3, -0.2, 0.0]), np.array([-0.1, 0.4, 1.0])]
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = engine.optimizer(torch.nn.ParameterList([p]), fl.optim())
    assert isinstance(opt, torch.optim.Adam)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), _adam_steps(w0, grads, 3e-4, (0.9, 0.999), 5e-4), rtol=1e-12)
