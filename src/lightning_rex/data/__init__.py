"""The data side of REX.

The uneven batch sampler (the home of the plan schedule), the processed train loader, and the
exact gradient weighting.
"""
