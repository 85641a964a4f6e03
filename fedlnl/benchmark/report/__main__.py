"""``python -m fedlnl.benchmark.report DIR``: the same as ``fedlnl-report DIR``."""
from fedlnl.benchmark.report.cli import main

raise SystemExit(main())
