"""OmegaConf resolvers used by the YAML files; imported before Hydra composes a config."""
from __future__ import annotations

from omegaconf import OmegaConf

FIDELITIES = ("paper", "reference")


def _fidelity(paper_value, reference_value, *, _root_):
    """``${fidelity:<paper>,<reference>}``: the value for the run's top-level ``fidelity``."""
    mode = _root_.get("fidelity", "paper")
    if mode not in FIDELITIES:
        raise ValueError(f"fidelity: got {mode!r}, allowed: {', '.join(FIDELITIES)}")
    return paper_value if mode == "paper" else reference_value


def register() -> None:
    if not OmegaConf.has_resolver("fidelity"):
        OmegaConf.register_new_resolver("fidelity", _fidelity)


register()
