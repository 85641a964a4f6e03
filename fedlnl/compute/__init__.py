"""What the runner owns of the computation: where the images live and how a batch is made
(``data``, ``placement``), the compiled local step (``compiled``) and the scores of a model on
held-out data (``evaluation``). The methods train through ``fedlnl/methods/common/engine.py``, which
builds on this package; nothing here imports a method."""
