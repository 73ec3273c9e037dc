"""The thin Lightning layer.

The strategy, the callback that forwards hooks into the window driver, and the
``torch.distributed`` implementation of the driver's collectives.
"""
