"""The figure jobs: each one's commands, and how its output becomes markdown fragments.

A renderer takes a job's saved data (``{"date", "machine", "commands": {key: {"command",
"seconds", "load", "result"}}}``) and returns ``{fragment name: markdown}``. Numbers are
formatted in one place (:mod:`common`), so the pages quote exactly these strings
(``tests/test_figures.py``). The real runs (demo, bench, examples) run with
``OMP_NUM_THREADS=1``; ``load`` runs a command beside busy loops, other CPU-heavy processes
on the same cores.
"""

from __future__ import annotations

from common import Command, Job, _example, _rex
from loop_jobs import FABRIC_CMDS, MEMORY_CMDS, render_fabric, render_memory
from model_code_jobs import MODEL_CODE_CMDS, render_model_code
from real_jobs import (
    BATCH_EXAMPLE,
    BENCH_CMDS,
    DEMO,
    EMULATION,
    EXAMPLE_CMDS,
    render_batch_example,
    render_bench,
    render_defaults,
    render_demo,
    render_emulation,
    render_examples,
    render_validation,
)
from reliability_jobs import RELIABILITY_CMDS, render_reliability
from sim_jobs import (
    GNS_LONG_CMDS,
    SIM4096_CMDS,
    TARGET_CMDS,
    _gns_cmds,
    _help_cmds,
    _peer_cmds,
    _readme_cmds,
    render_4096,
    render_gns,
    render_gns_long,
    render_sim_help,
    render_sim_peers,
    render_sim_readme,
    render_targets,
)

__all__ = ["JOBS", "Command", "Job"]

JOBS = {
    job.name: job
    for job in (
        Job("defaults", {}, render_defaults),
        Job("sim-readme", _readme_cmds(), render_sim_readme),
        Job("sim-help", _help_cmds(), render_sim_help),
        Job("sim-peers", _peer_cmds(), render_sim_peers),
        Job("sim-targets", TARGET_CMDS, render_targets),
        Job("sim-4096", SIM4096_CMDS, render_4096),
        Job("sim-memory", MEMORY_CMDS, render_memory),
        Job("fabric", FABRIC_CMDS, render_fabric),
        Job("gns", _gns_cmds(), render_gns),
        Job("gns-long", GNS_LONG_CMDS, render_gns_long),
        Job(
            "emulation",
            {
                "idle-1": _rex(*EMULATION),
                "idle-2": _rex(*EMULATION, "--headroom", "2"),
                "busy-1": _rex(*EMULATION, load=2),
                "busy-2": _rex(*EMULATION, "--headroom", "2", load=2),
            },
            render_emulation,
        ),
        Job("bench", BENCH_CMDS, render_bench),
        Job("model-code", MODEL_CODE_CMDS, render_model_code),
        Job("reliability", RELIABILITY_CMDS, render_reliability),
        Job(
            "demo",
            {
                "idle": _example(*DEMO, output="file"),
                "busy": _example(*DEMO, output="file", load=1),
            },
            render_demo,
        ),
        Job("batch-example", BATCH_EXAMPLE, render_batch_example),
        Job("examples", EXAMPLE_CMDS, render_examples),
        Job(
            "controller",
            {"rates": Command(("{python}", "{root}/docs/figures/validation_rates.py"))},
            render_validation,
        ),
    )
}
