"""``lamina.utils``: helpers around the tensor library, as PyTorch's ``torch.utils``;
``data`` holds datasets, samplers and ``DataLoader``."""

from . import data

__all__ = ["data"]
