"""Run a function on N real gloo ranks started with the fork start method.

Every rank gets the usual launcher environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, NODE_RANK), so a ``Trainer(devices=N, strategy=...)`` built inside the function
attaches to the externally created processes exactly as under torchrun. Each rank's return
value comes back to the test; an exception on any rank fails the test with its traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launcher_env(rank: int, world: int, port: int) -> None:
    """The environment a launcher such as torchrun gives each rank."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        LOCAL_WORLD_SIZE=str(world),
    )


def _collect_before_fork() -> None:
    """Free unreachable objects of earlier in-process tests before forking.

    A one-device fit in this process initialises a gloo process group; after it is destroyed,
    a reference cycle can keep its Python object alive. A forked rank inherits the object but
    not gloo's threads, and when its garbage collector frees it, the destructor waits for
    those threads forever. Collecting here frees such objects while their threads exist.
    """
    import gc

    gc.collect()


def _child(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any) -> None:
    _launcher_env(rank, world, port)
    try:
        import torch

        torch.set_num_threads(1)
        out = fn(rank, *args)
        # plain pickle: torch's ForkingPickler would share tensors through file descriptors
        # that die with this process
        q.put((rank, True, pickle.dumps(out)))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_distributed(
    fn: Callable[..., Any], *args: Any, world_size: int = 2, timeout: float = 240
) -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world_size`` forked ranks; return the results by rank."""
    _collect_before_fork()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, fn, args, q), daemon=False)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, out = q.get(timeout=timeout)
            if ok:
                results[rank] = pickle.loads(out)
            else:
                errors.append(f"rank {rank}:\n{out}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 30)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("a rank failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]


def _failing_child(
    rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any
) -> None:
    _launcher_env(rank, world, port)
    import time

    t0 = time.monotonic()
    code = 0
    try:
        import torch

        torch.set_num_threads(1)
        fn(rank, *args)
        q.put((rank, None, "", time.monotonic() - t0))
    except BaseException as err:
        q.put((rank, type(err).__name__, str(err), time.monotonic() - t0))
        code = 1
    q.close()
    q.join_thread()  # flush the report before leaving
    os._exit(code)  # no teardown: a failing rank leaves as a crashed process would


def run_expecting_failure(
    fn: Callable[..., Any], *args: Any, world_size: int = 2, deadline: float = 60.0
) -> dict[int, dict[str, Any]]:
    """Run ``fn(rank, *args)`` on forked ranks; report how and how fast each one ended.

    Returns per rank ``{"exitcode", "error" (type name or None), "message", "seconds"}``; a
    rank still alive after ``deadline`` seconds is killed and reported with exitcode None.
    """
    import time

    _collect_before_fork()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_failing_child, args=(r, world_size, port, fn, args, q))
        for r in range(world_size)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=max(0.0, deadline - (time.monotonic() - t0)))
    out: dict[int, dict[str, Any]] = {}
    for r, p in enumerate(procs):
        alive = p.is_alive()
        if alive:
            p.kill()
            p.join(5)
        out[r] = {"exitcode": None if alive else p.exitcode, "error": None, "message": ""}
    import queue

    while True:
        try:
            rank, err, msg, secs = q.get(timeout=1.0)
        except queue.Empty:
            break
        out[rank].update(error=err, message=msg, seconds=secs)
    return out
