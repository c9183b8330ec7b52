"""lamina.save / lamina.load: round trips of tensors, state dicts and checkpoints, and a
file that is damaged, tampered with, truncated or not lamina's always refused with a
"load:" error, never loaded as something else."""

import hashlib
import io
import json
import math
import os
import pathlib
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

import lamina as lm
from lamina.dispatch.dtypes import BY_NAME
from lamina.serialization import HEADER, VERSION, LoadError, load, save


def round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    save(obj, buffer)
    buffer.seek(0)
    return load(buffer, **load_kwargs)


def saved(obj) -> bytes:
    buffer = io.BytesIO()
    save(obj, buffer)
    return buffer.getvalue()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def rezip(files: dict[str, bytes]) -> bytes:
    """An archive with these members, their CRCs correct: tampering zipfile cannot see."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def edited_header(data: bytes, edit) -> bytes:
    files = members(data)
    header = json.loads(files[HEADER])
    edit(header)
    files[HEADER] = json.dumps(header).encode()
    return rezip(files)


def refused(data: bytes, match: str = "") -> LoadError:
    with pytest.raises(LoadError, match=match) as info:
        load(io.BytesIO(data))
    assert str(info.value).startswith("load:")
    return info.value


def same(a, b) -> bool:
    """Equal values and types, NaN equal to NaN, tensors by dtype, shape and values."""
    if isinstance(a, lm.Tensor):
        return (
            isinstance(b, lm.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a.numpy(), b.numpy(), equal_nan=a.dtype.kind in "fc")
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    return a == b


def nested(depth):
    """Lists and dicts ``depth`` deep, the deepest save takes."""
    x = {}
    for i in range(depth - 1):
        x = [x] if i % 2 else {"k": x}
    return x


def values(dtype, shape=(2, 3)):
    n = math.prod(shape)
    a = np.arange(n).reshape(shape) - 2
    if dtype.kind == "b":
        return a % 2 == 0
    if dtype.kind == "c":
        return (a + 0.5j * (a - 1)).astype(dtype.np)
    if dtype.kind == "f":
        return (a / 3).astype(dtype.np)
    return a.astype(dtype.np) if dtype.kind == "i" else (a + 2).astype(dtype.np)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_dtype_round_trips(name):
    t = lm.asarray(values(BY_NAME[name]))
    assert same(round_trip(t), t)


def test_extreme_values_round_trip():
    for dtype in (lm.float32, lm.float64, lm.complex64):
        t = lm.asarray(np.array([np.nan, np.inf, -np.inf, -0.0, 5e-45], dtype=dtype.np))
        assert same(round_trip(t), t)
    t = lm.asarray(np.array([np.iinfo(np.uint64).max, 0], dtype=np.uint64))
    assert round_trip(t).tolist() == t.tolist()


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 1, 3)])
def test_scalar_and_empty_shapes(shape):
    for dtype in (lm.float32, lm.bool, lm.complex128):
        t = lm.asarray(values(dtype, shape))
        back = round_trip(t)
        assert same(back, t) and back.shape == shape


def test_views_save_their_values():
    base = lm.asarray(np.arange(24.0).reshape(4, 6))
    views = [base.mT, base[::2, 1::3], base[::-1], base[::-1, ::-2], base[1]]
    for view, back in zip(views, round_trip(views)):
        assert same(back, view) and back.is_contiguous
        assert not np.shares_memory(back.numpy(), base.numpy())


def test_loaded_tensors_are_writable_and_independent_of_the_file():
    t = lm.asarray([1.0, 2.0])
    back = round_trip(t)
    back[0] = 5.0
    assert back.tolist() == [5.0, 2.0] and t.tolist() == [1.0, 2.0]


def test_a_tensor_twice_loads_as_one_tensor():
    t = lm.asarray([1.0, 2.0])
    back = round_trip({"a": t, "b": [t, (t,)]})
    assert back["a"] is back["b"][0] is back["b"][1][0]
    assert len(json.loads(members(saved([t, t]))[HEADER])["tensors"]) == 1


def test_tied_parameters_stay_tied():
    w = lm.nn.Parameter(lm.asarray(values(lm.float32)))
    back = round_trip({"encoder": w, "decoder": w})
    assert back["encoder"] is back["decoder"]
    assert isinstance(back["encoder"], lm.nn.Parameter)


def test_views_of_the_same_memory_load_sharing_memory():
    # Module.state_dict() gives tied weights as two detached tensors of one storage
    w = lm.nn.Parameter(lm.asarray(values(lm.float32)))
    a, b = w.detach(), w.detach()
    data = saved({"a": a, "b": b, "w": w})
    assert len([n for n in members(data) if n.startswith("lamina/data/")]) == 1
    back = load(io.BytesIO(data))
    assert back["a"] is not back["b"]
    assert np.shares_memory(back["a"].numpy(), back["b"].numpy())
    assert np.shares_memory(back["a"].numpy(), back["w"].numpy())
    assert isinstance(back["w"], lm.nn.Parameter) and not isinstance(back["a"], lm.nn.Parameter)


def test_requires_grad_and_parameters_are_kept():
    p = lm.nn.Parameter(lm.asarray([1.0, 2.0], dtype=lm.float32))
    frozen = lm.nn.Parameter(lm.asarray([1.0]), requires_grad=False)
    leaf = lm.asarray([3.0]).requires_grad_()
    nonleaf = leaf * 2
    plain = lm.asarray([4.0])
    back = round_trip([p, frozen, leaf, nonleaf, plain])
    assert [isinstance(t, lm.nn.Parameter) for t in back] == [True, True, False, False, False]
    assert [t.requires_grad for t in back] == [True, False, True, True, False]
    assert all(t.is_leaf and t.grad is None for t in back)
    lm.sum(back[0] * back[0]).backward()
    assert back[0].grad.tolist() == [2.0, 4.0]


def test_python_values_and_containers():
    obj = OrderedDict(
        [
            ("z", None),
            ("a", [True, False, 0, -7, 2**63, -(2**63) - 1, 3**200, -(5**90)]),
            (3, (1.5, -0.0, math.inf, -math.inf, math.nan, 1e-310, 1.7976931348623157e308)),
            (-1, [complex(1, -2), complex(math.nan, math.inf), 0j]),
            ((1, "x"), {"é ∑ \U0001f600 \ud800": b"\x00\xff bytes", "": ""}),
            (None, [lm.float32, lm.bool, lm.complex64, [], (), {}, OrderedDict()]),
            (2.5, np.arange(6, dtype=np.int16).reshape(2, 3)),
            (True, {1: {2: {3: [[[]]]}}}),
            (False, nested(99)),
        ]
    )
    back = round_trip(obj)
    assert type(back) is OrderedDict and list(back) == list(obj)
    assert same(back, obj)
    assert type(round_trip({"b": 1, "a": 2})) is dict
    assert list(round_trip({"b": 1, "a": 2, 0: 3})) == ["b", "a", 0]
    assert round_trip(None) is None and round_trip("x") == "x"


def test_numpy_arrays_round_trip_as_arrays():
    a = np.arange(6.0).reshape(2, 3)[:, ::-1]
    back = round_trip({"a": a, "again": a, "t": lm.asarray(a)})
    assert type(back["a"]) is np.ndarray and same(back["a"], a) and back["a"] is back["again"]
    assert isinstance(back["t"], lm.Tensor)


def test_module_state_dict_loads_into_a_new_module(tmp_path):
    lm.manual_seed(0)
    model = lm.nn.Linear(3, 2, dtype=lm.float32)
    save(model.state_dict(), tmp_path / "model.lm")
    other = lm.nn.Linear(3, 2, dtype=lm.float32)
    other.load_state_dict(load(tmp_path / "model.lm"))
    x = lm.asarray(values(lm.float32, (4, 3)))
    assert same(other(x), model(x))
    assert same(other.weight, model.weight) and isinstance(other.weight, lm.nn.Parameter)


def test_optimizer_like_state_and_rng_state():
    w = lm.nn.Parameter(lm.asarray([1.0, 2.0]))
    checkpoint = {
        "epoch": 7,
        "model": OrderedDict(w=w),
        "optimizer": {
            "state": {
                0: {"step": lm.asarray(3.0), "exp_avg": lm.zeros(2), "exp_avg_sq": lm.ones(2)},
                1: {"momentum_buffer": None},
            },
            "param_groups": [
                {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0, 1], "amsgrad": False}
            ],
        },
        "rng": lm.random.Generator().manual_seed(123).get_state(),  # 128-bit ints
    }
    back = round_trip(checkpoint)
    assert same(back, checkpoint)
    assert list(back["optimizer"]["state"]) == [0, 1]
    generator = lm.random.Generator()
    generator.set_state(back["rng"])
    assert same(lm.randn(3, generator=generator), lm.randn(3, generator=checkpoint_rng(123)))


def checkpoint_rng(seed):
    return lm.random.Generator().manual_seed(seed)


def test_paths_and_file_objects(tmp_path):
    t = lm.asarray(values(lm.int32))
    save(t, str(tmp_path / "a.lm"))
    save(t, tmp_path / "b.lm")
    with open(tmp_path / "c.lm", "wb") as out:
        save(t, out)
    for name in ("a.lm", "b.lm", "c.lm"):
        assert same(load(str(tmp_path / name)), t)
        assert same(load(tmp_path / name), t)
        with open(tmp_path / name, "rb") as source:
            assert same(load(source), t)
    assert (tmp_path / "a.lm").read_bytes() == saved(t)  # the same object, the same bytes

    class Pipe:  # a stream that cannot seek
        def __init__(self, data):
            self.source = io.BytesIO(data)

        def read(self, n=-1):
            return self.source.read(n)

    assert same(load(Pipe(saved(t))), t)
    with pytest.raises(TypeError, match="binary"):
        load(io.StringIO("text"))
    with pytest.raises(TypeError, match="binary"):
        save(t, io.StringIO())


def test_saving_a_path_is_atomic(tmp_path, monkeypatch):
    from lamina import serialization

    path = tmp_path / "checkpoint.lm"
    save({"v": 1}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        save({"v": 2, "bad": object()}, path)  # refused before the file is touched

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(serialization, "_write_values", crash)
    with pytest.raises(KeyboardInterrupt):
        save({"v": lm.zeros(3)}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["checkpoint.lm"]
    monkeypatch.undo()
    save({"v": 3}, path)
    assert load(path) == {"v": 3} and os.listdir(tmp_path) == ["checkpoint.lm"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_map_location():
    t = lm.asarray([1.0, 2.0]).requires_grad_()
    for where in (None, "cpu", lm.Device("cpu"), {"cpu": "cpu"}, lambda x, saved: x):
        back = round_trip(t, map_location=where)
        assert back.device == "cpu" and back.requires_grad and same(back, t)
    with pytest.raises(ValueError, match="unknown device 'cuda'"):
        round_trip(t, map_location="cuda")
    with pytest.raises(TypeError, match="map_location"):
        round_trip(t, map_location=3)


def test_tensors_of_another_device():
    if "counting" not in lm.dispatch.keys.devices():
        pytest.skip("the example backend's 'counting' device is not installed")
    p = lm.nn.Parameter(lm.asarray([1.0, 2.0], device="counting"))
    data = saved({"p": p, "again": p})
    back = load(io.BytesIO(data))  # back where it was saved
    assert back["p"].device == "counting" and back["p"] is back["again"]
    assert isinstance(back["p"], lm.nn.Parameter) and back["p"].is_leaf
    assert load(io.BytesIO(data), map_location="cpu")["p"].device == "cpu"
    cpu = lm.asarray([3.0]).requires_grad_()
    moved = round_trip(cpu, map_location="counting")
    assert moved.device == "counting" and moved.requires_grad and moved.is_leaf
    seen = []
    round_trip(p, map_location=lambda x, saved: seen.append((x.device.name, saved)) or x)
    assert seen == [("cpu", "counting")]


# ---------------------------------------------------------------- refused on save


class Head:
    pass


def test_unsupported_objects_are_named_with_their_path():
    with pytest.raises(TypeError, match=r"type Head at \['model'\]\['head'\]"):
        save({"model": {"head": Head()}}, io.BytesIO())
    with pytest.raises(TypeError, match=r"type function at \[0\]\[1\]"):
        save([(1, lambda: 0)], io.BytesIO())
    with pytest.raises(TypeError, match=r"Linear at the top level.*state_dict\(\)"):
        save(lm.nn.Linear(2, 2, dtype=lm.float32), io.BytesIO())
    with pytest.raises(TypeError, match=r"float64 at \['lr'\].*item\(\)"):
        save({"lr": np.float64(0.1)}, io.BytesIO())
    with pytest.raises(TypeError, match="defaultdict .*plain dict"):
        save(__import__("collections").defaultdict(list), io.BytesIO())
    with pytest.raises(TypeError, match="sparse tensor at"):
        save([lm.asarray([[1.0, 0.0]]).to_sparse()], io.BytesIO())
    with pytest.raises(TypeError, match="dtype float16"):
        save(np.zeros(2, np.float16), io.BytesIO())
    with pytest.raises(TypeError, match=r"dict key of type Head at \['a'\]"):
        save({"a": {Head(): 1}}, io.BytesIO())
    loop = []
    loop.append({"x": loop})
    with pytest.raises(ValueError, match=r"contains itself at \[0\]\['x'\]"):
        save(loop, io.BytesIO())
    deep = []
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ValueError, match=r"nested more than 100 deep at \[0\]\[0\]\[0\]"):
        save(deep, io.BytesIO())


# ---------------------------------------------------------------- refused on load


def test_weights_only_changes_nothing_the_format_holds_data_only():
    for flag in (True, False, None):
        assert same(round_trip(lm.zeros(2), weights_only=flag), lm.zeros(2))
    with pytest.raises(TypeError, match="weights_only must be a bool or None"):
        round_trip(lm.zeros(2), weights_only="yes")


def test_not_lamina_files():
    refused(b"", "empty")
    refused(b"hello, this is text\n" * 10, "not a lamina file .*not a ZIP")
    refused(rezip({"other.txt": b"x"}), "not a lamina file .*without lamina/header.json")
    refused(rezip({HEADER: b'{"format": "other"}'}), "not a lamina file")
    refused(rezip({HEADER: b"\x80 not json"}), "damaged")


def test_every_truncation_is_refused():
    data = saved({"w": lm.asarray(values(lm.float32)), "n": 1})
    for n in range(1, len(data)):
        refused(data[:n], "damaged|not a lamina file")


def test_every_flipped_byte_is_refused_or_harmless():
    obj = {"w": lm.asarray(values(lm.float32, (2, 2))), "b": lm.asarray([True]), "n": [1, 2.5]}
    data = saved(obj)
    loaded = 0
    for i in range(len(data)):
        changed = bytearray(data)
        changed[i] ^= 0x55
        try:
            back = load(io.BytesIO(bytes(changed)))
        except LoadError as exc:
            assert str(exc).startswith("load:")
        else:  # a ZIP timestamp or an unused field: harmless
            loaded += 1
            assert same(back, obj), i
    assert loaded < len(data) // 4


def test_changed_values_fail_their_sha256():
    files = members(saved(lm.asarray(values(lm.float64))))
    files["lamina/data/0"] = bytes([files["lamina/data/0"][0] ^ 1]) + files["lamina/data/0"][1:]
    refused(rezip(files), "do not match their sha256")


def test_a_header_claiming_a_bigger_shape_is_refused_before_allocating():
    data = saved(lm.asarray(values(lm.float32)))

    def shape(new):
        return lambda h: h["tensors"]["0"].update(shape=new)

    refused(edited_header(data, shape([3, 3])), r"needs 36 bytes, but lamina/data/0 holds 24")
    refused(edited_header(data, shape([2**40, 2**40])), "needs")  # no exabytes asked for
    refused(edited_header(data, shape([-2, -3])), "invalid shape")
    refused(edited_header(data, shape([2.0, 3])), "invalid shape")
    refused(edited_header(data, lambda h: h["tensors"]["0"].update(dtype="float16")), "dtype")
    refused(edited_header(data, lambda h: h["tensors"]["0"].update(dtype="float64")), "needs")
    refused(edited_header(data, lambda h: h["tensors"]["0"].update(file="../etc")), "missing")
    refused(edited_header(data, lambda h: h.update(object={"tensor": "1"})), "not in the file")
    refused(edited_header(data, lambda h: h.update(object={"pickle": "x"})), "unexpected tag")
    refused(edited_header(data, lambda h: h.update(object={"dict": [[[1], 2]]})), "unexpected")
    refused(edited_header(data, lambda h: h["tensors"]["0"].update(extra=1)), "keys")


def test_a_member_claiming_more_bytes_than_the_file_holds_is_refused():
    data = bytearray(saved(lm.zeros(4)))
    entry = data.find(b"PK\x01\x02")  # the central directory's first entry: lamina/data/0
    assert data[entry + 46 : entry + 59] == b"lamina/data/0"
    data[entry + 20 : entry + 28] = (2**31 - 1).to_bytes(4, "little") * 2  # its two sizes
    refused(bytes(data), "claim more bytes than the file holds")


def test_bool_values_other_than_0_and_1_are_refused():
    files = members(saved(lm.asarray([True, False])))
    files["lamina/data/0"] = b"\x01\x02"
    header = json.loads(files[HEADER])
    header["tensors"]["0"]["sha256"] = hashlib.sha256(b"\x01\x02").hexdigest()
    files[HEADER] = json.dumps(header).encode()
    refused(rezip(files), "not 0 or 1")


def test_a_stream_at_its_end_says_to_seek():
    buffer = io.BytesIO()
    save([1], buffer)
    with pytest.raises(LoadError, match=r"f\.seek\(0\)"):
        load(buffer)


def test_a_newer_version_is_refused_naming_both():
    data = edited_header(saved([1]), lambda h: h.update(version=VERSION + 1))
    refused(data, f"version {VERSION + 1}.*reads version {VERSION}.*upgrade")
    refused(edited_header(saved([1]), lambda h: h.update(version="1")), "version")


def test_compressed_members_are_refused():
    files = members(saved(lm.zeros(1000)))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    refused(buffer.getvalue(), "compressed")


def test_pytorch_files_are_refused_with_a_way_to_convert(tmp_path):
    torch = pytest.importorskip("torch")
    state = {"weight": torch.ones(2, 3)}
    torch.save(state, tmp_path / "new.pt")
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    for name in ("new.pt", "old.pt"):
        with pytest.raises(LoadError, match=r"^load: this is a PyTorch file.*torch\.load"):
            load(tmp_path / name)


def test_missing_files_raise_as_open_does(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.lm")
    with pytest.raises(FileNotFoundError):
        save(1, pathlib.Path(tmp_path / "no" / "such" / "dir.lm"))
