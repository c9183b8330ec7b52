"""Grad mode: whether the autograd layer records operations. Thread-local, as users of
PyTorch expect: ``no_grad`` in one thread does not affect another."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")  # a decorated function's parameters and result, kept by the decorators
R = TypeVar("R")


class _State(threading.local):
    enabled = True  # every new thread starts with grad mode on


state = _State()


def is_grad_enabled() -> bool:
    return state.enabled


class set_grad_enabled:
    """Context manager and decorator; also takes effect at once when called plainly."""

    def __init__(self, mode: bool) -> None:
        self.prev = state.enabled
        self.mode = bool(mode)
        state.enabled = self.mode

    def __enter__(self) -> set_grad_enabled:
        return self

    def __exit__(self, *exc: object) -> None:
        state.enabled = self.prev

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        mode = self.mode
        state.enabled = self.prev  # used as a decorator: do not change the mode now

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


class _ModeContext:
    mode = None

    def __enter__(self) -> None:
        self.prev = state.enabled
        state.enabled = self.mode

    def __exit__(self, *exc: object) -> None:
        state.enabled = self.prev

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        cls = type(self)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with cls():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_ModeContext):
    """Turn recording off in a block or a decorated function."""

    mode = False


class enable_grad(_ModeContext):
    """Turn recording back on (inside ``no_grad``)."""

    mode = True
