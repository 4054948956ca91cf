"""The C ABI (prepare.h, generated beside the library) through ctypes: status codes become
exceptions carrying the library's last error. No torch here: pointers and streams are integers."""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Iterable, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]

UNIQUE_ID_BYTES = 128

#: The C enum PrepareDtype: the codes the library takes for element types.
DTYPE_CODES = {"bf16": 0, "fp16": 1, "fp32": 2}

TUNINGS = {"runtime": 0, "static": 1}


class PrepareError(RuntimeError):
    """A call into prepare failed; `status` is the C status code."""

    status = 4

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(PrepareError, ValueError):
    """An argument is invalid (a CPU or non-contiguous tensor, a dtype no package holds, ...)."""

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


class _Options(ctypes.Structure):
    _fields_ = [
        ("packages", ctypes.POINTER(ctypes.c_char_p)),
        ("package_count", ctypes.c_size_t),
        ("cache_dir", ctypes.c_char_p),
        ("timeout_seconds", ctypes.c_double),
        ("tuning", ctypes.c_int32),
        ("retune", ctypes.c_int32),
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
    "prepare_route": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_char_p,
                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_choice_json": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_serves": ([ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)],
                       ctypes.c_int32),
    "prepare_zero_copy_region": ([ctypes.c_void_p, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int32),
    "prepare_force": ([ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t, ctypes.c_char_p],
                      ctypes.c_int32),
    "prepare_check": ([ctypes.c_void_p], ctypes.c_int32),
    "prepare_close": ([ctypes.c_void_p], ctypes.c_int32),
}


def library() -> ctypes.CDLL:
    """The C library, loaded on first use (it needs no GPU, driver or NCCL to load)."""
    global _library, _library_path
    with _lock:
        if _library is None:
            path = library_path()
            loaded = ctypes.CDLL(path)
            for name, (arguments, result) in _SIGNATURES.items():
                function = getattr(loaded, name)
                function.argtypes = arguments
                function.restype = result
            _library, _library_path = loaded, path
        return _library


def native_version() -> str:
    """The C library's version; equals `prepare.__version__` in a consistent install."""
    return library().prepare_version().decode()


def _check(status: int) -> None:
    if status == 0:
        return
    message = library().prepare_last_error().decode(errors="replace")
    raise _ERRORS.get(status, PrepareError)(message, status)


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
    """One rank's serving handle in the C library. Not thread-safe: one thread at a time."""

    def __init__(self, pointer: int):
        self._pointer: Optional[int] = pointer

    @staticmethod
    def _options(packages: Sequence[PathLike], cache_dir: Optional[PathLike], timeout: float,
                 tuning: str, retune: bool):
        if isinstance(packages, (str, bytes, os.PathLike)):
            packages = [packages]
        paths = [os.fsencode(package) for package in packages]
        if not paths:
            raise InvalidArgument("no package was given: give one package directory per dtype")
        if tuning not in TUNINGS:
            raise InvalidArgument(f"tuning={tuning!r}: use 'runtime' or 'static'")
        timeout = float(timeout)
        if not timeout > 0 or timeout != timeout or timeout == float("inf"):
            raise InvalidArgument(f"timeout={timeout!r}: give seconds above 0")
        options = _Options()
        _check(library().prepare_options_init(ctypes.byref(options)))
        array = (ctypes.c_char_p * len(paths))(*paths)
        options.packages = ctypes.cast(array, ctypes.POINTER(ctypes.c_char_p))
        options.package_count = len(paths)
        options.cache_dir = None if cache_dir is None else os.fsencode(cache_dir)
        options.timeout_seconds = timeout
        options.tuning = TUNINGS[tuning]
        options.retune = int(bool(retune))
        # The array must outlive the call: keep it with the options.
        return options, array

    @classmethod
    def open_unique_id(cls, packages: Union[PathLike, Sequence[PathLike]], unique_id: bytes,
                       rank: int, world: int, device: int, cache_dir: Optional[PathLike] = None,
                       timeout: float = 60.0, tuning: str = "runtime",
                       retune: bool = False) -> "NativeHandle":
        """Starts a handle from an NCCL unique id every rank received. Collective."""
        if not isinstance(unique_id, (bytes, bytearray)) or len(unique_id) != UNIQUE_ID_BYTES:
            raise InvalidArgument(f"unique_id must be {UNIQUE_ID_BYTES} bytes")
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune)
        identifier = ctypes.create_string_buffer(bytes(unique_id), UNIQUE_ID_BYTES)
        out = ctypes.c_void_p()
        _check(library().prepare_open_unique_id(ctypes.byref(options), identifier, rank, world,
                                                device, ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def open_env(cls, packages: Union[PathLike, Sequence[PathLike]],
                 cache_dir: Optional[PathLike] = None, timeout: float = 60.0,
                 tuning: str = "runtime", retune: bool = False) -> "NativeHandle":
        """Starts a handle from torchrun's variables. Collective."""
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune)
        out = ctypes.c_void_p()
        _check(library().prepare_open_env(ctypes.byref(options), ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def open_comm(cls, packages: Union[PathLike, Sequence[PathLike]], nccl_comm: int,
                  rank: int, world: int, device: int, nonblocking: bool = False,
                  cache_dir: Optional[PathLike] = None, timeout: float = 60.0,
                  tuning: str = "runtime", retune: bool = False) -> "NativeHandle":
        """Starts a handle split from the caller's `ncclComm_t` (an integer). Collective."""
        options, _keep = cls._options(packages, cache_dir, timeout, tuning, retune)
        out = ctypes.c_void_p()
        _check(library().prepare_open_comm(ctypes.byref(options), nccl_comm, rank, world,
                                           device, int(bool(nonblocking)), ctypes.byref(out)))
        return cls(out.value)

    @property
    def closed(self) -> bool:
        return self._pointer is None

    def _live(self) -> int:
        if self._pointer is None:
            raise PrepareError("this prepare handle is closed")
        return self._pointer

    def all_reduce(self, input: int, output: int, count: int, dtype: int, stream: int) -> None:
        """Enqueues the sum of `count` elements at device address `input` into `output`."""
        _check(library().prepare_all_reduce(self._live(), input, output, count, dtype, stream))

    def route(self, dtype: int, nbytes: int) -> str:
        return _text(library().prepare_route, self._live(), dtype, nbytes)

    def choice_json(self, dtype: int) -> str:
        return _text(library().prepare_choice_json, self._live(), dtype)

    def serves(self, dtype: int) -> bool:
        served = ctypes.c_int32(0)
        _check(library().prepare_serves(self._live(), dtype, ctypes.byref(served)))
        return bool(served.value)

    def zero_copy_region(self, dtype: int) -> Tuple[int, int]:
        """(device address, bytes) of the zero-copy region; (0, 0) when only NCCL runs."""
        address = ctypes.c_void_p()
        nbytes = ctypes.c_size_t()
        _check(library().prepare_zero_copy_region(self._live(), dtype, ctypes.byref(address),
                                                  ctypes.byref(nbytes)))
        return address.value or 0, nbytes.value

    def force(self, dtype: int, bucket: int, profile: str) -> None:
        if bucket < 0:
            raise InvalidArgument(f"bucket {bucket} is negative")
        _check(library().prepare_force(self._live(), dtype, bucket, profile.encode()))

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


def served_names(handle: NativeHandle) -> Iterable[str]:
    """The dtype names a handle serves."""
    return [name for name, code in DTYPE_CODES.items() if handle.serves(code)]
