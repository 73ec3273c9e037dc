"""NVML telemetry and the memory bound: inert on CPU, headroom and growth on CUDA."""

from __future__ import annotations

import pytest
import torch

from lightning_rex.measure.telemetry import GpuTelemetry, MemoryBound, throttled


def test_telemetry_and_memory_bound_on_cpu_are_inert() -> None:
    cpu = torch.device("cpu")
    tel = GpuTelemetry(cpu)
    assert not tel.available and tel.sample() is None and tel.identity() is None
    mem = MemoryBound(cpu, max_micro_batch_size=None)
    mem.step_start()
    mem.step_end(24)
    assert mem.cap(24) is None
    assert MemoryBound(cpu, max_micro_batch_size=40).cap(24) == 40


def test_memory_bound_on_cuda_uses_headroom_cache_and_growth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dev = torch.device("cuda", 0)
    stats = {"alloc": 1000, "peak": 1000 + 24 * 100, "reserved": 5000, "free": 20_000}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: stats["alloc"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: stats["peak"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: stats["reserved"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (stats["free"], 10**9))
    mem = MemoryBound(dev, max_micro_batch_size=None, max_growth=2.0, safety=1.0)
    mem.step_start()
    mem.step_end(24)
    assert mem.per_sample_bytes == 100
    # headroom = free + (reserved - allocated) = 20000 + 4000 -> 240 samples; growth caps at 48
    assert mem.cap(24) == 48
    mem.largest_run = 200
    assert mem.cap(24) == 240
    assert MemoryBound(dev, max_micro_batch_size=30).cap(24) == 30


def test_throttle_reasons() -> None:
    assert throttled({"throttle_reasons": ["hw_thermal_slowdown"]})
    assert not throttled({"throttle_reasons": ["gpu_idle"]})
    assert not throttled(None)
