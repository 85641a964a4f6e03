"""benchmarks/export_federation.py writes the federation a run trains on, so external code (an official
repository run beside the suite) sees exactly the same partition and noisy labels."""
from __future__ import annotations

import importlib.util
import json

import numpy as np

from conftest import REPO, run_tiny

spec = importlib.util.spec_from_file_location("export_federation", REPO / "benchmarks" / "export_federation.py")
export_federation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(export_federation)


def test_exported_federation_is_the_one_the_run_trains_on(tmp_path):
    over = ["noise.rho_tau=[0.6,0.5]", "seed=3"]
    summary = run_tiny(tmp_path / "run", over)
    out = tmp_path / "fed.npz"
    info = export_federation.export(["debug=tiny", *over], out, images=True)
    z = np.load(out)
    assert str(z["federation_hash"]) == info["hash"] == summary["federation_hash"]
    offsets, idx = z["client_offsets"], z["client_indices"]
    val = z["val_indices"]  # the clients' validation samples (selection.val_share): every sample is in one set
    assert offsets[0] == 0 and offsets[-1] == len(idx) and z["val_offsets"][-1] == len(val) > 0
    assert len(idx) + len(val) == len(np.unique(np.concatenate([idx, val]))) == len(z["labels"])
    noisy = z["labels"] != z["clean_labels"]
    assert noisy.any() and info["noise_rate"] == noisy.mean()
    for k in np.flatnonzero(~z["noisy_client"]):  # a clean client's labels are all clean
        assert not noisy[idx[offsets[k]:offsets[k + 1]]].any()
    assert z["x_train"].shape[0] == len(z["labels"]) and z["x_test"].shape[0] == len(z["y_test"])
    meta = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert meta["federation_hash"] == info["hash"]
