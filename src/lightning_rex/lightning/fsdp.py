"""``RexFSDPStrategy``: fully sharded data parallel (FSDP2) with uneven per-rank micro-batches.

It is Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` with the whole
world as its data-parallel dimension (no tensor parallelism), so every parameter is sharded
across all ranks by PyTorch's FSDP2 ``fully_shard``, and REX's uneven loader, plan schedule
and weighting (:mod:`~lightning_rex.lightning.uneven`, shared with
:class:`~lightning_rex.RexStrategy`). Why FSDP2 rather than Lightning's ``FSDPStrategy``:
``FSDPStrategy`` wraps FSDP1, which PyTorch keeps for compatibility only and which refuses
a CPU device; ``fully_shard`` is the maintained path, runs on CPU with gloo (so the exact
weighting is tested on a laptop) and exposes the switches uneven accumulation needs.

FSDP2 averages gradients in its reduce-scatter as DDP's all-reduce does, so each rank's loss
carries the same factor ``N x b_r / B``. A rank whose micro-batch is above its pass cap
trains it as accumulation passes. Its collectives must stay in step with the other ranks',
which each all-gather a layer in forward, again in backward, then reduce-scatter it
(:meth:`RexFSDPStrategy.passes_unsynced`):

* the passes before the last run with gradient sync off and keep the layers unsharded, so
  only the first pass's forward all-gathers;
* the last pass reshards after its forward as usual, so its backward all-gathers and
  reduce-scatters like every other rank's.

The accumulating rank holds its layers unsharded across its passes (ZeRO-2 for that step,
on that rank); the other ranks keep full sharding.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from lightning_rex.core.checks import check_keywords
from lightning_rex.data.weighting import LossReduction
from lightning_rex.lightning.uneven import UnevenPlans

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.fabric.strategies.registry import _StrategyRegistry

__all__ = ["RexFSDPStrategy", "shard_module", "unsynced_fsdp_passes"]

ModuleTypes = type[nn.Module] | Sequence[type[nn.Module]] | None


def _types(value: ModuleTypes) -> tuple[type[nn.Module], ...]:
    if value is None:
        return ()
    if isinstance(value, type):
        return (value,)
    return tuple(value)


def shard_module(
    module: nn.Module,
    mesh: Any,
    *,
    sharded_modules: ModuleTypes = None,
    activation_checkpointing: ModuleTypes = None,
    mp_policy: Any = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply activation checkpointing and FSDP2 ``fully_shard`` to a module, layer by layer.

    Args:
        module: The module (the LightningModule, or a Fabric model).
        mesh: The 1-D data-parallel device mesh.
        sharded_modules: The layer classes that become FSDP units of their own (transformer
            blocks, say). None: every element of an ``nn.ModuleList``. Then each of the
            module's own children with parameters is sharded, with what is left in it: these
            are what a training step calls (a LightningModule's ``training_step`` does not
            go through its ``forward``).
        activation_checkpointing: Layer classes whose activations are recomputed in
            backward instead of kept (``checkpoint_wrapper``), or None.
        mp_policy: An FSDP2 ``MixedPrecisionPolicy`` (bf16 parameters and float32
            reductions, say), or None for the module's own dtype.
        reshard_after_forward: Free each layer's gathered parameters after its forward
            (ZeRO-3, the default) or keep them to backward (ZeRO-2).

    Returns:
        The module, sharded in place.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    ckpt = _types(activation_checkpointing)
    if ckpt:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        apply_activation_checkpointing(module, check_fn=lambda m: isinstance(m, ckpt))
    units = _types(sharded_modules)
    if units:
        layers = [m for m in module.modules() if isinstance(m, units) and m is not module]
    else:
        layers = [m for lst in module.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    kwargs["mp_policy"] = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    for layer in layers:
        if not isinstance(layer, FSDPModule):
            fully_shard(layer, **kwargs)
    # the module's own children are what its steps call (a LightningModule's training_step
    # does not go through its forward): each is a root, gathering what is left in it
    for child in module.children():
        container = isinstance(child, (nn.ModuleList, nn.ModuleDict))  # no forward to hook
        if not (container or isinstance(child, FSDPModule)) and any(
            True for _ in child.parameters()
        ):
            fully_shard(child, **kwargs)
    return module


def _fsdp_units(module: nn.Module) -> list[Any]:
    """The FSDP2 units in a module, in module order."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def _reshards_after_forward(unit: Any) -> bool:
    """Whether an FSDP2 unit frees its gathered parameters after forward (as it runs now).

    FSDP2 has a setter for this but no getter; the unit's parameter group holds it (its
    post-forward mesh is None when it keeps them). ``tests/lightning/test_fsdp.py`` checks
    that this still reads what ``fully_shard(reshard_after_forward=...)`` set.
    """
    return _settings(unit)[2]


def _settings(unit: Any) -> tuple[bool, bool, bool]:
    """A unit's (gradient sync, reshard after backward, reshard after forward), as set now.

    The three live in its parameter group (private to FSDP2, read here only); a unit without
    parameters of its own reads as FSDP's defaults.
    """
    group = unit._get_fsdp_state()._fsdp_param_group
    if group is None:
        return True, True, True
    return (
        bool(group.reduce_grads),
        bool(group.reshard_after_backward),
        group.post_forward_mesh_info is not None,
    )


def _contains(outer: nn.Module, m: nn.Module) -> bool:
    return any(x is m for x in outer.modules() if x is not outer)


@contextmanager
def unsynced_fsdp_passes(model: nn.Module) -> Iterator[None]:
    """Run accumulation passes before the last without a reduce-scatter, layers unsharded.

    On entry every FSDP2 unit stops syncing gradients and keeps its gathered parameters
    after forward and backward; on exit each gets back its own settings, so the last pass's
    forward reuses the gathered parameters, reshards as built, and its backward gathers and
    reduce-scatters as every other rank's does. The roots are initialised first (FSDP does
    it at their first forward, and decides then that a root keeps its parameters), so what
    is restored is what every other rank runs with. Used by :class:`RexFSDPStrategy` and
    :class:`~lightning_rex.lightning.fabric.RexLoop`.

    Args:
        model: The sharded model.

    Yields:
        Nothing.
    """
    units = _fsdp_units(model)
    for unit in units:
        if not any(_contains(other, unit) for other in units if other is not unit):
            unit._get_fsdp_state()._lazy_init()  # a root: idempotent, as its forward does
    own = [_settings(u) for u in units]
    for unit in units:
        unit.set_requires_gradient_sync(False, recurse=False)
        unit.set_reshard_after_backward(False, recurse=False)
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit, (sync, after_backward, after_forward) in zip(units, own, strict=True):
            unit.set_requires_gradient_sync(sync, recurse=False)
            unit.set_reshard_after_backward(after_backward, recurse=False)
            unit.set_reshard_after_forward(after_forward, recurse=False)


class RexFSDPStrategy(UnevenPlans, ModelParallelStrategy):
    """Fully sharded data parallel (FSDP2) with per-rank micro-batches and exact weighting.

    Registered with Lightning as ``"rex_fsdp"`` on ``import lightning_rex``. The model is
    sharded either by the LightningModule's own ``configure_model`` (calling ``fully_shard``
    with ``self.device_mesh["data_parallel"]``, as under ``ModelParallelStrategy``) or, when
    it does not, by the strategy in ``setup`` (:func:`shard_module`, with the arguments
    below). Optimizers are built after sharding, as FSDP2 requires.

    Mixed precision: ``Trainer(precision="bf16-mixed")`` (autocast) works as under
    ``ModelParallelStrategy``; ``mp_policy`` gives FSDP2's own (bf16 parameters gathered,
    float32 gradients reduced). Checkpoints: sharded (a folder, one file per rank, the
    default) or full (``save_distributed_checkpoint=False``, one file); either resumes on
    another world size, exactly once, as under ``RexStrategy``.

    Args:
        micro_batch_sizes: The initial plan; as for :class:`~lightning_rex.RexStrategy`.
        batch_fractions: Likewise.
        min_micro_batch_size: Likewise.
        max_micro_batch_size: Likewise.
        max_pass_sizes: Likewise. Accumulation passes keep FSDP's collectives in step (see
            the module's docstring).
        loss_reduction: Likewise.
        adaptive: Likewise.
        dynamic_batch: Likewise.
        sharded_modules: The layer classes that become FSDP units when the strategy shards
            (None: every element of an ``nn.ModuleList``); see :func:`shard_module`.
        activation_checkpointing: Layer classes to recompute in backward, when the strategy
            shards (None: none).
        mp_policy: An FSDP2 ``MixedPrecisionPolicy`` when the strategy shards, or None.
        reshard_after_forward: When the strategy shards: ZeRO-3 (True, the default) or
            ZeRO-2 (False).
        save_distributed_checkpoint: Sharded checkpoints (True, the default) or one full
            file assembled on rank 0 (False).
        process_group_backend: The backend (None: NCCL on CUDA, gloo on CPU).
        timeout: The process group's timeout.

    Raises:
        ValueError: For a bad configuration, naming the argument and the allowed values.
        TypeError: For a keyword it does not take, naming the closest one.
    """

    strategy_name = "rex_fsdp"

    def __init__(
        self,
        *,
        micro_batch_sizes: Sequence[int] | None = None,
        batch_fractions: Sequence[float] | None = None,
        min_micro_batch_size: int | None = None,
        max_micro_batch_size: int | None = None,
        max_pass_sizes: int | Sequence[int | None] | None = None,
        loss_reduction: LossReduction = "mean",
        adaptive: bool = True,
        dynamic_batch: bool = True,
        sharded_modules: ModuleTypes = None,
        activation_checkpointing: ModuleTypes = None,
        mp_policy: Any = None,
        reshard_after_forward: bool = True,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        check_keywords(
            "RexFSDPStrategy",
            kwargs,
            [],
            "its own arguments (see its docstring; tensor parallelism is not supported: every "
            "rank is a data-parallel rank)",
        )
        from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=default_pg_timeout if timeout is None else timeout,
            micro_batch_sizes=micro_batch_sizes,
            batch_fractions=batch_fractions,
            min_micro_batch_size=min_micro_batch_size,
            max_micro_batch_size=max_micro_batch_size,
            max_pass_sizes=max_pass_sizes,
            loss_reduction=loss_reduction,
            adaptive=adaptive,
            dynamic_batch=dynamic_batch,
        )
        self.sharded_modules = _types(sharded_modules)
        self.activation_checkpointing = _types(activation_checkpointing)
        self.mp_policy = mp_policy
        self.reshard_after_forward = bool(reshard_after_forward)

    @classmethod
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``rex_fsdp``; calling it again is a no-op.

        Args:
            strategy_registry: Lightning's ``StrategyRegistry``.
        """
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(
                cls.strategy_name,
                cls,
                description="FSDP2 with uneven per-rank micro-batches (lightning-rex)",
            )

    def setup_environment(self) -> None:
        """Set up the process group and the mesh: the whole world is data parallel."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        """Shard the model (when ``configure_model`` did not), then set up as FSDP2 does.

        Args:
            trainer: The Trainer.
        """
        from torch.distributed.fsdp import FSDPModule

        if self.world_size == 1:
            rank_zero_warn(
                "lightning-rex: RexFSDPStrategy on one device has nothing to balance (or shard)."
            )
        assert self.model is not None
        if any(isinstance(m, FSDPModule) for m in self.model.modules()):
            super().setup(trainer)
            return
        # ModelParallelStrategy.setup requires a configure_model that shards; this is its
        # sequence with the strategy's own sharding in that place
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        self.model_to_device()
        shard_module(
            self.model,
            self.device_mesh["data_parallel"],
            sharded_modules=self.sharded_modules,
            activation_checkpointing=self.activation_checkpointing,
            mp_policy=self.mp_policy,
            reshard_after_forward=self.reshard_after_forward,
        )
        self.model = self.precision_plugin.convert_module(self.model)
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    @contextmanager
    def passes_unsynced(self) -> Iterator[None]:
        """Run the passes before the last without a reduce-scatter, layers kept unsharded.

        On entry every FSDP unit stops syncing gradients and keeps its gathered parameters
        after forward and backward; on exit each gets back its own setting, so the last
        pass's forward reuses the gathered parameters, reshards, and its backward gathers
        and reduce-scatters as every other rank's does.

        Yields:
            Nothing.
        """
        assert self.model is not None
        with unsynced_fsdp_passes(self.model):
            yield
