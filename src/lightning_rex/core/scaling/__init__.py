"""Global batch scaling: the gradient noise scale, goodput's model and the scaling decider."""
