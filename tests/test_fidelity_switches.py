"""Issue 13's switches: RoFL's L_cen scale, FedDiv's initial filter on the raw loss scale, FedCorr's
reference behaviours and VGG-11's reference head, each with its paper and reference value."""
import json

import numpy as np
import pytest
import torch

from conftest import compose_cfg, run_tiny
from fedlnl.methods import feddiv as fd
from fedlnl.methods.rofl import centroid_loss
from fedlnl.models.vgg import VGG11

SWITCHES = [  # (config group overrides, key, paper value, reference value)
    (["method=rofl"], "method.cen_normalize", True, False),
    (["method=rofl"], "method.forget_rate", "noise", 0.2),
    (["method=fedcorr"], "method.relabel_cap", "noisy_count", "mu_hat"),
    (["method=fedcorr"], "method.untrained_losses", "keep", "zero"),
    (["method=fedcorr"], "method.relabel_without_finetuning", False, True),
    (["method=fedcorr_fedprox"], "method.relabel_cap", "noisy_count", "mu_hat"),
    (["model=vgg11"], "model.reference_head", False, True),
]


@pytest.mark.parametrize("groups, key, paper, reference", SWITCHES, ids=lambda v: str(v))
def test_switch_values_follow_fidelity(groups, key, paper, reference):
    def value(cfg):
        node = cfg
        for part in key.split("."):
            node = node[part]
        return node
    assert value(compose_cfg(groups)) == paper
    assert value(compose_cfg([*groups, "fidelity=reference"])) == reference


def test_vgg11_reference_head_has_1000_logits():
    x = torch.zeros(2, 3, 32, 32)
    assert VGG11(10, (3, 32, 32), reference_head=True, dropout_rng="client")(x).shape == (2, 1000)
    assert VGG11(10, (3, 32, 32), reference_head=False, dropout_rng="client")(x).shape == (2, 10)


def test_rofl_centroid_loss_scale():
    g = torch.Generator().manual_seed(0)
    z, f = 20 * torch.rand(8, 64, generator=g), torch.rand(8, 64, generator=g)
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1])
    raw = centroid_loss(z, f, mask, normalize=False)
    assert raw.item() == pytest.approx(float((mask[:, None] * (z - f) ** 2).sum()))  # the code's batch sum
    unit = centroid_loss(z, f, mask, normalize=True)
    cos = torch.nn.functional.cosine_similarity(z, f, dim=1)
    assert unit.item() == pytest.approx(float((mask * (2 - 2 * cos)).sum()), rel=1e-5)
    assert unit.item() <= 4 * int(mask.sum()) < raw.item()  # bounded per sample, unlike the raw scale


def test_feddiv_initial_filter_on_raw_losses_gives_the_scaled_split():
    f0 = fd.initial_filter(np.random.default_rng(3), 1e-6)
    x = np.random.default_rng(4).gamma(1.5, 2.0, 500)  # raw CE losses, far outside [0, 1]
    scaled = fd.clean_posterior(fd.minmax(x), f0)
    raw = fd.clean_posterior(x, fd.on_loss_scale(f0, x))
    np.testing.assert_allclose(raw, scaled, atol=1e-9)
    # before the fix the [0, 1] filter met raw losses: a different split
    assert not np.array_equal(fd.clean_posterior(x, f0) >= 0.5, scaled >= 0.5)


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("switch", [False, True])
def test_fedcorr_relabels_after_an_empty_fine_tuning_stage_only_with_the_switch(tmp_path, switch):
    overrides = ["noise.rho=0.5", "noise.tau=0.5", "method.T2=0",
                 f"method.relabel_without_finetuning={str(switch).lower()}"]
    s = run_tiny(tmp_path, overrides, "fedcorr")
    assert s["status"] == "complete"
    relabeled = [r["stage2_relabeled"] for r in _rows(tmp_path) if "stage2_relabeled" in r]
    assert len(relabeled) == (1 if switch else 0)


def test_fedcorr_zeroed_losses_for_undrawn_clients_run(tmp_path):
    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5", "method.fraction_scheduling=false",
                            "method.stage1_replace=true", "method.untrained_losses=zero",
                            "method.relabel_cap=mu_hat"], "fedcorr")
    assert s["status"] == "complete" and s["rounds_run"] == s["total_rounds"]
