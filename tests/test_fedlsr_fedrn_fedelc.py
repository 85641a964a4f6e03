"""FedLSR, FedRN, FedELC: closed-form checks of their distinctive pieces (docs/methods/fedlsr_fedrn_fedelc.md §22), the stores
and the second view they add to the kit, their switches, and small runs of their mechanics."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import compose_cfg, run_tiny
from fedlnl.methods import fedelc, fedlsr, fedrn
from fedlnl.methods.common import views
from fedlnl.methods.common.stores import ModelCache, SampleStore

SWITCHES = [  # (method, key, the inferred paper form, the code's form = the default in both fidelities)
    ("fedlsr", "entropy_form", "views", "code"), ("fedlsr", "view_per_sample", True, False),
    ("fedlsr", "view_space", "pixels", "normalised"), ("fedrn", "score_augment", False, True),
    ("fedelc", "distance", "l2", "sum_of_norms"), ("fedelc", "gmm_votes", 1, 9),
    ("fedelc", "detect_augment", False, True), ("fedelc", "gmm_seeds", "run", "fixed"),
]
FIDELITY_SWITCHES = [  # (method, key, fidelity=paper, fidelity=reference = the official code's form)
    ("fedlsr", "cls_form", "log", "softmax"),  # slides p. 8 and Figure 4: CE(p_s, y) on probabilities
    ("fedlsr", "js_reduction", "batchmean", "mean"),  # slides p. 9: KL summed over the classes
    ("fedrn", "neighbour_cache", "aggregation", "immediate"),
]


@pytest.mark.parametrize("method, key, paper, code", SWITCHES)
def test_defaults_are_the_codes_forms_and_the_paper_forms_are_settable(method, key, paper, code):
    # the papers' text was not available for these: the code's forms are the defaults in both fidelities
    assert compose_cfg([f"method={method}"]).method[key] == code
    assert compose_cfg([f"method={method}", "fidelity=reference"]).method[key] == code
    assert compose_cfg([f"method={method}", f"method.{key}={paper}"]).method[key] == paper


@pytest.mark.parametrize("method, key, paper, reference", FIDELITY_SWITCHES)
def test_switches_follow_fidelity(method, key, paper, reference):
    assert compose_cfg([f"method={method}"]).method[key] == paper
    assert compose_cfg([f"method={method}", "fidelity=reference"]).method[key] == reference
    assert compose_cfg([f"method={method}", f"method.{key}={reference}"]).method[key] == reference


# ----------------------------------------------------------------------------------- FedLSR
L1 = torch.tensor([[math.log(3.0), 0.0]])  # softmax = (3/4, 1/4)
L2 = torch.tensor([[0.0, 0.0]])            # softmax = (1/2, 1/2)


def test_fedlsr_sharpened_mixture_and_classification_loss_by_hand():
    # p = ½(3/4, 1/4) + ½(1/2, 1/2) = (5/8, 3/8); p² ∝ (25, 9) -> p_s = (25/34, 9/34)
    p_s = fedlsr.sharpened_mixture(L1, L2, 0.5, 0.5)
    assert torch.allclose(p_s, torch.tensor([[25 / 34, 9 / 34]]), atol=1e-7)
    y = torch.tensor([0])
    assert fedlsr.cls_loss(p_s, y, "log").item() == pytest.approx(-math.log(25 / 34), rel=1e-6)
    # the code's CrossEntropyLoss on probabilities: -log softmax(p_s)_0 = log(1 + e^{(9-25)/34})
    assert fedlsr.cls_loss(p_s, y, "softmax").item() == pytest.approx(math.log1p(math.exp(-16 / 34)), rel=1e-6)


def test_fedlsr_js_entropy_and_total_loss_on_a_hand_made_pair():
    q1, q2 = fedlsr.tempered(L1, 1.0), fedlsr.tempered(L2, 1.0)  # T_d = 1: plain softmax
    m = (5 / 8, 3 / 8)
    kl = lambda p: sum(pi * math.log(pi / mi) for pi, mi in zip(p, m))  # noqa: E731
    js = 0.5 * (kl((3 / 4, 1 / 4)) + kl((1 / 2, 1 / 2)))
    assert fedlsr.js_divergence(q1, q2, "batchmean").item() == pytest.approx(js, rel=1e-5)
    assert fedlsr.js_divergence(q1, q2, "mean").item() == pytest.approx(js / 2, rel=1e-5)  # ÷ C = 2
    h = lambda p: -sum(pi * math.log(pi) for pi in p)  # noqa: E731
    assert fedlsr.entropy_term(q1, q2, "views").item() == pytest.approx(0.5 * (h((.75, .25)) + h((.5, .5))), rel=1e-5)
    s = torch.softmax(torch.tensor([0.75, 0.25]), 0).tolist()  # the code: entropy of softmax(q1)
    assert fedlsr.entropy_term(q1, q2, "code").item() == pytest.approx(h(s), rel=1e-5)
    # tempered outputs: 1/T_d = 3 sharpens (3/4, 1/4) to (27/28, 1/28)
    assert torch.allclose(fedlsr.tempered(L1, 3.0), torch.tensor([[27 / 28, 1 / 28]]), atol=1e-6)
    total = fedlsr.lsr_loss(L1, L2, torch.tensor([0]), 0.5, 0.2, 0.6, T=0.5, inv_T_d=1.0, cls_form="log",
                            entropy_form="views", js_reduction="batchmean")
    want = -math.log(25 / 34) + 0.2 * js + 0.6 * 0.5 * (h((.75, .25)) + h((.5, .5)))
    assert total.item() == pytest.approx(want, rel=1e-5)


def test_fedlsr_classification_loss_on_probabilities_makes_a_noisy_label_costlier_after_sharpening():
    """Figure 4's caption (slides p. 8): when the model predicts the true class and y is a noisy label,
    CE(p_s, y) exceeds CE(p1, y), CE(p2, y) and CE(p, y): CE of probability vectors, −log p[y]."""
    l1, l2 = torch.tensor([[0.0, math.log(3 / 7)]]), torch.tensor([[0.0, math.log(4 / 6)]])  # (.7, .3), (.6, .4)
    y = torch.tensor([1])  # the noisy label
    p_s = fedlsr.sharpened_mixture(l1, l2, 0.5, 0.5)  # p = (.65, .35) -> p² ∝ (.4225, .1225)
    assert torch.allclose(p_s, torch.tensor([[0.4225 / 0.545, 0.1225 / 0.545]]), atol=1e-6)
    ce = fedlsr.cls_loss(p_s, y, "log").item()
    assert ce == pytest.approx(-math.log(0.1225 / 0.545), rel=1e-6)
    assert ce > max(-math.log(0.3), -math.log(0.4), -math.log(0.35))
    # the code's form reads p_s as logits: −log softmax(p_s)_1 = log(1 + e^{p_s0 − p_s1}), within [log(1 + e^{-1}), log(1 + e)]
    code = fedlsr.cls_loss(p_s, y, "softmax").item()
    assert code == pytest.approx(math.log1p(math.exp((0.4225 - 0.1225) / 0.545)), rel=1e-6)
    assert math.log1p(math.exp(-1)) < code < math.log1p(math.e) and code < ce


def test_fedlsr_js_is_against_the_views_mean_not_the_uniform_distribution():
    """Slides p. 9: JS(q1, q2) = ½(KL(q1 ‖ U) + KL(q2 ‖ U)) with U = (q1 + q2)/2 (the code's JS function,
    per the author in issue #3): zero for two equal views, where a KL to the uniform would not be."""
    q = fedlsr.tempered(L1, 1.0)  # (3/4, 1/4)
    assert fedlsr.js_divergence(q, q, "batchmean").item() == pytest.approx(0.0, abs=1e-7)
    kl_uniform = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert kl_uniform > 0.13
    # two samples: the batch mean of the per-sample sums (paper) and the mean over B·C entries (code)
    q1 = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    q2 = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    js0 = 0.5 * (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)) * 2  # m = (1/2, 1/2)
    assert fedlsr.js_divergence(q1, q2, "batchmean").item() == pytest.approx(js0 / 2, rel=1e-6)
    assert fedlsr.js_divergence(q1, q2, "mean").item() == pytest.approx(js0 / 4, rel=1e-6)


@pytest.mark.parametrize("fidelity, cls, js", [("paper", "log", "batchmean"), ("reference", "softmax", "mean")])
def test_fedlsr_built_from_the_config_uses_its_fidelitys_loss(fidelity, cls, js):
    from conftest import build_method

    m = build_method(compose_cfg(["method=fedlsr", f"fidelity={fidelity}"]))
    assert (m.cls_form, m.js_reduction, m.entropy_form) == (cls, js, "code")
    y = torch.tensor([0])
    got = fedlsr.lsr_loss(L1, L2, y, 0.5, m.gamma, m.gamma_e, T=m.sharpen_T, inv_T_d=1.0, cls_form=m.cls_form,
                          entropy_form=m.entropy_form, js_reduction=m.js_reduction)
    p_s = torch.tensor([[25 / 34, 9 / 34]])
    m_ = (5 / 8, 3 / 8)
    js_sum = 0.5 * sum(a * math.log(a / b) for a, b in zip((3 / 4, 1 / 4), m_)) + \
        0.5 * sum(a * math.log(a / b) for a, b in zip((1 / 2, 1 / 2), m_))
    cls_value = -math.log(25 / 34) if cls == "log" else math.log1p(math.exp(-16 / 34))
    js_value = js_sum if js == "batchmean" else js_sum / 2
    s = torch.softmax(torch.tensor([0.75, 0.25]), 0)
    entropy = float(-(s * s.log()).sum())
    assert p_s.sum() == pytest.approx(1.0)
    assert got.item() == pytest.approx(cls_value + 0.4 * js_value + 0.6 * entropy, rel=1e-5)


def test_fedlsr_warmup_schedule():
    assert [fedlsr.warmup_weight(t, 0.4, 6.0) for t in (0, 3, 5, 6, 29)] == pytest.approx([0, 0.2, 0.4 * 5 / 6, 0.4, 0.4])
    assert fedlsr.warmup_weight(0, 0.4, 0.0) == 0.4  # no warm-up


def test_second_view_keeps_shape_changes_images_and_draws_per_sample_or_per_batch():
    x = torch.rand(8, 3, 6, 6)
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25)
    xb = (x - mean) / std
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a = views.mild_view(xb, mean, std, g(), kind="color", per_sample=True, space="pixels")
    assert a.shape == xb.shape and not torch.equal(a, xb)
    assert torch.equal(a, views.mild_view(xb, mean, std, g(), kind="color", per_sample=True, space="pixels"))
    pixels = a * std + mean  # the colour operations keep pixel values in [0, 1]
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5
    assert torch.equal(views.mild_view(xb, mean, std, g(), kind="none", per_sample=True, space="pixels"), xb)
    one = torch.zeros(1, 1, 3, 3)
    one[0, 0, 0, 1] = 1.0
    assert torch.equal(views.rotate(one, torch.Generator(), True, degrees=0.0), one)  # θ = 0: unchanged
    # one draw per batch: every image of a constant batch gets the same view
    same = torch.rand(1, 3, 6, 6).expand(4, 3, 6, 6).contiguous()
    v = views.color_jitter(same, torch.Generator().manual_seed(1), per_sample=False)
    assert all(torch.allclose(v[0], v[i]) for i in range(4))
    v = views.color_jitter(same, torch.Generator().manual_seed(1), per_sample=True)
    assert not all(torch.allclose(v[0], v[i]) for i in range(4))


def test_rotation_by_ninety_degrees_moves_a_pixel_counter_clockwise(monkeypatch):
    monkeypatch.setattr(views, "_draw", lambda n, per_sample, gen, device, low=0.0, high=1.0:
                        torch.full((n,), 90.0, device=device))
    one = torch.zeros(1, 1, 3, 3)
    one[0, 0, 0, 1] = 1.0  # top middle -> middle left (torchvision's positive angle)
    want = torch.zeros(1, 1, 3, 3)
    want[0, 0, 1, 0] = 1.0
    assert torch.allclose(views.rotate(one, torch.Generator(), True), want)


def test_hue_conversion_round_trips():
    x = torch.rand(5, 3, 4, 4)
    assert torch.allclose(views.hsv_to_rgb(*views.rgb_to_hsv(x)), x, atol=1e-5)


# ----------------------------------------------------------------------------------- FedRN
def test_fedrn_reliability_scores_and_neighbour_choice_by_hand():
    # client k: expertise 0.5, signature (1, 0); candidates 3, 5, 8
    exp = [0.9, 0.3, 0.7]
    sig = [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]  # cos to (1, 0): 1/√2, 0, 1
    own, scores = fedrn.reliability_scores(0.5, [1.0, 0.0], exp, sig, alpha=0.6)
    # expertise over (k, 3, 5, 8) = (.5, .9, .3, .7): min-max -> (1/3, 1, 0, 2/3)
    # similarity (1, 1/√2, 0, 1): min-max -> (1, 1/√2, 0, 1)
    assert own == pytest.approx(0.6 / 3 + 0.4)
    want = [0.6 * 1 + 0.4 / math.sqrt(2), 0.0, 0.6 * 2 / 3 + 0.4]
    assert scores == pytest.approx(want)
    assert fedrn.top_neighbours(scores, [3, 5, 8], 2) == [(3, pytest.approx(want[0])), (8, pytest.approx(want[2]))]
    assert fedrn.top_neighbours([0.2, 0.5, 0.5], [1, 2, 4], 1) == [(2, 0.5)]  # tie: the lower id
    assert fedrn.top_neighbours(scores, [3, 5, 8], 5)[-1][0] == 5  # K larger than the candidates
    # all-equal values normalise to 0 (the code divides by zero)
    own, scores = fedrn.reliability_scores(0.5, [1.0, 0.0], [0.5], [[1.0, 0.0]], alpha=0.6)
    assert (own, scores) == (pytest.approx(0.4), [pytest.approx(0.0)])


def test_fedrn_ensemble_gmm_selects_the_low_loss_samples():
    from fedlnl.methods.common import semisup

    rng = np.random.default_rng(0)
    losses = torch.tensor(np.r_[rng.uniform(0.0, 0.2, 30), rng.uniform(2.0, 2.5, 10)], dtype=torch.float32)
    gmm = {"max_iter": 100, "tol": 1e-2, "reg_covar": 5e-4}
    own = semisup.clean_probability(losses, 0, **gmm)
    assert (own[:30] > 0.99).all() and (own[30:] < 0.01).all()
    # a neighbour that believes the opposite outweighed 0.7 : 0.3 by k's own GMM
    w, clean = fedrn.ensemble_clean([own, 1 - own], [0.7, 0.3], 0.5)
    assert torch.allclose(w, 0.7 * own.double() + 0.3 * (1 - own.double()))
    assert clean.tolist() == [True] * 30 + [False] * 10
    # nobody above the threshold: every sample is kept (the code)
    assert fedrn.ensemble_clean([torch.zeros(4)], [1.0], 0.5)[1].all()
    assert fedrn.ensemble_clean([torch.ones(2), torch.zeros(2)], [0.0, 0.0], 0.4)[0].tolist() == [0.5, 0.5]


def test_model_cache_and_sample_store():
    cache = ModelCache()
    cache.put(4, {"w": torch.zeros(3)}, expertise=0.8)
    cache.put(1, {"w": torch.ones(2, 2)}, expertise=0.1, signature=torch.ones(2))
    assert cache.clients() == [1, 4] and 4 in cache and 2 not in cache and len(cache) == 2
    assert cache.record(4, "expertise") == 0.8 and cache.record(4, "signature") is None
    assert cache.bytes_of(1) == 16 and cache.bytes_of(4) == 12
    store = SampleStore(2)
    idx = torch.tensor([5, 2])
    rows = store.get(idx, lambda missing: missing.float().view(-1, 1).expand(-1, 2))
    assert rows.tolist() == [[5, 5], [2, 2]] and store.has(torch.tensor([2, 3, 5, 9])).tolist() == [True, False, True, False]
    store.set(torch.tensor([2]), torch.tensor([[7.0, 8.0]]))
    assert store.get(torch.tensor([2, 5]), lambda m: 1 / 0).tolist() == [[7, 8], [5, 5]]  # no re-init


@pytest.mark.parametrize("cache, second_sees", [("aggregation", 1), ("immediate", 2)])
def test_fedrn_neighbour_trained_earlier_in_the_round_is_chosen_only_when_immediate(tmp_path, cache, second_sees):
    """Round 0 (warm-up): client 0 trains and is cached. Round 1: clients 1 then 2, K = 10. With the
    cache updated at aggregation both see one candidate (client 0); with ``immediate`` (the code)
    client 2 also sees client 1, trained earlier in the same round."""
    from conftest import build_method
    from fedlnl.benchmark.runner import Runner

    cfg = compose_cfg(["method=fedrn", "debug=tiny", "logger=none", "device=cpu", "method.num_neighbors=10",
                       f"method.neighbour_cache={cache}"])
    method = build_method(cfg)
    runner = Runner(cfg, tmp_path, "fedrn", "g", method)
    runner.prepare()
    state = method.init(runner.model, runner.info, runner.context(0))
    assert method.warmup_rounds(runner.context(0)) == 1
    state, _ = method.aggregate(state, [method.client_update(state, runner.view(0), runner.context(0))],
                                runner.context(0))
    ctx = runner.context(1)
    first = method.client_update(state, runner.view(1), ctx)
    assert (1 in state["cache"]) == (cache == "immediate")
    if cache == "immediate":  # the cache holds exactly what client 1 uploads
        assert all(torch.equal(state["cache"].weights(1)[n], t.cpu()) for n, t in first.weights.items())
        assert state["cache"].record(1, "expertise") == first.payload["expertise"]
    second = method.client_update(state, runner.view(2), ctx)
    assert (first.metrics["neighbour_models"], second.metrics["neighbour_models"]) == (1, second_sees)
    state, metrics = method.aggregate(state, [first, second], ctx)
    assert state["cache"].clients() == [0, 1, 2] and metrics["neighbour_models"] == 1 + second_sees


def test_fedrn_counts_the_neighbour_downloads(tmp_path):
    import json

    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5"], "fedrn")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["stage"] == "warmup" and rows[0]["neighbour_models"] == 0
    later = rows[1:]
    assert all(r["stage"] == "neighbours" and r["neighbour_models"] > 0 for r in later)
    # every extra model is a full state dict: bytes per model = the upload's weight bytes
    # 3 uploads a round, each + e_k + 10 logits; the 6 clients' validation counts (16 bytes each)
    model_bytes = ((rows[0]["bytes_up"] - 6 * 16) / 3) - 4 * 11
    assert rows[-1]["bytes_down_extra"] == pytest.approx(sum(r["neighbour_models"] for r in later) * model_bytes)
    assert s["status"] == "complete" and "sample_f1" in s["detection"]


# ----------------------------------------------------------------------------------- FedELC
def test_fedelc_label_update_one_step_against_the_gradient_formula():
    torch.manual_seed(0)
    B, C, alpha, beta, lam = 4, 3, 0.5, 0.2, 1000.0
    logits = torch.randn(B, C)
    y = torch.tensor([0, 2, 1, 1])
    ytilde = fedelc.initial_labels(y, C, 10.0).requires_grad_(True)
    fedelc.elc_loss(logits, ytilde, y, alpha, beta).backward()
    new = ytilde.detach() - lam * ytilde.grad
    # ∂L/∂ỹ_i = [(y^d_i − p_i)/C + α(y^d_i − e_{y_i})] / B
    yd, p = torch.softmax(fedelc.initial_labels(y, C, 10.0), 1), torch.softmax(logits, 1)
    grad = ((yd - p) / C + alpha * (yd - F.one_hot(y, C))) / B
    assert torch.allclose(new, fedelc.initial_labels(y, C, 10.0) - lam * grad, atol=1e-4)
    # the loss value itself
    logp = torch.log_softmax(logits, 1)
    lc = (p * (logp - yd.log())).sum(1).mean()
    lo = -yd.log()[torch.arange(B), y].mean()
    le = -(p * logp).sum(1).mean()
    assert fedelc.elc_loss(logits, fedelc.initial_labels(y, C, 10.0), y, alpha, beta).item() == pytest.approx(
        (lc / C + alpha * lo + beta * le / C).item(), rel=1e-6)
    # the merge after local training
    merged = fedelc.merge_labels(torch.zeros(1, 2), torch.tensor([[0.0, math.log(3.0)]]), 10.0)
    assert torch.allclose(merged, torch.tensor([[10 * (0.5 + 0.25) / 2, 10 * (0.5 + 0.75) / 2]]))


def test_fedelc_detects_the_noisy_clients_by_their_class_losses():
    from fedlnl.methods.common import noisyclients

    # 3 clients with low per-class losses, 2 with high ones; client 4 lacks class 2 (nanmin fill)
    raw = np.array([[0.1, 0.2, 0.1], [0.2, 0.1, 0.2], [0.1, 0.1, 0.1], [2.0, 1.8, 2.2], [1.9, 2.1, np.nan]])
    matrix = noisyclients.normalise_columns(raw)
    assert matrix[4, 2] == 0.0 and matrix[3].min() > 0.8
    noisy, info = noisyclients.gmm_noisy(matrix, [0])
    assert noisy.tolist() == [False, False, False, True, True] and info["votes"] == [[3, 4]]


def test_fedelc_labels_persist_across_rounds_and_flag_disagreements(tmp_path):
    """One noisy client trained twice: its label vectors start where the first round left them."""
    from fedlnl.benchmark.runner import Runner
    from fedlnl.methods.common.protocol import RoundContext

    cfg = compose_cfg(["method=fedelc", "debug=tiny", "logger=none", "device=cpu"])
    from conftest import build_method
    method = build_method(cfg)
    runner = Runner(cfg, tmp_path, "fedelc", "g", method)
    runner.prepare()
    ctx = runner.context(1)
    state = method.init(runner.model, runner.info, ctx)
    state["noisy"] = np.ones(runner.info.num_clients, dtype=bool)
    view = runner.view(0)
    method.client_update(state, view, ctx)
    first = state["labels"].get(view.indices, lambda m: 1 / 0)
    assert not torch.allclose(first, fedelc.initial_labels(view.labels, 10, 10.0))  # learnt
    assert torch.allclose(first.sum(1), torch.full((view.size,), 10.0), atol=1e-4)  # K·(average of two distributions)
    method.client_update(state, view, RoundContext(**{**ctx.__dict__, "round": 2}))
    assert not torch.allclose(state["labels"].get(view.indices, lambda m: 1 / 0), first)
    assert state["flags"][0]["flagged"].dtype == torch.bool
