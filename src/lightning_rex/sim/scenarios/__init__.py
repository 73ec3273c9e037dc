"""Simulator scenarios: what a simulated cluster is, and where it comes from.

``scenario`` (the validated scenario), ``schema`` (loading files and mappings), ``presets``
and ``workload_presets``, ``fleets``, ``curves``, ``noise``, ``memory``, ``workload``, and the
field checks and error they share (``fields``, ``errors``).
"""
