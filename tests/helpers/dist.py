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


def _child(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        LOCAL_WORLD_SIZE=str(world),
    )
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
