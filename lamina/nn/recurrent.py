"""Recurrent layers: ``LSTM``, ``GRU``, the Elman ``RNN`` and their one-step cells
``LSTMCell``, ``GRUCell`` and ``RNNCell``, with PyTorch's parameters (names, shapes, gate
order, initialization), arguments and results, bidirectional layers included, so that
state dicts and code port unchanged.

They are built from dispatched operators, so autograd runs through them: a layer
projects the whole sequence's input with one matrix product up front, then runs all
its steps in one operator call (native_lstm_sequence, native_gru_sequence: Note
[Sequence in columns]; RNN's steps are a product and its nonlinearity each);
LSTMCell's step is one fused cell (native_lstm_cell), GRUCell's and RNNCell's a few
elementwise operators. Gate order (the blocks of rows of each weight): LSTM input,
forget, cell, output (i, f, g, o); GRU reset, update, new (r, z, n).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lamina.dispatch import ops
from lamina.dispatch.arguments import checked
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor

from . import functional as F
from . import init
from .modules import Module, Parameter

_LSTM_CELL = OPERATORS["native_lstm_cell"]
_LSTM_SEQUENCE = OPERATORS["native_lstm_sequence"]
_GRU_SEQUENCE = OPERATORS["native_gru_sequence"]
_SUFFIXES = ("", "_reverse")  # the parameters' names per direction: PyTorch's
_NONLINEARITIES = {"tanh": ops.tanh, "relu": F.relu}


def _lstm_gates(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The next (h, c) from the pre-activations (N, 4H) of gates i, f, g, o and c (N,
    H): one call of the fused cell, on the gates as (4, N, H) (a view)."""
    blocks = ops.moveaxis(ops.reshape(gates, (*c.shape[:-1], 4, c.shape[-1])), -2, 0)
    h, c_next, _ = _LSTM_CELL(blocks, c)
    return h, c_next


def _gru_gates(xw: Tensor, hw: Tensor, h: Tensor) -> Tensor:
    """The next h from the input's and the hidden state's projections (N, 3H), each
    with its own bias (b_hn sits inside r * (...), as in PyTorch)."""
    size = h.shape[-1]
    # Note [Recurrent pieces]: split, not slicing, takes a tensor apart: its gradient is
    # one concatenation, where each slice's would be a zero tensor of the whole and an add
    x_rz, x_n = ops.split(xw, [2 * size, size], axis=-1)
    h_rz, h_n = ops.split(hw, [2 * size, size], axis=-1)
    r, z = ops.split(F.sigmoid(x_rz + h_rz), size, axis=-1)
    n = ops.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) n + z h


# Note [States in columns]: a layer's loop (in native_lstm_sequence's and
# native_gru_sequence's kernels) keeps its states as columns, (H, N), and computes each
# step's pre-activations as w_hh @ h, (G * H, N). Each gate is then a block of whole
# rows -- contiguous, so the fused cell reads them in place -- where in rows, (N,
# G * H), a gate is a strided slice of every row. The product is also the faster of
# the two forms for a small batch (OpenBLAS, one thread, 16 x 128 -> 512: 21 us
# against 37).
def _columns(t: Tensor) -> Tensor:
    """A view with the last two axes swapped."""
    return ops.matrix_transpose(t)


def _projected(w_ih: Tensor, x: Tensor, bias: Tensor | None, shape: tuple) -> Tensor:
    """A layer's input projections w_ih @ x (+ bias, per row), (G * H, L * N), as
    ``shape`` (G * H, L, N): Note [Sequence in columns]."""
    xw = ops.matmul(w_ih, x)
    if bias is not None:
        xw = xw + ops.expand_dims(bias, axis=-1)
    return ops.reshape(xw, shape)


# Note [Sequence in columns]: an LSTM or GRU layer runs its whole sequence in one
# operator call (native_lstm_sequence, native_gru_sequence; one autograd node, where a
# step was a product, a sum and the cell, each a dispatch and a node), on the sequence
# in columns: the input's projections (G * H, L, N) and the output (H, L, N), the steps
# and the batch together the columns. A layer's input in columns, (input_size, L * N),
# is then a view of the previous layer's output (of a contiguous (L, N, input_size)
# input, its transpose), so the projection is one matrix product reading both operands
# in place, and so are its gradients; so is weight_hh's gradient, the steps' gates'
# gradients against the h's before them, (G * H, (L - 1) N) and (H, (L - 1) N) views,
# plus the first step's against h0. Each step reads and writes strided (G * H, N) and
# (H, N) slices: copies of a few thousand elements beside the step's product. A
# bidirectional layer's reverse direction runs the same kernel on its projections with
# the steps reversed (a flipped view) and flips its output back; the directions'
# outputs, stacked on rows, (2H, L, N), are the next layer's input in columns.


def _parameter(shape: tuple, dtype: Any, device: Any) -> Tensor:
    """Uninitialized (reset_parameters fills it), of lamina's default float dtype
    unless dtype says otherwise."""
    return Parameter(ops.empty(shape, dtype=dtype, device=device))


def _uniform_init(module: Module, hidden_size: int) -> None:
    """Every weight and bias in U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) (PyTorch's)."""
    bound = 1.0 / math.sqrt(hidden_size) if hidden_size else 0.0
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


def _floating(cls: str, input: Tensor) -> None:
    if input.dtype.kind != "f":
        raise TypeError(f"{cls}: input must be a floating tensor, got {input.dtype}")


def _state(cls: str, name: str, t: Tensor | None, shape: tuple, like: Tensor) -> Tensor:
    """A given initial state of ``shape``, or zeros."""
    if t is None:
        return ops.zeros(shape, dtype=like.dtype, device=like.device)
    if t.shape != shape:
        raise ValueError(f"{cls}: expected {name} of shape {shape}, got {t.shape}")
    return t


class _RNNBase(Module):
    """The multi-layer sequence loop shared by LSTM and GRU."""

    gates: int  # blocks of rows in each weight

    @checked
    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        if input_size < 1 or hidden_size < 1 or num_layers < 1:
            raise ValueError(
                f"{cls}: input_size, hidden_size and num_layers must be positive, got "
                f"{input_size}, {hidden_size} and {num_layers}"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{cls}: dropout must be in [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        self.bidirectional = bidirectional
        rows = self.gates * hidden_size
        for layer in range(num_layers):
            columns = input_size if layer == 0 else hidden_size * self._directions
            for suffix in _SUFFIXES[: self._directions]:
                shapes = {"weight_ih": (rows, columns), "weight_hh": (rows, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(rows,), bias_hh=(rows,))
                for name, shape in shapes.items():
                    setattr(self, f"{name}_l{layer}{suffix}", _parameter(shape, dtype, device))
        self.reset_parameters()

    @property
    def _directions(self) -> int:
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        _uniform_init(self, self.hidden_size)

    def _weights(self, layer: int, suffix: str) -> tuple:
        """weight_ih, weight_hh, bias_ih, bias_hh of ``layer`` in the direction of
        ``suffix`` (biases None without bias)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return tuple(getattr(self, f"{n}_l{layer}{suffix}", None) for n in names)

    def _sequence(self, input: Tensor) -> tuple[Tensor, bool]:
        """The input as (L, N, input_size), and whether it had a batch axis."""
        cls = type(self).__name__
        _floating(cls, input)
        if input.ndim not in (2, 3):
            raise ValueError(f"{cls}: expected a 2-D or 3-D input, got shape {input.shape}")
        if input.shape[-1] != self.input_size:
            raise ValueError(
                f"{cls}: expected input of size {self.input_size} in its last axis, "
                f"got shape {input.shape}"
            )
        batched = input.ndim == 3
        if not batched:
            input = ops.expand_dims(input, axis=1)
        elif self.batch_first:
            input = ops.permute_dims(input, (1, 0, 2))
        if input.shape[0] == 0:
            raise ValueError(
                f"{cls}: expected a sequence of length 1 or more, got shape {input.shape}"
            )
        return input, batched

    def _initial(self, name: str, t: Tensor | None, x: Tensor, batched: bool) -> Tensor:
        """The initial state (num_layers * directions, N, H) (given without N for an
        unbatched input)."""
        states = self.num_layers * self._directions
        shape = (states, x.shape[1], self.hidden_size) if batched else (states, self.hidden_size)
        t = _state(type(self).__name__, name, t, shape, x)
        return t if batched else ops.expand_dims(t, axis=1)

    def _run(self, input: Tensor, initial: dict[str, Tensor | None]) -> tuple[Tensor, list]:
        """The layers over ``input`` from the initial states (``initial``: name -> a
        tensor or None), each layer's directions on the same input, the reverse one
        on the steps reversed (Note [Sequence in columns]): the last layer's output in
        the input's arrangement, and the final states, one tensor per initial state."""
        x, batched = self._sequence(input)
        states = [self._initial(name, t, x, batched) for name, t in initial.items()]
        length, n, size = x.shape[0], x.shape[1], self.hidden_size
        # each layer's input in columns, (input_size, L * N): Note [Sequence in columns]
        x = _columns(ops.reshape(x, (length * n, self.input_size)))
        finals: list[list[Tensor]] = [[] for _ in states]
        for layer in range(self.num_layers):
            outputs = []
            for direction, suffix in enumerate(_SUFFIXES[: self._directions]):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, suffix)
                bias = self._input_bias(b_ih, b_hh)
                xw = _projected(w_ih, x, bias, (self.gates * size, length, n))
                first = [_columns(s[layer * self._directions + direction]) for s in states]
                if direction:  # the steps from last to first (a view)
                    xw = ops.flip(xw, axis=1)
                out, last = self._layer(xw, first, w_hh, b_hh)  # Note [States in columns]
                outputs.append(ops.flip(out, axis=1) if direction else out)
                for final, state in zip(finals, last):
                    final.append(_columns(state))
            out = outputs[0] if len(outputs) == 1 else ops.concat(outputs, axis=0)
            out = self._between_layers(out, layer)
            x = ops.reshape(out, (out.shape[0], length * n))
        out = ops.permute_dims(out, (1, 2, 0))  # (L, N, directions * H), a view
        return self._output(out, batched), [_final(f, batched) for f in finals]

    def _input_bias(self, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor | None:
        """The bias added to the input's projections: both biases, which enter every
        gate's sum (GRU keeps b_hh for its steps)."""
        return None if b_ih is None else b_ih + b_hh

    def _layer(self, xw: Tensor, states: list[Tensor], w_hh: Tensor, b_hh: Tensor | None):
        """(every step's h (H, L, N), the last states) of one layer in one direction,
        from the projections xw (G * H, L, N) and the initial states, in columns."""
        raise NotImplementedError

    def _between_layers(self, x: Tensor, layer: int) -> Tensor:
        """PyTorch's dropout on every layer's output but the last, while training."""
        if self.dropout and self.training and layer < self.num_layers - 1:
            return F.dropout(x, self.dropout)
        return x

    def _output(self, out: Tensor, batched: bool) -> Tensor:
        """The last layer's (L, N, directions * H) steps in the input's arrangement."""
        if not batched:
            return ops.squeeze(out, axis=1)
        return ops.permute_dims(out, (1, 0, 2)) if self.batch_first else out

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


def _final(states: list[Tensor], batched: bool) -> Tensor:
    out = ops.stack(states, axis=0)  # (num_layers, N, H)
    return out if batched else ops.squeeze(out, axis=1)


class LSTM(_RNNBase):
    """A multi-layer long short-term memory over a sequence: ``forward(input, hx=None)``
    with input (L, N, input_size) ((N, L, input_size) with batch_first, (L,
    input_size) unbatched) and hx = (h_0, c_0), each (num_layers * directions, N,
    hidden_size) or None for zeros, returns (output, (h_n, c_n)): every step's
    last-layer h (both directions' side by side, (L, N, directions * hidden_size)), and
    each layer's and direction's last h and c. ``proj_size`` is not supported."""

    gates = 4

    def __init__(self, *args: Any, proj_size: int = 0, **kwargs: Any) -> None:
        if proj_size:
            raise NotImplementedError("LSTM: proj_size is not supported yet")
        super().__init__(*args, **kwargs)

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h0, c0 = (None, None) if hx is None else hx
        out, (h, c) = self._run(input, {"h_0": h0, "c_0": c0})
        return out, (h, c)

    def _layer(self, xw, states, w_hh, b_hh):
        out, h, c, _, _ = _LSTM_SEQUENCE(*_LSTM_SEQUENCE.check(xw, *states, w_hh))
        return out, (h, c)


class GRU(_RNNBase):
    """A multi-layer gated recurrent unit over a sequence: ``forward(input, hx=None)``
    with input as LSTM's and h_0 (num_layers * directions, N, hidden_size) or None for
    zeros, returns (output, h_n)."""

    gates = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, (h,) = self._run(input, {"h_0": hx})
        return out, h

    def _input_bias(self, b_ih, b_hh):
        return b_ih  # b_hh's n part sits inside r * (w_hn h + b_hn): the kernel adds it

    def _layer(self, xw, states, w_hh, b_hh):
        out, h, _ = _GRU_SEQUENCE(*_GRU_SEQUENCE.check(xw, *states, w_hh, b_hh))
        return out, (h,)


def _nonlinearity(cls: str, name: str) -> Callable[[Tensor], Tensor]:
    """RNN's and RNNCell's activation, by PyTorch's name."""
    if name not in _NONLINEARITIES:
        raise ValueError(f"{cls}: nonlinearity must be 'tanh' or 'relu', got {name!r}")
    return _NONLINEARITIES[name]


class RNN(_RNNBase):
    """A multi-layer Elman network over a sequence: h_t = nonlinearity(W_ih x_t + b_ih
    + W_hh h_(t-1) + b_hh), nonlinearity ``"tanh"`` (the default) or ``"relu"``;
    ``forward(input, hx=None)`` as GRU's. Each step is a matrix product and the
    nonlinearity, dispatched one after another (its weights are one block of rows)."""

    gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",  # PyTorch's place for it: fourth
        *args: Any,
        **kwargs: Any,
    ) -> None:
        _nonlinearity("RNN", nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out, (h,) = self._run(input, {"h_0": hx})
        return out, h

    def _layer(self, xw, states, w_hh, b_hh):
        (h,), activation = states, _nonlinearity("RNN", self.nonlinearity)
        steps = []
        for x_t in ops.unstack(xw, axis=1):  # Note [Recurrent pieces]: not slices
            h = activation(x_t + ops.matmul(w_hh, h))
            steps.append(h)
        return ops.stack(steps, axis=1), (h,)


class _CellBase(Module):
    """One step: weight_ih (G * hidden_size, input_size), weight_hh (G * hidden_size,
    hidden_size), bias_ih and bias_hh (G * hidden_size,)."""

    gates: int

    @checked
    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        if input_size < 1 or hidden_size < 1:
            raise ValueError(
                f"{cls}: input_size and hidden_size must be positive, got {input_size} "
                f"and {hidden_size}"
            )
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        rows = self.gates * hidden_size
        self.weight_ih = _parameter((rows, input_size), dtype, device)
        self.weight_hh = _parameter((rows, hidden_size), dtype, device)
        if bias:
            self.bias_ih = _parameter((rows,), dtype, device)
            self.bias_hh = _parameter((rows,), dtype, device)
        else:
            self.bias_ih = self.bias_hh = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _uniform_init(self, self.hidden_size)

    def _step_input(self, input: Tensor) -> Tensor:
        """The input as (N, input_size)."""
        cls = type(self).__name__
        _floating(cls, input)
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ValueError(
                f"{cls}: expected input of shape (N, {self.input_size}) or "
                f"({self.input_size},), got {input.shape}"
            )
        return input if input.ndim == 2 else ops.expand_dims(input, axis=0)

    def _hidden(self, name: str, t: Tensor | None, x: Tensor, batched: bool) -> Tensor:
        shape = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        t = _state(type(self).__name__, name, t, shape, x)
        return t if batched else ops.expand_dims(t, axis=0)

    def _projections(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        return F.linear(x, self.weight_ih, self.bias_ih), F.linear(h, self.weight_hh, self.bias_hh)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


def _unbatched(t: Tensor, batched: bool) -> Tensor:
    return t if batched else ops.squeeze(t, axis=0)


class LSTMCell(_CellBase):
    """One LSTM step: ``forward(input, hx=None)`` with input (N, input_size) or
    (input_size,) and hx = (h, c) (or None for zeros) returns the next (h, c)."""

    gates = 4

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        batched = input.ndim == 2
        x = self._step_input(input)
        h, c = (None, None) if hx is None else hx
        h, c = self._hidden("h", h, x, batched), self._hidden("c", c, x, batched)
        xw, hw = self._projections(x, h)
        h, c = _lstm_gates(xw + hw, c)
        return _unbatched(h, batched), _unbatched(c, batched)


class GRUCell(_CellBase):
    """One GRU step: ``forward(input, hx=None)`` with input (N, input_size) or
    (input_size,) and hx (or None for zeros) returns the next h."""

    gates = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        batched = input.ndim == 2
        x = self._step_input(input)
        h = self._hidden("hx", hx, x, batched)
        return _unbatched(_gru_gates(*self._projections(x, h), h), batched)


class RNNCell(_CellBase):
    """One Elman step: ``forward(input, hx=None)`` with input (N, input_size) or
    (input_size,) and hx (or None for zeros) returns nonlinearity(W_ih x + b_ih + W_hh h
    + b_hh), nonlinearity ``"tanh"`` (the default) or ``"relu"``."""

    gates = 1

    def __init__(self, *args: Any, nonlinearity: str = "tanh", **kwargs: Any) -> None:
        _nonlinearity("RNNCell", nonlinearity)
        super().__init__(*args, **kwargs)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        batched = input.ndim == 2
        x = self._step_input(input)
        h = self._hidden("hx", hx, x, batched)
        xw, hw = self._projections(x, h)
        return _unbatched(_nonlinearity("RNNCell", self.nonlinearity)(xw + hw), batched)

    def extra_repr(self) -> str:
        s = super().extra_repr()  # PyTorch's: the nonlinearity unquoted, not RNN's
        return s if self.nonlinearity == "tanh" else s + f", nonlinearity={self.nonlinearity}"
