import os

import pytest
import torch

# The distributed tests fork this process. An OpenMP thread pool that in-process tests spun
# up (torch ops, also from the controller's threads) does not survive a fork reliably, and a
# forked rank could hang in its first parallel region. One intra-op thread keeps the parent
# fork-safe; the models here are tiny.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clean_process_state():
    """Restore environment variables and tear down any process group a test left behind."""
    env = dict(os.environ)
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)
