"""The framework-free window loop shared by training and the simulator."""
