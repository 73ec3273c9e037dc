"""GlobalBatchScaling's argument checks: one ValueError naming the argument, for every case."""

import math

import pytest

from lightning_rex.core.scaling.config import GlobalBatchScaling


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"candidates": 10**8}, "candidates"),
        ({"candidates": 2.5}, "candidates"),
        ({"min_gain": math.inf}, "min_gain"),
        ({"beta": math.inf}, "beta"),
        ({"min_noise_steps": math.nan}, "min_noise_steps"),
        ({"windows_between": math.nan}, "windows_between"),
        ({"max_global_batch": math.nan}, "max_global_batch"),
        ({"max_global_batch": math.inf}, "max_global_batch"),
        ({"max_global_batch": 2**40}, "max_global_batch"),
        ({"min_global_batch": "a"}, "min_global_batch"),
        ({"decay": math.nan}, "decay"),
        ({"confidence": "x"}, "confidence"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {"min_global_batch": 16, "max_global_batch": 256, **kwargs}
    with pytest.raises(ValueError, match=f"^{name} must be"):
        GlobalBatchScaling(**args)


def test_good_arguments_are_kept():
    g = GlobalBatchScaling(16, 256, candidates=1024, beta=0.0, min_noise_steps=0)
    assert (g.candidates, g.beta, g.min_noise_steps) == (1024, 0.0, 0)
