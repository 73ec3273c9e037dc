"""Running a policy through a scenario.

``engine`` (the training loop's window driver on simulated ranks), ``times`` (the step
times), ``scoring`` (the metrics against the oracle) and ``goodput`` (global batch runs to a
workload's target).
"""
