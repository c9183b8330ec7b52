"""Derivative formulas of every differentiable operator, one line each (the role of
PyTorch's derivatives.yaml).

A formula ``f(g, r, n, *args)`` gets the output gradient ``g`` (a list of them for
several outputs), the result ``r`` (only where ``uses_result``; a tuple of them for
several outputs), ``n`` (per argument:
does it need a gradient) and the call's arguments as the backend kernel got them;
tensor arguments a formula does not list in ``saves`` arrive as None (with ``saves=()``,
the default, every argument does, non-tensors too: list the index of an axis a formula
needs). It returns one gradient per argument (per tensor of the list, for concat and stack), written
with lamina operators, so formulas run on every device and can themselves be
differentiated (``create_graph=True``). ``n[i] and expr`` skips work nobody needs.
The engine reduces broadcast gradients to each input's shape and casts them to its
dtype, so formulas may return broadcast-shaped gradients.

Note [Complex gradients]: as in PyTorch, the gradient of a real loss L with respect to
a complex z = x + iy is dL/dx + i dL/dy (the conjugate Wirtinger derivative, doubled),
so ``z -= lr * z.grad`` descends, and a real z gets the real gradient it always had. A
formula maps g, the gradient of its output, to ``g * conj(f'(z))`` for a holomorphic
f (``_conj``, which leaves real tensors alone, writes that); the non-holomorphic ones
(abs, sign, real, imag, conj, vecdot's conjugated x1) are derived one by one. Where a
real input meets a complex output, the engine keeps the real part (Note [Complex
dtypes] in dispatch/dtypes.py).
"""

import cmath
import math

from lamina.dispatch import fft as FFT
from lamina.dispatch import layouts, ops
from lamina.dispatch import linalg as LA
from lamina.dispatch.decompositions import DECOMPOSITIONS
from lamina.dispatch.dtypes import bool_, real_of
from lamina.dispatch.schema import OPERATORS
from lamina.dispatch.tensor import Tensor

from .grad_mode import is_grad_enabled


class Derivative:
    __slots__ = (
        "name",
        "formula",
        "saves",
        "sizes",
        "uses_result",
        "list_input",
        "binary_saves",
        "unary_saves",
        "outputs",
        "releases",
    )

    def __init__(
        self, name, formula, saves=(), sizes=(), uses_result=False, outputs=None, releases=False
    ):
        self.name, self.formula = name, formula
        # Note [Releasing saved values]: a formula that ``releases`` is told, before its
        # saved arguments, whether this backward is the node's last (no retain_graph), so
        # that it may let go of each saved value as soon as it has used it (a compiled
        # backward: Note [Joint graph] in lamina.jit) rather than all when it returns
        self.releases = releases
        self.saves = saves  # indices of saved arguments; None saves them all
        # indices of tensor arguments the formula reads only the shape and dtype of: the
        # node keeps a graph.Sizes instead (as PyTorch's formulas keep self.sizes()), so
        # changing such a tensor in place later is no error. Not for views: a view's
        # node keeps its base, whose version then catches the base changed under it
        # (lamina does not regenerate a view's graph as PyTorch does)
        self.sizes = sizes
        # Note [Saved outputs]: with several outputs, ``r`` is the tuple of all of them;
        # ``outputs`` is how many (the first ones) are differentiable, None for all: the
        # others are state the kernel computed for backward (pooling argmax indices,
        # batch-norm mean and inverse std), saved, never requiring grad
        self.uses_result = uses_result
        self.outputs = outputs
        self.list_input = name in ("concat", "stack")  # gradients per tensor of the list
        # for graph.record_binary: False (saves nothing), True (saves both arguments)
        # or None (anything else: the general record)
        self.binary_saves = (
            None
            if uses_result or sizes
            else False
            if saves == ()
            else True
            if saves in (None, (0, 1))
            else None
        )
        # for graph.record_unary: the same for a one-argument operator (True: saves its
        # input); a formula that uses the result may record there too
        self.unary_saves = (
            None
            if sizes or outputs is not None
            else False
            if saves == ()
            else True
            if saves in (None, (0,))
            else None
        )


def _zero(g):
    return ops.zeros_like(g)


def _conj(x):
    """conj(x) of a complex tensor or Python complex; anything else as it is (real
    formulas pay nothing for Note [Complex gradients])."""
    if isinstance(x, Tensor):
        return ops.conj(x) if x.dtype.kind == "c" else x
    return x.conjugate() if isinstance(x, complex) else x


def _mH(x):
    """The conjugate transpose of each matrix (the transpose of a real one)."""
    return _conj(ops.matrix_transpose(x))


def _expand_reduced(g, shape, axis, keepdims):
    """A reduction's gradient broadcast back to the input's shape."""
    if not keepdims:
        g = ops.reshape(g, tuple(1 if i in axis else s for i, s in enumerate(shape)))
    return ops.broadcast_to(g, shape)


def _maximum_mask(a, b, dtype):
    # Ties share the gradient equally, as in PyTorch. (Not nested where()s: the inner
    # one would get two Python scalars and no tensor to take its dtype from.)
    return ops.astype(a > b, dtype) + ops.astype(a == b, dtype) * 0.5


def _pow_base(g, a, b):
    """d(a ** b)/da = b * a ** (b - 1), taken as 0 where b == 0 (as PyTorch does: at
    a == 0 the product would be 0 * inf); ``b`` may be a Python scalar."""
    if not isinstance(b, Tensor):
        return g * _conj(b * a ** (b - 1)) if b != 0 else _zero(g)
    return g * _conj(ops.where(b == 0, 0.0, b * a ** (b - 1)))


def _pow_exponent(g, a, b):
    """d(a ** b)/db = a ** b * log(a), taken as 0 where a <= 0 (a == 0 for a complex
    base); ``a`` may be a Python scalar (``2.0 ** x``)."""
    complex_ = g.dtype.kind == "c"  # a complex power: a negative real base is fine too
    if not isinstance(a, Tensor):
        if complex_:
            return g * _conj(a**b * cmath.log(a)) if a != 0 else _zero(g)
        return g * (a**b * math.log(a)) if a > 0 else _zero(g)
    if complex_ and a.dtype.kind != "c":
        a = a * (1 + 0j)  # the complex dtype of a's precision
    defined = a != 0 if complex_ else a > 0
    return g * _conj(ops.where(defined, a**b * ops.log(ops.where(defined, a, 1.0)), 0.0))


def _sign(g, r, n, x):
    """sign is piecewise constant for reals; for a complex z it is z / |z|, whose
    gradient is g's part tangent to the unit circle at sign(z), over |z| (0 at 0)."""
    if x.dtype.kind != "c":
        return (_zero(g),)
    m = ops.abs(x)
    tangent = g - ops.real(g * ops.conj(r)) * r
    return (ops.where(m == 0, 0.0, tangent / ops.where(m == 0, 1.0, m)),)


def _matmul(g, r, n, a, b):
    a2 = ops.expand_dims(a, axis=0) if a.ndim == 1 else a
    b2 = ops.expand_dims(b, axis=-1) if b.ndim == 1 else b
    g2 = g
    if b.ndim == 1:  # first: for vector @ vector, g is 0-d
        g2 = ops.expand_dims(g2, axis=-1)
    if a.ndim == 1:
        g2 = ops.expand_dims(g2, axis=-2)
    ga = n[0] and _sum_to(ops.matmul(g2, _mH(b2)), a2.shape)
    if n[1] and a2.ndim == 2 and _transposed(b):
        # Note [Gradient layout]: b is a transposed matrix (``x @ w.T``, a linear layer):
        # its gradient computed as (g^H a)^H has b's layout, so the transpose's backward
        # hands w a C-contiguous gradient, as PyTorch's mm backward does. Computed as
        # a^H g it was w's transpose, and the optimizer's update, reading it across the
        # rows, took 10x as long as on a contiguous one.
        gb = _mH(ops.matmul(_mH(g2), a2))
    else:
        gb = n[1] and _sum_to(ops.matmul(_mH(a2), g2), b2.shape)
    return (n[0] and ops.reshape(ga, a.shape), n[1] and ops.reshape(gb, b.shape))


def _transposed(m):
    """A matrix stored column by column (the transpose of a C-contiguous one)."""
    rows, cols = m.shape if m.ndim == 2 else (0, 0)
    return rows > 1 and cols > 1 and layouts.strides_of(m) == (1, rows)


def _sum_to(g, shape):
    """Sum ``g`` down to ``shape`` (undoing broadcasting)."""
    if g.shape == shape:
        return g
    if g.ndim < len(shape):  # x[1:3] = w with w of shape (1, 2): leading 1-dims
        return ops.reshape(_sum_to(g, shape[len(shape) - g.ndim :]), shape)
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1
    )
    g = ops.sum(g, axis=axes, keepdims=True) if axes else g
    return ops.reshape(g, shape)


def _tensordot(g, r, n, a, b, axes):
    a_axes, b_axes = axes
    free_a = [d for d in range(a.ndim) if d not in a_axes]
    free_b = [d for d in range(b.ndim) if d not in b_axes]
    ga = gb = None
    if n[0]:
        # g (free_a + free_b) . b over free_b -> free_a + b's contracted axes, sorted
        t = ops.tensordot(g, _conj(b), axes=(tuple(range(len(free_a), g.ndim)), tuple(free_b)))
        order = free_a + [a_axes[b_axes.index(d)] for d in sorted(b_axes)]
        ga = ops.permute_dims(t, tuple(order.index(d) for d in range(a.ndim)))
    if n[1]:
        t = ops.tensordot(_conj(a), g, axes=(tuple(free_a), tuple(range(len(free_a)))))
        order = [b_axes[a_axes.index(d)] for d in sorted(a_axes)] + free_b
        gb = ops.permute_dims(t, tuple(order.index(d) for d in range(b.ndim)))
    return ga, gb


def _prod(g, r, n, x, axis, dtype, keepdims):
    shape = x.shape
    g = _expand_reduced(g, shape, axis, keepdims)
    r = _expand_reduced(ops.prod(x, axis=axis, keepdims=True), shape, axis, True)
    zero = x == 0
    nonzero_prod = ops.prod(ops.where(zero, 1.0, x), axis=axis, keepdims=True)
    zeros = ops.sum(zero, axis=axis, keepdims=True)
    if is_grad_enabled() and x.requires_grad and ops.max(zeros).item() > 1:
        # create_graph with two zeros in a slice: the gradient is 0 there, but not its
        # derivative (the product of the other elements), which the masks would lose
        return (g * _conj(_prod_others(x, axis)),)
    at_zero = ops.where(zeros == 1, nonzero_prod, 0.0)
    return (g * _conj(ops.where(zero, at_zero, r / ops.where(zero, 1.0, x))),)


def _prod_others(x, axis):
    """For each element, the product of the others of its slice along ``axis``, as a
    differentiable expression (an (n, n) where() per slice: create_graph only)."""
    keep = [d for d in range(x.ndim) if d not in axis]
    order = keep + list(axis)
    lead = tuple(x.shape[d] for d in keep)
    count = math.prod(x.shape[d] for d in axis)
    rows = ops.reshape(ops.permute_dims(x, tuple(order)), lead + (1, count))
    others = ops.prod(ops.where(ops.eye(count, dtype=bool_, device=x.device), 1.0, rows), axis=-1)
    others = ops.reshape(others, lead + tuple(x.shape[d] for d in axis))
    return ops.permute_dims(others, tuple(order.index(d) for d in range(x.ndim)))


def _var(g, r, n, x, axis, correction, keepdims):
    count = math.prod(x.shape[d] for d in axis)
    mean = ops.mean(x, axis=axis, keepdims=True)
    return (_expand_reduced(g, x.shape, axis, keepdims) * 2.0 * (x - mean) / (count - correction),)


def _std(g, r, n, x, axis, correction, keepdims):
    count = math.prod(x.shape[d] for d in axis)
    mean = ops.mean(x, axis=axis, keepdims=True)
    r = _expand_reduced(r, x.shape, axis, keepdims)
    # constant data has std 0 and (x - mean) 0: the gradient is 0 there, not 0 / 0
    grad = (
        _expand_reduced(g, x.shape, axis, keepdims)
        * (x - mean)
        / ((count - correction) * ops.where(r == 0, 1.0, r))
    )
    return (grad,)


def _extreme(g, r, n, x, axis, keepdims):
    # Ties share the gradient evenly (PyTorch's amax/amin).
    mask = ops.astype(x == _expand_reduced(r, x.shape, axis, keepdims), x.dtype)
    return (
        _expand_reduced(g, x.shape, axis, keepdims)
        * mask
        / ops.sum(mask, axis=axis, keepdims=True),
    )


def _getitem(g, r, n, x, key):
    # index_add is differentiable in g, so create_graph needs nothing more
    return (OPERATORS["index_add"](ops.zeros(x.shape, dtype=g.dtype, device=g.device), key, g),)


def _setitem(g, r, n, x, key, value):
    gx = None
    if n[0]:
        gx = ops.asarray(g, copy=True)
        gx[key] = 0.0
    # value's gradient is g[key], summed to value's shape by the engine (Node.shapes):
    # value itself is not saved, so h[0] = h[1] (value a view of the target) works
    return (gx, None, n[2] and g[key])


def _split(gs, r, n, x, sections, axis):
    if isinstance(gs, Tensor):  # one piece: the engine hands a lone output's gradient bare
        gs = [gs]
    size = x.shape[axis]
    sizes = (
        [min(sections, size - i) for i in range(0, size, sections)]
        if isinstance(sections, int)
        else list(sections)
    )
    pieces = []
    for g, s in zip(gs, sizes):
        shape = x.shape[:axis] + (s,) + x.shape[axis + 1 :]
        pieces.append(ops.zeros(shape, dtype=x.dtype, device=x.device) if g is None else g)
    return (ops.concat(pieces, axis=axis),)


def _concat(g, r, n, arrays, axis):
    sizes = [a.shape[axis] for a in arrays]
    return ops.split(g, sizes, axis=axis)


def _stack(g, r, n, arrays, axis):
    return ops.unstack(g, axis=axis)


def _clip(g, r, n, x, lo, hi):
    # clip is min(max(x, lo), hi): the upper bound wins where it is below the lower one
    # (then the result is hi everywhere), as in NumPy and PyTorch
    below = x < lo if lo is not None else None  # max(x, lo) took lo
    above = (ops.maximum(x, lo) if lo is not None else x) > hi if hi is not None else None
    inside = ops.ones_like(x, dtype=bool_)
    if below is not None:
        inside = ops.logical_and(inside, ops.logical_not(below))
    if above is not None:
        inside = ops.logical_and(inside, ops.logical_not(above))
    from_lo = (
        below if above is None or below is None else ops.logical_and(below, ops.logical_not(above))
    )
    # the result has the broadcast shape of x and the bounds: each gradient is summed
    # back to its input's shape
    return (
        n[0] and _sum_to(g * ops.astype(inside, g.dtype), x.shape),
        n[1] and _sum_to(g * ops.astype(from_lo, g.dtype), lo.shape),
        n[2] and _sum_to(g * ops.astype(above, g.dtype), hi.shape),
    )


def _where(g, r, n, c, x1, x2):
    return (None, n[1] and ops.where(c, g, 0.0), n[2] and ops.where(c, 0.0, g))


# ---------------------------------------------------------------- Array API 2024.12
# (issue 15)


def _without_initial(g, axis, include_initial):
    return g[(slice(None),) * axis + (slice(1, None),)] if include_initial else g


def _reverse_cumsum(g, axis):
    return ops.flip(ops.cumulative_sum(ops.flip(g, axis=axis), axis=axis), axis=axis)


def _cumulative_sum(g, r, n, x, axis, dtype, include_initial):
    return (_reverse_cumsum(_without_initial(g, axis, include_initial), axis),)


def _cumulative_prod(g, r, n, x, axis, dtype, include_initial):
    """d r_j / d x_i = r_j / x_i for j >= i where x has no zero; with zeros, the
    product of the others, prod_{k <= j, k != i} x_k, from an (n, n) scan per slice."""
    g = _without_initial(g, axis, include_initial)
    r = _without_initial(r, axis, include_initial)
    if not ops.any(x == 0).item():
        return (_reverse_cumsum(g * _conj(r), axis) / _conj(x),)
    xs, gs = ops.moveaxis(x, axis, -1), ops.moveaxis(g, axis, -1)
    size = x.shape[axis]
    eye = ops.eye(size, dtype=bool_, device=x.device)
    others = ops.where(eye, 1.0, ops.expand_dims(xs, -2))  # [..., i, k]
    scans = ops.cumulative_prod(others, axis=-1)  # [..., i, j]
    later = ops.triu(ops.ones((size, size), dtype=x.dtype, device=x.device))  # j >= i
    grad = ops.sum(_conj(scans) * later * ops.expand_dims(gs, -2), axis=-1)
    return (ops.moveaxis(grad, -1, axis),)


def _sort(g, r, n, x, axis, descending, stable):
    order = ops.argsort(x, axis=axis, descending=descending, stable=True)
    return (ops.take_along_axis(g, ops.argsort(order, axis=axis), axis=axis),)


# ---------------------------------------------------------------- lamina.linalg
# (issue 15) complex matrices take conjugate transposes (_mH) where real ones take
# transposes. The factorizations of several outputs (eigh, svd, qr) read their results,
# all of them (Derivative.uses_result), as PyTorch's formulas do: no factorization is
# recomputed, and a second derivative reaches the one node whose outputs the first
# used (Note [Gauge invariance] needs that).
#
# Note [Gauge invariance]: the eigenvectors of a Hermitian matrix, and the pairs of
# singular vectors, of a complex matrix are defined up to a phase each (v -> v e^{i phi};
# for svd, u and v together); a real matrix's, up to a sign. A loss that depends on the
# phase (Im(v[0]), say) has no gradient; the formulas drop the phase's direction, which
# is right for every loss that does not depend on it (|v|**2, v diag(w) v^H, U S Vh,
# U Vh) and silently wrong for the others, so they check as PyTorch does that the
# phase's component of the output gradients, Im(diag(V^H gV)) (for svd, that of U's
# plus that of V's), is about 0, and raise otherwise (_check_gauge).


def _check_gauge(name, what, phase, tol=1e-2):
    """Raise unless ``phase`` (Im(diag(V^H gV)), one per vector) is about 0: within
    PyTorch's lax 1e-2, so that rounding never raises and the losses PyTorch accepts
    pass. Costs a device sync, as PyTorch's check does."""
    if ops.any(ops.abs(phase) > tol).item():
        raise RuntimeError(
            f"linalg.{name} backward: the {what} of a complex matrix are defined only up "
            "to a phase each (v -> v * exp(i*phi)), and the loss depends on that phase, so "
            "its gradient is not defined. Differentiate a function that does not depend on "
            "it (abs(v), v @ diag(w) @ v^H, U @ diag(S) @ Vh, ...); see Note [Gauge "
            "invariance] in autograd/derivatives.py"
        )


def _diag_embed(d):
    """The diagonal matrices of the vectors d[..., :]."""
    return ops.expand_dims(d, -1) * ops.eye(d.shape[-1], dtype=d.dtype, device=d.device)


def _matrix_scalar(t):
    """A (batch of) scalars as (..., 1, 1), to scale matrices."""
    return ops.expand_dims(ops.expand_dims(t, -1), -1)


def _off_diagonal_inverse(d):
    """F[..., i, j] = 1 / d[..., i, j] off the diagonal, 0 on it."""
    eye = ops.eye(d.shape[-1], dtype=bool_, device=d.device)
    return ops.where(eye, 0.0, 1.0 / ops.where(eye, 1.0, d))


def _det(g, r, n, x):
    return (_matrix_scalar(g * _conj(r)) * _mH(LA.inv(x)),)


def _slogdet(gs, r, n, x):
    """log|det| moves with Re tr(A^-1 dA), a complex sign with its angle, Im tr(A^-1
    dA): together (g_log + i Im(g_sign conj(sign))) A^-H; a real sign is piecewise
    constant."""
    g_sign, g_log = gs
    coef = g_log
    if x.dtype.kind == "c" and g_sign is not None:
        turn = ops.imag(g_sign * ops.conj(LA.slogdet(x).sign)) * 1j
        coef = turn if coef is None else coef + turn
    return (None if coef is None else _matrix_scalar(coef) * _mH(LA.inv(x)),)


def _solve(g, r, n, a, b):
    vector = b.ndim == 1
    gb = LA.solve(_mH(a), ops.expand_dims(g, -1) if vector else g)
    ga = None
    if n[0]:
        xs = ops.expand_dims(r, -1) if vector else r
        ga = -ops.matmul(gb, _mH(xs))
    return ga, (gb[..., 0] if vector else gb)


def _cholesky(g, r, n, x, upper):
    """gA = L^-T phi(L^T gL) L^-1, symmetrized; phi keeps the lower triangle and
    halves the diagonal (Murray 2016, as PyTorch)."""
    low, gl = (_mH(r), _mH(g)) if upper else (r, g)
    p = ops.matmul(_mH(low), gl)
    phi = ops.tril(p) - 0.5 * ops.tril(ops.triu(p))
    inv = LA.inv(low)
    s = ops.matmul(ops.matmul(_mH(inv), phi), inv)
    return (0.5 * (s + _mH(s)),)


def _qr(gs, r, n, x, mode):
    """PyTorch's linalg_qr_backward (R's diagonal is real: LAPACK's Householder QR).
    M >= N: gA = (gQ + Q (X + X^H - Re diag(X))) R^-H with X = triu(gR R^H - Q^H gQ).
    M < N (Q square, R = [R1 | R2]): gA = [Q Y R1^-H | 0] + Q gR with Y = tril(K - K^H)
    less half its (imaginary) diagonal, K = Q^H gQ - gR R^H."""
    q, rr = r
    m, k = q.shape[-2], rr.shape[-1]
    if mode == "complete" and m > k:
        raise NotImplementedError(
            f"linalg.qr: the gradient of mode 'complete' needs M <= N (the last M - N "
            f"columns of Q are arbitrary); got shape {rr.shape[:-2] + (m, k)}: use mode "
            "'reduced'"
        )
    gq, gr = gs
    inner = 0.0
    if gr is not None:
        inner = ops.matmul(gr, _mH(rr))
    if gq is not None:
        inner = inner - ops.matmul(_mH(q), gq)
    if m >= k:
        upper = ops.triu(inner)
        upper = upper + _mH(upper) - _diag_embed(ops.real(LA.diagonal(upper)))
        grad = ops.matmul(q, upper)
        if gq is not None:
            grad = grad + gq
        return (_right_solve_mH(grad, rr),)
    skew = _mH(inner) - inner  # -inner - (-inner)^H
    lower = ops.tril(skew) - 0.5 * _diag_embed(LA.diagonal(skew))
    grad = _right_solve_mH(ops.matmul(q, lower), rr[..., :m])
    grad = ops.concat(
        [grad, ops.zeros(grad.shape[:-1] + (k - m,), dtype=grad.dtype, device=grad.device)], axis=-1
    )
    return (grad if gr is None else grad + ops.matmul(q, gr),)


def _right_solve_mH(b, a):
    """b a^-H, as (a^-1 b^H)^H: one solve, no inverse."""
    return _mH(LA.solve(a, _mH(b)))


def _eigh(gs, r, n, x):
    """PyTorch's linalg_eig_backward, Hermitian: gA = V (diag(gw) + F o skew(V^H gV)) V^H
    with F[i, j] = 1 / (w[j] - w[i]) off the diagonal (0 on it: the phases' direction,
    Note [Gauge invariance]) and skew(X) = (X - X^H) / 2."""
    gw, gv = gs
    w, v = r
    if gv is None:  # eigvalsh's formula
        return (ops.matmul(v * ops.expand_dims(gw, -2), _mH(v)),)
    vhgv = ops.matmul(_mH(v), gv)
    if vhgv.dtype.kind == "c":
        _check_gauge("eigh", "eigenvectors", ops.imag(LA.diagonal(vhgv)))
    f = _off_diagonal_inverse(ops.expand_dims(w, -2) - ops.expand_dims(w, -1))
    inner = f * (0.5 * (vhgv - _mH(vhgv)))
    if gw is not None:
        inner = inner + _diag_embed(gw)
    return (ops.matmul(ops.matmul(v, inner), _mH(v)),)


def _eigvalsh(g, r, n, x):
    v = LA.eigh(x).eigenvectors
    return (ops.matmul(v * ops.expand_dims(g, -2), _mH(v)),)


def _svd(gs, r, n, x, full_matrices):
    """PyTorch's svd_backward (Townsend 2016, with the phase of complex singular vectors,
    Note [Gauge invariance]): gA = U [(skew(U^H gU) S + S skew(V^H gV)) / E + diag(gS) +
    i Im(diag(U^H gU)) / S] V^H with E[i, j] = S[j]^2 - S[i]^2 and skew(X) = X - X^H,
    plus, for a tall (wide) x, the part of gU (gV) outside U's (V's) span. With
    full_matrices the last columns of U (rows of Vh) of a non-square x are an arbitrary
    basis: the loss may not depend on them (_full_svd_part)."""
    gu, gsv, gvh = gs
    u, s, vh = r
    m, k = u.shape[-2], vh.shape[-1]
    if full_matrices and m != k:
        u, vh, gu, gvh = _full_svd_part(u, vh, gu, gvh, s.shape[-1])
    if gu is None and gvh is None:  # svdvals' formula
        return (ops.matmul(u * ops.expand_dims(gsv, -2), vh),)
    v = _mH(vh)
    uhgu = None if gu is None else ops.matmul(_mH(u), gu)
    vhgv = None if gvh is None else ops.matmul(_mH(v), _mH(gvh))
    if u.dtype.kind == "c":
        phase = 0.0
        for inner_product in (uhgu, vhgv):
            if inner_product is not None:
                phase = phase + ops.imag(LA.diagonal(inner_product))
        _check_gauge("svd", "singular vectors", phase)
    s2 = s * s
    f = _off_diagonal_inverse(ops.expand_dims(s2, -2) - ops.expand_dims(s2, -1))
    inner = 0.0 if gsv is None else _diag_embed(gsv)
    extra = 0.0
    if gu is not None:
        inner = inner + (f * (uhgu - _mH(uhgu))) * ops.expand_dims(s, -2)
        if gvh is not None and u.dtype.kind == "c":
            inner = inner + _diag_embed(1j * ops.imag(LA.diagonal(uhgu)) / s)
        if m > k:  # the part of gU outside U's span
            out_of_span = gu - ops.matmul(u, uhgu)
            extra = ops.matmul(out_of_span / ops.expand_dims(s, -2), vh)
    if gvh is not None:
        inner = inner + ops.expand_dims(s, -1) * (f * (vhgv - _mH(vhgv)))
        if k > m:
            out_of_span = _mH(gvh) - ops.matmul(v, vhgv)
            extra = extra + ops.matmul(u / ops.expand_dims(s, -2), _mH(out_of_span))
    return (ops.matmul(ops.matmul(u, inner), vh) + extra,)


def _full_svd_part(u, vh, gu, gvh, size):
    """The reduced factors and their gradients of a full_matrices svd of a non-square
    matrix, whose gradients must be 0 on the arbitrary part: a loss of the reduced part
    only (U[:, :K], or svdvals' second derivative) passes; one that reads the rest
    raises, where PyTorch ignores that part's gradient. Costs a device sync."""
    rest = (gu is not None and ops.any(gu[..., size:] != 0).item()) or (
        gvh is not None and ops.any(gvh[..., size:, :] != 0).item()
    )
    if rest:
        raise NotImplementedError(
            "linalg.svd: with full_matrices=True, the last columns of U (rows of Vh) of a "
            "non-square matrix are an arbitrary basis and a loss that depends on them has "
            "no gradient: use full_matrices=False"
        )
    gu = None if gu is None else gu[..., :size]
    gvh = None if gvh is None else gvh[..., :size, :]
    return u[..., :size], vh[..., :size, :], gu, gvh


def _svdvals(g, r, n, x):
    u, _, vh = LA.svd(x, full_matrices=False)
    return (ops.matmul(u * ops.expand_dims(g, -2), vh),)


def _diagonal(g, r, n, x, offset):
    size = g.shape[-1]
    base = ops.arange(size, device=g.device)
    rows, cols = (base, base + offset) if offset >= 0 else (base - offset, base)
    zeros = ops.zeros(x.shape, dtype=g.dtype, device=g.device)
    return (OPERATORS["index_add"](zeros, (Ellipsis, rows, cols), g),)


def _vector_norm(g, r, n, x, axis, keepdims, ord):
    if ord == 0:
        return (ops.zeros_like(x),)
    g = _expand_reduced(g, x.shape, axis, keepdims)
    r = _expand_reduced(r, x.shape, axis, keepdims)
    if ord in (math.inf, -math.inf):
        # the extreme |x| recomputed here, not r: a backend's |z| of a complex z may
        # differ from the kernel's by an ulp (NumPy's SIMD loop against libm's hypot)
        m = ops.abs(x)
        extreme = (ops.max if ord > 0 else ops.min)(m, axis=axis, keepdims=True)
        mask = ops.astype(m == extreme, x.dtype)
        share = mask / ops.sum(mask, axis=axis, keepdims=True)
        return (g * ops.sign(x) * share,)
    if ord == 1:
        return (g * ops.sign(x),)
    scale = ops.abs(x) ** (ord - 1.0) / ops.where(r == 0, 1.0, r) ** (ord - 1.0)
    return (g * ops.sign(x) * ops.where(r == 0, 0.0, scale),)


_to_device = OPERATORS["to_device"]
# ---------------------------------------------------------------- lamina.fft
# (issue 15) a transform with norm N is linear over the reals; its adjoint is the
# opposite transform with the dual norm (the scale stays: backward <-> forward), then
# the input's zero-padding or trimming undone (_fit). The real-input transforms keep
# the real part; the Hermitian-input ones (irfft, hfft) count each interior frequency
# twice (_hermitian_weights), as their output sees it and its conjugate.

_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _fit(g, axes, sizes):
    """g trimmed or zero-padded along each of axes to the sizes (the input's)."""
    for axis, size in zip(axes, sizes):
        have = g.shape[axis]
        if have > size:
            g = g[(slice(None),) * axis + (slice(0, size),)]
        elif have < size:
            shape = g.shape[:axis] + (size - have,) + g.shape[axis + 1 :]
            g = ops.concat([g, ops.zeros(shape, dtype=g.dtype, device=g.device)], axis=axis)
    return g


def _hermitian_weights(g, axis, n):
    """1 for frequency 0 (and n / 2 of an even n), 2 for the others: the weights of
    rfft(g) in the gradient of irfft (PyTorch's fft_c2r_backward)."""
    weights = [1.0] + [2.0] * (n - n // 2 - 1) + [1.0] * (1 - n % 2)
    w = ops.asarray(weights, dtype=real_of(g.dtype), device=g.device)
    return ops.reshape(w, (n // 2 + 1,) + (1,) * (g.ndim - axis - 1))


def _c2c(inverse, nd):
    adjoint = FFT.fftn if inverse else FFT.ifftn  # of ifft(n) is fftn(n), of fft ifft

    def formula(g, r, n, x, size, axes, norm):
        sizes, axes = (size, axes) if nd else ((size,), (axes,))
        grad = adjoint(g, s=sizes, axes=axes, norm=_DUAL[norm])
        return (_fit(grad, axes, [x.shape[a] for a in axes]),)

    return formula


def _r2c(conjugate, nd):
    """rfft, rfftn (and ihfft = conj(rfft) with the dual norm, ``conjugate``): the
    gradient is the real part of the inverse transform of g padded to s[-1]."""

    def formula(g, r, n, x, size, axes, norm):
        sizes, axes = (size, axes) if nd else ((size,), (axes,))
        if conjugate:
            g, norm = ops.conj(g), _DUAL[norm]
        full = _fit(g, axes[-1:], sizes[-1:])
        grad = ops.real(FFT.ifftn(full, s=sizes, axes=axes, norm=_DUAL[norm]))
        return (_fit(grad, axes, [x.shape[a] for a in axes]),)

    return formula


def _c2r(conjugate, nd):
    """irfft, irfftn (and hfft = irfft(conj(x)) with the dual norm, ``conjugate``):
    the real transform of g, interior frequencies doubled."""

    def formula(g, r, n, x, size, axes, norm):
        sizes, axes = (size, axes) if nd else ((size,), (axes,))
        if conjugate:
            norm = _DUAL[norm]
        grad = FFT.rfftn(g, s=sizes, axes=axes, norm=_DUAL[norm])
        grad = grad * _hermitian_weights(grad, axes[-1], sizes[-1])
        grad = _fit(grad, axes, [x.shape[a] for a in axes])
        return (ops.conj(grad) if conjugate else grad,)

    return formula


_LN2, _LN10 = math.log(2.0), math.log(10.0)


def _tanh(g, r):
    """tanh's gradient from its result: one kernel for real dtypes (tanh_backward's)."""
    if r.dtype.kind == "c":
        return g * _conj(1.0 - r * r)
    return _TANH_BACKWARD(g, r)


D = Derivative
DERIVATIVES = {
    d.name: d
    for d in [
        # elementwise, binary
        D("add", lambda g, r, n, a, b: (g, g)),
        D("subtract", lambda g, r, n, a, b: (g, n[1] and -g)),
        D(
            "multiply",
            lambda g, r, n, a, b: (n[0] and g * _conj(b), n[1] and g * _conj(a)),
            saves=(0, 1),
        ),
        D(
            "divide",
            lambda g, r, n, a, b: (n[0] and g / _conj(b), n[1] and -g * _conj(a / (b * b))),
            saves=(0, 1),
        ),
        D(
            "pow",
            lambda g, r, n, a, b: (n[0] and _pow_base(g, a, b), n[1] and _pow_exponent(g, a, b)),
            saves=(0, 1),
        ),
        D(
            "maximum",
            lambda g, r, n, a, b: (
                n[0] and g * _maximum_mask(a, b, g.dtype),
                n[1] and g * _maximum_mask(b, a, g.dtype),
            ),
            saves=(0, 1),
        ),
        D(
            "minimum",
            lambda g, r, n, a, b: (
                n[0] and g * _maximum_mask(b, a, g.dtype),
                n[1] and g * _maximum_mask(a, b, g.dtype),
            ),
            saves=(0, 1),
        ),
        D("floor_divide", lambda g, r, n, a, b: (n[0] and _zero(g), n[1] and _zero(g))),
        D(
            "remainder",
            lambda g, r, n, a, b: (n[0] and g, n[1] and -g * ops.floor_divide(a, b)),
            saves=(0, 1),
        ),
        D(
            "atan2",
            lambda g, r, n, a, b: (
                n[0] and g * b / (a * a + b * b),
                n[1] and -g * a / (a * a + b * b),
            ),
            saves=(0, 1),
        ),
        D(
            "hypot",
            lambda g, r, n, a, b: (n[0] and g * a / r, n[1] and g * b / r),
            saves=(0, 1),
            uses_result=True,
        ),
        D(
            "copysign",
            lambda g, r, n, a, b: (
                n[0] and g * ops.where(a == 0, 0.0, ops.sign(a) * ops.sign(r)),
                n[1] and _zero(g),
            ),
            saves=(0,),
            uses_result=True,
        ),
        D(
            "logaddexp",
            lambda g, r, n, a, b: (n[0] and g * ops.exp(a - r), n[1] and g * ops.exp(b - r)),
            saves=(0, 1),
            uses_result=True,
        ),
        # elementwise, unary
        # |z| and z / |z| of a complex z: their formulas hold as written (sign(z) is
        # the unit z / |z|); conj, real and imag are linear over the reals
        D("abs", lambda g, r, n, x: (g * ops.sign(x),), saves=(0,)),
        D("negative", lambda g, r, n, x: (-g,)),
        D("positive", lambda g, r, n, x: (g,)),
        D("square", lambda g, r, n, x: (2.0 * g * _conj(x),), saves=(0,)),
        D("conj", lambda g, r, n, x: (_conj(g),)),
        D("real", lambda g, r, n, x: (g,)),  # the engine makes it complex for complex x
        D("imag", lambda g, r, n, x: (g * 1j,)),
        D("sign", _sign, saves=(0,), uses_result=True),
        *[D(name, lambda g, r, n, x: (_zero(g),)) for name in ("floor", "ceil", "round", "trunc")],
        D("exp", lambda g, r, n, x: (g * _conj(r),), uses_result=True),
        D("expm1", lambda g, r, n, x: (g * _conj(r + 1.0),), uses_result=True),
        D("log", lambda g, r, n, x: (g / _conj(x),), saves=(0,)),
        D("log1p", lambda g, r, n, x: (g / _conj(x + 1.0),), saves=(0,)),
        D("log2", lambda g, r, n, x: (g / _conj(x * _LN2),), saves=(0,)),
        D("log10", lambda g, r, n, x: (g / _conj(x * _LN10),), saves=(0,)),
        D("sqrt", lambda g, r, n, x: (g / _conj(2.0 * r),), uses_result=True),
        D("sin", lambda g, r, n, x: (g * _conj(ops.cos(x)),), saves=(0,)),
        D("cos", lambda g, r, n, x: (-g * _conj(ops.sin(x)),), saves=(0,)),
        D("tan", lambda g, r, n, x: (g * _conj(1.0 + r * r),), uses_result=True),
        D("asin", lambda g, r, n, x: (g / _conj(ops.sqrt(1.0 - x * x)),), saves=(0,)),
        D("acos", lambda g, r, n, x: (-g / _conj(ops.sqrt(1.0 - x * x)),), saves=(0,)),
        D("atan", lambda g, r, n, x: (g / _conj(1.0 + x * x),), saves=(0,)),
        D("sinh", lambda g, r, n, x: (g * _conj(ops.cosh(x)),), saves=(0,)),
        D("cosh", lambda g, r, n, x: (g * _conj(ops.sinh(x)),), saves=(0,)),
        D("tanh", lambda g, r, n, x: (_tanh(g, r),), uses_result=True),
        D("asinh", lambda g, r, n, x: (g / _conj(ops.sqrt(x * x + 1.0)),), saves=(0,)),
        # sqrt(x - 1) sqrt(x + 1), not sqrt(x * x - 1): the two differ in sign off the
        # real axis, and acosh's branch cut is the first's
        D(
            "acosh",
            lambda g, r, n, x: (g / _conj(ops.sqrt(x - 1.0) * ops.sqrt(x + 1.0)),),
            saves=(0,),
        ),
        D("atanh", lambda g, r, n, x: (g / _conj(1.0 - x * x),), saves=(0,)),
        D("clip", _clip, saves=None),
        D("where", _where, saves=(0,)),
        D("astype", lambda g, r, n, x, dtype, copy: (g,)),
        D("copy", lambda g, r, n, x: (g,)),
        # reductions
        D(
            "sum",
            lambda g, r, n, x, axis, dtype, keepdims: (
                _expand_reduced(g, x.shape, axis, keepdims),
            ),
            sizes=(0,),
        ),
        D(
            "mean",
            lambda g, r, n, x, axis, keepdims: (
                _expand_reduced(g, x.shape, axis, keepdims)
                / float(math.prod(x.shape[d] for d in axis)),
            ),
            sizes=(0,),
        ),
        D("prod", _prod, saves=(0,)),
        D("var", _var, saves=(0,)),
        D("std", _std, saves=(0,), uses_result=True),
        D("max", _extreme, saves=(0,), uses_result=True),
        D("min", _extreme, saves=(0,), uses_result=True),
        # linear algebra
        D("matmul", _matmul, saves=(0, 1)),
        D("tensordot", _tensordot, saves=(0, 1)),
        D(  # sum(conj(a) * b): a's gradient is conj(g) * b
            "vecdot",
            lambda g, r, n, a, b, axis: (
                n[0] and _conj(ops.expand_dims(g, axis=axis)) * b,
                n[1] and ops.expand_dims(g, axis=axis) * a,
            ),
            saves=(0, 1),
        ),
        # views and manipulation
        D("reshape", lambda g, r, n, x, shape, copy: (ops.reshape(g, x.shape),), saves=(0,)),
        # saves=(1,) keeps the non-tensor argument (axes, axis): with saves=() the recorder
        # passes every argument as None, non-tensors too
        D(
            "permute_dims",
            lambda g, r, n, x, axes: (
                ops.permute_dims(g, tuple(axes.index(i) for i in range(len(axes)))),
            ),
            saves=(1,),
        ),
        D("matrix_transpose", lambda g, r, n, x: (ops.matrix_transpose(g),)),
        D("expand_dims", lambda g, r, n, x, axis: (ops.squeeze(g, axis=axis),), saves=(1,)),
        D("squeeze", lambda g, r, n, x, axis: (ops.reshape(g, x.shape),), saves=(0,)),
        D("flip", lambda g, r, n, x, axis: (ops.flip(g, axis=axis),), saves=(1,)),
        D("broadcast_to", lambda g, r, n, x, shape: (_sum_to(g, x.shape),), saves=(0,)),
        D("getitem", _getitem, saves=(0, 1)),  # the key may be a tensor (mask, indices)
        D("setitem", _setitem, saves=(1,)),
        D("index_add", lambda g, r, n, x, key, values: (g, None, n[2] and g[key]), saves=(1,)),
        D("split", _split, saves=(0,)),
        # the gradient moves back to x's device (x itself is not kept: graph.Sizes)
        D("to_device", lambda g, r, n, x, device: (_to_device(g, x.device),), sizes=(0,)),
        D("concat", _concat, saves=None),
        D("stack", _stack, saves=None),
        # Array API 2024.12 (issue 15)
        D("reciprocal", lambda g, r, n, x: (-g * _conj(r * r),), uses_result=True),
        D("cumulative_sum", _cumulative_sum, saves=(1, 3)),
        D("cumulative_prod", _cumulative_prod, saves=None, uses_result=True),
        D("sort", _sort, saves=None),
        # lamina.linalg (issue 15)
        D(
            "inv",
            lambda g, r, n, x: (-ops.matmul(ops.matmul(_mH(r), g), _mH(r)),),
            uses_result=True,
        ),
        D("det", _det, saves=(0,), uses_result=True),
        D("slogdet", _slogdet, saves=(0,)),
        D("solve", _solve, saves=(0, 1), uses_result=True),
        D("cholesky", _cholesky, saves=(1,), uses_result=True),
        D("qr", _qr, saves=(1,), uses_result=True),
        D("eigh", _eigh, uses_result=True),
        D("eigvalsh", _eigvalsh, saves=(0,)),
        D("svd", _svd, saves=(1,), uses_result=True),
        D("svdvals", _svdvals, saves=(0,)),
        D("diagonal", _diagonal, saves=(0, 1)),
        D("vector_norm", _vector_norm, saves=None, uses_result=True),
        # lamina.fft (issue 15): the formulas read only x's shape
        D("fft", _c2c(False, False), sizes=(0,)),
        D("ifft", _c2c(True, False), sizes=(0,)),
        D("fftn", _c2c(False, True), sizes=(0,)),
        D("ifftn", _c2c(True, True), sizes=(0,)),
        D("rfft", _r2c(False, False), sizes=(0,)),
        D("rfftn", _r2c(False, True), sizes=(0,)),
        D("ihfft", _r2c(True, False), sizes=(0,)),
        D("irfft", _c2r(False, False), sizes=(0,)),
        D("irfftn", _c2r(False, True), sizes=(0,)),
        D("hfft", _c2r(True, False), sizes=(0,)),
    ]
}


# ---------------------------------------------------------------- neural-network primitives
# Note [nn formulas]: each primitive's backward is a dispatched operator with a kernel of
# its own (conv2d_backward_input, pool2d_scatter, ...), fed with what the forward saved
# to make it cheap: pooling's argmax indices, batch norm's mean and inverse standard
# deviation, LRN's scale (Note [Saved outputs]). The backward operators of the linear
# primitives are differentiable in turn -- convolution's three operators are each
# other's adjoints, as are scatter and gather through the indices and average pooling
# and its backward -- so double backward needs nothing more. Batch norm's and LRN's
# backward kernels are not: under create_graph their formulas use the same gradient
# written with elementwise operators and reductions instead.

_CONV = OPERATORS["conv2d"]
_CONV_INPUT = OPERATORS["conv2d_backward_input"]
_CONV_WEIGHT = OPERATORS["conv2d_backward_weight"]
_RESAMPLE = OPERATORS["resample2d"]
_RESAMPLE_BACKWARD = OPERATORS["resample2d_backward"]
_SCATTER = OPERATORS["pool2d_scatter"]
_GATHER = OPERATORS["pool2d_gather"]
_AVG = OPERATORS["avg_pool2d"]
_AVG_BACKWARD = OPERATORS["avg_pool2d_backward"]
_ADAPTIVE = OPERATORS["adaptive_avg_pool2d"]
_ADAPTIVE_BACKWARD = OPERATORS["adaptive_avg_pool2d_backward"]
_BN_BACKWARD = OPERATORS["native_batch_norm_backward"]
_LN_BACKWARD = OPERATORS["native_layer_norm_backward"]
_LSTM_CELL_BACKWARD = OPERATORS["native_lstm_cell_backward"]
_LSTM_SEQUENCE_BACKWARD = OPERATORS["native_lstm_sequence_backward"]
_GRU_SEQUENCE_BACKWARD = OPERATORS["native_gru_sequence_backward"]
_GN_BACKWARD = OPERATORS["native_group_norm_backward"]
_EMBEDDING_BACKWARD = OPERATORS["embedding_dense_backward"]
_LRN_BACKWARD = OPERATORS["local_response_norm_backward"]
_RELU_BACKWARD = OPERATORS["relu_backward"]
_LEAKY_BACKWARD = OPERATORS["leaky_relu_backward"]
_GELU_BACKWARD = OPERATORS["gelu_backward"]
_SIGMOID = OPERATORS["sigmoid"]
_SILU_BACKWARD = OPERATORS["silu_backward"]
_TANH_BACKWARD = OPERATORS["tanh_backward"]
_SIGMOID_BACKWARD = OPERATORS["sigmoid_backward"]
_HARDTANH_BACKWARD = OPERATORS["hardtanh_backward"]
_HARDSWISH_BACKWARD = OPERATORS["hardswish_backward"]
_SMOOTH_L1_BACKWARD = OPERATORS["smooth_l1_loss_backward"]
_NLL_LOSS = OPERATORS["nll_loss"]
_NLL_LOSS_BACKWARD = OPERATORS["nll_loss_backward"]
_SOFTMAX_BACKWARD = OPERATORS["softmax_backward"]
_ATTENTION_BACKWARD = OPERATORS["native_scaled_dot_product_attention_backward"]
_LOG_SOFTMAX_BACKWARD = OPERATORS["log_softmax_backward"]
_CROSS_ENTROPY_BACKWARD = OPERATORS["cross_entropy_loss_backward"]
_NONE = (None,) * 8


def _conv2d(g, r, n, x, w, b, *geometry):
    gx = n[0] and _CONV_INPUT(g, w, x, *geometry)
    gw = gb = None
    if n[1] or n[2]:
        gw, gb = _CONV_WEIGHT(g, x, w.shape, *geometry, bool(n[2]))
    return (gx, n[1] and gw, n[2] and gb, *_NONE[:4])


def _relu_of(formula):
    """The formula of relu(op(...)) from op's: grad where the result is positive, then
    op's (Note [Fused epilogues])."""
    return lambda g, r, n, *args: formula(_RELU_BACKWARD(g, r), None, n, *args)


def _conv2d_backward_input(u, r, n, g, w, x, *geometry):
    """Its adjoint in grad is conv2d; in weight, the weight gradient of grad over u; x
    gives only its shape and layout (no gradient)."""
    gg = n[0] and _CONV(u, w, None, *geometry)
    gw = n[1] and _CONV_WEIGHT(g, u, w.shape, *geometry, False)[0]
    return (gg, gw, *_NONE[:5])


def _conv2d_backward_weight(us, r, n, g, x, weight_shape, *geometry_and_bias):
    """(grad_weight, grad_bias) is adjoint to conv2d(x, u_w, u_b) in grad, and to the
    input gradient of grad over u_w in x; an empty grad_bias (no bias_grad) has no
    adjoint."""
    *geometry, bias_grad = geometry_and_bias
    uw, ub = us[0], us[1] if bias_grad else None
    gg = gx = None
    if n[0]:
        weight = uw if uw is not None else ops.zeros(weight_shape, dtype=g.dtype, device=g.device)
        gg = _CONV(x, weight, ub, *geometry)
    if n[1] and uw is not None:
        gx = _CONV_INPUT(g, uw, x, *geometry)
    return (gg, gx, *_NONE[:6])


def _index_pool(gs, r, n, x, *window):
    g, indices = gs[0], r[1]
    return (None if g is None else _SCATTER(g, indices, x.shape), *_NONE[:5])


def _values_pool(with_indices):
    """max_pool2d and min_pool2d without indices: their backward computes them (the
    functional form runs the indexed operator whenever a gradient is wanted)."""

    def formula(g, r, n, x, *window):
        indices = OPERATORS[with_indices](x, *window)[1]
        return (_SCATTER(g, indices, x.shape), *_NONE[:5])

    return formula


def _nn_axes(x):
    """Every axis but the channels (1), and the shape a (C,) tensor broadcasts in."""
    axes = tuple(d for d in range(x.ndim) if d != 1)
    return axes, tuple(-1 if d == 1 else 1 for d in range(x.ndim))


def _batch_norm(gs, r, n, x, w, b, running_mean, running_var, training, momentum, eps, relu):
    """With relu, grad counts where the result is positive (Note [Fused batch norm and
    relu])."""
    g = gs[0]
    if g is None:
        return (None,) * 9
    if is_grad_enabled():  # create_graph: the differentiable form
        gated = _RELU_BACKWARD(g, r[0]) if relu else g
        gx, gw, gb = _batch_norm_composite(gated, r, x, w, training, eps)
    else:
        gx, gw, gb = _BN_BACKWARD(g, x, w, r[1], r[2], training, r[0] if relu else None)
    return (n[0] and gx, n[1] and gw, n[2] and gb, *_NONE[:6])


def _batch_norm_composite(g, r, x, w, training, eps):
    """batch norm's gradient in dispatched operators; in training the statistics are
    recomputed from x (they depend on it), in evaluation they are the saved constants."""
    axes, shape = _nn_axes(x)
    if training:
        mean = ops.mean(x, axis=axes, keepdims=True)
        centered = x - mean
        invstd = 1.0 / ops.sqrt(ops.mean(centered * centered, axis=axes, keepdims=True) + eps)
    else:
        centered = x - ops.reshape(r[1], shape)
        invstd = ops.reshape(r[2], shape)
    xhat = centered * invstd
    gw, gb = ops.sum(g * xhat, axis=axes), ops.sum(g, axis=axes)
    scale = invstd if w is None else ops.reshape(w, shape) * invstd
    if not training:
        return g * scale, gw, gb
    count = float(x.size // x.shape[1])
    mean_g = ops.reshape(gb, shape) / count
    mean_gx = ops.reshape(gw, shape) / count
    return scale * (g - mean_g - xhat * mean_gx), gw, gb


# Layer norm, group norm and embedding: the backward kernels, or under create_graph
# their decompositions (dispatched operators, so differentiable again), the statistics
# recomputed from x by the forward's decomposition (they depend on it).


def _layer_norm(gs, r, n, x, normalized_shape, w, b, eps):
    g = gs[0]
    if g is None:
        return _NONE[:5]
    if is_grad_enabled():
        decomposed = DECOMPOSITIONS["native_layer_norm"]
        _, mean, rstd = decomposed(None, x, normalized_shape, None, None, eps)
        backward = DECOMPOSITIONS["native_layer_norm_backward"]
        gx, gw, gb = backward(None, g, x, normalized_shape, mean, rstd, w)
    else:
        gx, gw, gb = _LN_BACKWARD(g, x, normalized_shape, r[1], r[2], w)
    return (n[0] and gx, None, n[2] and gw, n[3] and gb, None)


def _lstm_cell(gs, r, n, gates, c):
    """Under create_graph the decompositions' gradient, from activations recomputed from
    gates (they depend on it)."""
    grad_h, grad_c = gs[0], gs[1]
    if grad_h is None and grad_c is None:
        return (None, None)
    if is_grad_enabled():
        _, c_next, activations = DECOMPOSITIONS["native_lstm_cell"](None, gates, c)
        backward = DECOMPOSITIONS["native_lstm_cell_backward"]
        g_gates, g_c = backward(None, grad_h, grad_c, c, c_next, activations)
    else:
        g_gates, g_c = _LSTM_CELL_BACKWARD(grad_h, grad_c, c, r[1], r[2])
    return (n[0] and g_gates, n[1] and g_c)


def _lstm_sequence(gs, r, n, projections, h0, c0, weight_hh):
    """Under create_graph the decompositions' gradient, from the steps recomputed (as
    _lstm_cell)."""
    grads = gs[:3]  # of every step's h, the last h, the last c
    if all(g is None for g in grads):
        return (None,) * 4
    if is_grad_enabled():
        forward = DECOMPOSITIONS["native_lstm_sequence"]
        output, _, _, cs, activations = forward(None, projections, h0, c0, weight_hh)
        backward = DECOMPOSITIONS["native_lstm_sequence_backward"]
        result = backward(None, *grads, h0, c0, weight_hh, output, cs, activations)
    else:
        result = _LSTM_SEQUENCE_BACKWARD(*grads, h0, c0, weight_hh, r[0], r[3], r[4])
    return tuple(need and g for need, g in zip(n, result))


def _gru_sequence(gs, r, n, projections, h0, weight_hh, bias_hh):
    """As _lstm_sequence."""
    grads = gs[:2]  # of every step's h, the last h
    if all(g is None for g in grads):
        return (None,) * 4
    if is_grad_enabled():
        forward = DECOMPOSITIONS["native_gru_sequence"]
        output, _, activations = forward(None, projections, h0, weight_hh, bias_hh)
        backward = DECOMPOSITIONS["native_gru_sequence_backward"]
        result = backward(None, *grads, h0, weight_hh, output, activations)
    else:
        result = _GRU_SEQUENCE_BACKWARD(*grads, h0, weight_hh, r[0], r[2])
    return tuple(need and g for need, g in zip(n, result))


def _group_norm(gs, r, n, x, w, b, num_groups, eps):
    g = gs[0]
    if g is None:
        return _NONE[:5]
    if is_grad_enabled():
        _, mean, rstd = DECOMPOSITIONS["native_group_norm"](None, x, None, None, num_groups, eps)
        backward = DECOMPOSITIONS["native_group_norm_backward"]
        gx, gw, gb = backward(None, g, x, mean, rstd, w, num_groups)
    else:
        gx, gw, gb = _GN_BACKWARD(g, x, r[1], r[2], w, num_groups)
    return (n[0] and gx, n[1] and gw, n[2] and gb, None, None)


def _embedding(g, r, n, w, indices, padding_idx):
    args = (g, indices, w.shape[0], padding_idx)
    if is_grad_enabled():
        return (DECOMPOSITIONS["embedding_dense_backward"](None, *args), None, None)
    return (_EMBEDDING_BACKWARD(*args), None, None)


def _attention(gs, r, n, q, k, v, mask, is_causal, scale, need_weights):
    """From the saved weights P (the forward ran with need_weights): dQ, dK and dV by
    the fused backward (its decomposition says how), dMask = softmax's backward of dO
    V^T summed to the mask's shape. Under create_graph (and where the forward kept no
    weights) P is recomputed by the decomposition, so it depends on q and k again, and
    under create_graph the gradients are the backward's decomposition too."""
    g = gs[0]
    if g is None:
        return _NONE[:7]
    weights = r[1]
    grad_mode = is_grad_enabled()
    if grad_mode or not need_weights:
        weights = DECOMPOSITIONS["native_scaled_dot_product_attention"](
            None, q, k, v, mask, is_causal, scale, True
        )[1]
    args = (g, q, k, v, weights, scale)
    if grad_mode:
        gq, gk, gv = DECOMPOSITIONS["native_scaled_dot_product_attention_backward"](None, *args)
    else:
        gq, gk, gv = _ATTENTION_BACKWARD(*args)
    scores = n[3] and _SOFTMAX_BACKWARD(ops.matmul(g, ops.matrix_transpose(v)), weights, -1)
    gmask = n[3] and _sum_to(scores, mask.shape)
    return (n[0] and gq, n[1] and gk, n[2] and gv, gmask, None, None, None)


def _channel_window_sum(t, before, after):
    """The sum of t over the channels [c - before, c + after] of each channel c (zeros
    outside), differentiable: shifted slices of a copy padded with zeros."""
    c = t.shape[1]
    pads = [
        ops.zeros(t.shape[:1] + (k,) + t.shape[2:], dtype=t.dtype, device=t.device)
        for k in (before, after)
    ]
    padded = ops.concat([pads[0], t, pads[1]], axis=1)
    total = padded[:, 0:c]
    for d in range(1, before + after + 1):
        total = total + padded[:, d : d + c]
    return total


def _lrn(gs, r, n, x, size, alpha, beta, k):
    g = gs[0]
    if g is None:
        return _NONE[:5]
    if is_grad_enabled():  # create_graph: the differentiable form
        before, after = size // 2, (size - 1) // 2
        s = k + (alpha / size) * _channel_window_sum(x * x, before, after)
        inv = s**-beta
        t = g * (x * inv) / s
        gx = g * inv - (2.0 * alpha * beta / size) * x * _channel_window_sum(t, after, before)
    else:
        gx = _LRN_BACKWARD(g, x, r[0], r[1], size, alpha, beta, k)
    return (gx, *_NONE[:4])


_SQRT_2PI = math.sqrt(2.0 * math.pi)
_TANH_BETA = math.sqrt(2.0 / math.pi)
_TANH_KAPPA = 0.044715


def _gelu_second(x, approximate):
    """gelu's second derivative, in dispatched operators."""
    if approximate == "tanh":
        du = _TANH_BETA * (1.0 + 3.0 * _TANH_KAPPA * x * x)
        t = ops.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x))
        return (1.0 - t * t) * (du - x * t * du * du + 3.0 * _TANH_BETA * _TANH_KAPPA * x * x)
    return ops.exp(-0.5 * x * x) * (2.0 - x * x) / _SQRT_2PI


def _silu_second(x):
    """silu's second derivative, s (1 - s) (2 + x (1 - 2 s)) with s = sigmoid(x)."""
    s = _SIGMOID(x)
    return s * (1.0 - s) * (2.0 + x * (1.0 - 2.0 * s))


def _nll_loss(g, r, n, x, target, weight, ignore_index, reduction):
    return (_NLL_LOSS_BACKWARD(g, x, target, weight, ignore_index, reduction), *_NONE[:4])


def _nll_loss_backward(u, r, n, g, x, target, weight, ignore_index, reduction):
    """Linear in g: u's loss, as nll_loss computes it, is g's gradient."""
    return (n[0] and _NLL_LOSS(u, target, weight, ignore_index, reduction), *_NONE[:5])


def _cross_entropy_loss(g, r, n, x, target, ignore_index):
    """The fused backward, from the logits (the forward kept no log-probabilities: Note
    [One-pass cross entropy]); under create_graph its decomposition, log_softmax's and
    nll_loss's gradients in turn, which can be differentiated again."""
    args = (g, x, target, ignore_index)
    if is_grad_enabled():
        return (DECOMPOSITIONS["cross_entropy_loss_backward"](None, *args), None, None)
    return (_CROSS_ENTROPY_BACKWARD(*args), None, None)


def _mse_loss(g, r, n, x, t, reduction):
    if reduction == "mean":  # an empty batch: no elements, an empty gradient
        scale = 2.0 / x.size if x.size else 0.0
    else:
        scale = 2.0
    grad = (x - t) * (g * scale)
    return (n[0] and grad, n[1] and -grad, None)


def _loss_scale(g, x, reduction):
    """g spread over the elements: over their number for 'mean' (0 when empty)."""
    if reduction == "mean":
        return g * (1.0 / x.size if x.size else 0.0)
    return g


def _smooth_l1_loss(g, r, n, x, t, reduction, beta):
    grad = _SMOOTH_L1_BACKWARD(g, x, t, reduction, beta)
    return (n[0] and grad, n[1] and -grad, None, None)


def _smooth_l1_loss_backward(u, r, n, g, x, t, reduction, beta):
    """Linear in g; in x (and -t) the slope's derivative, 1 / beta where |d| < beta."""
    gg = None
    if n[0]:
        gg = _SMOOTH_L1_BACKWARD(u, x, t, "none", beta)
        if reduction != "none":  # g was 0-d: the sum of its effects
            gg = _loss_scale(ops.sum(gg), x, reduction)
    gx = None
    if n[1] or n[2]:
        inside = ops.abs(x - t) < beta
        gx = ops.where(inside, u * _loss_scale(g, x, reduction) / (beta or 1.0), 0.0)
    return (gg, n[1] and gx, n[2] and -gx, None, None)


def _bce_with_logits(g, r, n, x, t, weight, reduction, pos_weight):
    """d/dx = l sigmoid(x) - pos_weight t with l = 1 + (pos_weight - 1) t, d/dt = -x
    without pos_weight, else log sigmoid(-x) - pos_weight log sigmoid(x) (PyTorch's form:
    no inf - inf at x = -inf); none for the weights."""
    scale = _loss_scale(g, x, reduction)
    if weight is not None:
        scale = scale * weight
    s = _SIGMOID(x)
    if pos_weight is None:
        gx, gt = n[0] and s - t, n[1] and -x
    else:
        tail = ops.log1p(ops.exp(-ops.abs(x)))  # log sigmoid(x) = min(x, 0) - tail
        gx = n[0] and ((pos_weight - 1.0) * t + 1.0) * s - pos_weight * t
        gt = n[1] and (ops.minimum(-x, 0.0) - tail - pos_weight * (ops.minimum(x, 0.0) - tail))
    return (n[0] and gx * scale, n[1] and gt * scale, None, None, None)


def _linear(g, r, n, x, w, b):
    if x.ndim == 2:  # a batch of vectors: the products need no reshapes
        return _linear_2d(g, n, x, w)
    # one GEMM over the flattened leading axes: a batched product of (L, out) blocks
    # was 1.1x slower (OpenBLAS, one thread, 8 x 128 rows, 768 -> 256)
    gx, gw, gb = _linear_2d(
        ops.reshape(g, (-1, w.shape[0])), n, ops.reshape(x, (-1, w.shape[1])), w
    )
    return n[0] and ops.reshape(gx, x.shape), gw, gb


def _linear_2d(g, n, x, w):
    """Linear's gradients for matrices g (rows, out) and x (rows, in); g's transpose
    is a view, which the BLAS reads as it is."""
    gx = n[0] and ops.matmul(g, w)
    gw = n[1] and ops.matmul(ops.matrix_transpose(g), x)
    gb = n[2] and ops.sum(g, axis=0)
    return gx, gw, gb


DERIVATIVES.update(
    {
        d.name: d
        for d in [
            D("conv2d", _conv2d, saves=(0, 1)),
            D("conv2d_relu", _relu_of(_conv2d), saves=(0, 1), uses_result=True),
            D("conv2d_backward_input", _conv2d_backward_input, saves=(0, 1)),
            D("conv2d_backward_weight", _conv2d_backward_weight, saves=(0, 1)),
            D(  # the tables and weights are constants: no gradient
                "resample2d",
                lambda g, r, n, x, *tables: (_RESAMPLE_BACKWARD(g, *tables, x), *_NONE[:4]),
                saves=(0, 1, 2, 3, 4),  # the input for its shape and layout
            ),
            D(
                "resample2d_backward",
                lambda u, r, n, g, *tables_and_x: (_RESAMPLE(u, *tables_and_x[:4]), *_NONE[:5]),
                saves=(1, 2, 3, 4),
            ),
            D("linear", _linear, saves=(0, 1)),
            D("linear_relu", _relu_of(_linear), saves=(0, 1), uses_result=True),
            D("max_pool2d", _values_pool("max_pool2d_with_indices"), saves=(0,)),
            D("min_pool2d", _values_pool("min_pool2d_with_indices"), saves=(0,)),
            D("max_pool2d_with_indices", _index_pool, sizes=(0,), uses_result=True, outputs=1),
            D("min_pool2d_with_indices", _index_pool, sizes=(0,), uses_result=True, outputs=1),
            D(
                "pool2d_scatter",
                lambda u, r, n, g, indices, shape: (_GATHER(u, indices), None, None),
                saves=(1,),
            ),
            D(
                "pool2d_gather",
                lambda u, r, n, x, indices: (_SCATTER(u, indices, x.shape), None),
                saves=(1,),
                sizes=(0,),
            ),
            D(
                "avg_pool2d",
                lambda g, r, n, x, *window: (_AVG_BACKWARD(g, x, *window), *_NONE[:6]),
                saves=(0,),  # for its shape and layout
            ),
            D(
                "avg_pool2d_backward",
                lambda u, r, n, g, x, *window: (_AVG(u, *window), *_NONE[:7]),
            ),
            D(
                "adaptive_avg_pool2d",
                lambda g, r, n, x, size: (_ADAPTIVE_BACKWARD(g, x), None),
                saves=(0,),
            ),
            D(
                "adaptive_avg_pool2d_backward",
                lambda u, r, n, g, x: (_ADAPTIVE(u, tuple(g.shape[-2:])), None),
                sizes=(0,),
            ),
            D("native_batch_norm", _batch_norm, saves=(0, 1), uses_result=True, outputs=1),
            D("native_layer_norm", _layer_norm, saves=(0, 2), uses_result=True, outputs=1),
            D("native_lstm_cell", _lstm_cell, saves=(0, 1), uses_result=True, outputs=2),
            D("native_lstm_sequence", _lstm_sequence, saves=None, uses_result=True, outputs=3),
            D("native_gru_sequence", _gru_sequence, saves=None, uses_result=True, outputs=2),
            D("native_group_norm", _group_norm, saves=(0, 1), uses_result=True, outputs=1),
            D("embedding", _embedding, saves=(1,), sizes=(0,)),
            D(
                "native_scaled_dot_product_attention",
                _attention,
                saves=None,
                uses_result=True,
                outputs=1,
            ),
            D("native_local_response_norm", _lrn, saves=(0,), uses_result=True, outputs=1),
            D("relu", lambda g, r, n, x: (_RELU_BACKWARD(g, r),), uses_result=True),
            D(
                "relu_backward",
                lambda u, r, n, g, result: (_RELU_BACKWARD(u, result), None),
                saves=(1,),
            ),
            D(
                "leaky_relu",
                lambda g, r, n, x, slope: (_LEAKY_BACKWARD(g, x, slope), None),
                saves=(0,),
            ),
            D(
                "leaky_relu_backward",
                lambda u, r, n, g, x, slope: (
                    n[0] and _LEAKY_BACKWARD(u, x, slope),
                    n[1] and _zero(u),  # piecewise linear: 0 almost everywhere
                    None,
                ),
                saves=(1,),
            ),
            D(
                "gelu",
                lambda g, r, n, x, approximate: (_GELU_BACKWARD(g, x, approximate), None),
                saves=(0,),
            ),
            D(
                "gelu_backward",
                lambda u, r, n, g, x, approximate: (
                    n[0] and _GELU_BACKWARD(u, x, approximate),
                    n[1] and u * g * _gelu_second(x, approximate),
                    None,
                ),
                saves=(0, 1),
            ),
            D("sigmoid", lambda g, r, n, x: (_SIGMOID_BACKWARD(g, r),), uses_result=True),
            D(
                "sigmoid_backward",
                lambda u, r, n, g, y: (
                    n[0] and _SIGMOID_BACKWARD(u, y),
                    n[1] and u * g * (1.0 - 2.0 * y),
                ),
                saves=(0, 1),
            ),
            D(
                "tanh_backward",
                lambda u, r, n, g, y: (n[0] and _TANH_BACKWARD(u, y), n[1] and -2.0 * u * g * y),
                saves=(0, 1),
            ),
            D("silu", lambda g, r, n, x: (_SILU_BACKWARD(g, x),), saves=(0,)),
            D(
                "silu_backward",
                lambda u, r, n, g, x: (
                    n[0] and _SILU_BACKWARD(u, x),
                    n[1] and u * g * _silu_second(x),
                ),
                saves=(0, 1),
            ),
            D(
                "hardtanh",
                lambda g, r, n, x, lo, hi: (_HARDTANH_BACKWARD(g, x, lo, hi), None, None),
                saves=(0,),
            ),
            D(
                "hardtanh_backward",
                lambda u, r, n, g, x, lo, hi: (
                    n[0] and _HARDTANH_BACKWARD(u, x, lo, hi),
                    n[1] and _zero(u),  # piecewise constant slope: 0 almost everywhere
                    None,
                    None,
                ),
                saves=(1,),
            ),
            D("hardswish", lambda g, r, n, x: (_HARDSWISH_BACKWARD(g, x),), saves=(0,)),
            D(
                "hardswish_backward",
                lambda u, r, n, g, x: (
                    n[0] and _HARDSWISH_BACKWARD(u, x),
                    n[1] and ops.where((x > -3.0) & (x < 3.0), u * g * (1.0 / 3.0), 0.0),
                ),
                saves=(0, 1),
            ),
            D(
                "softmax",
                lambda g, r, n, x, dim: (_SOFTMAX_BACKWARD(g, r, dim), None),
                uses_result=True,
            ),
            D(
                "log_softmax",
                lambda g, r, n, x, dim: (_LOG_SOFTMAX_BACKWARD(g, r, dim), None),
                uses_result=True,
            ),
            D(
                "softmax_backward",  # of r * (g - sum(g * r))
                lambda u, out, n, g, r, dim: (
                    n[0] and _SOFTMAX_BACKWARD(u, r, dim),
                    n[1]
                    and u * (g - ops.sum(g * r, axis=dim, keepdims=True))
                    - g * ops.sum(u * r, axis=dim, keepdims=True),
                    None,
                ),
                saves=(0, 1),
            ),
            D(
                "log_softmax_backward",  # of g - exp(r) * sum(g)
                lambda u, out, n, g, r, dim: (
                    n[0] and u - ops.sum(u * ops.exp(r), axis=dim, keepdims=True),
                    n[1] and -u * ops.exp(r) * ops.sum(g, axis=dim, keepdims=True),
                    None,
                ),
                saves=(0, 1),
            ),
            D("nll_loss", _nll_loss, saves=(0, 1, 2)),
            D("nll_loss_backward", _nll_loss_backward, saves=(2, 3)),
            D("cross_entropy_loss", _cross_entropy_loss, saves=(0, 1)),
            D("mse_loss", _mse_loss, saves=(0, 1)),
            D("smooth_l1_loss", _smooth_l1_loss, saves=(0, 1)),
            D("smooth_l1_loss_backward", _smooth_l1_loss_backward, saves=(0, 1, 2)),
            D("binary_cross_entropy_with_logits", _bce_with_logits, saves=(0, 1, 2, 4)),
            D("to_layout", lambda g, r, n, x, layout: (g, None)),
        ]
    }
)
