"""Nothing silently wrong (issue 17): state that survives copies, misuse refused with a
clear error, errors that say what went wrong. Threads are tests/test_threads.py."""

import copy
import ctypes
import pickle

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch import arguments

# ---------------------------------------------------------------- copies and pickles


def roundtrip(t):
    return pickle.loads(pickle.dumps(t))


@pytest.mark.parametrize("how", [copy.deepcopy, roundtrip], ids=["deepcopy", "pickle"])
def test_a_leaf_that_requires_grad_still_requires_grad_after_a_copy(how):
    """A deep-copied model silently stopped training: its leaves came back without
    requires_grad."""
    w = lm.asarray([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    lm.sum(w * w).backward()
    c = how(w)
    assert c.requires_grad and c.is_leaf and c.tolist() == w.tolist()
    assert c.dtype is w.dtype and c.shape == w.shape
    assert (c.grad is not None) == (how is copy.deepcopy)  # pickle keeps no grad, as torch
    if c.grad is not None:
        assert c.grad.tolist() == w.grad.tolist() and c.grad.numpy() is not w.grad.numpy()
    c.grad = None
    lm.sum(c * 3.0).backward()  # it trains on its own
    assert c.grad.tolist() == [[3.0, 3.0], [3.0, 3.0]] and w.grad.tolist() != c.grad.tolist()
    assert not np.shares_memory(c.detach().numpy(), w.detach().numpy())


def test_deepcopy_keeps_a_users_attributes_and_the_memo():
    w = lm.ones(2, requires_grad=True)
    w.name = "weight"
    model = {"w": w, "again": w}
    c = copy.deepcopy(model)
    assert c["w"] is c["again"] and c["w"] is not w and c["w"].name == "weight"


def test_a_non_leaf_cannot_be_deep_copied_but_pickles_as_a_leaf():
    """As in PyTorch: deepcopy of a non-leaf that requires grad raises, pickling gives
    a leaf that requires grad."""
    w = lm.ones(2, requires_grad=True)
    y = w * 2.0
    with pytest.raises(
        RuntimeError, match="only leaf tensors that require grad can be deep-copied"
    ):
        copy.deepcopy(y)
    p = roundtrip(y)
    assert p.requires_grad and p.is_leaf and p.tolist() == [2.0, 2.0]
    assert copy.deepcopy(y.detach()).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("how", [copy.deepcopy, roundtrip], ids=["deepcopy", "pickle"])
def test_sparse_tensors_copy_and_pickle(how):
    """TypeError: numpy() needs a dense CPU tensor -- from __getstate__."""
    s = lm.sparse_coo_tensor([[0, 1, 1], [1, 0, 0]], [3.0, 4.0, 5.0], (2, 2))  # a duplicate
    c = how(s)
    assert c.is_sparse and c.shape == (2, 2) and c.dtype is lm.get_default_dtype()
    assert c.is_coalesced() == s.is_coalesced() and c.nnz == 3
    assert c.to_dense().tolist() == [[0.0, 3.0], [9.0, 0.0]]
    assert not np.shares_memory(c.values().numpy(), s.values().numpy())


@pytest.mark.parametrize("how", [copy.deepcopy, roundtrip], ids=["deepcopy", "pickle"])
def test_device_tensors_copy_and_pickle(how):
    import lamina_example_backend as example

    w = lm.asarray([1.0, 2.0], device="counting", requires_grad=True)
    lm.sum(w * w).backward()
    c = how(w)
    assert c.device == "counting" and c.requires_grad and c.tolist() == [1.0, 2.0]
    assert isinstance(c._data, example.CountingStorage) and c._data is not w._data
    assert c._data.array is not w._data.array
    if how is copy.deepcopy:
        assert c.grad.device == "counting" and c.grad.tolist() == [2.0, 4.0]


def test_unpickling_a_tensor_of_a_device_that_is_gone_says_so():
    data = pickle.dumps(lm.ones(2, device="counting"))
    lm.backends.unregister("example")
    try:
        with pytest.raises(ValueError, match="cannot unpickle a tensor of device 'counting'"):
            pickle.loads(data)
    finally:
        import lamina_example_backend as example

        lm.backends.register(example.plugin, "example", "entry point")
    assert pickle.loads(data).device == "counting"


# ---------------------------------------------------------------- hooks


def test_a_hook_returning_a_gradient_of_another_shape_is_refused():
    """w.grad became shape (5,) for a (3,) leaf."""
    w = lm.ones(3, requires_grad=True)
    y = w * 2.0
    y.register_hook(lambda g: lm.ones(5))
    with pytest.raises(
        RuntimeError, match=r"changed the shape of the gradient from \(3,\) to \(5,\)"
    ):
        lm.sum(y).backward()
    assert w.grad is None
    v = lm.ones(2, dtype=lm.float64, requires_grad=True)  # the hook narrows to float32
    v.register_hook(lambda g: lm.astype(g, lm.float32))
    with pytest.raises(RuntimeError, match="changed the dtype of the gradient"):
        lm.sum(v * 1.0).backward()
    u = lm.ones(2, requires_grad=True)
    u.register_hook(lambda g: g.to("counting"))
    with pytest.raises(
        RuntimeError, match="changed the device of the gradient from cpu to counting"
    ):
        lm.sum(u * 1.0).backward()


def test_a_hook_returning_a_non_tensor_says_what_it_returned():
    """AttributeError: 'str' object has no attribute 'detach'."""
    w = lm.ones(3, requires_grad=True)
    w.register_hook(lambda g: "oops")
    with pytest.raises(
        TypeError, match="hook .*<lambda> returned str, but a gradient hook must return a tensor"
    ):
        lm.sum(w * 2.0).backward()


# ---------------------------------------------------------------- autograd entry points


def test_too_few_gradients_for_the_outputs_say_how_many():
    """A raw KeyError: <multiply_backward>."""
    w = lm.ones(2, requires_grad=True)
    y1, y2 = lm.sum(w * 2.0), lm.sum(w * 3.0)
    g = lm.asarray(1.0)
    with pytest.raises(ValueError, match=r"grad: got 2 outputs but 1 gradient \(grad_outputs\)"):
        lm.autograd.grad([y1, y2], [w], grad_outputs=[g], retain_graph=True)
    with pytest.raises(
        ValueError, match=r"backward: got 2 outputs but 1 gradient \(grad_tensors\)"
    ):
        lm.autograd.backward([y1, y2], [g])
    assert lm.autograd.grad([y1, y2], [w], grad_outputs=[g, None])[0].tolist() == [5.0, 5.0]


# ---------------------------------------------------------------- values that do not fit


def test_a_fill_value_an_integer_dtype_cannot_hold_is_refused():
    """full(3, nan, dtype=int64) gave INT64_MIN (and a NumPy warning)."""
    with pytest.raises(ValueError, match="full: cannot convert float nan to int64"):
        lm.full(3, float("nan"), dtype=lm.int64)
    with pytest.raises(ValueError, match="cannot convert float inf to uint8"):
        lm.full(3, float("inf"), dtype=lm.uint8)
    with pytest.raises(OverflowError, match="fill value 1e\\+30 is out of bounds"):
        lm.full(3, 1e30, dtype=lm.int32)
    assert lm.full(2, -2.7, dtype=lm.int8).tolist() == [-2, -2]  # truncates, as NumPy
    assert lm.full(1, float("nan"), dtype=lm.bool).tolist() == [True]  # as NumPy


def test_from_dlpack_of_an_unsupported_dtype_is_lamina_s_type_error():
    """bfloat16 passed NumPy's RuntimeError through (float16 got lamina's TypeError)."""
    with pytest.raises(
        TypeError, match="from_dlpack: cannot import BFloat16Buffer .*lamina supports bool, int8"
    ):
        lm.from_dlpack(BFloat16Buffer())


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class BFloat16Buffer:
    """A DLPack producer of 3 bfloat16 zeros (kDLBfloat, 16 bits), as torch would give."""

    def __init__(self):
        self.buf, self.shape = np.zeros(3, np.uint16), (ctypes.c_int64 * 1)(3)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim = self.buf.ctypes.data, DLDevice(1, 0), 1
        t.dtype, t.shape, t.byte_offset = DLDataType(4, 16, 1), self.shape, 0

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = (
            ctypes.py_object,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
        )
        return new(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (1, 0)


# ---------------------------------------------------------------- argument types

x = lm.ones((2, 3))
w = lm.ones(2, requires_grad=True)

# (call, the function and argument the TypeError must name): a bool, float or string
# where an int, axis, shape, dtype, device or bool belongs
WRONG_TYPES = [
    (lambda: lm.sum(x, axis=True), "sum: axis must be an int, got bool"),
    (lambda: lm.set_num_threads(1.5), "set_num_threads: n must be an int, got float"),
    (lambda: lm.zeros(2.0), "zeros: shape must be a tuple of ints"),
    (lambda: lm.ones((2, True)), "ones: shape must be a tuple of ints"),
    (lambda: lm.empty("3"), "empty: shape must be a tuple of ints"),
    (lambda: lm.full(2.5, 1.0), "full: shape must be a tuple of ints"),
    (lambda: lm.eye(2.0), "eye: n_rows must be an int, got float"),
    (lambda: lm.eye(3, True), "eye: n_cols must be an int, got bool"),
    (lambda: lm.eye(3, k=1.0), "eye: k must be an int, got float"),
    (lambda: lm.linspace(0, 1, 3.0), "linspace: num must be an int, got float"),
    (lambda: lm.linspace(0, 1, 3, endpoint="no"), "linspace: endpoint must be a bool, got str"),
    (lambda: lm.unstack(x, axis=True), "unstack: axis must be an int, got bool"),
    (lambda: lm.asarray([1], copy="yes"), "asarray: copy must be a bool, got str"),
    (lambda: lm.asarray([1], dtype=3), "asarray: dtype: unsupported dtype 3"),
    (
        lambda: lm.asarray([1], device=0),
        "asarray: device must be a device or a device name, got int",
    ),
    (lambda: lm.astype(x, None), "astype: dtype must be a dtype, got None"),
    (lambda: lm.astype(x, lm.int8, copy=2.5), "astype: copy must be a bool, got float"),
    (
        lambda: lm.astype(x, lm.int8, device=5),
        "astype: device must be a device or a device name, got int",
    ),
    (
        lambda: lm.zeros_like(x, device=1.0),
        "zeros_like: device must be a device or a device name, got float",
    ),
    (lambda: lm.full_like(x, 1, dtype=1.5), "full_like: dtype: unsupported dtype 1.5"),
    (lambda: lm.ones(2, requires_grad="yes"), "ones: requires_grad must be a bool, got str"),
    (lambda: lm.from_dlpack(np.ones(2), copy="no"), "from_dlpack: copy must be a bool, got str"),
    (lambda: x.to(3), "to: device must be a device or a device name, got int"),
    (
        lambda: x.to_device(None),
        "to_device: device must be a device or a device name, got NoneType",
    ),
    (
        lambda: lm.ones(2).requires_grad_("yes"),
        "requires_grad_: requires_grad must be a bool, got str",
    ),
    (
        lambda: lm.sum(w * 2.0).backward(retain_graph="x"),
        "backward: retain_graph must be a bool, got str",
    ),
    (
        lambda: lm.autograd.grad(lm.sum(w * 2.0), [w], create_graph=1.5),
        "grad: create_graph must be a bool, got float",
    ),
    (
        lambda: lm.autograd.gradcheck(lm.exp, [w], eps="a"),
        "gradcheck: eps must be a real number, got str",
    ),
    (lambda: lm.random.seed(True), "seed: value must be an int, got bool"),
    (lambda: lm.random.seed(2.5), "seed: value must be an int, got float"),
    (lambda: lm.optim.SGD([w], lr="0.1"), "SGD: lr must be a real number, got str"),
    (lambda: lm.optim.SGD([w], lr=0.1, nesterov="yes"), "SGD: nesterov must be a bool, got str"),
]


@pytest.mark.parametrize(
    "call, message", WRONG_TYPES, ids=[m.split(",")[0] for _, m in WRONG_TYPES]
)
def test_a_wrong_argument_type_is_a_type_error_naming_the_argument(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)


def test_negative_sizes_of_a_new_tensor_name_the_function():
    with pytest.raises(
        ValueError, match=r"zeros: shape must not have negative sizes, got \(2, -1\)"
    ):
        lm.zeros((2, -1))
    with pytest.raises(ValueError, match="rand: shape must not have negative sizes"):
        lm.rand(-3)


def test_checked_functions_keep_their_signature_and_doc():
    import inspect

    assert str(inspect.signature(lm.eye)).startswith(
        "(n_rows: 'int', n_cols: 'int | None' = None, /, *, k"
    )
    assert lm.zeros.__doc__.startswith("A tensor of ``shape`` filled with 0")
    assert lm.Tensor.to.__name__ == "to" and "device" in inspect.signature(lm.Tensor.to).parameters
    assert "eps" in inspect.signature(lm.autograd.gradcheck).parameters
    assert set(arguments.ANNOTATIONS.values()) <= set(arguments.KINDS)


def test_there_is_one_layer_state():
    """lm.dispatch.table.set_layer once changed the tables without lm.layers knowing."""
    assert not hasattr(lm.dispatch, "table")
    with lm.layers.off("sparse"):
        assert lm.dispatch.layers.state() == lm.layers.state()
        assert lm.layers.state()["sparse"] is False
        sparse = next(row for row in lm.dispatch.dump_table("add") if row[0] == "Sparse")
        assert sparse[1] == "[off: RuntimeError]"
    assert lm.dispatch.layers.state() == lm.layers.state() == lm.layers.DEFAULTS


# ---------------------------------------------------------------- found by differential testing


def test_assigning_a_gradient_of_another_shape_dtype_or_device_is_refused():
    """w.grad = lm.ones(3) for a (2,) leaf was kept, and the next backward broadcast into
    it; as in PyTorch, the assignment raises."""
    w = lm.ones(2, dtype=lm.float64, requires_grad=True)  # float64: the float32 grad differs
    with pytest.raises(
        RuntimeError, match=r"cannot assign a gradient of shape \(3,\) to a tensor of shape \(2,\)"
    ):
        w.grad = lm.ones(3, dtype=lm.float64)
    with pytest.raises(RuntimeError, match="gradient of dtype lamina.float32"):
        w.grad = lm.ones(2, dtype=lm.float32)
    with pytest.raises(RuntimeError, match="gradient of device counting to a tensor of device cpu"):
        w.grad = lm.ones(2, dtype=lm.float64, device="counting")
    with pytest.raises(TypeError, match="grad must be a tensor or None, got str"):
        w.grad = "a"
    w.grad = lm.full(2, 3.0, dtype=lm.float64)
    lm.sum(w * 1.0).backward()
    assert w.grad.tolist() == [4.0, 4.0]
    w.grad = None
    assert w.grad is None


def test_a_backward_gradient_on_another_device_is_refused_and_another_dtype_cast():
    """y.backward(g) with g on another device put the leaf's .grad on g's device."""
    w = lm.ones(2, requires_grad=True)
    y = w * 2.0
    with pytest.raises(ValueError, match="the gradient of an output on cpu is on counting"):
        y.backward(lm.ones(2, device="counting"), retain_graph=True)
    y.backward(lm.ones(2, dtype=lm.int64))  # cast to the output's dtype, as in PyTorch
    assert w.grad.tolist() == [2.0, 2.0] and w.grad.dtype is y.dtype is lm.get_default_dtype()


@pytest.mark.parametrize(
    "call",
    [
        lambda: lm.astype(lm.asarray([1.0, np.nan]), lm.int64),
        lambda: lm.astype(lm.asarray([np.inf]), lm.int16),
        lambda: lm.astype(lm.asarray([3e9]), lm.int32),
        lambda: lm.astype(lm.asarray([-1.5]), lm.uint8),
        lambda: lm.sum(lm.asarray([np.nan, 1.5]), dtype=lm.int64),
        lambda: lm.asarray(np.array([1e30]), dtype=lm.int8),
    ],
    ids=["nan", "inf", "int32-range", "negative-to-uint", "sum-dtype", "asarray-dtype"],
)
def test_floats_an_integer_dtype_cannot_hold_are_refused_not_cast_to_garbage(call):
    """NumPy's cast gives INT64_MIN for NaN (with a RuntimeWarning lamina let through)."""
    with pytest.raises(ValueError, match="has no value in u?int"):
        call()


def test_float_to_int_casts_that_fit_truncate_as_numpy_does():
    values = np.array([-128.9, -0.5, 0.9, 127.99])
    assert lm.astype(lm.asarray(values), lm.int8).tolist() == values.astype(np.int8).tolist()
    assert lm.astype(lm.asarray([-(2.0**63)]), lm.int64).tolist() == [-(2**63)]
    with lm.backends.use("numpy_ref"):
        with pytest.raises(ValueError, match="nan has no value in int64"):
            lm.astype(lm.asarray([np.nan]), lm.int64)


def test_a_bool_is_not_a_size_of_a_sparse_tensor():
    """sparse_coo_tensor(..., (True,)) made a tensor of shape (1,)."""
    with pytest.raises(
        TypeError, match=r"sparse_coo_tensor: shape must be a tuple of ints, got \(True,\)"
    ):
        lm.sparse_coo_tensor([[0]], [1.0], (True,))


def test_a_narrowing_setitem_is_refused_with_a_message_that_fits():
    """float64 into float32 was refused "without changing their kind" (it is the same)."""
    with pytest.raises(
        TypeError, match="float64 values into a lamina.float32 tensor without a narrowing cast"
    ):
        lm.ones(2, dtype=lm.float32)[0] = lm.asarray(2.5, dtype=lm.float64)
    with pytest.raises(
        TypeError, match="float64 values into a lamina.int8 tensor without changing their kind"
    ):
        lm.zeros(2, dtype=lm.int8)[0] = lm.asarray(2.5, dtype=lm.float64)
