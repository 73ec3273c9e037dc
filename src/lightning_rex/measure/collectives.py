"""Where a step waits on its peers: every ``torch.distributed`` collective, entered and left.

A collective inside a training step (``self.log(..., sync_dist=True)``, ``self.all_gather``,
a torchmetrics metric syncing on step, ``SyncBatchNorm``'s statistics, the user's own
``all_reduce``) makes a fast rank wait there until the slowest rank arrives. That wait is
not the fast rank's compute, and a timer that counts it sees every rank as slow as the
slowest. The compute timer and the emulator therefore listen here: while at least one of
them is attached, the collective functions of ``torch.distributed`` (and of
``torch.distributed.distributed_c10d``, where the object collectives call them) are wrapped,
and each call from a Python caller that looks the function up at call time (Lightning,
torchmetrics, ``torch.nn.SyncBatchNorm``, ``dist.all_reduce(...)`` in user code) tells every
listener when it was entered and when it returned. A collective called inside another one
(``all_gather_object`` runs ``all_gather``) is one collective. The wrappers are removed when
the last listener goes.

Inside a ``torch.compile`` region the wrappers are not traced: Dynamo breaks the graph at a
collective and runs it eagerly, where it is timed (a model compiled whole runs the same
collectives as before, in one more graph).

What no listener can see, and is reported instead (:meth:`CollectiveListener.collective_unseen`):
an asynchronous collective (``async_op=True``): the call returns at once and the wait is in
``work.wait()``, wherever that is.

Not seen and not reported: collectives bound before the wrappers were installed
(``from torch.distributed import all_reduce`` in a module imported earlier), functional
collectives (DTensor, ``torch.distributed._functional_collectives``) and collectives issued
from C++ (DDP's own gradient buckets, which the timer brackets separately).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

__all__ = ["COLLECTIVES", "CollectiveListener", "add_listener", "remove_listener"]

COLLECTIVES = (
    "_broadcast_coalesced",  # DDP's broadcast of the buffers (BatchNorm's) in every forward
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
)
"""The blocking collectives (and point-to-point calls) of ``torch.distributed`` that are wrapped."""


class CollectiveListener(Protocol):
    """What the wrappers tell: a collective entered and left, or one no wrapper can time."""

    def collective_entered(self) -> None:
        """A blocking collective is about to run (called before it, on the calling thread)."""

    def collective_left(self) -> None:
        """The collective returned (its wait on the peers is over)."""

    def collective_unseen(self, name: str, why: str) -> None:
        """A collective ran whose wait cannot be timed.

        Args:
            name: The ``torch.distributed`` function.
            why: Why its wait is not seen.
        """


_listeners: list[CollectiveListener] = []
_originals: dict[tuple[str, str], Callable[..., Any]] = {}
_lock = threading.Lock()
_inside = threading.local()  # depth of nested collectives on this thread


def add_listener(listener: CollectiveListener, first: bool = False) -> None:
    """Start telling ``listener`` about collectives (the wrappers go in with the first one).

    Args:
        listener: The listener; adding one already listening does nothing.
        first: Tell it before the others (the emulator must delay a collective before the
            timer marks its start, or the delay would count as a wait).
    """
    with _lock:
        if any(x is listener for x in _listeners):
            return
        if first:
            _listeners.insert(0, listener)
        else:
            _listeners.append(listener)
        if not _originals:
            _install()


def remove_listener(listener: CollectiveListener) -> None:
    """Stop telling ``listener`` (the wrappers go with the last one).

    Args:
        listener: The listener; one not listening is ignored.
    """
    with _lock:
        _listeners[:] = [x for x in _listeners if x is not listener]
        if not _listeners and _originals:
            _uninstall()


def _modules() -> list[Any]:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    return [dist, c10d]


def _install() -> None:
    if not torch.distributed.is_available():  # pragma: no cover - torch without distributed
        return
    for module in _modules():
        for name in COLLECTIVES:
            fn = getattr(module, name, None)
            if fn is None:
                continue
            _originals[(module.__name__, name)] = fn
            setattr(module, name, _wrap(name, fn))


def _uninstall() -> None:
    modules = {m.__name__: m for m in _modules()}
    for (module, name), fn in _originals.items():
        setattr(modules[module], name, fn)
    _originals.clear()


def _async_index(fn: Callable[..., Any]) -> int | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return None
    return params.index("async_op") if "async_op" in params else None


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    at = _async_index(fn)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_inside, "depth", 0)
        listeners = list(_listeners)
        if depth or not listeners:
            return fn(*args, **kwargs)
        if kwargs.get("async_op") or (at is not None and len(args) > at and args[at]):
            for listener in listeners:
                listener.collective_unseen(name, "it is asynchronous (async_op=True)")
            return fn(*args, **kwargs)
        for listener in listeners:
            listener.collective_entered()
        _inside.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.depth = 0
            for listener in listeners:
                listener.collective_left()

    timed.__wrapped_collective__ = fn  # type: ignore[attr-defined]
    # never traced into a compiled graph: a collective there would run where no wrapper sees
    # it, so Dynamo breaks the graph at it and runs it eagerly, timed
    return torch.compiler.disable(timed)
