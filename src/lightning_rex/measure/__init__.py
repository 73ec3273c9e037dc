"""Per-rank measurement: each rank's own compute time, NVML telemetry, the memory bound."""
