"""``python -m lightning_rex simulate``: its command line and what it prints and writes.

``simulate`` (the command), ``goodput`` (the comparison on workload scenarios), ``report``
(seed aggregates), ``trace`` (``--trace DIR``) and ``progress`` (the progress bar).
"""
