"""The decision state machine: the controller, its state, its looks and its validation."""
