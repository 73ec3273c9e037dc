"""Print, as JSON, how often validation rolls back a plan of each true step time.

One and three looks, with the controller test's own trials
(``tests/core/decide/test_controller.py``).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.core.decide.test_controller import validation_rates

FACTORS = (1.05, 1.02, 1.00, 0.98, 0.90, 0.80)

if __name__ == "__main__":
    out = []
    for factor in FACTORS:
        one, _ = validation_rates(factor)
        three, early = validation_rates(factor, looks=3)
        out.append({"factor": factor, "rolled_1": one, "rolled_3": three, "longer_3": early})
    print(json.dumps({"trials": 100, "rows": out}))
