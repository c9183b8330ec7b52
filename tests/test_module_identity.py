"""What a module is survives copies, moves and slices, and its names stay sound, as in
PyTorch: deepcopy and pickle keep Parameters (requires_grad, values), buffers and tied
weights (the same Parameter in two modules is one object in the copy); ``float()`` /
``double()`` / ``to(dtype)`` keep ties; a Sequential slice keeps its children's names
and a ModuleList slice is a ModuleList; indices out of range name the index; and
``register_parameter`` / ``register_buffer`` / ``add_module`` refuse names that would
shadow another entry or attribute, dotted names and empty ones.

Each behaviour is a function of the library (lamina, or torch where it is installed),
so the last test checks that PyTorch behaves the same in every enumerated case."""

import copy
import pickle
import sys

import pytest

import lamina as lm

# ---------------------------------------------------------------- the library


class Lib:
    """What the cases need of lamina or torch: tensors, dtypes and ``nn``."""

    def __init__(self, tag, lib):
        self.tag, self.lib, self.nn = tag, lib, lib.nn
        self.float32, self.float64, self.int64 = lib.float32, lib.float64, lib.int64

    def dtype_name(self, t):
        for name in ("float32", "float64", "int64"):
            if t.dtype == getattr(self, name):
                return name
        return str(t.dtype)


LAMINA = Lib("lamina", lm)


def tied_class(L):
    """An embedding-like weight shared by the model and two Linear layers, plus a
    frozen parameter and a buffer; a module-level class (pickle finds it by name)."""
    name = f"Tied_{L.tag}"
    if name in globals():
        return globals()[name]
    nn = L.nn

    def __init__(self):
        nn.Module.__init__(self)
        self.embedding = nn.Parameter(L.lib.randn(4, 3))
        self.encode = nn.Linear(3, 4)
        self.decode = nn.Linear(3, 4, bias=False)
        self.encode.weight = self.embedding
        self.decode.weight = self.embedding
        self.frozen = nn.Parameter(L.lib.ones(3), requires_grad=False)
        self.register_buffer("count", L.lib.zeros(()) + 2.0)

    def forward(self, x):
        return self.encode(x) + self.decode(x * self.frozen)

    cls = type(name, (nn.Module,), {"__init__": __init__, "forward": forward})
    cls.__module__ = __name__
    setattr(sys.modules[__name__], name, cls)
    return cls


def build(kind, L):
    nn, lib = L.nn, L.lib
    if kind == "linear":
        return nn.Linear(3, 2)
    if kind == "conv2d":
        return nn.Conv2d(2, 3, 3, padding=1)
    if kind == "batchnorm2d":
        bn = nn.BatchNorm2d(2)
        bn(lib.randn(4, 2, 3, 3))  # running statistics that are not the initial ones
        bn.bias.requires_grad_(False)  # requires_grad must survive too
        return bn
    if kind == "sequential":
        return nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.ReLU(), nn.Linear(3, 3))
    if kind == "modulelist":
        shared = nn.Linear(2, 2)
        return nn.ModuleList([shared, nn.Linear(2, 3), shared])  # a module in two places
    if kind == "tied":
        return tied_class(L)()
    raise ValueError(kind)


KINDS = ["linear", "conv2d", "batchnorm2d", "sequential", "modulelist", "tied"]


def roundtrip(obj):
    return pickle.loads(pickle.dumps(obj))


COPIES = {"deepcopy": copy.deepcopy, "pickle": roundtrip}


def places(model, table="_parameters"):
    """Every place a tensor of ``table`` sits (module paths, duplicates included: a
    module in two places counts twice) -> the id of the tensor there."""
    out = {}

    def walk(prefix, module):
        for name, t in getattr(module, table).items():
            if t is not None:
                out[prefix + name] = id(t)
        for name, child in module._modules.items():
            if child is not None:
                walk(f"{prefix}{name}.", child)

    walk("", model)
    return out


def tie_groups(model, table="_parameters"):
    """The tie structure: each place -> the index of the first place of its tensor."""
    first, groups = {}, {}
    for i, (place, key) in enumerate(places(model, table).items()):
        groups[place] = first.setdefault(key, i)
    return groups


def describe(model, L):
    """Everything about a model's tensors that a copy or a move must keep, but values
    (compared separately) and identities."""
    return {
        "params": [(n, p.requires_grad) for n, p in model.named_parameters()],
        "count": len(list(model.parameters())),
        "all_parameters": all(isinstance(p, L.nn.Parameter) for p in model.parameters()),
        "buffers": [(n, L.dtype_name(b)) for n, b in model.named_buffers()],
        "ties": tie_groups(model),
        "buffer_ties": tie_groups(model, "_buffers"),
        "modules": [(n, type(m).__name__.split("_")[0]) for n, m in model.named_modules()],
    }


def values(model):
    return {n: t.detach().tolist() for n, t in model.state_dict().items()}


# ---------------------------------------------------------------- the enumerated cases


def copy_case(kind, how, L):
    model = build(kind, L)
    c = COPIES[how](model)
    out = describe(c, L)
    out["same_as_original"] = describe(model, L) == out
    out["values_kept"] = values(model) == values(c)
    out["shares_nothing"] = not (
        set(places(model).values()) & set(places(c).values())
        or set(places(model, "_buffers").values()) & set(places(c, "_buffers").values())
    )
    out["type"] = type(c).__name__.split("_")[0]
    if kind == "tied":
        out["tied_is"] = c.encode.weight is c.decode.weight is c.embedding
    return out


MOVES = {
    "float": lambda m, L: m.float(),
    "double": lambda m, L: m.double(),
    "to_float64": lambda m, L: m.to(L.float64),
    "double_then_float": lambda m, L: m.double().float(),
}


def move_case(kind, how, L):
    model = build(kind, L)
    before = describe(model, L)
    old_values = values(model)
    result = MOVES[how](model, L)
    out = describe(model, L)
    out["returns_self"] = result is model
    out["ties_kept"] = out["ties"] == before["ties"] and out["count"] == before["count"]
    out["requires_grad_kept"] = [p[1] for p in out["params"]] == [p[1] for p in before["params"]]
    out["dtypes"] = [L.dtype_name(p) for p in model.parameters()]
    out["values_kept"] = all(
        all(abs(a - b) < 1e-6 for a, b in zip(_flat(old_values[k]), _flat(v)))
        for k, v in values(model).items()
    )
    if kind == "tied":
        out["tied_is"] = model.encode.weight is model.decode.weight is model.embedding
    return out


def _flat(v):
    if isinstance(v, list):
        for x in v:
            yield from _flat(x)
    else:
        yield v


def four(L, cls):
    nn = L.nn
    items = [nn.ReLU(), nn.Linear(2, 2), nn.Identity(), nn.Sigmoid()]
    return (nn.Sequential(*items) if cls == "Sequential" else nn.ModuleList(items)), items


SLICES = {
    "1:3": slice(1, 3),
    "::2": slice(None, None, 2),
    "-2:": slice(-2, None),
    ":0": slice(None, 0),
    "::-1": slice(None, None, -1),
    ":": slice(None),
}
INDICES = [0, 3, -1, -4, 4, -5, 100]


def slice_case(cls, key, L):
    seq, items = four(L, cls)
    part = seq[SLICES[key]]
    return {
        "type": type(part).__name__,
        "names": list(part._modules),
        "children": [items.index(m) for m in part],
        "len": len(part),
    }


def index_case(cls, index, L):
    seq, items = four(L, cls)
    try:
        return ("ok", items.index(seq[index]))
    except Exception as e:  # the kind of error is the outcome
        return (type(e).__name__, str(e).strip("'\""))


def holder(L):
    """A module with a parameter "w", a buffer "buf", a child "sub", a plain
    attribute "plain"."""
    nn = L.nn
    m = nn.Module()
    m.w = nn.Parameter(L.lib.ones(2))
    m.register_buffer("buf", L.lib.zeros(2))
    m.sub = nn.Linear(2, 2)
    m.plain = 3
    return m


def _p(L):
    return L.nn.Parameter(L.lib.ones(2))


def _t(L):
    return L.lib.ones(2)


def _m(L):
    return L.nn.Identity()


# name, what registers it -> the refused name (None: accepted, as PyTorch accepts it)
REGISTRATIONS = {
    "buffer_over_parameter": ("w", lambda m, L: m.register_buffer("w", _t(L))),
    "buffer_over_module": ("sub", lambda m, L: m.register_buffer("sub", _t(L))),
    "buffer_over_attribute": ("plain", lambda m, L: m.register_buffer("plain", _t(L))),
    "buffer_dotted": ("a.b", lambda m, L: m.register_buffer("a.b", _t(L))),
    "buffer_empty": ("", lambda m, L: m.register_buffer("", _t(L))),
    "buffer_not_a_string": (1, lambda m, L: m.register_buffer(1, _t(L))),
    "parameter_over_buffer": ("buf", lambda m, L: m.register_parameter("buf", _p(L))),
    "parameter_over_module": ("sub", lambda m, L: m.register_parameter("sub", _p(L))),
    "parameter_over_attribute": ("plain", lambda m, L: m.register_parameter("plain", _p(L))),
    "parameter_over_method": ("forward", lambda m, L: m.register_parameter("forward", None)),
    "parameter_dotted": ("a.b", lambda m, L: m.register_parameter("a.b", _p(L))),
    "parameter_empty": ("", lambda m, L: m.register_parameter("", _p(L))),
    "parameter_not_a_string": (1, lambda m, L: m.register_parameter(1, _p(L))),
    "parameter_a_plain_tensor": ("x", lambda m, L: m.register_parameter("x", _t(L))),
    "module_over_parameter": ("w", lambda m, L: m.add_module("w", _m(L))),
    "module_over_buffer": ("buf", lambda m, L: m.add_module("buf", _m(L))),
    "module_over_attribute": ("plain", lambda m, L: m.add_module("plain", _m(L))),
    "module_over_method": ("forward", lambda m, L: m.add_module("forward", _m(L))),
    "module_over_training": ("training", lambda m, L: m.add_module("training", _m(L))),
    "module_dotted": ("a.b", lambda m, L: m.add_module("a.b", _m(L))),
    "module_empty": ("", lambda m, L: m.add_module("", _m(L))),
    "module_not_a_string": (1, lambda m, L: m.add_module(1, _m(L))),
    "module_not_a_module": ("x", lambda m, L: m.add_module("x", 3)),
    # accepted: a new name, or the same name in the same table again
    "parameter_again": (None, lambda m, L: m.register_parameter("w", _p(L))),
    "parameter_new": (None, lambda m, L: m.register_parameter("x", _p(L))),
    "parameter_new_none": (None, lambda m, L: m.register_parameter("x", None)),
    "buffer_again": (None, lambda m, L: m.register_buffer("buf", _t(L))),
    "buffer_new": (None, lambda m, L: m.register_buffer("x", None)),
    "module_again": (None, lambda m, L: m.add_module("sub", _m(L))),
    "module_new": (None, lambda m, L: m.add_module("x", None)),
}


def registration_case(key, L):
    m = holder(L)
    before = (list(m._parameters), list(m._buffers), list(m._modules), m.plain)
    try:
        REGISTRATIONS[key][1](m, L)
    except Exception as e:  # the kind of error is the outcome
        after = (list(m._parameters), list(m._buffers), list(m._modules), m.plain)
        return (type(e).__name__, str(e.args[0] if e.args else e), after == before)
    return ("ok",)


def outcomes(L):
    """Every enumerated case's outcome for library ``L``."""
    out = {}
    for kind in KINDS:
        for how in COPIES:
            out[f"copy-{kind}-{how}"] = copy_case(kind, how, L)
        for how in MOVES:
            out[f"move-{kind}-{how}"] = move_case(kind, how, L)
    for cls in ("Sequential", "ModuleList"):
        for key in SLICES:
            out[f"slice-{cls}-{key}"] = slice_case(cls, key, L)
        for index in INDICES:
            out[f"index-{cls}-{index}"] = index_case(cls, index, L)
    for key in REGISTRATIONS:
        out[f"register-{key}"] = registration_case(key, L)
    return out


# ---------------------------------------------------------------- lamina's behaviour


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("kind", KINDS)
def test_copies_keep_parameters_buffers_and_ties(kind, how):
    out = copy_case(kind, how, LAMINA)
    assert out["all_parameters"], out["params"]
    assert out["same_as_original"]  # names, requires_grad, buffers, ties, count
    assert out["values_kept"] and out["shares_nothing"]
    assert out["type"] == type(build(kind, LAMINA)).__name__.split("_")[0]
    if kind == "tied":
        assert out["tied_is"] and out["count"] == 3  # embedding, frozen, encode.bias
        assert [rg for _, rg in out["params"]] == [True, False, True]  # own ones first
    if kind == "batchnorm2d":
        assert out["buffers"] == [
            ("running_mean", "float32"),
            ("running_var", "float32"),
            ("num_batches_tracked", "int64"),
        ]
        assert [rg for _, rg in out["params"]] == [True, False]
    if kind == "modulelist":
        assert out["ties"]["2.weight"] == out["ties"]["0.weight"]


def test_a_copied_model_trains_on_its_own():
    model = build("tied", LAMINA)
    c = copy.deepcopy(model)
    lm.sum(c(lm.ones(2, 3))).backward()
    assert model.embedding.grad is None and c.embedding.grad is not None
    assert c.frozen.grad is None  # still frozen


def test_a_deep_copy_leaves_the_parameters_gradients_behind():
    """As PyTorch's Parameter.__deepcopy__: TransformerEncoder's copies of a layer that
    had been trained started with its gradients, and the first step used them."""
    layer = lm.nn.TransformerEncoderLayer(8, 2, 16, 0.0)
    lm.sum(layer(lm.ones((3, 2, 8)))).backward()
    assert all(p.grad is not None for p in layer.parameters())
    encoder = lm.nn.TransformerEncoder(layer, 2)
    assert all(p.grad is None for p in encoder.parameters())
    assert all(p.grad is not None for p in layer.parameters())  # the original keeps its own
    w = lm.asarray([1.0, 2.0], requires_grad=True)  # a plain tensor's .grad is copied
    lm.sum(w * w).backward()
    assert copy.deepcopy(w).grad.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("how", [copy.deepcopy, roundtrip], ids=list(COPIES))
def test_a_parameter_alone_copies_as_a_parameter(how):
    for requires_grad in (True, False):
        p = lm.nn.Parameter(lm.ones(2), requires_grad=requires_grad)
        c = how(p)
        assert isinstance(c, lm.nn.Parameter) and c.requires_grad is requires_grad
    assert not isinstance(how(lm.ones(2)), lm.nn.Parameter)  # a plain tensor stays plain


@pytest.mark.parametrize("how", list(MOVES))
@pytest.mark.parametrize("kind", KINDS)
def test_dtype_moves_keep_ties(kind, how):
    out = move_case(kind, how, LAMINA)
    assert out["returns_self"] and out["all_parameters"]
    assert out["ties_kept"] and out["requires_grad_kept"] and out["values_kept"]
    want = "float32" if how in ("float", "double_then_float") else "float64"
    assert set(out["dtypes"]) == {want}
    assert dict(out["buffers"]).get("num_batches_tracked", "int64") == "int64"
    if kind == "tied":
        assert out["tied_is"] and out["count"] == 3


def test_a_device_move_keeps_parameters_buffers_and_ties():
    """As a dtype move: each distinct parameter moved once, a Parameter still, tied
    weights one tensor; buffers move too (the meta device: shapes without values)."""
    model = lm.nn.Sequential(lm.nn.Conv2d(3, 3, 1), lm.nn.BatchNorm2d(3), lm.nn.Conv2d(3, 3, 1))
    model[2].weight = model[0].weight
    assert model.to("meta") is model
    weights = [model[0].weight, model[2].weight]
    assert weights[0] is weights[1] and len(list(model.parameters())) == 5
    for p in model.parameters():
        assert isinstance(p, lm.nn.Parameter) and p.requires_grad and p.device == "meta"
    assert {b.device.name for b in model.buffers()} == {"meta"}


@pytest.mark.parametrize("key", list(SLICES))
@pytest.mark.parametrize("cls", ["Sequential", "ModuleList"])
def test_slices_keep_names_and_types(cls, key):
    out = slice_case(cls, key, LAMINA)
    chosen = list(range(4))[SLICES[key]]
    assert out["type"] == cls and out["children"] == chosen and out["len"] == len(chosen)
    if cls == "Sequential":  # the children's own names
        assert out["names"] == [str(i) for i in chosen]
    else:  # a ModuleList numbers its modules
        assert out["names"] == [str(i) for i in range(len(chosen))]


@pytest.mark.parametrize("index", INDICES)
@pytest.mark.parametrize("cls", ["Sequential", "ModuleList"])
def test_indices(cls, index):
    out = index_case(cls, index, LAMINA)
    if -4 <= index < 4:
        assert out == ("ok", index % 4)
    else:
        assert out == ("IndexError", f"index {index} is out of range")


def test_a_sequential_slice_keeps_the_fusion_setting_and_runs():
    seq = lm.nn.Sequential(lm.nn.Linear(2, 2), lm.nn.ReLU(), lm.nn.Linear(2, 2))
    seq.fuse = False
    part = seq[1:]
    assert list(part._modules) == ["1", "2"] and part.fuse is False
    assert part(lm.ones(1, 2)).shape == (1, 2)
    assert part[0] is seq[1] and part[-1] is seq[2]


@pytest.mark.parametrize("key", list(REGISTRATIONS))
def test_registrations_refuse_bad_names(key):
    name, _ = REGISTRATIONS[key]
    out = registration_case(key, LAMINA)
    if name is None:
        assert out == ("ok",)
        return
    error, message, unchanged = out
    assert unchanged  # a refused registration changes nothing
    if key.endswith(("not_a_string", "a_plain_tensor", "not_a_module")):
        assert error == "TypeError"
    else:
        assert error == "KeyError"
        assert (repr(name) in message) if name else ('""' in message)


# ---------------------------------------------------------------- PyTorch's behaviour


def test_pytorch_behaves_the_same_in_every_case():
    torch = pytest.importorskip("torch")
    want = outcomes(Lib("torch", torch))
    got = outcomes(LAMINA)
    assert want.keys() == got.keys()
    differ = {}
    for key, w in want.items():
        g = got[key]
        if key.startswith("register-") and len(w) == 3:  # the error kind, not its words
            w, g = (w[0], w[2]), (g[0], g[2])
        if key.startswith("index-") and w[0] != "ok":
            w, g = w[0], g[0]
        if w != g:
            differ[key] = (g, w)
    assert not differ, differ
