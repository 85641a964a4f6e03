"""``fedlnl-export``: write the federation of a config and seed as plain files (issue 37).

    fedlnl-export out=DIR [oracle=true] <the overrides of fedlnl-run>

writes the federation fedlnl-run would train on for those overrides (the same checks first: a bad
value is one line and exit 2, nothing written) into DIR: per-client training, validation and local
test indices, the noisy labels, the setting, the federation hash and a manifest with the sha256 of
every file (format: ``fedlnl.datasets.portable``). The clean labels only with ``oracle=true``, in
their own file. ``fedlnl-run federation=DIR ...`` runs on it after checking every checksum.
"""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from fedlnl.benchmark import compose, preflight
from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.benchmark.validate import ConfigError

USAGE = "usage: fedlnl-export out=DIR [oracle=true] <fedlnl-run overrides>"


def split_argv(argv: list[str]) -> tuple[Path, bool, list[str]]:
    """(out, oracle, the overrides for the config); ConfigError for a missing or bad own key."""
    out, oracle, rest = None, False, []
    for arg in argv:
        if arg.startswith("out="):
            out = arg[4:]
        elif arg.startswith("oracle="):
            if arg[7:].lower() not in ("true", "false"):
                raise ConfigError(f"oracle={arg[7:]} is invalid: allowed true, false")
            oracle = arg[7:].lower() == "true"
        elif arg.startswith("-"):
            raise ConfigError(f"{arg} is not an option of fedlnl-export ({USAGE})")
        else:
            rest.append(arg)
    if not out:
        raise ConfigError(f"out=DIR is required ({USAGE})")
    return Path(out).expanduser(), oracle, rest


def build(overrides: list[str]):
    """(federation, the arguments it was built from, the job config) of ``fedlnl-run <overrides>``,
    after the run's own checks (ConfigError, one line)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from fedlnl.datasets.federation import build_federation

    problem = preflight.check_argv(overrides)
    if problem:
        raise ConfigError(problem)
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(preflight.CONF), version_base=None):
        cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        if job.get("federation"):
            raise ConfigError("federation= is invalid with fedlnl-export: it exports the federation a config builds")
        preflight.check_cell(job, compose.typed_keys([o for o in overrides if not o.startswith("hydra")]))
        sel = SelectionSettings.of(job.get("selection"))
        args = (job.dataset, job.partition, job.noise, job.fl.num_clients, job.seed, sel.val_share,
                sel.client_test_size)
        try:
            fed = build_federation(*args)
        except preflight.DATA_ERRORS as err:
            raise ConfigError(preflight.first_line(err)) from err
        resolved = OmegaConf.to_container(job, resolve=True)
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    return fed, args, resolved


def export(argv: list[str]) -> tuple[Path, dict, dict]:
    """Check, build and write; returns (out, manifest, federation stats)."""
    from fedlnl.datasets import portable
    from fedlnl.datasets.federation import federation_setting, federation_stats

    out, oracle, overrides = split_argv(argv)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={out} is invalid: it is a file (give a directory)")
    fed, args, _job = build(overrides)
    try:
        manifest = portable.write(fed, federation_setting(*args), overrides, out, oracle)
    except OSError as err:
        raise ConfigError(f"out={out}: {type(err).__name__}: {preflight.first_line(err)}") from err
    return out, manifest, federation_stats(fed)


def bundle(overrides: list[str], images: bool = False) -> tuple[dict, object]:
    """(arrays, federation): a config's federation as one ``.npz``'s arrays, with its oracle and, with
    ``images``, the decoded images (uint8 NCHW, the suite's sample order) and their normalisation: the
    file ``benchmarks/export_federation.py`` writes for a harness that runs and scores external code
    (``benchmarks/feddiv_official``). The arrays of ``federation.npz`` and ``oracle.npz`` under the same
    names, plus ``y_test``, ``federation_hash`` and ``config`` (the composed config as YAML)."""
    import numpy as np

    from fedlnl.datasets import portable

    fed, _args, job = build(overrides)
    arrays = {**portable.arrays_of(fed), **portable.oracle_arrays(fed.oracle), "y_test": fed.source.y_test.numpy(),
              "federation_hash": np.array(fed.hash), "config": np.array(OmegaConf.to_yaml(job))}
    if images:
        src = fed.source
        arrays.update(x_train=src.x_train.numpy(), x_test=src.x_test.numpy(), mean=np.asarray(src.mean),
                      std=np.asarray(src.std))
    return arrays, fed


def main(argv: list[str] | None = None) -> None:
    try:
        out, manifest, stats = export(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"fedlnl-export: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"fedlnl-export: {out}: federation {manifest['federation_hash']}, {len(manifest['files'])} files "
          f"({', '.join(sorted(manifest['files']))}), realised noise {stats['noise_rate']:.4f}; run on it with "
          f"fedlnl-run federation={out} <the same overrides>")


if __name__ == "__main__":
    main()
