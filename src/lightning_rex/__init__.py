"""lightning-rex: adaptive uneven micro-batches for PyTorch Lightning on mixed clusters.

``import lightning_rex`` registers the strategies ``"rex"``, ``"rex_spawn"``, ``"rex_fork"``
and ``"rex_fsdp"`` with Lightning's ``StrategyRegistry``, and ``"rex"`` and ``"rex_fsdp"``
with Fabric's (idempotently), so that
``Trainer(strategy="rex")`` works: at once when Lightning is already imported, otherwise as
soon as it is (:mod:`lightning_rex.lightning.registration`). The Lightning classes
(:class:`RexStrategy`, :class:`RexCallback`, the loader, the sampler, the emulator) are
imported on first use, so that ``lightning_rex.core``, ``.driver`` and ``.sim`` import
without Lightning or ``torch.distributed``.
"""

from typing import TYPE_CHECKING

from lightning_rex.__about__ import __version__
from lightning_rex.core.lazy import lazy_attributes
from lightning_rex.core.plans.plan import Plan, even_plan, round_fractions, validate_plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.saved import StateError
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.driver.errors import RexRankError
from lightning_rex.lightning.registration import register_when_lightning_loads

if TYPE_CHECKING:
    from lightning_rex.data.loader import RexDataLoader
    from lightning_rex.data.sampler import UnevenBatchSampler
    from lightning_rex.lightning.callback import RexCallback
    from lightning_rex.lightning.fabric import RexLoop
    from lightning_rex.lightning.fsdp import RexFSDPStrategy
    from lightning_rex.lightning.strategy import RexStrategy
    from lightning_rex.tools.emulator import HeterogeneityEmulator

_LAZY = {
    "HeterogeneityEmulator": "lightning_rex.tools.emulator",
    "RexCallback": "lightning_rex.lightning.callback",
    "RexDataLoader": "lightning_rex.data.loader",
    "RexFSDPStrategy": "lightning_rex.lightning.fsdp",
    "RexLoop": "lightning_rex.lightning.fabric",
    "RexStrategy": "lightning_rex.lightning.strategy",
    "UnevenBatchSampler": "lightning_rex.data.sampler",
}

__all__ = [
    "GlobalBatchScaling",
    "HeterogeneityEmulator",
    "Plan",
    "PlanSchedule",
    "RexCallback",
    "RexDataLoader",
    "RexFSDPStrategy",
    "RexLoop",
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


# the Lightning classes of the public API import on first use
__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

register_when_lightning_loads()
