"""``save(obj, f)`` and ``load(f)``: tensors, state dicts and checkpoints in a file that
loading never runs code from, for scripts written with ``torch.save`` / ``torch.load``.

What can be saved: tensors (their values, dtype, shape, ``requires_grad`` and whether
they are an ``nn.Parameter``; not ``.grad``), NumPy arrays of lamina's dtypes, lamina
dtypes, ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, and
lists, tuples, dicts and OrderedDicts of these. A tensor found twice in the object (tied
weights) is stored once and loads as one tensor; tensors that are the same view of the
same memory (``state_dict()`` entries of tied weights) load sharing memory. Other shared
objects (a list found twice) load as separate copies.

Format, version 1
-----------------
A ZIP archive whose members are stored, not compressed:

``lamina/header.json``
    UTF-8 JSON: ``{"format": "lamina.save", "version": 1, "object": VALUE,
    "tensors": {ID: TENSOR, ...}}``.
``lamina/data/N``
    The elements of one tensor in C order, little-endian, and nothing else.

A VALUE is JSON ``null``, ``true``, ``false``, a string, an int (a number without
fraction or exponent), a finite float (a number with one), a list of VALUEs, or an
object of exactly one key, which says what it holds::

    {"tensor": ID}                    a tensor, by its id in "tensors"
    {"ndarray": ID}                   a NumPy array, likewise
    {"tuple": [VALUE, ...]}
    {"dict": [[KEY, VALUE], ...]}     in order; a KEY is a VALUE other than a list,
    {"ordered_dict": [[KEY, VALUE], ...]}   dict, tensor or array
    {"int": "-0x1f"}                  an int outside [-2**63, 2**63), in hex
    {"float": "nan" | "inf" | "-inf"}
    {"complex": [FLOAT, FLOAT]}       real and imaginary parts, floats as above
    {"bytes": "BASE64"}
    {"dtype": "float32"}              a lamina dtype, by name

A TENSOR is ``{"dtype": NAME, "shape": [INT, ...], "file": "lamina/data/N", "sha256":
HEX, "requires_grad": BOOL, "parameter": BOOL, "device": NAME}``: the file holds
exactly prod(shape) * itemsize bytes whose SHA-256 is ``sha256``; ``device`` is where
the tensor was when saved. Tensors may share a file (then they share dtype, shape and
sha256). A reader refuses a file whose format differs, whose version is newer than it
knows, whose header has a key or tag it does not know, or with a member that is
compressed or encrypted, whose size disagrees with the header, or whose bytes fail their
sha256; members may claim no more bytes in all than the file holds, and sizes are checked
before anything is allocated. Containers nest at most 100 deep.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import math
import os
import re
import secrets
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from lamina.dispatch import keys
from lamina.dispatch.devices import Device
from lamina.dispatch.dtypes import BY_NAME, DType
from lamina.dispatch.tensor import Tensor, from_array
from lamina.nn.modules import Module, Parameter

__all__ = ["LoadError", "load", "save"]

FORMAT = "lamina.save"
VERSION = 1
HEADER = "lamina/header.json"
DATA = "lamina/data/"

_EPOCH = (1980, 1, 1, 0, 0, 0)  # ZIP's earliest date: the same object gives the same bytes
_CHUNK = 1 << 24
_INT64 = 1 << 63
_MAX_DIMS = 64
_MAX_DEPTH = 100  # nesting any reader's JSON parser and stack take with room to spare
_HEX_INT = re.compile(r"-?0x[0-9a-f]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TENSOR_KEYS = {"dtype", "shape", "file", "sha256", "requires_grad", "parameter", "device"}
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

PathLike = str | bytes | os.PathLike
MapLocation = None | str | Device | Mapping | Callable[[Tensor, str], Tensor]


class LoadError(ValueError):
    """``load`` was given a file it cannot read: damaged, truncated, or not a lamina
    file."""


def _damaged(detail: str) -> LoadError:
    return LoadError(f"load: the file is damaged or not a lamina file: {detail}")


# ---------------------------------------------------------------- save


def save(obj: Any, f: PathLike | BinaryIO) -> None:
    """Write ``obj`` (a tensor, a state dict, a checkpoint dict...) to ``f``, a path or
    a binary file object. A path is written whole or not at all: a failure mid-save
    leaves any earlier file under that name as it was."""
    writer = _Writer()
    # the whole object is checked before the file is touched: a TypeError writes nothing
    encoded = writer.encode(obj, ())
    header = {"format": FORMAT, "version": VERSION, "object": encoded, "tensors": writer.tensors}
    if isinstance(f, (str, bytes, os.PathLike)):
        _write_atomically(os.fsdecode(f), lambda out: writer.write(out, header))
    else:
        if isinstance(f, io.TextIOBase) or not hasattr(f, "write"):
            raise TypeError(
                f"save: f must be a path or a file opened in binary mode ('wb'), "
                f"got {type(f).__name__}"
            )
        writer.write(f, header)


def _where(path: tuple) -> str:
    return "at " + "".join(f"[{p!r}]" for p in path) if path else "at the top level"


def _unsupported(x: Any, path: tuple) -> TypeError:
    kind = type(x).__name__
    if isinstance(x, Module) or hasattr(x, "state_dict"):
        hint = f"save its state_dict() instead (and load it with {kind}.load_state_dict)"
    elif isinstance(x, np.generic):
        hint = "save x.item(), a Python number, instead"
    elif isinstance(x, (dict, list, tuple)):  # a defaultdict, a namedtuple
        hint = "convert it to a plain dict, list or tuple first"
    else:
        hint = "convert it to one of these, or save its state_dict() if it has one"
    return TypeError(
        f"save: cannot save object of type {kind} {_where(path)}: lamina saves tensors, "
        "NumPy arrays, dtypes, None, bool, int, float, complex, str, bytes, and lists, "
        f"tuples, dicts and OrderedDicts of them; {hint}"
    )


def _float(x: float) -> Any:
    return x if math.isfinite(x) else {"float": "nan" if math.isnan(x) else repr(x)}


class _Writer:
    """Turns an object into the header's VALUE, collecting the tensors it holds."""

    def __init__(self) -> None:
        self.tensors: dict[str, dict] = {}
        self.ids: dict[int, str] = {}  # id(tensor or array) -> its id in the header
        self.files: dict[tuple, str] = {}  # (address, shape, strides, dtype) -> file
        self.arrays: dict[str, np.ndarray] = {}  # file -> the values to write
        self.alive: list[Any] = []  # ids above stay unique while these are referenced
        self.open: set[int] = set()  # containers being encoded, to find cycles

    def encode(self, x: Any, path: tuple) -> Any:
        kind = type(x)
        if x is None or kind is bool or kind is str:
            return x
        if kind is int:
            return x if -_INT64 <= x < _INT64 else {"int": hex(x)}
        if kind is float:
            return _float(x)
        if kind is complex:
            return {"complex": [_float(x.real), _float(x.imag)]}
        if kind is bytes:
            return {"bytes": base64.b64encode(x).decode("ascii")}
        if isinstance(x, DType):
            return {"dtype": x.name}
        if isinstance(x, Tensor):
            return {"tensor": self._tensor(x, path)}
        if kind is np.ndarray:
            return {"ndarray": self._ndarray(x, path)}
        if kind in (list, tuple, dict, OrderedDict):
            return self._container(x, path)
        raise _unsupported(x, path)

    def _container(self, x: Any, path: tuple) -> Any:
        if id(x) in self.open:
            raise ValueError(f"save: the object contains itself {_where(path)}")
        if len(path) >= _MAX_DEPTH:
            raise ValueError(
                f"save: containers are nested more than {_MAX_DEPTH} deep {_where(path[:3])}..."
            )
        self.open.add(id(x))
        try:
            if isinstance(x, dict):
                tag = "ordered_dict" if type(x) is OrderedDict else "dict"
                return {
                    tag: [[self._key(k, path), self.encode(v, (*path, k))] for k, v in x.items()]
                }
            items = [self.encode(v, (*path, i)) for i, v in enumerate(x)]
            return items if type(x) is list else {"tuple": items}
        finally:
            self.open.discard(id(x))

    def _key(self, k: Any, path: tuple) -> Any:
        if type(k) is tuple:
            return {"tuple": [self._key(part, path) for part in k]}
        if type(k) in _SCALARS or isinstance(k, DType):
            return self.encode(k, path)
        raise TypeError(
            f"save: cannot save a dict key of type {type(k).__name__} {_where(path)}: keys "
            "must be str, int, float, complex, bool, None, bytes, dtypes or tuples of them"
        )

    def _tensor(self, t: Tensor, path: tuple) -> str:
        if id(t) in self.ids:
            return self.ids[id(t)]
        if t.is_sparse:
            raise TypeError(
                f"save: cannot save the sparse tensor {_where(path)}; save x.to_dense(), "
                "or x.indices() and x.values()"
            )
        device = t.device.name
        values = t._host()  # read, not handed out (Note [Sealed storages])
        return self._entry(t, values, t.requires_grad, isinstance(t, Parameter), device)

    def _ndarray(self, a: np.ndarray, path: tuple) -> str:
        if id(a) in self.ids:
            return self.ids[id(a)]
        if a.dtype.newbyteorder("=") not in {d.np for d in BY_NAME.values()}:
            raise TypeError(
                f"save: cannot save the NumPy array of dtype {a.dtype} {_where(path)}: "
                f"lamina saves arrays of its dtypes ({', '.join(BY_NAME)})"
            )
        return self._entry(a, a, False, False, "cpu")

    def _entry(
        self, x: Any, values: np.ndarray, requires_grad: bool, parameter: bool, device: str
    ) -> str:
        dtype = values.dtype.newbyteorder("=")
        where = (values.__array_interface__["data"][0], values.shape, values.strides, dtype)
        file = self.files.get(where)
        if file is None:
            file = self.files[where] = f"{DATA}{len(self.files)}"
            self.arrays[file] = values
        ident = self.ids[id(x)] = str(len(self.tensors))
        self.alive.append(x)
        self.tensors[ident] = {
            "dtype": dtype.name,
            "shape": list(values.shape),
            "file": file,
            "sha256": None,  # known once the file is written
            "requires_grad": requires_grad,
            "parameter": parameter,
            "device": device,
        }
        return ident

    def write(self, out: BinaryIO, header: dict) -> None:
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
            digests = {file: _write_values(archive, file, a) for file, a in self.arrays.items()}
            for entry in self.tensors.values():
                entry["sha256"] = digests[entry["file"]]
            text = json.dumps(header, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
            archive.writestr(_member(HEADER, len(text)), text.encode("ascii"))


def _member(name: str, size: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size  # tells zipfile in advance whether the member needs ZIP64
    info.external_attr = 0o644 << 16
    return info


def _write_values(archive: zipfile.ZipFile, name: str, values: np.ndarray) -> str:
    """Write the elements of ``values`` (C order, little-endian); returns their SHA-256."""
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    raw = little.reshape(-1).view(np.uint8)
    digest = hashlib.sha256()
    with archive.open(_member(name, raw.nbytes), "w") as out:
        for start in range(0, raw.nbytes, _CHUNK):
            chunk = memoryview(raw[start : start + _CHUNK])
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _write_atomically(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write to a new file beside ``path``, then rename it over ``path``: the name never
    holds a partly written file."""
    if os.path.islink(path):  # write through the link, as open(path, "wb") would
        path = os.path.realpath(path)
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save: no such directory: {directory!r}")
    while True:
        temporary = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
        try:  # 0o666 less the umask: the file gets the permissions open() would give
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


_O_BINARY = getattr(os, "O_BINARY", 0)


# ---------------------------------------------------------------- load


def load(
    f: PathLike | BinaryIO,
    map_location: MapLocation = None,
    weights_only: bool | None = True,
) -> Any:
    """Read an object ``save`` wrote, from a path or a binary file object.

    ``map_location`` says where tensors go: None puts each where it was saved (its
    device must be available), ``"cpu"`` or a ``Device`` puts all there, a dict maps
    saved device names to others, and a callable ``fn(tensor, saved_device_name)`` gets
    each tensor on the CPU and returns it placed. ``weights_only`` is accepted for
    PyTorch's sake and changes nothing: lamina's files hold data only, so loading never
    runs code whichever it says.

    A file that is damaged, truncated or not a lamina file raises ``LoadError`` (a
    ValueError); a PyTorch file raises one that says how to convert it."""
    if weights_only not in (True, False, None):
        raise TypeError(f"load: weights_only must be a bool or None, got {weights_only!r}")
    place = _placement(map_location)
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(os.fsdecode(f), "rb") as stream:
            return _load(stream, place)
    if isinstance(f, io.TextIOBase) or not hasattr(f, "read"):
        raise TypeError(
            f"load: f must be a path or a file opened in binary mode ('rb'), got {type(f).__name__}"
        )
    if not (hasattr(f, "seekable") and f.seekable()):
        f = io.BytesIO(f.read())  # a ZIP is read from its end: a pipe is read whole first
    return _load(f, place)


Placement = Callable[[Tensor, str], Tensor]


def _known_device(name: str) -> str:
    if name not in keys.devices():
        raise ValueError(
            f"load: unknown device {name!r} in map_location; lamina's devices now: "
            f"{', '.join(keys.devices())}"
        )
    return name


def _placement(map_location: MapLocation) -> Placement:
    """``map_location`` as a function of (CPU tensor, saved device name)."""
    if map_location is None:
        return _to_device
    if isinstance(map_location, (str, Device)):
        target = _known_device(str(map_location))
        return lambda t, saved: _to_device(t, target)
    if isinstance(map_location, Mapping):
        table = {str(k): _known_device(str(v)) for k, v in map_location.items()}
        return lambda t, saved: _to_device(t, table.get(saved, saved))
    if callable(map_location):
        return lambda t, saved: _checked_result(map_location(t, saved))
    raise TypeError(
        "load: map_location must be None, a device name, a Device, a dict or a callable, "
        f"got {type(map_location).__name__}"
    )


def _to_device(t: Tensor, name: str) -> Tensor:
    if name == "cpu":
        return t
    if name not in keys.devices():
        raise RuntimeError(
            f"load: the file holds a tensor saved on device {name!r}, which is not "
            f"available now (devices: {', '.join(keys.devices())}); pass map_location='cpu'"
        )
    return t.to_device(name)


def _checked_result(t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"load: map_location returned {type(t).__name__}, not a tensor")
    return t


_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    struct.error,
    OSError,
    OverflowError,
    NotImplementedError,
    RuntimeError,  # zipfile's "encrypted, password required"
    UnicodeDecodeError,
    ValueError,  # a seek before the start of a file object
)


def _load(stream: BinaryIO, place: Placement) -> Any:
    start = stream.tell()
    size = stream.seek(0, io.SEEK_END)
    stream.seek(start)
    head = stream.read(4)
    stream.seek(start)
    if not head:
        if start:
            raise LoadError(
                "load: nothing to read at the file object's position (after save(obj, f), "
                "call f.seek(0) before load(f))"
            )
        raise LoadError("load: the file is empty, not a lamina file")
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        raise _pytorch_file("a Python pickle (torch.save's legacy format, or other pickled data)")
    try:
        archive = zipfile.ZipFile(stream)
    except _ZIP_ERRORS as exc:
        if head.startswith(b"PK\x03\x04"):
            raise _damaged(f"a ZIP archive that cannot be read, perhaps truncated ({exc})") from exc
        raise LoadError("load: not a lamina file (it is not a ZIP archive)") from exc
    with archive:
        return _Reader(archive, size, place).read()


@contextlib.contextmanager
def _reading(name: str) -> Iterator[None]:
    """zipfile's own checks (CRC, local headers) failing, said as a damaged file."""
    try:
        yield
    except LoadError:
        raise
    except _ZIP_ERRORS as exc:
        raise _damaged(f"reading {name} failed ({type(exc).__name__}: {exc})") from exc


def _pytorch_file(what: str) -> LoadError:
    return LoadError(
        f"load: this is a PyTorch file ({what}), which lamina cannot read: PyTorch's files "
        "are pickles, and lamina never unpickles (unpickling can run any code). Convert it "
        "where PyTorch is installed: sd = torch.load(path, map_location='cpu', "
        "weights_only=True); lamina.save({k: lamina.asarray(v.detach().numpy()) for k, v in "
        "sd.items()}, new_path)"
    )


class _Entry(NamedTuple):
    dtype: DType
    shape: tuple[int, ...]
    file: str
    sha256: str
    requires_grad: bool
    parameter: bool
    device: str


class _Reader:
    """Checks a lamina archive and builds the object it holds."""

    def __init__(self, archive: zipfile.ZipFile, size: int, place: Placement) -> None:
        self.archive, self.size, self.place = archive, size, place
        self.members = self._members()
        self.entries: dict[str, _Entry] = {}
        self.arrays: dict[str, np.ndarray] = {}  # file -> its values
        self.placed: dict[str, Tensor] = {}  # file -> its values as a placed tensor
        self.objects: dict[tuple[str, str], Any] = {}  # (tag, id) -> what it loaded as

    def _members(self) -> dict[str, zipfile.ZipInfo]:
        infos = self.archive.infolist()
        names = [info.filename for info in infos]
        if HEADER not in names:
            if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
                raise _pytorch_file("torch.save's ZIP format")
            if any(n.startswith("lamina/") for n in names):
                raise _damaged(f"{HEADER} is missing")
            raise LoadError(f"load: not a lamina file (a ZIP archive without {HEADER})")
        if len(set(names)) != len(names):
            raise _damaged("the archive names a member twice")
        # stored members that do not overlap take at most the file's size in all
        if sum(info.compress_size for info in infos) > self.size:
            raise _damaged("the archive's members claim more bytes than the file holds")
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise _damaged(f"member {info.filename!r} is compressed or encrypted")
            if info.compress_size != info.file_size:
                raise _damaged(f"member {info.filename!r} has inconsistent sizes")
            if info.header_offset + info.compress_size > self.size:
                raise _damaged(f"member {info.filename!r} extends past the end of the file")
        return dict(zip(names, infos))

    def read(self) -> Any:
        header = self._header()
        tensors = header["tensors"]
        if not isinstance(tensors, dict):
            raise _damaged("'tensors' is not a JSON object")
        by_file: dict[str, _Entry] = {}
        for ident, e in tensors.items():
            entry = self.entries[ident] = self._entry(ident, e)
            first = by_file.setdefault(entry.file, entry)
            if first[:4] != entry[:4]:
                raise _damaged(f"tensors sharing {entry.file} disagree on what it holds")
        try:
            return self._decode(header["object"], key=False)
        except RecursionError:
            raise _damaged("the object is nested too deeply") from None

    def _header(self) -> dict:
        with _reading(HEADER):
            raw = self.archive.read(self.members[HEADER])
        try:
            header = json.loads(
                raw.decode("utf-8"),
                object_pairs_hook=_unique_keys,
                parse_constant=_no_constants,
            )
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise _damaged(f"{HEADER} is not valid JSON ({exc})") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise LoadError(f"load: not a lamina file ({HEADER} does not name {FORMAT!r})")
        version = header.get("version")
        if type(version) is not int or version < 1:
            raise _damaged(f"format version {version!r} is not a version number")
        if version > VERSION:
            raise LoadError(
                f"load: the file has format version {version}, written by a newer lamina; "
                f"this lamina reads version {VERSION} and older: upgrade lamina to load it"
            )
        if set(header) != {"format", "version", "object", "tensors"}:
            raise _damaged(f"unexpected keys in {HEADER}: {sorted(header)}")
        return header

    def _entry(self, ident: str, e: Any) -> _Entry:
        what = f"tensor {ident!r}"
        if not isinstance(e, dict) or set(e) != _TENSOR_KEYS:
            raise _damaged(f"{what} is not described by the keys {sorted(_TENSOR_KEYS)}")
        dtype = BY_NAME.get(e["dtype"]) if isinstance(e["dtype"], str) else None
        if dtype is None:
            raise _damaged(f"{what} has unknown dtype {e['dtype']!r}")
        shape = e["shape"]
        if not (
            isinstance(shape, list)
            and len(shape) <= _MAX_DIMS
            and all(type(n) is int and 0 <= n < _INT64 for n in shape)
        ):
            raise _damaged(f"{what} has invalid shape {shape!r}")
        flags = (e["requires_grad"], e["parameter"])
        if not all(type(flag) is bool for flag in flags):
            raise _damaged(f"{what} has invalid flags")
        if e["requires_grad"] and dtype.kind not in "fc":
            raise _damaged(f"{what} of dtype {dtype.name} cannot require grad")
        if not isinstance(e["sha256"], str) or not _SHA256.fullmatch(e["sha256"]):
            raise _damaged(f"{what} has an invalid sha256")
        if not isinstance(e["device"], str):
            raise _damaged(f"{what} has an invalid device")
        file = e["file"]
        if not isinstance(file, str) or not file.startswith(DATA) or file not in self.members:
            raise _damaged(f"the values of {what} ({file!r}) are missing")
        nbytes = math.prod(shape) * dtype.itemsize
        if self.members[file].file_size != nbytes:
            raise _damaged(
                f"{what} of shape {tuple(shape)} and dtype {dtype.name} needs {nbytes} "
                f"bytes, but {file} holds {self.members[file].file_size}"
            )
        return _Entry(dtype, tuple(shape), file, e["sha256"], *flags, e["device"])

    def _values(self, entry: _Entry) -> np.ndarray:
        """The file's elements, read once, checked against its size and SHA-256."""
        if entry.file in self.arrays:
            return self.arrays[entry.file]
        little = entry.dtype.np.newbyteorder("<")
        try:  # sizes were checked against the stored bytes: this allocation is bounded
            array = np.empty(entry.shape, dtype=little)
        except (ValueError, MemoryError) as exc:
            raise _damaged(f"shape {entry.shape} cannot be allocated ({exc})") from None
        raw = memoryview(array.reshape(-1).view(np.uint8))
        digest = hashlib.sha256()
        with _reading(entry.file), self.archive.open(self.members[entry.file]) as source:
            done = 0
            while done < len(raw):
                n = source.readinto(raw[done : done + _CHUNK])
                if not n:
                    raise _damaged(f"{entry.file} ends early")
                digest.update(raw[done : done + n])
                done += n
        if digest.hexdigest() != entry.sha256:
            raise _damaged(f"the values in {entry.file} do not match their sha256")
        if entry.dtype.kind == "b" and array.size and array.view(np.uint8).max() > 1:
            raise _damaged(f"the bool values in {entry.file} are not 0 or 1")
        native = array.astype(entry.dtype.np, copy=False)  # a no-op on little-endian hosts
        self.arrays[entry.file] = native
        return native

    def _tensor(self, ident: str) -> Tensor:
        entry = self.entries[ident]
        placed = self.placed.get(entry.file)
        if placed is None:
            cpu = from_array(self._values(entry))
            placed = self.placed[entry.file] = self.place(cpu, entry.device).detach()
        t = placed.detach()  # a tensor of its own, sharing the file's values
        if entry.parameter:
            return Parameter(t, requires_grad=entry.requires_grad)
        return t.requires_grad_() if entry.requires_grad else t

    def _array(self, ident: str) -> np.ndarray:
        entry = self.entries[ident]
        if entry.requires_grad or entry.parameter:
            raise _damaged(f"NumPy array {ident!r} is marked as a tensor")
        return self._values(entry).view()

    def _decode(self, v: Any, key: bool) -> Any:
        if v is None or type(v) in (bool, str, int, float):
            return v
        if isinstance(v, list) and not key:
            return [self._decode(x, False) for x in v]
        if not isinstance(v, dict) or len(v) != 1:
            raise _damaged(f"unexpected {type(v).__name__} in the object")
        ((tag, payload),) = v.items()
        decode = _TAGS.get(tag)
        if decode is None or (key and tag in _NOT_KEYS):
            raise _damaged(f"unexpected tag {tag!r} in the object")
        return decode(self, payload, key)

    def _shared(self, tag: str, payload: Any, make: Callable[[str], Any]) -> Any:
        if not isinstance(payload, str) or payload not in self.entries:
            raise _damaged(f"{tag} {payload!r} is not in the file")
        if (tag, payload) not in self.objects:
            self.objects[tag, payload] = make(payload)
        return self.objects[tag, payload]

    def _pairs(self, payload: Any) -> list[tuple[Any, Any]]:
        if not isinstance(payload, list):
            raise _damaged("a dict is not a list of pairs")
        pairs = []
        for pair in payload:
            if not isinstance(pair, list) or len(pair) != 2:
                raise _damaged("a dict is not a list of pairs")
            pairs.append((self._decode(pair[0], True), self._decode(pair[1], False)))
        return pairs


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a JSON object names a key twice")
    return out


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # only the tagged {"float": "nan"} form is


def _number(x: Any) -> float:
    if type(x) is float:
        return x
    if isinstance(x, dict) and len(x) == 1 and x.get("float") in _NONFINITE:
        return _NONFINITE[x["float"]]
    raise _damaged(f"{x!r} is not a float")


def _big_int(reader: _Reader, payload: Any, key: bool) -> int:
    if not isinstance(payload, str) or not _HEX_INT.fullmatch(payload):
        raise _damaged(f"{payload!r} is not a hexadecimal int")
    return int(payload, 16)


def _complex(reader: _Reader, payload: Any, key: bool) -> complex:
    if not isinstance(payload, list) or len(payload) != 2:
        raise _damaged("a complex is not two floats")
    return complex(_number(payload[0]), _number(payload[1]))


def _bytes(reader: _Reader, payload: Any, key: bool) -> bytes:
    if not isinstance(payload, str):
        raise _damaged("bytes are not a base64 string")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise _damaged("bytes are not valid base64") from None


def _dtype(reader: _Reader, payload: Any, key: bool) -> DType:
    if not isinstance(payload, str) or payload not in BY_NAME:
        raise _damaged(f"unknown dtype {payload!r}")
    return BY_NAME[payload]


def _tuple(reader: _Reader, payload: Any, key: bool) -> tuple:
    if not isinstance(payload, list):
        raise _damaged("a tuple is not a list")
    return tuple(reader._decode(x, key) for x in payload)


def _dict(reader: _Reader, payload: Any, key: bool) -> dict:
    return dict(reader._pairs(payload))


def _ordered_dict(reader: _Reader, payload: Any, key: bool) -> OrderedDict:
    return OrderedDict(reader._pairs(payload))


_TAGS: dict[str, Callable[[_Reader, Any, bool], Any]] = {
    "tensor": lambda r, p, key: r._shared("tensor", p, r._tensor),
    "ndarray": lambda r, p, key: r._shared("ndarray", p, r._array),
    "tuple": _tuple,
    "dict": _dict,
    "ordered_dict": _ordered_dict,
    "int": _big_int,
    "float": lambda r, p, key: _number({"float": p}),
    "complex": _complex,
    "bytes": _bytes,
    "dtype": _dtype,
}
_NOT_KEYS = {"tensor", "ndarray", "dict", "ordered_dict"}
