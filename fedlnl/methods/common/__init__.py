"""The shared method kit: the plugin contract (protocol), local-training mechanics (engine), label-noise
tools (lnl), the semi-supervised pieces of DivideMix (semisup), two networks trained jointly (pair) and
per-sample prediction histories (history). Plain functions, no base class."""
