"""What a run will cost, counted before training (``dry_run=true``).

The planner walks the method's own schedule on the real federation: for every round the clients the
method's sampling code draws (``protocol.planned_clients``: its ``plan_clients`` hook, or its
``sample_clients`` when sampling reads no state) and for each of them the update its training code
makes (``protocol.planned_update``: optimiser steps, uploaded state dicts and payload). The sums are
the run's ``comm_cost`` (participations), ``local_steps`` and ``bytes_up`` (with the clients' validation
reports: 16 bytes a client with a validation set at each evaluation, ``benchmark/selection.py``). A figure that training
decides (clients picked by their loss or by noise estimates, samples a filter keeps) is an upper
bound and is labelled ``≤``; every other figure is exactly what the run will record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedlnl.benchmark.selection import REPORT_BYTES
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import FederationInfo, RoundContext, planned_clients, planned_update


@dataclass
class Plan:
    rounds: int
    participations: int = 0
    local_steps: int = 0
    bytes_up: int = 0
    exact: dict = field(default_factory=lambda: {"participations": True, "local_steps": True, "bytes_up": True})
    #: why a figure is a bound (one short reason per cause)
    bounds: list = field(default_factory=list)
    #: local steps of each round (``local_steps`` is their sum): what a shared prefix's rounds cost
    round_steps: list = field(default_factory=list)

    def figure(self, key: str) -> str:
        """``12,000`` or ``≤12,000``."""
        return f"{'' if self.exact[key] else '≤'}{getattr(self, key):,}"

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "participations": self.participations, "local_steps": self.local_steps,
                "bytes_up": self.bytes_up, "exact": dict(self.exact), "bounds": list(self.bounds)}


def plan_run(method, info: FederationInfo, model: torch.nn.Module, total: int, seed: int, eval_every: int = 1,
             reporters: int = 0) -> Plan:
    """The plan of ``total`` rounds of ``method`` on the federation ``info`` with ``model``, evaluated
    every ``eval_every`` rounds and at the last, where ``reporters`` clients send validation counts."""
    plan = Plan(total)
    weights = engine.payload_bytes(engine.get_weights(model))
    name = type(method).__name__
    for rnd in range(total):
        ctx = RoundContext(round=rnd, total_rounds=total, seed=seed, device=torch.device("cpu"),
                           num_clients=info.num_clients, client_sizes=info.client_sizes)
        try:
            drawn = planned_clients(method, ctx)
        except (TypeError, KeyError, AttributeError) as err:  # sample_clients read the state it was not given
            from fedlnl.benchmark.validate import ConfigError

            raise ConfigError(f"cannot plan {name}: its sample_clients needs the training state "
                              f"({type(err).__name__}: {err}); give it a plan_clients(ctx) hook "
                              "(fedlnl.methods.common.protocol)") from err
        plan.participations += drawn.count
        if not drawn.exact:
            _bound(plan, ("participations", "local_steps", "bytes_up"),
                   f"{name} picks at most {drawn.count} clients a round where training decides (from round {rnd + 1})")
        if drawn.clients is not None:
            updates = [planned_update(method, ctx, k, info, model) for k in drawn.clients]
            steps = sum(u.steps for u in updates)
            sent = sum(u.models * weights + u.payload for u in updates)
        else:  # `count` of the candidates, chosen by training: the largest figures bound the round
            among = drawn.among if drawn.among is not None else range(info.num_clients)
            updates = [planned_update(method, ctx, k, info, model) for k in among]
            steps = sum(sorted((u.steps for u in updates), reverse=True)[:drawn.count])
            sent = sum(sorted((u.models * weights + u.payload for u in updates), reverse=True)[:drawn.count])
            differ = [key for key, values in (("local_steps", {u.steps for u in updates}),
                                               ("bytes_up", {(u.models, u.payload) for u in updates}))
                      if len(values) > 1]
            if differ:
                _bound(plan, differ, f"{name} picks {drawn.count} clients by training: the largest updates "
                       f"of the candidates counted (from round {rnd + 1})")
        if not all(u.exact for u in updates):
            _bound(plan, ("local_steps",), f"{name} trains on samples that training selects "
                   f"(from round {rnd + 1})")
        plan.local_steps += steps
        plan.round_steps.append(steps)
        plan.bytes_up += sent
        if (rnd + 1) % eval_every == 0 or rnd + 1 == total:  # the runner's evaluations
            plan.bytes_up += REPORT_BYTES * reporters
    return plan


def _bound(plan: Plan, keys, reason: str) -> None:
    for key in keys:
        plan.exact[key] = False
    kind = reason.split(" (", 1)[0]
    if not any(b.split(" (", 1)[0] == kind for b in plan.bounds):  # the first round of each cause
        plan.bounds.append(reason)


def compare(plan: dict, summary: dict) -> list[str]:
    """Differences between a plan and a finished run's summary (empty: the plan held): an exact
    figure must equal the run's, a bound must not be exceeded."""
    out = []
    for key, got in (("participations", summary.get("comm_cost")), ("local_steps", summary.get("local_steps")),
                     ("bytes_up", summary.get("bytes_up"))):
        want = plan[key]
        ok = got == want if plan["exact"][key] else got is not None and got <= want
        if not ok:
            out.append(f"{key}: planned {'' if plan['exact'][key] else '≤'}{want}, ran {got}")
    if plan["rounds"] != summary.get("total_rounds"):
        out.append(f"rounds: planned {plan['rounds']}, ran {summary.get('total_rounds')}")
    return out


def describe(plan: Plan) -> str:
    """One line: rounds, participations, local steps, bytes uploaded."""
    return (f"{plan.rounds:,} rounds, {plan.figure('participations')} client participations, "
            f"{plan.figure('local_steps')} local steps, {size(plan.bytes_up, plan.exact['bytes_up'])} uploaded")


def size(n: int, exact: bool) -> str:
    mark = "" if exact else "≤"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{mark}{n / scale:,.1f} {unit} ({n:,} bytes)"
    return f"{mark}{n:,} bytes"



def plan_config(cfg, model_label: str, typed=None) -> Plan:
    """The plan of a composed config (its checks included: raises ConfigError)."""
    from fedlnl.benchmark import preflight

    method = preflight.check_cell(cfg, typed or {})
    cell = preflight.build_cell(cfg, method, model_label)
    return plan_run(method, cell.info, cell.model, cell.total, int(cfg.seed), *cell.evaluations(cfg))


def cell_names(run_dirs: list[Path]) -> tuple[list[str], Path | None]:
    """Whole cell names for the plan's table: each run dir relative to the sweep dir they share (then
    named once above the table), never cut; absolute paths where they share none."""
    parents = {Path(d).parent for d in run_dirs}
    if len(parents) != 1:
        return [str(d) for d in run_dirs], None
    root = parents.pop()
    return [Path(d).name for d in run_dirs], root
