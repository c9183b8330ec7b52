"""The loop cache: the C core's loops kept on disk as shared libraries, opened without
Numba.

Note [Loop cache]: a loop of the C core (Note [C loops] in numba_cpu/kernels.py) is a
plain C function of pointers and lengths; once compiled it needs neither Numba nor
LLVM to run. Numba's own cache cannot hand it back without both: the first cached
cfunc a process loads costs ~100 ms of compiler initialization, which was most of the
time of the first operation after ``import lamina``. So each loop, when Numba has just
compiled it, is also emitted as position-independent object code (from its optimized
LLVM IR, for the same CPU), linked into a small shared library by the C compiler, and
later processes open that library with ctypes in a fraction of a millisecond.

A library is found by its loop's key (``jit.c_loop``'s: templates, scalar functions
and dtypes, each named by module and qualified name, so only module-level functions
qualify) in a directory named by a stamp of all that could change the machine code:
the backends' sources (size and mtime of every .py file under ``backends/``, as Numba
stamps a source file), the installs of Numba and llvmlite, the Python version and the
CPU (model and flags). A library is written under a temporary name and renamed, so a
process running at the same time sees all of it or none. One that cannot be written or
opened (no C compiler, a read-only directory, a loop that needs Numba's runtime) leaves
that loop to Numba's cache: slower to start, never wrong. A library on disk is
untrusted input, checked before it is opened (Note [Checked libraries]).

``LAMINA_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/lamina``, else
``~/.cache/lamina``); ``LAMINA_LOOP_CACHE=0`` turns it off.

A loop stored here is compiled without Numba's cache, so it is on disk once; every
other kernel, and a loop that cannot live here, is in Numba's cache. Both stay bounded:
this cache keeps _KEEP stamp directories, and a new stamp makes the next process that
loads Numba prune Numba's cache of what the current sources cannot load (Note [Numba's
cache files]).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

# hashlib, shutil, subprocess and tempfile are imported where they are used: together
# ~5 ms of ``import lamina``, which only a first operation needs

_SOURCES = Path(__file__).resolve().parent  # the backends' sources: their edits invalidate
_SYMBOL = "lamina_loop"  # every library exports its loop under this name too

_directory: Path | bool | None = False  # False: not looked up yet; None: no cache
_compiler: str | None = None  # "" where there is none
_machine: Any = None  # llvmlite's target machine for position-independent code
_libraries: list[ctypes.CDLL] = []  # open libraries stay open: the C core holds addresses


def _source_stats() -> dict[str, tuple[int, int]]:
    """Each backend source file's (size, mtime in ns), as they are now."""
    stats = {}
    for root, dirs, files in sorted(os.walk(_SOURCES)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(root, name))
                stats[os.path.join(root, name)] = (st.st_size, st.st_mtime_ns)
    return stats


# Note [Source stamps]: what a process compiles comes from the sources it imported, not
# from the files as they are when it saves: an edit while a process runs (a contributor
# changing a kernel during a test run) must not label the old code with the new source.
# So the backends' files are stat'ed once, when this module is imported (~0.3 ms), and
# everything this process caches -- the loop libraries' directory (``_stamp``), Numba's
# indexes of the backends' kernels (``harden_numba_cache``) -- is stamped with that
# snapshot. A kernel whose Numba cache is set up after its file changed runs code of
# either version, so it is compiled in memory only. Numba's own stamp covers one file
# and is taken when its cache is set up, which for lamina's lazily compiled kernels is
# after the edit: that saved old machine code under the new source's stamp, which every
# later process then loaded (with a changed signature: garbage or a crash).
_IMPORTED = _source_stats()
_imported_stamp: str | None = None  # _stamp(_IMPORTED), once needed


def _stamp(sources: dict[str, tuple[int, int]]) -> str:
    """A digest of everything, besides a loop's key, that its machine code depends on:
    the backends' ``sources`` (``_IMPORTED``: Note [Source stamps]), Python, Numba,
    llvmlite and the CPU."""
    import hashlib
    import importlib.util

    parts = [sys.version, sys.platform]
    parts += [f"{path}:{size}:{mtime}" for path, (size, mtime) in sources.items()]
    for package in ("numba", "llvmlite"):
        spec = importlib.util.find_spec(package)  # finds, does not import
        origin = spec.origin if spec and spec.origin else ""
        st = os.stat(origin) if origin else None
        parts.append(f"{package}:{origin}:{st and st.st_mtime_ns}")
    parts.append(_cpu())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def imported_stamp() -> str:
    """``_stamp`` of the sources as this process imported them (Note [Source stamps])."""
    global _imported_stamp
    if _imported_stamp is None:
        _imported_stamp = _stamp(_IMPORTED)
    return _imported_stamp


def _cpu() -> str:
    """The CPU's model and flags (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 16).split("\n\n", 1)[0]
        return "\n".join(
            line for line in first.splitlines() if line.startswith(("model name", "flags"))
        )
    except OSError:
        import platform

        return f"{platform.machine()} {platform.processor()}"


def directory() -> Path | None:
    """The directory of this stamp's libraries, or None when the cache is off."""
    global _directory
    if _directory is False:
        found = None  # set once: a thread racing this one must not see "no cache"
        if os.environ.get("LAMINA_LOOP_CACHE", "1") != "0":
            base = os.environ.get("LAMINA_CACHE_DIR") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lamina"
            )
            found = Path(base) / "loops" / imported_stamp()
            with contextlib.suppress(OSError):  # in use: _prune keeps the recent ones
                os.utime(found)
        _directory = found
    return _directory


_KEEP = 8  # stamp directories kept: other installs, other versions of the sources


def _prune(loops: Path) -> None:
    """Remove all but the _KEEP most recently used stamp directories of ``loops``
    (every edit of the backends' sources starts a new one, ~10 MB once full)."""
    import shutil

    with contextlib.suppress(OSError):
        stamps = sorted(loops.iterdir(), key=lambda d: d.stat().st_mtime, reverse=True)
        for old in stamps[_KEEP:]:
            shutil.rmtree(old, ignore_errors=True)


def _name(part: Any) -> str | None:
    """A name of one part of a key that is the same in every process, or None."""
    if isinstance(part, str):  # a name the key's maker keeps stable (a fused group's)
        return part
    qualname = getattr(part, "__qualname__", None)
    if qualname is not None:  # a function: a module-level one is found by its name
        return None if "<" in qualname else f"{part.__module__}.{qualname}"
    if isinstance(part, tuple):
        names = [_name(p) for p in part]
        return None if None in names else "(" + ",".join(names) + ")"
    dtype_name = getattr(part, "name", None)  # a lamina DType
    return dtype_name if isinstance(dtype_name, str) else None


def find(key: tuple) -> tuple[int | None, Path | None]:
    """The address of the loop of ``key`` if its library is here; else None and where
    to store the library (None where it cannot be stored: leave the loop to Numba's
    cache)."""
    root, name = directory(), _name(key)
    if root is None or name is None:
        return None, None
    import hashlib

    library = root / (hashlib.sha256(name.encode()).hexdigest()[:32] + ".so")
    address = _load(library)
    if address is not None:
        return address, None
    if library.with_suffix(".numba").exists() or not _has_compiler():
        return None, None  # this loop cannot live here
    return None, library


def store(library: Path, cfunc: Any) -> int | None:
    """Write the library of Numba cfunc ``cfunc`` (compiled without Numba's cache, so
    that its IR is at hand) and return the address of the loop in it, opened; None if
    it cannot be written or opened (then later processes leave it to Numba)."""
    import subprocess
    import tempfile

    address = None
    with contextlib.suppress(OSError, subprocess.CalledProcessError, AttributeError, RuntimeError):
        code = _object_code(cfunc)
        if not library.parent.exists():
            library.parent.mkdir(parents=True, exist_ok=True)
            _prune(library.parent.parent)
        with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
            obj, lib = os.path.join(tmp, "loop.o"), os.path.join(tmp, "loop.so")
            with open(obj, "wb") as f:
                f.write(code)
            alias = f"-Wl,--defsym={_SYMBOL}={cfunc.native_name}"
            try:
                link = [_compiler, "-shared", "-o", lib, obj, _runtime(library.parent), alias]
                link += _WRAPPED
                subprocess.run(link, check=True, capture_output=True)
            except subprocess.CalledProcessError:  # runtime.o may be the damaged part
                with contextlib.suppress(OSError):
                    (library.parent / "runtime.o").unlink()
                link[5] = _runtime(library.parent)
                subprocess.run(link, check=True, capture_output=True)
            # opened under its temporary name: the loader takes a second library of a
            # name it has loaded (a damaged one that failed to open) for the first
            address = _open(lib)
            if address is not None:
                with open(lib, "rb") as f:
                    data = f.read()
                record = os.path.join(tmp, "record")
                with open(record, "w") as f:
                    f.write(_record(data))
                os.replace(record, _record_path(library))
                os.replace(lib, library)
    if address is None:
        with contextlib.suppress(OSError):
            library.with_suffix(".numba").touch()
    return address


# Note [Checked libraries]: a cached library is untrusted input. A user may delete or
# edit it, a disk may damage it, and a damaged shared object does not fail to open: the
# dynamic loader maps what its headers promise, so a truncated file dies of SIGBUS on
# first touch of a missing page and a corrupted one of SIGSEGV, long after dlopen
# returned. So each library ``<key>.so`` has a record ``<key>.sum`` beside it, written
# once the library is complete (each under a temporary name, then renamed, the record
# first: a record without its library is a plain miss, a library without its record a
# doubt): the record's format, the library's size and its sha256. A process opens a
# library only if the size, the ELF header (class, byte order and machine of this
# Python's own executable) and the checksum of its bytes agree with the record. On any
# doubt (no record, a mismatch, an unreadable file, a library that still fails to
# open) it deletes the library (only the very file it read), compiles the loop and
# writes the library again, with one warning per process naming the first such file.
# Only complete libraries, each opened by its writer first, are ever renamed into
# place, so the file that a process opens after checking is the one it checked or
# another good one; what no loader survives is a file edited in place while mapped
# (a private copy of the checked bytes would survive it, at ~250 us per library).
# A process reading between another's two renames of a library over an old one sees
# the new record and the old library: if they differ, it rebuilds too (wasted time,
# never a crash); but libraries of the same loop are the same bytes, so they agree.
# The warning is a LoopCacheWarning, not a RuntimeWarning, which test suites (ours)
# turn into errors: a damaged cache must cost time, not fail an operation.


class LoopCacheWarning(UserWarning):
    """A cached loop library was damaged or unverifiable, and is being rebuilt."""


_FORMAT = "lamina-loop-1"  # the record's first word: a record of another format is doubt
_warned = False  # one warning per process: a damaged cache would give one per library
_elf: bytes | bool | None = False  # False: not read yet; None: this Python is not ELF


def _record_path(library: Path) -> Path:
    return library.with_suffix(".sum")


def _record(data: bytes) -> str:
    import hashlib

    return f"{_FORMAT} {len(data)} {hashlib.sha256(data).hexdigest()}\n"


def _own_elf() -> bytes | None:
    """The ELF class, byte order and machine of this Python's executable (the bytes a
    library it can open must have), or None where it is not ELF."""
    global _elf
    if _elf is False:
        found = None
        with contextlib.suppress(OSError):
            with open(sys.executable, "rb") as f:
                header = f.read(20)
            if header[:4] == b"\x7fELF" and len(header) == 20:
                found = header[4:6] + header[18:20]
        _elf = found
    return _elf


def _doubt(data: bytes, record: str) -> str | None:
    """Why the bytes ``data`` of a library are not the library its record describes, or
    None when they are."""
    fields = record.split()
    if len(fields) != 3 or fields[0] != _FORMAT:
        return "its checksum record is unreadable"
    if fields[1] != str(len(data)):
        return f"it is {len(data)} bytes long, but {fields[1]} were written"
    own = _own_elf()
    if own is not None and (data[:4] != b"\x7fELF" or data[4:6] + data[18:20] != own):
        return "it is not a shared library for this machine"
    if _record(data) != record:
        return "its contents differ from what was written (checksum mismatch)"
    return None


def _load(library: Path) -> int | None:
    """The address of the loop in ``library`` if it is there and is what was written
    (Note [Checked libraries]); else None, having removed a damaged one."""
    try:
        with open(library, "rb") as f:
            identity = os.fstat(f.fileno())  # the file read, for _reject
            data = f.read()
    except FileNotFoundError:
        return None  # not written yet, or deleted: a plain miss
    except OSError as error:
        _reject(library, None, f"it cannot be read ({error.strerror})")
        return None
    try:
        with open(_record_path(library)) as r:
            record = r.read(256)
    except FileNotFoundError:
        _reject(library, identity, "it has no checksum record")
        return None
    except (OSError, UnicodeDecodeError) as error:
        _reject(library, identity, f"its checksum record cannot be read ({error})")
        return None
    reason = _doubt(data, record)
    if reason is None:
        address = _open(library)
        if address is not None:
            return address
        reason = "it fails to open"
    _reject(library, identity, reason)
    return None


def _reject(library: Path, identity: os.stat_result | None, reason: str) -> None:
    """Delete a library in doubt (only the very file that was read: another process may
    have just renamed a good one into its place) and say so, once per process."""
    global _warned
    with contextlib.suppress(OSError):
        now = os.stat(library)
        if identity is not None and (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
            library.unlink()
    if not _warned:
        _warned = True
        import warnings

        warnings.warn(
            f"lamina's loop cache: ignoring {library}: {reason}. Lamina compiles the loop "
            "again and rewrites the library (this once, for each such library); if this "
            "repeats, delete the directory or set LAMINA_CACHE_DIR elsewhere.",
            LoopCacheWarning,
            stacklevel=2,
        )


# Note [fmod in loop libraries]: float % and // (remainder, floor_divide) call fmod,
# which Numba's JIT binds to its own bridge, numba_fmod: built with the compiler's
# inline x87 fprem loop (exact, as fmod is), falling back to the C library's fmod only
# for a NaN result. A loop library calling the C library's fmod itself ran 2.5x slower
# (glibc 2.36: 22 ns a call, against 8; 10^4 float64 remainders 221 us against 87).
# So a library is linked with its calls of fmod and fmodf wrapped (``_WRAPPED``: the
# linker's --wrap, which LLVM's calls for frem reach too) by the same bridge, in
# _RUNTIME below.
_WRAPPED = ["-Wl,--wrap=fmod", "-Wl,--wrap=fmodf"]

# What a loop may reference of Numba's runtime, which Numba hands to LLVM at run time
# instead of exporting, so a library links its own copy. The cfunc wrapper's error path
# (a loop that raised) calls the first two: the same two lines as Numba's _helperlib.c.
# NRT_decref's body names the third, reached only for a non-null meminfo; a loop whose
# arrays are numba.carray views of pointers has none (their meminfo is NULL, and
# NRT_decref returns first), and a loop that allocates an array needs more of the
# runtime (NRT_MemInfo_alloc...), which is not here: its library fails to open. Then
# the fmod bridge (Note [fmod in loop libraries]): the compiler's x87 fprem loop, the
# C library's fmod for a NaN result only (its NaN and errno, as numba_fmod does).
_RUNTIME = r"""
typedef int PyGILState_STATE;
PyGILState_STATE PyGILState_Ensure(void);
void PyGILState_Release(PyGILState_STATE);
void numba_gil_ensure(PyGILState_STATE *state) { *state = PyGILState_Ensure(); }
void numba_gil_release(PyGILState_STATE *state) { PyGILState_Release(*state); }
void NRT_MemInfo_call_dtor(void *meminfo) { (void)meminfo; }
double __real_fmod(double, double);
float __real_fmodf(float, float);
#if defined(__x86_64__) || defined(__i386__)
#define FMOD(T, NAME, LIBM)                                                             \
    T NAME(T x, T y) {                                                                  \
        long double r = x;                                                              \
        __asm__("1: fprem\n\tfnstsw %%ax\n\ttestb $4, %%ah\n\tjnz 1b"                      \
                : "+t"(r) : "u"((long double)y) : "ax", "cc");                          \
        return r == r ? (T)r : LIBM(x, y);                                              \
    }
#else
#define FMOD(T, NAME, LIBM) T NAME(T x, T y) { return LIBM(x, y); }
#endif
FMOD(double, __wrap_fmod, __real_fmod)
FMOD(float, __wrap_fmodf, __real_fmodf)
"""


def _runtime(root: Path) -> str:
    """The object file of _RUNTIME in ``root``, compiled once."""
    import subprocess
    import tempfile

    runtime = root / "runtime.o"
    if not runtime.exists():
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            obj = os.path.join(tmp, "runtime.o")
            compile_ = [_compiler, "-c", "-fPIC", "-O2", "-x", "c", "-", "-o", obj]
            subprocess.run(compile_, input=_RUNTIME.encode(), check=True, capture_output=True)
            os.replace(obj, runtime)
    return str(runtime)


def _has_compiler() -> bool:
    global _compiler
    if _compiler is None:
        import shutil

        _compiler = shutil.which(os.environ.get("CC", "cc").split()[0]) or ""
    return bool(_compiler)


def _object_code(cfunc: Any) -> bytes:
    """Position-independent object code of a cfunc's optimized IR, for the CPU Numba
    compiled it for (Numba's own object code is not position-independent)."""
    global _machine
    import llvmlite.binding as llvm  # loaded already: Numba has just compiled cfunc

    if _machine is None:
        codegen = cfunc._library.codegen
        _machine = llvm.Target.from_default_triple().create_target_machine(
            cpu=codegen._get_host_cpu_name(),
            features=codegen._get_host_cpu_features(),
            opt=3,
            reloc="pic",
            codemodel="default",
        )
    return _machine.emit_object(llvm.parse_assembly(cfunc._library.get_llvm_str()))


def _open(path: str | Path) -> int | None:
    """The address of the loop in the library at ``path``, opened; None where it fails
    to open."""
    try:
        handle = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        address = ctypes.cast(getattr(handle, _SYMBOL), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    _libraries.append(handle)
    return address


# ---------------------------------------------------------------- Numba's cache

# Note [Numba's cache files]: Numba keeps a kernel in the cache directory of its source
# file (``__pycache__`` beside it, or under NUMBA_CACHE_DIR): one index per function,
# ``<module>.<qualname>-<first line>.py311.nbi``, stamped with the backends' sources as
# the saving process imported them (Note [Source stamps]; Numba's own stamp hashes the
# one source file) and naming one data file per compiled variant, ``<same>.<n>.nbc``.
# Numba ignores an index whose stamp is stale and rewrites it at its next save, but
# deletes nothing: the index of a function that moved to another line stays for ever,
# and so do the data files numbered past the rewritten index's count. So the first
# process that loads Numba after the backends' sources changed (``_stamp``, recorded in
# the _PRUNED file) removes, in the cache directories of those sources, every index of
# this Python that is stale, names a module that is gone or was written by another
# Numba, with its data files, and every data file no fresh index names. Between changes
# nothing accumulates: a kernel's key is the same in every process (Note [Closure cells]
# in jit.py), so an index grows only by the variants programs compile. A process saving
# a kernel while another prunes may lose its data file; the next process that needs it
# compiles it again (never wrong).

_PRUNED = "lamina-pruned"  # in the cache directory of backends/: the stamp last pruned for

# Note [Numba's cache races]: Numba saves a variant of a kernel by reading the function's
# index, adding an entry and writing it back, with no lock. Two processes compiling
# different variants of one kernel at once (test workers, a pool of a user's processes)
# both read an index of n entries, both write data file n+1, and the index that survives
# names one variant's data under the other's signature. The next process asking for that
# signature loads another variant's machine code: a KeyError at best, a cfunc reading
# its pointers as the wrong types at worst. So while Numba is in a lamina process, every
# save (and flush) of an index takes an exclusive lock on a file of its cache directory
# and every load a shared one (``harden_numba_cache``), which also keeps a load from
# reading an index whose data file is not written yet. And each data file carries the
# key it was saved under, which a load compares with the key it asked for: an index
# naming another variant's data -- left by a process without the lock, or by files
# copied over each other -- is a miss, compiled again. That includes variants of one
# signature, two closures of one template (Winograd's block loops for two algorithms
# or layouts), which no signature check tells apart. A float64 Winograd weight
# gradient loaded from a damaged cache once hung on every run, and aborted beside
# PyTorch ("double free or corruption"), until its index was rebuilt.

_LOCK = "lamina-numba.lock"  # in each of Numba's cache directories
_KEYED = "lamina-keyed"  # first of a data file's (mark, key, Numba's data)

# Note [Cache keys and options]: Numba keys a cached variant by signature, bytecode and
# closure cells, not by the options it was compiled with. One function compiled both
# with ``parallel=True`` and without (sparse matrix products by rows), or with and
# without ``fastmath``, ``nogil``, had one key: the process that asked second loaded the
# first one's machine code -- a parallel loop where a serial one was wanted, called from
# a thread of lamina's pool. So a cache whose ``options`` attribute is set (by
# ``jit.compile_kernel``) adds them to every key.


def harden_numba_cache() -> None:
    """Numba's cache files read and written under a lock (Note [Numba's cache races]),
    keyed by compile options too (Note [Cache keys and options]) and, for the backends'
    kernels, stamped with the sources this process imported (Note [Source stamps])."""
    from numba.core.caching import Cache

    if not getattr(Cache.__init__, "stamped_as_imported", False):
        init = Cache.__init__

        def stamped_as_imported(self: Any, py_func: Any) -> None:
            init(self, py_func)
            source = os.path.realpath(py_func.__code__.co_filename)
            if source not in _IMPORTED:
                return  # not a backend's kernel: Numba's stamp of its file
            try:
                st = os.stat(source)
                unchanged = (st.st_size, st.st_mtime_ns) == _IMPORTED[source]
            except OSError:
                unchanged = False
            if unchanged:
                self._cache_file._source_stamp = imported_stamp()
            else:  # this process may run either version of the file: nothing from disk
                self.disable()

        stamped_as_imported.stamped_as_imported = True  # type: ignore[attr-defined]
        Cache.__init__ = stamped_as_imported
    if not getattr(Cache._index_key, "keyed_by_options", False):
        index_key = Cache._index_key

        def keyed_by_options(self: Any, sig: Any, codegen: Any) -> Any:
            key = index_key(self, sig, codegen)
            options = getattr(self, "options", None)
            return key if options is None else (*key, options)

        keyed_by_options.keyed_by_options = True  # type: ignore[attr-defined]
        Cache._index_key = keyed_by_options
    from numba.core.caching import IndexDataCacheFile

    if not getattr(IndexDataCacheFile, "saves_keys", False):  # Note [Numba's cache races]
        save, load = IndexDataCacheFile.save, IndexDataCacheFile.load

        def save_with_key(self: Any, key: Any, data: Any) -> None:
            save(self, key, (_KEYED, key, data))

        def load_if_keyed(self: Any, key: Any) -> Any:
            found = load(self, key)
            keyed = type(found) is tuple and len(found) == 3 and found[0] == _KEYED
            return found[2] if keyed and found[1] == key else None

        IndexDataCacheFile.save, IndexDataCacheFile.load = save_with_key, load_if_keyed
        IndexDataCacheFile.saves_keys = True
    try:
        import fcntl
    except ImportError:  # no flock (Windows): Numba's own behaviour
        return

    def locked(method: Any, mode: int) -> Any:
        def under_lock(self: Any, *args: Any) -> Any:
            try:
                fd = os.open(os.path.join(self._cache_path, _LOCK), os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # a directory not made yet (nothing to load) or read-only
                return method(self, *args)
            try:
                fcntl.flock(fd, mode)
                return method(self, *args)
            finally:
                os.close(fd)  # releases the lock

        under_lock.locked = True  # type: ignore[attr-defined]
        return under_lock

    if not getattr(IndexDataCacheFile.save, "locked", False):
        IndexDataCacheFile.save = locked(IndexDataCacheFile.save, fcntl.LOCK_EX)
        IndexDataCacheFile.flush = locked(IndexDataCacheFile.flush, fcntl.LOCK_EX)
        IndexDataCacheFile.load = locked(IndexDataCacheFile.load, fcntl.LOCK_SH)


# Note [Compiling once]: processes that share Numba's cache (pytest's workers, the two
# per-call cores' test runs of CI, a user's pool) and need one kernel at the same time
# would each compile it: Numba looks in the cache, misses, compiles and saves, and
# nothing keeps the others from doing the same meanwhile. So a compile holds a lock on
# one byte of a file in its cache directory, the byte chosen by a hash of the kernel's
# key (its function's index, signature and options); a process that waited for it looks
# in the cache again and loads what the other saved. Keys that share a byte wait for
# each other, which is slower, never wrong; so is a wait given up after
# _COMPILE_WAIT seconds (a process stopped mid-compile), which compiles.

_COMPILING = "lamina-compiling.lock"  # in each of Numba's cache directories
_COMPILE_WAIT = 120.0
_LOCK_BYTES = 1 << 16  # the bytes of _COMPILING that keys are hashed to


@contextlib.contextmanager
def compiling_once(cache: Any, key: str) -> Any:
    """Note [Compiling once]'s lock of ``key`` held through the block, which compiles
    into ``cache`` (a Numba cache: Numba loads from it again once the lock is taken)."""
    path = getattr(cache, "_cache_path", None)  # None: a function Numba does not cache
    fd = None
    try:
        import fcntl

        os.makedirs(path, exist_ok=True)  # as Numba's save would
        fd = os.open(os.path.join(path, _COMPILING), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, TypeError, OSError):  # no fcntl, no cache, a read-only directory
        pass
    if fd is None:
        yield
        return
    name = f"{cache._impl.filename_base}|{key}".encode()
    byte = int.from_bytes(hashlib.blake2b(name, digest_size=4).digest(), "little")
    byte %= _LOCK_BYTES
    try:
        deadline = time.monotonic() + _COMPILE_WAIT
        while time.monotonic() < deadline:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
                break
            except (BlockingIOError, PermissionError):  # held by another process
                time.sleep(0.005)
            except OSError:  # a file system without record locks: compile unlocked
                break
        yield
    finally:
        os.close(fd)  # releases the lock


def prune_numba_cache() -> None:
    """Remove Numba's stale cache files of the backends' kernels, once per change of
    their sources (Note [Numba's cache files]); Numba is loaded."""
    stamp, here = imported_stamp(), _numba_locator(_SOURCES / "jit.py")
    if here is None:
        return
    marker = Path(here.get_cache_path()) / _PRUNED
    with contextlib.suppress(OSError):
        if marker.read_text() == stamp:
            return
    sources: dict[Path, dict[str, Any]] = {}  # cache directory -> {module: locator}
    for root, dirs, files in os.walk(_SOURCES):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                locator = _numba_locator(Path(root) / name)
                if locator is not None:
                    modules = sources.setdefault(Path(locator.get_cache_path()), {})
                    modules[name[:-3]] = locator
    for directory, modules in sources.items():
        _prune_numba_directory(directory, modules)
    with contextlib.suppress(OSError):
        marker.write_text(stamp)


def _numba_locator(source: Path) -> Any:
    """Numba's cache locator for the kernels of ``source`` (where they are cached, the
    source's stamp), or None where Numba cannot cache them."""
    import types

    from numba.core.caching import CompileResultCacheImpl

    stand_in = types.FunctionType((lambda: None).__code__.replace(co_filename=str(source)), {})
    try:
        return CompileResultCacheImpl(stand_in).locator
    except RuntimeError:  # no directory Numba can write
        return None


def _prune_numba_directory(directory: Path, modules: dict[str, Any]) -> None:
    """Note [Numba's cache files] in one cache directory, whose sources' modules are
    ``modules`` ({name: locator})."""
    import pickle

    import numba

    tag = f".py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    try:
        names = os.listdir(directory)
    except OSError:
        return
    ours = [
        n
        for n in names
        if n.endswith(tag + ".nbi") or (n.endswith(".nbc") and n.rsplit(".", 2)[0].endswith(tag))
    ]
    keep = set()
    for name in ours:
        locator = modules.get(name.split(".", 1)[0])
        if not name.endswith(".nbi") or locator is None:
            continue
        try:
            with open(directory / name, "rb") as f:
                version = pickle.load(f)
                stamp, overloads = pickle.loads(f.read())
            fresh = version == numba.__version__ and stamp == imported_stamp()
        except Exception:  # unreadable (damaged, another Numba's types), source gone: stale
            continue
        if fresh:
            keep.add(name)
            keep.update(overloads.values())
    for name in ours:
        if name not in keep:
            with contextlib.suppress(OSError):
                os.unlink(directory / name)
