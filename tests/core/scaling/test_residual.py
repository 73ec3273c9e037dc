import json
import math

import numpy as np
import pytest

from lightning_rex.core.saved import StateError
from lightning_rex.core.scaling.batch_scaling import BatchScaler
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.scaling.residual import (
    GoodputObservation,
    check_observation,
    refresh_predictions,
    residual_posterior,
)

CFG = GlobalBatchScaling(16, 4096)


def test_refresh_remakes_each_plans_prediction_once_and_keeps_the_rest():
    obs = [
        GoodputObservation(64, math.log(0.2), 1e-4, math.log(0.1), (32, 32)),
        GoodputObservation(64, math.log(0.2), 1e-4, math.log(0.1), (32, 32)),
        GoodputObservation(64, math.log(0.2), 1e-4, math.log(0.1), (40, 24)),
        GoodputObservation(64, math.log(0.2), 1e-4, math.log(0.1)),  # saved without a plan
    ]
    asked = []

    def predict_plan(plan):
        asked.append(plan)
        return {(32, 32): 0.2, (40, 24): math.inf}[plan]

    refresh_predictions(obs, predict_plan)
    assert asked == [(32, 32), (40, 24)]
    assert [o.pred for o in obs] == pytest.approx([math.log(0.2)] * 2 + [math.log(0.1)] * 2)


def test_a_first_window_on_a_split_of_unseen_sizes_does_not_penalise_its_batch_for_good():
    # the first window at 512 ran a split the rank model had never seen sizes of: it
    # measured 1.6x its prediction; the model has learnt them since, and predicts it right
    rng = np.random.default_rng(0)
    sc = BatchScaler(CFG, 64, 2)
    learnt = {(32, 32): 0.1, (300, 212): 0.32, (256, 256): 0.3}
    for _ in range(3):
        sc.record(64, 0.1 * np.exp(rng.normal(0, 0.02, 30)), 0.1, (32, 32))
    sc.record(512, 0.32 * np.exp(rng.normal(0, 0.02, 30)), 0.2, (300, 212))
    for _ in range(3):
        sc.record(512, 0.3 * np.exp(rng.normal(0, 0.02, 30)), 0.3, (256, 256))
    batches = np.array([64, 512, 1024])
    stale, _ = residual_posterior(sc._obs, CFG, batches)
    sc.refresh(learnt.__getitem__)
    fresh, _ = residual_posterior(sc._obs, CFG, batches)
    assert stale[1] > 0.05  # the stale first window drags 512 (and what is near) up
    assert abs(fresh[1]) < 0.02 and abs(fresh[2]) < abs(stale[2])
    # the plans are saved with the observations, and a state saved before them still loads
    saved = json.loads(json.dumps(sc.state_dict()))
    assert saved["obs"][3][4] == [300, 212]
    again = BatchScaler(CFG, 64, 2)
    again.load_state_dict(saved)
    assert again._obs[3].plan == (300, 212)
    saved["obs"] = [entry[:4] for entry in saved["obs"]]
    again.load_state_dict(saved)
    assert again._obs[3].plan is None


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ([64, 0.1, 1e-4], r"obs\[0\] must be"),
        ([64, 0.1, 1e-4, 0.1, [30, 30]], r"obs\[0\]\[4\]"),  # sums to 60
        ([64, 0.1, 1e-4, 0.1, [70, -6]], r"obs\[0\]\[4\]\[1\]"),
        ([64, 0.1, 1e-4, 0.1, "32,32"], r"obs\[0\]\[4\]"),
        ([64, 0.1, 0.0, 0.1, None], r"obs\[0\]\[2\]"),
    ],
)
def test_a_bad_saved_observation_names_its_field(entry, where):
    with pytest.raises(StateError, match=where):
        check_observation(entry, "scaler.obs[0]", 16, 4096)
    assert check_observation([64, 0.1, 1e-4, 0.1, None], "o", 16, 4096).plan is None
