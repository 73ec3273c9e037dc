"""Simulator policies: the interface, the built-in ones, and the published peers.

``base`` (the hooks the engine calls and their defaults), ``builtin`` (even, static,
proportional, throughput, rex, the oracle), and the peers re-implemented from their papers
(``lbb``, ``omnilearn``, ``pollux``, ``adaptive_oracle``; ``peers`` holds what they share).
"""
