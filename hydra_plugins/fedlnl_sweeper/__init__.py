"""Hydra loads sweepers only from the ``hydra_plugins`` namespace: fedlnl's sweepers, registered here
(the logic lives in ``fedlnl.benchmark.sweeper`` and ``fedlnl.benchmark.tune``)."""
from hydra.plugins.sweeper import Sweeper

from fedlnl.benchmark import sweeper as _sweeper


class ValidatingSweeper(_sweeper.ValidatingSweeper):
    """See ``fedlnl.benchmark.sweeper.ValidatingSweeper``."""


class TuningSweeper(Sweeper):
    """See ``fedlnl.benchmark.tune``; Optuna is imported only when a tune runs (``experiment=tune``)."""

    def __init__(self, **config) -> None:
        from fedlnl.benchmark.tune import TuningSweeperImpl

        config.pop("max_batch_size", None)  # the grid sweeper's key, merged under the tuning values
        self.sweeper = TuningSweeperImpl(storage=None, study_name=None, max_failure_rate=0.0, search_space=None,
                                         custom_search_space=None, **config)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments):
        return self.sweeper.sweep(arguments)
