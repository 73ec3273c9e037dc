"""Per-rank GPU telemetry (NVML) and the memory bound on a rank's micro-batch.

* :class:`GpuTelemetry` reads device identity, utilisation, clocks, temperature, power and
  the clock-event (throttle) reasons through nvidia-ml-py (imported as ``pynvml``). Thermal
  or power throttling is a real cause of stragglers; :func:`throttled` says whether a sample
  shows it. Without a CUDA device or without NVML it returns None and never raises.
* :class:`MemoryBound` turns CUDA memory statistics into an upper bound on a rank's
  micro-batch: the headroom (``torch.cuda.mem_get_info`` free memory plus what PyTorch's cache
  holds, reserved minus allocated) divided by the observed memory per sample (the step's peak
  allocation above its baseline, per sample), never above the user's
  ``max_micro_batch_size``, and growing by at most ``max_growth`` times the largest size the
  rank has already run until that headroom is confirmed. On CPU only the user bound applies.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

__all__ = ["THROTTLE_REASONS", "GpuTelemetry", "MemoryBound", "device_key", "throttled"]

# nvmlClocksEventReason* bit masks (formerly nvmlClocksThrottleReason*)
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_SLOWING = {
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}


def throttled(sample: dict[str, Any] | None) -> bool:
    """Whether a telemetry sample shows power or thermal throttling.

    Args:
        sample: A dictionary from :meth:`GpuTelemetry.sample`, or None.

    Returns:
        True when any power/thermal/hardware slowdown reason is active.
    """
    return bool(sample) and bool(_SLOWING & set(sample.get("throttle_reasons", ())))  # type: ignore[union-attr]


class GpuTelemetry:
    """NVML readings for one CUDA device; inert on CPU or without NVML.

    Args:
        device: The rank's device.
    """

    def __init__(self, device: torch.device) -> None:
        self.available = False
        self._nvml: Any = None
        self._handle: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            try:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self._nvml = pynvml
            self.available = True
        except Exception:
            self.available = False

    def identity(self) -> dict[str, str] | None:
        """The device's name and UUID, or None without NVML.

        Returns:
            ``{"name": ..., "uuid": ...}``.
        """
        if not self.available:
            return None
        nvml = self._nvml
        name = nvml.nvmlDeviceGetName(self._handle)
        uuid = nvml.nvmlDeviceGetUUID(self._handle)
        return {"name": _text(name), "uuid": _text(uuid)}

    def sample(self) -> dict[str, Any] | None:
        """Read utilisation, clocks, temperature, power and throttle reasons.

        Returns:
            A JSON-able dictionary, or None without NVML. Readings a device does not support
            are left out.
        """
        if not self.available:
            return None
        nvml, handle = self._nvml, self._handle
        out: dict[str, Any] = dict(self.identity() or {})
        readers = {
            "util_gpu_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(
                handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        }
        for key, read in readers.items():
            with contextlib.suppress(Exception):  # a reading this device does not support
                out[key] = read()
        reasons = None
        for getter in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if hasattr(nvml, getter):
                try:
                    reasons = int(getattr(nvml, getter)(handle))
                    break
                except Exception:
                    continue
        if reasons is not None:
            out["throttle_reasons"] = [n for bit, n in THROTTLE_REASONS.items() if reasons & bit]
            out["throttled"] = throttled(out)
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MemoryBound:
    """Track memory per sample on a CUDA rank and bound its next micro-batch.

    Args:
        device: The rank's device.
        max_micro_batch_size: The user's cap, or None.
        max_growth: The factor by which a rank's size may grow beyond the largest size it
            has run, until that headroom is confirmed by running it (> 1).
        safety: The fraction of the measured headroom that may be used.
    """

    def __init__(
        self,
        device: torch.device,
        max_micro_batch_size: int | None = None,
        max_growth: float = 2.0,
        safety: float = 0.9,
    ) -> None:
        self.device = device
        self.user_cap = max_micro_batch_size
        self.max_growth = max_growth
        self.safety = safety
        self.cuda = device.type == "cuda"
        self.per_sample_bytes: float | None = None
        self.largest_run = 0
        self._baseline = 0

    def step_start(self) -> None:
        """Reset the peak statistics before a step (CUDA only)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)

    def step_end(self, micro_batch: int) -> None:
        """Record the step's memory per sample (CUDA) and the size that ran.

        Args:
            micro_batch: This rank's micro-batch size in the step.
        """
        self.largest_run = max(self.largest_run, micro_batch)
        if self.cuda and micro_batch > 0:
            peak = torch.cuda.max_memory_allocated(self.device)
            per = max(peak - self._baseline, 1) / micro_batch
            self.per_sample_bytes = (
                per if self.per_sample_bytes is None else max(self.per_sample_bytes, per)
            )

    def cap(self, current: int) -> int | None:
        """The largest micro-batch this rank may get next.

        Args:
            current: The rank's current micro-batch size.

        Returns:
            The bound, or None when nothing bounds it (CPU without a user cap).
        """
        caps: list[int] = []
        if self.user_cap is not None:
            caps.append(int(self.user_cap))
        if self.cuda:
            if self.largest_run > 0:
                caps.append(max(current, math.ceil(self.largest_run * self.max_growth)))
            if self.per_sample_bytes:
                free, _ = torch.cuda.mem_get_info(self.device)
                cached = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(
                    self.device
                )
                headroom = self.safety * (free + max(cached, 0))
                # measured between steps: the step's activations are back in the cache
                caps.append(max(1, int(headroom // self.per_sample_bytes)))
        return min(caps) if caps else None


def device_key(device: torch.device, telemetry: GpuTelemetry | None) -> str:
    """A rank's device identity, to key measured rates: the GPU's name, or the device type.

    Args:
        device: The rank's device.
        telemetry: Its NVML telemetry, if any.

    Returns:
        For example ``"NVIDIA A100-SXM4-80GB"`` or ``"cpu"``.
    """
    ident = telemetry.identity() if telemetry is not None else None
    if ident is not None:
        return str(ident["name"])
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return device.type
