"""lightning-rex: adaptive uneven micro-batches for PyTorch Lightning on mixed clusters.

``import lightning_rex`` registers the strategies ``"rex"``, ``"rex_spawn"`` and
``"rex_fork"`` with Lightning's ``StrategyRegistry`` (idempotently), so that
``Trainer(strategy="rex")`` works.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_rex.__about__ import __version__
from lightning_rex.core.batch_scaling import GlobalBatchScaling
from lightning_rex.core.plan import Plan, even_plan, round_fractions, validate_plan
from lightning_rex.core.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.state import StateError
from lightning_rex.data.loader import RexDataLoader
from lightning_rex.data.sampler import UnevenBatchSampler
from lightning_rex.driver.errors import RexRankError
from lightning_rex.lightning.callback import RexCallback
from lightning_rex.lightning.strategy import RexStrategy
from lightning_rex.tools.emulator import HeterogeneityEmulator

RexStrategy.register_strategies(StrategyRegistry)

__all__ = [
    "GlobalBatchScaling",
    "HeterogeneityEmulator",
    "Plan",
    "PlanSchedule",
    "RexCallback",
    "RexDataLoader",
    "RexRankError",
    "RexStrategy",
    "SizeBounds",
    "StateError",
    "UnevenBatchSampler",
    "__version__",
    "even_plan",
    "round_fractions",
    "validate_plan",
]
