"""Which top-level config keys change a run's numbers: the one declaration read by the config hash
(``benchmark/rundir.py``), the report's pooling of seeds (``benchmark/report/cells.py``) and the sweep
cells' directory names (``config.yaml``, ``hydra.job.config.override_dirname.exclude_keys``)."""
from __future__ import annotations

#: keys that never change a run's numbers: left out of the config hash, and runs that differ only in
#: these and the seed are pooled as seeds of one configuration by the report. ``threads`` is not one
#: of them: the CPU thread count can change float reductions, so neither a resume nor a report cell
#: mixes two thread counts.
#:
#: ``device`` and ``determinism`` are here although a GPU's numbers differ from the CPU's: the config
#: value cannot say what ran (``device=auto`` is a GPU on one machine and the CPU on another, and the
#: mode changes nothing on a CPU), so the hash would both split identical CPU runs and miss real
#: differences. What ran is the run's identity instead (``benchmark/device.py``: device kind, GPU
#: model, determinism mode, torch version), recorded in summary.json and the checkpoint: a resume and
#: ``skip_complete`` refuse a cell recorded with another device kind or mode, and the report keeps
#: device kinds in separate rows. ``data_placement`` moves the same bytes by another route (host and
#: device placement give byte-identical metrics). ``reuse_prefix`` loads rounds another run computed from
#: the same config, code and identity (``benchmark/runner.py``): the same numbers.
#: ``tuned`` names where tuned values came from; the values themselves are set in the config (and so in
#: the hash) by ``benchmark/tuning.apply``. ``tune`` is the tuning budget and sampler seed of
#: ``experiment=tune``: a trial's numbers are those of its config alone.
#: ``compile`` is not here: a compiled local step (``compute/compiled.py``) rounds differently from
#: the eager one, so compiled and eager runs are two configurations.
NON_RESULT_KEYS = ("logger", "name", "preset", "checkpoint_every", "checkpoint_minutes", "skip_complete",
                   "reuse_prefix", "dry_run", "device", "determinism", "data_placement", "tuned", "tune", "hydra")

#: result keys added after runs were already made, with the value that reproduces those runs: at that
#: value the key stays out of the config hash, so a run made before the key existed keeps its hash
#: (its sweep cell is still skipped or resumed), and any other value makes a configuration of its own.
#: A node's value is all of its keys (``rundir.is_legacy``): ``selection`` at the papers' protocol (no
#: validation set, 500-image client test sets, client figures at the reported round only). ``federation``
#: (an exported federation to run on) is a result key: without the export's ``oracle.npz`` the scorer's
#: client truth is derived from the realised noise (``datasets/portable.py``), so a detection score can
#: differ from the native run's (a client drawn noisy that received no wrong label counts as clean).
LEGACY_VALUES = {"compile": False, "federation": None,
                 "selection": {"val_share": 0, "client_test_size": 500, "client_every_eval": False}}
#: the same for a key inside a node ({(node, key): value}): at that value the key is left out of the node
#: in the config hash, before the node is compared with ``LEGACY_VALUES`` (noise=cifarn's
#: annotator_weights, added with label_set=annotators; selection.stage, added with the rule ``last``)
LEGACY_NESTED = {("noise", "annotator_weights"): None, ("selection", "stage"): "any"}
#: keys inside a node that cannot act where another key of the node has a value ({(node, key): (other,
#: value)}): left out of the node in the config hash there (``selection.stage`` without a validation set)
INERT_NESTED = {("selection", "stage"): ("val_share", 0)}

#: command-line overrides left out of a sweep cell's directory name (``${cell_dir_excluded:}``): the
#: result-neutral keys and the logger's mode; the preset selectors (the sweep directory is named after
#: the preset); the launcher's job count; a tune's budget and directories (``tune.*``: not its trials'
#: configs); and ``threads``, which the SLURM launcher sets from each allocation: a cell run again
#: with another thread count finds its own directory, whose config hash differs, and is refused with
#: the difference named rather than trained a second time beside it.
CELL_DIR_EXCLUDED = (*NON_RESULT_KEYS, "logger.mode", "experiment", "paper", "threads", "hydra.launcher.n_jobs",
                     "tune.trials", "tune.seed", "tune.root", "tune.dir")
