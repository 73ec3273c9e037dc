"""The engine: running a policy through a scenario.

Named ``engine``, not ``run``: :func:`lightning_rex.sim.run` is the public function that runs
one policy, and a subpackage of the same name would hide it from ``import a.b.c`` forms.

``engine`` (the training loop's window driver on simulated ranks), ``times`` (the step
times), ``scoring`` (the metrics against the oracle) and ``goodput`` (global batch runs to a
workload's target).
"""
