import os
from pathlib import Path

# Tests fork real ranks from this process (tests/helpers/dist.py). An OpenMP thread team
# started here (MKL's threaded float64 tanh in an in-process reference computation, say)
# does not survive a fork: the child's first parallel region waits forever for threads it
# does not have. One thread in this process starts no team; each rank sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

_ROOT = Path(__file__).resolve().parents[1]


_SESSION_ENV = dict(os.environ)


@pytest.fixture(autouse=True)
def _clean_process_state():
    """Restore environment variables and tear down any process group a test left behind.

    Launcher variables (``MASTER_PORT``, ``LOCAL_RANK``...) that an in-process fit of a
    module-scoped fixture left behind are removed before each test too: a script a test
    starts would otherwise take itself for a rank of an external launch and wait for peers.
    """
    from tests.helpers.env import LAUNCHER

    for key in LAUNCHER:
        if key in os.environ and key not in _SESSION_ENV:
            del os.environ[key]
    env = dict(os.environ)
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)


@pytest.fixture(autouse=True)
def _no_files_in_the_checkout():
    """A test that writes run outputs into the checkout (a Trainer without a root dir) fails."""
    before = {p.name for p in _ROOT.iterdir()}
    yield
    new = {p.name for p in _ROOT.iterdir()} - before
    assert not new, f"the test wrote {sorted(new)} into the checkout; give it a tmp_path"


@pytest.fixture(autouse=True, scope="session")
def _no_files_in_the_checkout_from_shared_fixtures():
    """The same check for module- and session-scoped fixtures, at the end of the session."""
    before = {p.name for p in _ROOT.iterdir()}
    yield
    new = {p.name for p in _ROOT.iterdir()} - before
    assert not new, f"the session wrote {sorted(new)} into the checkout; give it a tmp_path"
