"""Grad mode: whether the autograd layer records operations. Thread-local, as users of
PyTorch expect: ``no_grad`` in one thread does not affect another."""

import functools
import threading


class _State(threading.local):
    enabled = True  # every new thread starts with grad mode on


state = _State()


def is_grad_enabled():
    return state.enabled


class set_grad_enabled:
    """Context manager and decorator; also takes effect at once when called plainly."""

    def __init__(self, mode):
        self.prev = state.enabled
        self.mode = bool(mode)
        state.enabled = self.mode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        state.enabled = self.prev

    def __call__(self, fn):
        mode = self.mode
        state.enabled = self.prev  # used as a decorator: do not change the mode now

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


class _ModeContext:
    mode = None

    def __enter__(self):
        self.prev = state.enabled
        state.enabled = self.mode

    def __exit__(self, *exc):
        state.enabled = self.prev

    def __call__(self, fn):
        cls = type(self)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with cls():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_ModeContext):
    """Turn recording off in a block or a decorated function."""

    mode = False


class enable_grad(_ModeContext):
    """Turn recording back on (inside ``no_grad``)."""

    mode = True
