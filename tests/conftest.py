import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _clean_process_state():
    """Restore environment variables and tear down any process group a test left behind."""
    env = dict(os.environ)
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)
