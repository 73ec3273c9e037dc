"""Run a function on N real gloo ranks started with the fork start method.

Every rank gets the usual launcher environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, NODE_RANK), so a ``Trainer(devices=N, strategy=...)`` built inside the function
attaches to the externally created processes exactly as under torchrun. Each rank's return
value comes back to the test; an exception on any rank fails the test with its traceback.

A rank that does not finish within the deadline fails the test too, never the whole run:
every process of that rank (its DataLoader workers included) first prints the Python stack
of each of its threads to the test's captured stderr, and is then killed with its process
group, so no orphaned worker keeps pytest's output pipe (and a CI job) open.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import time
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


def _own_group() -> None:
    """Lead a process group of this rank and the processes it forks (DataLoader workers),
    each of which prints its threads' stacks on SIGUSR1 (the handler survives the fork)."""
    os.setpgid(0, 0)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def _end_groups(procs: list[Any], dump: bool = False, grace: float = 0.0) -> None:
    """Kill every rank still running with its process group, after ``grace`` seconds to end
    (``dump``: each of their processes first prints its stacks)."""
    for p in procs:
        p.join(timeout=grace)
    if dump:
        for p in procs:
            if p.is_alive():
                for pid in _group_members(p.pid):  # one at a time: the stacks do not interleave
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        print(f"--- rank {procs.index(p)}, process {pid}:", file=sys.__stderr__)
                        os.kill(pid, signal.SIGUSR1)
                        time.sleep(0.5)
    for p in procs:
        if p.pid is not None:
            _signal_group(p.pid, signal.SIGKILL)  # the workers of a rank that ended, too
            if p.is_alive():  # (not yet its own group: forked a moment ago)
                p.kill()
        p.join(timeout=5)


def _start(procs: list[Any]) -> None:
    for p in procs:
        p.start()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(p.pid, p.pid)  # the child does it too: whichever runs first


def _group_members(pgid: int) -> list[int]:
    """The processes of a process group, the leader first (from Linux's /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:  # the fields after the name: state, ppid, pgrp
                    members.append(int(entry))
    return sorted(members, key=lambda pid: pid != pgid)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _child(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any) -> None:
    _own_group()
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
    """Run ``fn(rank, *args)`` on ``world_size`` forked ranks; return the results by rank.

    ``timeout`` bounds the whole run in seconds (below pytest-timeout's 300, so that a hang
    is reported with every rank's stacks and its processes are gone before the next test).
    """
    _collect_before_fork()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, fn, args, q), daemon=False)
        for r in range(world_size)
    ]
    _start(procs)
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    errors: list[str] = []
    hung = False
    try:
        for _ in range(world_size):
            try:
                rank, ok, out = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                hung = True
                waiting = sorted(set(range(world_size)) - set(results))
                errors.append(
                    f"ranks {waiting} did not finish within {timeout:.0f} s (a hang: the "
                    "stack of every thread of their processes is in the captured stderr)"
                )
                break
            if ok:
                results[rank] = pickle.loads(out)
            else:
                errors.append(f"rank {rank}:\n{out}")
                break
    except KeyboardInterrupt:
        _end_groups(procs)
        raise
    except BaseException:  # pytest-timeout's: the stacks of what is still running, too
        _end_groups(procs, dump=True)
        raise
    # every rank reported: 30 s to exit; then each rank's group is killed, whatever it left
    # behind included (a DataLoader worker holding pytest's output open)
    _end_groups(procs, dump=hung, grace=0.0 if hung else (5.0 if errors else 30.0))
    if errors:
        raise AssertionError("a rank failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]


def _failing_child(
    rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple, q: Any
) -> None:
    _own_group()
    _launcher_env(rank, world, port)
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
    _collect_before_fork()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_failing_child, args=(r, world_size, port, fn, args, q))
        for r in range(world_size)
    ]
    t0 = time.monotonic()
    _start(procs)
    for p in procs:
        p.join(timeout=max(0.0, deadline - (time.monotonic() - t0)))
    out: dict[int, dict[str, Any]] = {}
    for r, p in enumerate(procs):
        alive = p.is_alive()
        if alive:
            p.kill()
            p.join(5)
        out[r] = {"exitcode": None if alive else p.exitcode, "error": None, "message": ""}
    _end_groups(procs)  # what the ranks forked
    while True:
        try:
            rank, err, msg, secs = q.get(timeout=1.0)
        except queue.Empty:
            break
        out[rank].update(error=err, message=msg, seconds=secs)
    return out
