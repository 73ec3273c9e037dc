"""Package metadata, kept in one place."""

__version__ = "0.1.0"
__author__ = "lightning-rex developers"
__license__ = "Apache-2.0"
__docs__ = (
    "Adaptive uneven micro-batches with an exact gradient-weighted all-reduce "
    "for PyTorch Lightning on heterogeneous clusters."
)
