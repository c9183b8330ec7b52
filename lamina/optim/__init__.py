"""``lamina.optim``: PyTorch's ``torch.optim`` for lamina tensors -- the ``Optimizer``
base (parameter groups, state dicts, ``zero_grad``, ``step(closure)``), ``SGD``,
``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``, ``Adadelta`` with PyTorch's update rules,
and the learning-rate schedulers of ``lr_scheduler``."""

from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = [
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Optimizer",
    "RMSprop",
    "lr_scheduler",
]
