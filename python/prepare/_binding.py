"""The C ABI (prepare.h, generated beside the library) through ctypes: status codes become
exceptions carrying the library's last error. No torch here: pointers and streams are integers."""

from __future__ import annotations

import ctypes
import glob
import math
import numbers
import operator
import os
import threading
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]

UNIQUE_ID_BYTES = 128

#: The C enum PrepareDtype: the codes the library takes for element types.
DTYPE_CODES = {"bf16": 0, "fp16": 1, "fp32": 2}
# PrepareCollective's values, in its order.
COLLECTIVE_CODES = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2,
                    "all_reduce_add_rms_norm": 3}
# The C ABI these bindings are written for (PREPARE_ABI_VERSION of prepare.h). 2: the
# options' allow_inexact.
ABI_VERSION = 2

TUNINGS = {"runtime": 0, "static": 1}


class PrepareError(RuntimeError):
    """A call into prepare failed. Every error raised is one of the subclasses, one per C status
    code (`status`), so catching a subclass catches exactly that status."""

    status: int

    def __init__(self, message: str):
        if type(self) is PrepareError:
            raise TypeError("raise one of PrepareError's subclasses: one per status")
        super().__init__(message)


class InvalidArgument(PrepareError, ValueError):
    """An argument is invalid (out of range, a CPU or non-contiguous tensor, a dtype no package
    holds, a closed handle, ...)."""

    status = 1


class PackageRefused(PrepareError):
    """A package or its ladder was refused; the message names the file."""

    status = 2


class PeerTimeout(PrepareError):
    """A peer did not take part before the deadline; the message names it where known. The
    handle cannot be used again: every rank must start a new one."""

    status = 3


class RuntimeFailure(PrepareError):
    """The driver, NCCL or a kernel failed (including: none installed on this machine)."""

    status = 4


class InternalError(PrepareError):
    """A bug in prepare: a panic was caught at the C boundary."""

    status = 5


_ERRORS = {cls.status: cls for cls in (InvalidArgument, PackageRefused, PeerTimeout,
                                        RuntimeFailure, InternalError)}


def error_class(status: int) -> type:
    """The exception class of a C status code (InternalError for a code the package lacks)."""
    return _ERRORS.get(status, InternalError)


# Each C integer type's range: a Python integer outside it is refused, where ctypes would
# silently keep its low bits.
_C_INTEGERS = {
    "int32_t": (-(1 << 31), (1 << 31) - 1),
    "uint32_t": (0, (1 << 32) - 1),
    "uint64_t": (0, (1 << 64) - 1),
    "size_t": (0, (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1),
    "a pointer": (0, (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1),
}


def _shown(number: int) -> str:
    # str() of an integer of thousands of digits raises; its size says enough.
    bits = number.bit_length()
    return str(number) if bits <= 128 else f"<an integer of {bits} bits>"


def _kind(value: Any) -> str:
    """What a refused value is: "a float", "an int"."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name}"


def _integer(name: str, value: Any, c_type: str) -> int:
    """`value` as an int within the range of `c_type`, or InvalidArgument naming `name`."""
    low, high = _C_INTEGERS[c_type]
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise InvalidArgument(
            f"{name} is {_kind(value)}: give an integer from {low} to {high}")
    number = operator.index(value)
    if not low <= number <= high:
        raise InvalidArgument(
            f"{name}={_shown(number)} is out of range: give an integer from {low} to {high} "
            f"({c_type})")
    return number


def _address(name: str, value: Any) -> Optional[int]:
    """A device address or handle as an integer (None for NULL)."""
    return None if value is None else _integer(name, value, "a pointer")


def _seconds(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidArgument(
            f"timeout is {_kind(timeout)}: give seconds above 0 as a number")
    try:
        seconds = float(timeout)
    except OverflowError:
        raise InvalidArgument("timeout is too large for seconds (a C double)") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidArgument(f"timeout={seconds!r}: give seconds above 0")
    return seconds


def _c_string(name: str, value: Any, path: bool) -> bytes:
    """`value` encoded for the C library; a NUL byte, where the C string would end, is refused
    as Python's own file functions refuse it."""
    try:
        if path:
            encoded = os.fsencode(value)
        elif isinstance(value, str):
            encoded = value.encode()
        else:
            raise TypeError
    except TypeError:
        wanted = "a path (str, bytes or os.PathLike)" if path else "a str"
        raise InvalidArgument(f"{name} is {_kind(value)}: give {wanted}") from None
    except UnicodeEncodeError as error:
        raise InvalidArgument(f"{name} {value!r} cannot be encoded: {error.reason}") from None
    if b"\0" in encoded:
        raise InvalidArgument(f"{name} {value!r}: embedded null byte")
    return encoded


def _package_paths(packages: Any) -> List[bytes]:
    if isinstance(packages, (str, bytes, os.PathLike)):
        packages = [packages]
    try:
        listed = list(packages)
    except TypeError:
        raise InvalidArgument(
            f"packages is {_kind(packages)}: give a package directory or a sequence "
            "of them") from None
    if not listed:
        raise InvalidArgument("no package was given: give one package directory per collective "
                              "and dtype")
    return [_c_string(f"packages[{index}]", package, path=True)
            for index, package in enumerate(listed)]


def start_arguments(packages: Any, cache_dir: Any, timeout: Any, tuning: Any,
                    allow_inexact: Any = False
                    ) -> Tuple[List[bytes], Optional[bytes], float, int, int]:
    """The checked options of a handle's start (package paths, cache directory, seconds, tuning
    code, allow_inexact as 0 or 1), or InvalidArgument: what every open function checks before
    the library sees it."""
    paths = _package_paths(packages)
    cache = None if cache_dir is None else _c_string("cache_dir", cache_dir, path=True)
    if not (isinstance(tuning, str) and tuning in TUNINGS):
        raise InvalidArgument(f"tuning={tuning!r}: use 'runtime' or 'static'")
    # It keeps outputs exact, so only a bool is taken: a string "False" is not read as true.
    if not isinstance(allow_inexact, bool):
        raise InvalidArgument(f"allow_inexact is {_kind(allow_inexact)}: give True or False")
    return paths, cache, _seconds(timeout), TUNINGS[tuning], int(allow_inexact)


class _Options(ctypes.Structure):
    _fields_ = [
        ("packages", ctypes.POINTER(ctypes.c_char_p)),
        ("package_count", ctypes.c_size_t),
        ("cache_dir", ctypes.c_char_p),
        ("timeout_seconds", ctypes.c_double),
        ("tuning", ctypes.c_int32),
        ("retune", ctypes.c_int32),
        ("allow_inexact", ctypes.c_int32),
    ]


_library: Optional[ctypes.CDLL] = None
_library_path: Optional[str] = None
_lock = threading.Lock()


def library_path() -> str:
    """Where the C library is: $PREPARE_LIBRARY, else the one installed with this package."""
    override = os.environ.get("PREPARE_LIBRARY")
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_prepare_c*.so")))
    if not found:
        raise ImportError(
            f"prepare's C library (_prepare_c*.so) is not in {here}: the package was not built "
            "with its library; reinstall it with `pip install ./python` from the checkout"
        )
    return found[0]


_SIGNATURES = {
    "prepare_abi_version": ([], ctypes.c_uint32),
    "prepare_version": ([], ctypes.c_char_p),
    "prepare_last_error": ([], ctypes.c_char_p),
    "prepare_options_init": ([ctypes.POINTER(_Options)], ctypes.c_int32),
    "prepare_unique_id": ([ctypes.c_void_p], ctypes.c_int32),
    "prepare_open_env": ([ctypes.POINTER(_Options), ctypes.POINTER(ctypes.c_void_p)],
                         ctypes.c_int32),
    "prepare_open_unique_id": ([ctypes.POINTER(_Options), ctypes.c_void_p, ctypes.c_uint32,
                                ctypes.c_uint32, ctypes.c_int32,
                                ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int32),
    "prepare_open_comm": ([ctypes.POINTER(_Options), ctypes.c_void_p, ctypes.c_uint32,
                           ctypes.c_uint32, ctypes.c_int32, ctypes.c_int32,
                           ctypes.POINTER(ctypes.c_void_p)], ctypes.c_int32),
    "prepare_all_reduce": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_int32, ctypes.c_void_p], ctypes.c_int32),
    "prepare_reduce_scatter": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int32,
                                ctypes.c_void_p], ctypes.c_int32),
    "prepare_all_gather": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p], ctypes.c_int32),
    "prepare_reduce_scatter_v": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint32,
                                  ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p],
                                 ctypes.c_int32),
    "prepare_all_gather_v": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint32, ctypes.c_size_t,
                              ctypes.c_int32, ctypes.c_void_p], ctypes.c_int32),
    "prepare_all_reduce_add_rms_norm": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_size_t, ctypes.c_float, ctypes.c_int32,
                                         ctypes.c_void_p], ctypes.c_int32),
    "prepare_owned_rows": ([ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint32,
                            ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
                           ctypes.c_int32),
    "prepare_route": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_char_p,
                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_choice_json": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_serves": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                        ctypes.POINTER(ctypes.c_int32)],
                       ctypes.c_int32),
    "prepare_zero_copy_region": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_force": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_size_t,
                       ctypes.c_char_p],
                      ctypes.c_int32),
    "prepare_check": ([ctypes.c_void_p], ctypes.c_int32),
    "prepare_close": ([ctypes.c_void_p], ctypes.c_int32),
}


def _load(path: str, named_by_variable: bool) -> ctypes.CDLL:
    """Loads the library at `path` and binds its functions, or raises ImportError naming the
    file, who chose it and what is wrong with it."""

    def refused(what: str) -> ImportError:
        if named_by_variable:
            where = f"PREPARE_LIBRARY names {path},"
            fix = ("point it at the libprepare_c.so built with this package, or unset it to use "
                   "the library installed with the package")
        else:
            where = f"the C library installed with prepare, {path},"
            fix = "reinstall the package (`pip install ./python` from the checkout)"
        return ImportError(f"{where} {what}; {fix}", path=path)

    if os.sep in path and not os.path.exists(path):
        raise refused("which does not exist")
    if os.path.isdir(path):
        raise refused("which is a directory, not the library file")
    try:
        loaded = ctypes.CDLL(path)
    except OSError as error:
        raise refused(f"which cannot be loaded: {error}") from None
    try:
        version_of = loaded.prepare_version
    except AttributeError:
        raise refused("which is not prepare's C library: it has no prepare_version") from None
    version_of.argtypes, version_of.restype = _SIGNATURES["prepare_version"]
    version = (version_of() or b"").decode(errors="replace")
    # The package's version, read here rather than at import: `prepare/__init__.py` sets it
    # after importing this module, and is complete by the first call into the library.
    from . import __version__

    if version != __version__:
        raise refused(
            f"which is prepare {version}, but this package is prepare {__version__}: the "
            "package's calls may not match that library's functions")
    try:
        abi_of = loaded.prepare_abi_version
    except AttributeError:
        raise refused(f"which has no prepare_abi_version, though it says it is prepare "
                      f"{version}") from None
    abi_of.argtypes, abi_of.restype = _SIGNATURES["prepare_abi_version"]
    abi = abi_of()
    if abi != ABI_VERSION:
        raise refused(
            f"which offers C ABI version {abi}, but this package is written for C ABI version "
            f"{ABI_VERSION}: its calls do not match that library's functions")
    for name, (arguments, result) in _SIGNATURES.items():
        try:
            function = getattr(loaded, name)
        except AttributeError:
            raise refused(f"which has no {name}, though it says it is prepare {version}") from None
        function.argtypes = arguments
        function.restype = result
    return loaded


def library() -> ctypes.CDLL:
    """The C library, loaded on first use (it needs no GPU, driver or NCCL to load); refused
    with an ImportError when it is not prepare's, or not of this package's version."""
    global _library, _library_path
    with _lock:
        if _library is None:
            path = library_path()
            _library = _load(path, named_by_variable=bool(os.environ.get("PREPARE_LIBRARY")))
            _library_path = path
        return _library


def native_version() -> str:
    """The C library's version; equal to `prepare.__version__`, or the library is refused."""
    return library().prepare_version().decode()


def _check(status: int) -> None:
    if status == 0:
        return
    message = library().prepare_last_error().decode(errors="replace")
    error = _ERRORS.get(status)
    if error is None:
        raise InternalError(f"the library returned status {status}, unknown to this package: "
                            f"{message}")
    raise error(message)


def dtype_code(name: str) -> int:
    """The C code of a dtype name (bf16, fp16, fp32)."""
    try:
        return DTYPE_CODES[name]
    except KeyError:
        raise InvalidArgument(
            f"dtype {name!r} is not one of {', '.join(DTYPE_CODES)}") from None


def unique_id() -> bytes:
    """A fresh NCCL unique id (128 bytes): make it on one rank, send it to every rank."""
    buffer = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    _check(library().prepare_unique_id(buffer))
    return buffer.raw


def _text(function, *arguments) -> str:
    needed = ctypes.c_size_t(0)
    _check(function(*arguments, None, 0, ctypes.byref(needed)))
    buffer = ctypes.create_string_buffer(needed.value)
    _check(function(*arguments, buffer, needed.value, ctypes.byref(needed)))
    return buffer.value.decode()


class NativeHandle:
    """One rank's serving handle in the C library. Not thread-safe: one thread at a time. Made
    only by `open_unique_id`, `open_env` and `open_comm`: it owns the pointer the library
    returned, and closing any other pointer would corrupt the process."""

    # A handle whose open did not finish (or a closed one) holds no pointer.
    _pointer: Optional[int] = None

    def __init__(self, *_arguments: Any, **_keywords: Any):
        raise TypeError("a NativeHandle is made by NativeHandle.open_unique_id, open_env or "
                        "open_comm, never from a pointer")

    @classmethod
    def _opened(cls, out: ctypes.c_void_p) -> "NativeHandle":
        if not out.value:
            raise InternalError("the library reported success but returned no handle")
        handle = cls.__new__(cls)
        handle._pointer = out.value
        return handle

    @staticmethod
    def _options(packages: Any, cache_dir: Any, timeout: Any, tuning: Any, retune: bool,
                 allow_inexact: Any = False):
        paths, cache, seconds, tuning_code, inexact = start_arguments(
            packages, cache_dir, timeout, tuning, allow_inexact)
        options = _Options()
        _check(library().prepare_options_init(ctypes.byref(options)))
        array = (ctypes.c_char_p * len(paths))(*paths)
        options.packages = ctypes.cast(array, ctypes.POINTER(ctypes.c_char_p))
        options.package_count = len(paths)
        options.cache_dir = cache
        options.timeout_seconds = seconds
        options.tuning = tuning_code
        options.retune = int(bool(retune))
        options.allow_inexact = inexact
        # The array must outlive the call: keep it with the options.
        return options, array

    @staticmethod
    def _rank(rank: Any, world: Any, device: Any) -> Tuple[int, int, int]:
        return (_integer("rank", rank, "uint32_t"), _integer("world", world, "uint32_t"),
                _integer("device", device, "int32_t"))

    @classmethod
    def open_unique_id(cls, packages: Union[PathLike, Sequence[PathLike]], unique_id: bytes,
                       rank: int, world: int, device: int, cache_dir: Optional[PathLike] = None,
                       timeout: float = 60.0, tuning: str = "runtime",
                       retune: bool = False, allow_inexact: bool = False) -> "NativeHandle":
        """Starts a handle from an NCCL unique id every rank received. Collective."""
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != UNIQUE_ID_BYTES:
            raise InvalidArgument(f"unique_id must be {UNIQUE_ID_BYTES} bytes")
        rank, world, device = cls._rank(rank, world, device)
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune,
                                      allow_inexact)
        identifier = ctypes.create_string_buffer(bytes(unique_id), UNIQUE_ID_BYTES)
        out = ctypes.c_void_p()
        _check(library().prepare_open_unique_id(ctypes.byref(options), identifier, rank, world,
                                                device, ctypes.byref(out)))
        return cls._opened(out)

    @classmethod
    def open_env(cls, packages: Union[PathLike, Sequence[PathLike]],
                 cache_dir: Optional[PathLike] = None, timeout: float = 60.0,
                 tuning: str = "runtime", retune: bool = False,
                 allow_inexact: bool = False) -> "NativeHandle":
        """Starts a handle from torchrun's variables. Collective."""
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune,
                                      allow_inexact)
        out = ctypes.c_void_p()
        _check(library().prepare_open_env(ctypes.byref(options), ctypes.byref(out)))
        return cls._opened(out)

    @classmethod
    def open_comm(cls, packages: Union[PathLike, Sequence[PathLike]], nccl_comm: int,
                  rank: int, world: int, device: int, nonblocking: bool = False,
                  cache_dir: Optional[PathLike] = None, timeout: float = 60.0,
                  tuning: str = "runtime", retune: bool = False,
                  allow_inexact: bool = False) -> "NativeHandle":
        """Starts a handle split from the caller's `ncclComm_t` (an integer). Collective."""
        comm = _address("nccl_comm", nccl_comm)
        rank, world, device = cls._rank(rank, world, device)
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune,
                                      allow_inexact)
        out = ctypes.c_void_p()
        _check(library().prepare_open_comm(ctypes.byref(options), comm, rank, world, device,
                                           int(bool(nonblocking)), ctypes.byref(out)))
        return cls._opened(out)

    @property
    def closed(self) -> bool:
        return self._pointer is None

    def _live(self) -> int:
        if self._pointer is None:
            raise InvalidArgument("this prepare handle is closed")
        return self._pointer

    # Every method checks its arguments first, then that the handle is open.

    def all_reduce(self, input: int, output: int, count: int, dtype: int, stream: int) -> None:
        """Enqueues the sum of `count` elements at device address `input` into `output`."""
        arguments = (_address("input", input), _address("output", output),
                     _integer("count", count, "size_t"), _integer("dtype", dtype, "int32_t"),
                     _address("stream", stream))
        _check(library().prepare_all_reduce(self._live(), *arguments))

    def reduce_scatter(self, input: int, output: int, rows: int, width: int, dtype: int,
                       stream: int) -> None:
        """Enqueues the reduce-scatter of `rows` x `width` elements at device address `input`
        (the whole message) into `output` (this rank's rows, `owned_rows`)."""
        arguments = _row_arguments(input, output, rows, width, dtype, stream)
        _check(library().prepare_reduce_scatter(self._live(), *arguments))

    def all_gather(self, input: int, output: int, rows: int, width: int, dtype: int,
                   stream: int) -> None:
        """Enqueues the all-gather of `rows` x `width` elements: this rank's rows at device
        address `input` (`owned_rows`), every rank's at their place in `output`."""
        arguments = _row_arguments(input, output, rows, width, dtype, stream)
        _check(library().prepare_all_gather(self._live(), *arguments))

    def reduce_scatter_v(self, input: int, output: int, rows_per_rank: Sequence[int],
                         width: int, dtype: int, stream: int) -> None:
        """The reduce-scatter's v-form: rank r owns `rows_per_rank[r]` rows of `width`
        elements (the message's rows their sum) instead of the shape rule's."""
        arguments = _row_v_arguments(input, output, rows_per_rank, width, dtype, stream)
        _check(library().prepare_reduce_scatter_v(self._live(), *arguments))

    def all_gather_v(self, input: int, output: int, rows_per_rank: Sequence[int], width: int,
                     dtype: int, stream: int) -> None:
        """The all-gather's v-form: rank r owns `rows_per_rank[r]` rows of `width` elements."""
        arguments = _row_v_arguments(input, output, rows_per_rank, width, dtype, stream)
        _check(library().prepare_all_gather_v(self._live(), *arguments))

    def all_reduce_add_rms_norm(self, x: int, residual: int, weight: int, normed: int,
                                rows: int, hidden: int, eps: float, dtype: int,
                                stream: int) -> None:
        """Enqueues the fused all-reduce + residual add + RMSNorm of `rows` x `hidden` at
        device address `x`: the residual (0 for none) updated in place, the normalised rows
        into `normed`."""
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            raise InvalidArgument(f"eps is {_kind(eps)}: give a number of at least 0")
        arguments = (_address("x", x), _address("residual", residual or None),
                     _address("weight", weight), _address("normed", normed),
                     _integer("rows", rows, "size_t"), _integer("hidden", hidden, "size_t"),
                     float(eps), _integer("dtype", dtype, "int32_t"), _address("stream", stream))
        _check(library().prepare_all_reduce_add_rms_norm(self._live(), *arguments))

    # Each call below takes the package's key: a collective code, then a dtype code.

    def route(self, collective: int, dtype: int, nbytes: int) -> str:
        arguments = (*_key(collective, dtype), _integer("nbytes", nbytes, "uint64_t"))
        return _text(library().prepare_route, self._live(), *arguments)

    def choice_json(self, collective: int, dtype: int) -> str:
        key = _key(collective, dtype)
        return _text(library().prepare_choice_json, self._live(), *key)

    def serves(self, collective: int, dtype: int) -> bool:
        key = _key(collective, dtype)
        served = ctypes.c_int32(0)
        _check(library().prepare_serves(self._live(), *key, ctypes.byref(served)))
        return bool(served.value)

    def zero_copy_region(self, collective: int, dtype: int) -> Tuple[int, int]:
        """(device address, bytes) of the zero-copy region; (0, 0) when only NCCL runs."""
        key = _key(collective, dtype)
        address = ctypes.c_void_p()
        nbytes = ctypes.c_size_t()
        _check(library().prepare_zero_copy_region(self._live(), *key, ctypes.byref(address),
                                                  ctypes.byref(nbytes)))
        return address.value or 0, nbytes.value

    def force(self, collective: int, dtype: int, bucket: int, profile: str) -> None:
        """Routes a bucket to `profile`; InvalidArgument when it was dropped here or, unless the
        handle was opened with allow_inexact, its output differs from the reference sum."""
        arguments = (*_key(collective, dtype), _integer("bucket", bucket, "size_t"),
                     _c_string("profile", profile, path=False))
        _check(library().prepare_force(self._live(), *arguments))

    def check(self) -> None:
        _check(library().prepare_check(self._live()))

    def close(self) -> None:
        pointer, self._pointer = self._pointer, None
        if pointer is not None:
            _check(library().prepare_close(pointer))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def served_names(handle: NativeHandle, collective: int = 0) -> Iterable[str]:
    """The dtype names a handle serves for a collective code (all-reduce by default)."""
    return [name for name, code in DTYPE_CODES.items() if handle.serves(collective, code)]


def _key(collective: int, dtype: int) -> Tuple[int, int]:
    return _integer("collective", collective, "int32_t"), _integer("dtype", dtype, "int32_t")


def _row_arguments(input: Any, output: Any, rows: Any, width: Any, dtype: Any,
                   stream: Any) -> Tuple[Optional[int], Optional[int], int, int, int,
                                         Optional[int]]:
    return (_address("input", input), _address("output", output),
            _integer("rows", rows, "size_t"), _integer("width", width, "size_t"),
            _integer("dtype", dtype, "int32_t"), _address("stream", stream))


def _row_v_arguments(input: Any, output: Any, rows_per_rank: Any, width: Any, dtype: Any,
                     stream: Any) -> Tuple[Any, ...]:
    if isinstance(rows_per_rank, (str, bytes)) or not isinstance(rows_per_rank, Sequence):
        raise InvalidArgument(
            f"rows_per_rank is {_kind(rows_per_rank)}: give a list of row counts, one per rank")
    counts = [_integer(f"rows_per_rank[{index}]", count, "size_t")
              for index, count in enumerate(rows_per_rank)]
    ranks = _integer("len(rows_per_rank)", len(counts), "uint32_t")
    array = (ctypes.c_size_t * max(ranks, 1))(*counts)
    return (_address("input", input), _address("output", output), array, ranks,
            _integer("width", width, "size_t"), _integer("dtype", dtype, "int32_t"),
            _address("stream", stream))


def native_owned_rows(rows: int, world: int, rank: int) -> range:
    """The rows `rank` of `world` owns of a message of `rows`, as the C library says
    (`prepare_owned_rows`, the Rust `prepare::shape::owned_rows`)."""
    arguments = (_integer("rows", rows, "size_t"), _integer("world", world, "uint32_t"),
                 _integer("rank", rank, "uint32_t"))
    first, count = ctypes.c_size_t(), ctypes.c_size_t()
    _check(library().prepare_owned_rows(*arguments, ctypes.byref(first), ctypes.byref(count)))
    return range(first.value, first.value + count.value)
