"""The method families (torch-free, so the report can order its tables without importing a method).

Every method class names its ``family`` (a class attribute, one of ``FAMILIES``); the runner writes
it into each run's summary.json, and fedlnl-report groups its tables and figures by it in this order.
"""
from __future__ import annotations

#: the method families, in the order the report shows them
FAMILIES = ("FL baselines", "robust aggregation", "label-noise learning as local training",
            "federated label-noise methods", "centralized references")
