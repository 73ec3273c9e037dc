"""Two "nodes" on this machine through the stock launcher: torchrun --nnodes 2 on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.dist import free_port

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]


def test_torchrun_two_nodes_train_with_an_uneven_plan(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                str(ROOT / "tests" / "helpers" / "multinode_script.py"),
                str(tmp_path),
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    recs = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert recs[0]["node_rank"] == 0 and recs[1]["node_rank"] == 1
    assert recs[0]["world_size"] == recs[1]["world_size"] == 2
    assert recs[0]["env"] == "TorchElasticEnvironment"
    assert recs[0]["sizes"] == [40] * 4 and recs[1]["sizes"] == [24] * 4
