"""REX in a custom Fabric loop: ``strategy="rex"`` or ``"rex_fsdp"``, and :class:`RexLoop`.

Fabric runs the user's own loop, so REX gives it a small API instead of hooks:

.. code-block:: python

    fabric = L.Fabric(strategy="rex", devices=2)
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    rex = RexLoop(fabric, model)
    loader = rex.setup_dataloader(DataLoader(dataset, batch_size=16, shuffle=True))
    for batch in loader:
        for part in rex.passes(batch):  # one, or accumulation passes where memory binds
            fabric.backward(rex.scale(loss_fn(model, part)))
        optimizer.step()
        optimizer.zero_grad()
        rex.step()  # the step's compute time to the window driver; plans change here

:meth:`RexLoop.setup_dataloader` splits ``batch_size x world_size`` unevenly, exactly once
across plan changes, like ``RexStrategy``'s loader (it is the same loader).
:meth:`RexLoop.passes` times the rank's compute and pauses gradient sync on all passes but
the last; :meth:`RexLoop.scale` is the exact weighting (``N x s / B`` for a pass of ``s``
samples of a mean loss); :meth:`RexLoop.step` feeds the window driver, the same one
``RexCallback`` drives, with the same settings (``RexLoop(fabric, model, window=...)``
takes :class:`~lightning_rex.RexCallback`'s arguments).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning.fabric.strategies import DDPStrategy as FabricDDP
from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from lightning_rex.core import build
from lightning_rex.core.passes import passes as pass_sizes
from lightning_rex.core.plans.plan import Plan, even_plan
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.data.loader import RexDataLoader, build_rex_loader
from lightning_rex.data.weighting import LossReduction, pass_loss_scale
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.protocols import Decider
from lightning_rex.driver.records import DecisionLog, decision_line
from lightning_rex.lightning.callback import RexCallback
from lightning_rex.lightning.collectives import driver_collectives
from lightning_rex.lightning.fsdp import shard_module, unsynced_fsdp_passes
from lightning_rex.lightning.passes import mark_batch_dynamic, split_batch
from lightning_rex.lightning.plan_target import TrainSampler
from lightning_rex.measure.telemetry import device_key
from lightning_rex.measure.timing import ComputeTimer

__all__ = ["RexFabricDDP", "RexFabricFSDP", "RexLoop", "register_fabric_strategies"]


class RexFabricDDP(FabricDDP):
    """Fabric's DDP under the name ``"rex"``, with its arguments: :class:`RexLoop` does the rest."""


class RexFabricFSDP(FabricModelParallel):
    """Fabric's FSDP2 (``ModelParallelStrategy``, all ranks data parallel) as ``"rex_fsdp"``.

    ``fabric.setup(model, optimizer)`` shards the model with
    :func:`~lightning_rex.lightning.fsdp.shard_module` (``setup_module`` first, then the
    optimizer over the sharded parameters, as FSDP2 needs).

    Args:
        sharded_modules: The layer classes that become FSDP units (see :func:`shard_module`).
        activation_checkpointing: Layer classes to recompute in backward, or None.
        mp_policy: An FSDP2 ``MixedPrecisionPolicy``, or None.
        reshard_after_forward: ZeRO-3 (True) or ZeRO-2 (False).
        **kwargs: Fabric ``ModelParallelStrategy``'s other arguments
            (``save_distributed_checkpoint``, ``process_group_backend``, ``timeout``).
    """

    def __init__(
        self,
        sharded_modules: Any = None,
        activation_checkpointing: Any = None,
        mp_policy: Any = None,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        def parallelize(module: nn.Module, mesh: Any) -> nn.Module:
            return shard_module(
                module,
                mesh["data_parallel"],
                sharded_modules=sharded_modules,
                activation_checkpointing=activation_checkpointing,
                mp_policy=mp_policy,
                reshard_after_forward=reshard_after_forward,
            )

        super().__init__(parallelize, tensor_parallel_size=1, **kwargs)

    def setup_environment(self) -> None:
        """The whole world is data parallel."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def register_fabric_strategies(registry: Any) -> None:
    """Register ``"rex"`` and ``"rex_fsdp"`` with Fabric's strategy registry (idempotent).

    Args:
        registry: ``lightning.fabric.strategies.STRATEGY_REGISTRY``.
    """
    if "rex" not in registry:
        registry.register(
            "rex",
            RexFabricDDP,
            description="DDP for a RexLoop (lightning-rex)",
            start_method="popen",
        )
    if "rex_fsdp" not in registry:
        registry.register(
            "rex_fsdp", RexFabricFSDP, description="FSDP2 for a RexLoop (lightning-rex)"
        )


class RexLoop:
    """REX for a Fabric loop: the uneven loader, the weighting, and one call per step.

    Args:
        fabric: The launched Fabric.
        model: The model as ``fabric.setup`` returned it (its gradients are timed, and its
            sync is paused between accumulation passes).
        micro_batch_sizes: The initial plan (None: even).
        min_micro_batch_size: The smallest micro-batch a plan may give a rank.
        max_micro_batch_size: The largest (None: no bound).
        max_pass_sizes: Each rank's largest micro-batch in one pass (an int for all, one
            entry per rank, or None); more runs as accumulation passes.
        loss_reduction: ``"mean"`` (the default) or ``"sum"``: what the loss is over a pass.
        adaptive: Change the plan at run time (the default), or only monitor.
        dynamic_batch: Mark each pass's batch dimension dynamic for ``torch.compile`` (the
            default), so a plan change does not recompile per size.
        emulator: A :class:`~lightning_rex.HeterogeneityEmulator` to drive (tests, demos).
        **callback_args: :class:`~lightning_rex.RexCallback`'s arguments (``window``,
            ``settings``, ``verbose``, ``log_dir``, ...), the same configuration.
    """

    def __init__(
        self,
        fabric: Any,
        model: nn.Module,
        *,
        micro_batch_sizes: Sequence[int] | None = None,
        min_micro_batch_size: int = 1,
        max_micro_batch_size: int | None = None,
        max_pass_sizes: int | Sequence[int | None] | None = None,
        loss_reduction: LossReduction = "mean",
        adaptive: bool = True,
        dynamic_batch: bool = True,
        emulator: Any = None,
        **callback_args: Any,
    ) -> None:
        self.fabric, self.model = fabric, model
        self.rank, self.world_size = int(fabric.global_rank), int(fabric.world_size)
        self.options = RexCallback(**callback_args).options()
        self.bounds = SizeBounds(int(min_micro_batch_size), max_micro_batch_size)
        self.micro_batch_sizes = None if micro_batch_sizes is None else tuple(micro_batch_sizes)
        caps = max_pass_sizes
        self.pass_cap = caps if caps is None or isinstance(caps, int) else caps[self.rank]
        self.loss_reduction: LossReduction = loss_reduction
        self.adaptive = bool(adaptive)
        self.dynamic_batch = bool(dynamic_batch)
        self.emulator = emulator
        self.steps = 0
        self.loader: RexDataLoader | None = None
        self.driver: WindowDriver | None = None
        self.timer = ComputeTimer(fabric.device)
        self._sizes: Plan | None = None
        self._pass: int | None = None
        self._log: DecisionLog | None = None
        self._injected_s = 0.0
        self._in_epoch = 0  # batches of the current epoch already stepped
        self._epoch = 0  # the epoch the next iteration over the loader trains

    # ------------------------------------------------------------------ data
    def setup_dataloader(self, dataloader: DataLoader, state: dict[str, Any] | None = None) -> Any:
        """The uneven train loader for a map-style ``DataLoader`` with a per-rank ``batch_size``.

        Args:
            dataloader: The user's loader (``shuffle=True`` or not; no custom sampler).
            state: What :meth:`state_dict` returned at a checkpoint, to resume from (every
                rank the same): the loader continues with the first sample not yet trained,
                on this run's world size too, and the window driver with its state.

        Returns:
            The loader, on the device: it splits ``batch_size x world_size`` by the plan,
            one epoch per iteration over it.
        """
        shuffle = isinstance(dataloader.sampler, RandomSampler)
        from lightning.fabric.utilities.data import _update_dataloader

        sampler: DistributedSampler[Any] = DistributedSampler(
            dataloader.dataset,
            num_replicas=self.world_size,
            rank=self.rank,
            shuffle=shuffle,
        )
        plain = _update_dataloader(dataloader, sampler)
        self.loader = build_rex_loader(
            plain,
            world_size=self.world_size,
            rank=self.rank,
            plan_for=self._initial_plan,
            step_source=lambda: self.steps,
            bounds=self.bounds,
        )
        if state is not None:
            self.loader.load_state_dict(state["loader"])
            self.steps = int(state["steps"])
            self._in_epoch = int(state["loader"]["rex_sampler"]["consumed"])
            self._epoch = int(state["loader"]["rex_sampler"]["epoch"])
        target = TrainSampler(lambda: self.loader, lambda: None)
        self._start(target, None if state is None else state["driver"])
        return _Epochs(self)

    def state_dict(self) -> dict[str, Any]:
        """The loop's state for a checkpoint: every rank calls it (it gathers the window).

        Returns:
            The step count, the loader's position and plan schedule, the driver's state
            (JSON-able; save it with ``fabric.save`` beside the model's).
        """
        if self.loader is None or self.driver is None:
            raise RuntimeError("state_dict needs the train loader: call setup_dataloader first")
        return {
            "steps": self.steps,
            "loader": self.loader.state_dict(),
            "driver": self.driver.state_dict(),
        }

    def _initial_plan(self, global_batch: int) -> Plan:
        if self.micro_batch_sizes is not None:
            return self.bounds.check(self.micro_batch_sizes, global_batch, "micro_batch_sizes")
        return self.bounds.check(even_plan(global_batch, self.world_size), global_batch)

    def _start(self, target: TrainSampler, loaded: dict[str, Any] | None) -> None:
        options = self.options
        device = self.fabric.device
        self.driver = WindowDriver(
            replace(options.loop, apply_plans=self.adaptive),
            driver_collectives(device),
            target,
            self._decider,
            resolve=self.timer.window_row,
            caps=lambda: [self.pass_cap],
            on_record=self._write,
            clock=time.perf_counter if options.step_time_fn is None else (lambda: self._injected_s),
        )
        if self.emulator is not None:  # first: its backward hooks run before the timer's
            self.emulator.attach(self.model, self.rank, self.world_size, device)
        self.timer.attach_to(self.model)
        self.driver.start(self.steps, [device_key(device, None)], loaded, options.prior)

    def _decider(self, plan: Plan, bounds: SizeBounds) -> Decider:
        keys = list(self.driver.device_keys) if self.driver is not None else []
        devices = [str(k) for k in keys] if len(keys) == len(plan) else None
        schedule = self.plan_schedule
        return build.build_decider(
            self.options.settings, plan, schedule.global_batch, bounds, devices
        )

    @property
    def plan_schedule(self) -> Any:
        """The run's plan schedule (the sampler's)."""
        if self.loader is None:
            raise RuntimeError("call setup_dataloader first")
        return self.loader.batch_sampler.plan_schedule

    @property
    def plan(self) -> Plan:
        """The plan of the next step."""
        return self.plan_schedule.plan_at(self.steps)

    # ------------------------------------------------------------------ per step
    def passes(self, batch: Any) -> Iterator[Any]:
        """This rank's batch as its passes, with its compute timed and sync paused between.

        Args:
            batch: The batch the loader gave this rank.

        Yields:
            Each pass's batch (the batch itself when it fits in one); run forward and
            ``fabric.backward(rex.scale(loss))`` on each.
        """
        assert self.loader is not None
        sizes = self.loader.batch_sampler.sizes_for_batch(self._batch_index())
        self._sizes = sizes
        mine = sizes[self.rank]
        parts = pass_sizes(mine, self.pass_cap)
        chunks = [batch] if len(parts) == 1 else split_batch(batch, parts)
        if self.dynamic_batch:
            for size, chunk in zip(parts, chunks, strict=True):
                mark_batch_dynamic(chunk, size)
        if self.emulator is not None:
            self.emulator.step_start(self.rank, self.steps)
        self.timer.start()
        for index, (size, chunk) in enumerate(zip(parts, chunks, strict=True)):
            self._pass = size
            last = index == len(parts) - 1
            with contextlib.nullcontext() if last else self._unsynced():
                yield chunk
        if self.emulator is not None:
            self.emulator.step_end()
        self.timer.stop()

    def _batch_index(self) -> int:
        return self._in_epoch

    def _unsynced(self) -> Any:
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in self.model.modules()):
            return unsynced_fsdp_passes(self.model)
        return self.fabric.no_backward_sync(self.model, enabled=True)

    def scale(self, loss: Tensor) -> Tensor:
        """The pass's loss times its exact weight (``N x s / B`` for a mean loss).

        Args:
            loss: The loss of the pass :meth:`passes` yielded last.

        Returns:
            The scaled loss, for ``fabric.backward``.
        """
        if self._sizes is None or self._pass is None:
            raise RuntimeError("scale(loss) is for the passes of rex.passes(batch)")
        return loss * pass_loss_scale(self._sizes, self.rank, self._pass, self.loss_reduction)

    def step(self) -> None:
        """The step is done (after ``optimizer.step()``): feed the driver; plans change here."""
        assert self.driver is not None and self._sizes is not None
        sample: Any = self.timer.take_step()
        step_time_fn = self.options.step_time_fn
        if step_time_fn is not None:
            sample = float(step_time_fn(self.rank, self.steps, self._sizes[self.rank]))
            self._injected_s += sample
        comparable = tuple(self._sizes) == tuple(self.plan_schedule.plan_at(self.steps))
        self.driver.record(self.steps, [sample], comparable)
        self.steps += 1
        self._in_epoch += 1
        self._sizes = self._pass = None

    def finish(self) -> None:
        """End of training (every rank): agree that no rank failed, stop the decider."""
        if self.driver is not None:
            try:
                self.driver.finish()
            finally:
                self.driver.close()
                self.timer.detach()
                if self.emulator is not None:
                    self.emulator.remove()

    @property
    def records(self) -> list[dict[str, Any]]:
        """The window records (rank 0)."""
        return [] if self.driver is None else self.driver.records

    def _write(self, record: dict[str, Any]) -> None:
        if self._log is None and self.options.log_dir is not None:
            assert self.driver is not None
            self._log = DecisionLog(Path(self.options.log_dir), self.driver.run_id)
        if self._log is not None:
            self._log.write(record)
        line = decision_line(record) if self.options.verbose else None
        if line is not None:
            from lightning_rex.lightning.session import DECISIONS

            DECISIONS.info(line)


class _Epochs:
    """The loop's loader: each iteration one epoch, its batches moved to the device.

    The epoch is the loop's own (Fabric's loader would count iterations from 0, which a
    resumed run must not).
    """

    def __init__(self, loop: RexLoop) -> None:
        self.loop = loop

    def __len__(self) -> int:
        assert self.loop.loader is not None
        return len(self.loop.loader)

    def __iter__(self) -> Iterator[Any]:
        loop = self.loop
        assert loop.loader is not None
        loader = loop.loader
        if loader.batch_sampler.epoch != loop._epoch:
            loader.batch_sampler.set_epoch(loop._epoch)
        for batch in loader:
            yield loop.fabric.to_device(batch)
        loop._epoch += 1
        loop._in_epoch = 0
