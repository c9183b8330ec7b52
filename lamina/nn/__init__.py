"""lamina.nn: neural networks as in PyTorch; ``functional`` holds the primitives."""

from . import functional

__all__ = ["functional"]
