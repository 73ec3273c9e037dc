"""The statistics: the imbalance test, persistence, and the non-inferiority of a new plan."""
