"""NCCL's symmetric-memory all-reduce, driven through the library itself (ctypes, no torch).

NCCL 2.27 added kernels for buffers that every rank registers as one symmetric window: each
rank's buffer lies at the same offset of the window, so a kernel reaches a peer's copy without
looking up its address. torch does not expose them, so the contender calls NCCL directly, in
the libnccl that torch already loaded into the process (found in /proc/self/maps):

* set-up, local: `ncclGetVersion` (2.27 or later, else the contender is unavailable), one
  buffer of the largest message from `ncclMemAlloc`, and on rank 0 `ncclGetUniqueId`;
* set-up, collective: rank 0's 128-byte id broadcast through torch.distributed, then
  `ncclCommInitRank` on every rank (the CUDA device is the one torch set), then
  `ncclCommWindowRegister(comm, buffer, bytes, &window, NCCL_WIN_COLL_SYMMETRIC)`;
* one op: `ncclAllReduce(buffer, buffer, count, ncclBfloat16, ncclSum, comm, stream)` in place,
  on torch's current stream (inside `torch.cuda.graph`, the capture stream);
* the input is copied in, and the result out, with `cuMemcpyAsync` on the same stream;
* at the end: `ncclCommWindowDeregister`, `ncclMemFree`, `ncclCommDestroy`.
"""

import ctypes
import sys

from .common import describe
from .contenders import Contender

# nccl.h: NCCL_UNIQUE_ID_BYTES, the window flag, ncclDataType_t ncclBfloat16, ncclRedOp_t ncclSum.
NCCL_UNIQUE_ID_BYTES = 128
NCCL_WIN_COLL_SYMMETRIC = 0x01
NCCL_BFLOAT16 = 9
NCCL_SUM = 0
# The first release with symmetric windows and the kernels that use them.
MIN_VERSION = (2, 27, 0)
MAPS = "/proc/self/maps"


def decode_version(code):
    """(major, minor, patch) of an `ncclGetVersion` code.

    From 2.9 on the code is major x 10000 + minor x 100 + patch; before, major x 1000 +
    minor x 100 + patch.
    """
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100


def format_version(code):
    return ".".join(str(part) for part in decode_version(code))


def version_refusal(code):
    """Why NCCL of this `ncclGetVersion` code cannot run the contender, or None."""
    if decode_version(code) >= MIN_VERSION:
        return None
    wanted = ".".join(str(part) for part in MIN_VERSION[:2])
    return (
        f"NCCL {format_version(code)} has no symmetric windows or symmetric kernels "
        f"(ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC needs NCCL {wanted} or later)"
    )


def mapped_nccl_libraries(maps):
    """Files named in /proc/self/maps text whose name starts with `libnccl.so`, in order."""
    found = []
    for line in maps.splitlines():
        # address perms offset device inode path; the path may hold spaces.
        fields = line.split(None, 5)
        if len(fields) < 6:
            continue
        path = fields[5]
        # A file replaced on disk since it was loaded cannot be opened by its name.
        if path.endswith(" (deleted)") or not path.startswith("/"):
            continue
        if path.rsplit("/", 1)[-1].startswith("libnccl.so") and path not in found:
            found.append(path)
    return found


def loaded_nccl():
    """The libnccl this process already mapped (torch's), or an error naming what was sought."""
    try:
        with open(MAPS, encoding="utf-8", errors="replace") as handle:
            maps = handle.read()
    except OSError as exc:
        raise RuntimeError(f"cannot read {MAPS} to find torch's NCCL: {exc}") from exc
    paths = mapped_nccl_libraries(maps)
    if not paths:
        raise RuntimeError(
            f"no file named libnccl.so* is mapped in this process ({MAPS}, read after torch "
            "started its NCCL process group): this torch does not load NCCL as a shared "
            "library, so there is no NCCL to call"
        )
    return paths[0]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


_int = ctypes.c_int
_ptr = ctypes.c_void_p
_size = ctypes.c_size_t
# nccl.h's prototypes (2.27 and 2.28); ncclResult_t and the enums are ints, handles pointers.
PROTOTYPES = {
    "ncclGetVersion": (_int, [ctypes.POINTER(_int)]),
    "ncclGetErrorString": (ctypes.c_char_p, [_int]),
    "ncclGetLastError": (ctypes.c_char_p, [_ptr]),
    "ncclGetUniqueId": (_int, [ctypes.POINTER(UniqueId)]),
    "ncclCommInitRank": (_int, [ctypes.POINTER(_ptr), _int, UniqueId, _int]),
    "ncclCommDestroy": (_int, [_ptr]),
    "ncclCommAbort": (_int, [_ptr]),
    "ncclMemAlloc": (_int, [ctypes.POINTER(_ptr), _size]),
    "ncclMemFree": (_int, [_ptr]),
    "ncclCommWindowRegister": (_int, [_ptr, _ptr, _size, ctypes.POINTER(_ptr), _int]),
    "ncclCommWindowDeregister": (_int, [_ptr, _ptr]),
    "ncclAllReduce": (_int, [_ptr, _ptr, _size, _int, _int, _ptr, _ptr]),
}


class Nccl:
    """The entry points of one libnccl file, checked before use."""

    def __init__(self, path):
        self.path = path
        # Already loaded by torch, so this returns the same library, not a second copy.
        self.library = ctypes.CDLL(path)
        get_version = self._function("ncclGetVersion")
        code = _int()
        result = get_version(ctypes.byref(code))
        if result != 0:
            raise RuntimeError(f"ncclGetVersion in {path} returned {result}")
        self.version_code = code.value
        self.version = format_version(code.value)

    def _function(self, name):
        try:
            function = getattr(self.library, name)
        except AttributeError:
            raise RuntimeError(f"{self.path} has no {name}") from None
        function.restype, function.argtypes = PROTOTYPES[name]
        return function

    def bind(self):
        """Every entry point the contender calls, with nccl.h's prototypes; missing ones are
        named."""
        missing = [name for name in PROTOTYPES if not hasattr(self.library, name)]
        if missing:
            raise RuntimeError(f"{self.path} lacks {', '.join(missing)}")
        for name in PROTOTYPES:
            setattr(self, name, self._function(name))

    def check(self, result, call, comm=None):
        if result == 0:
            return
        text = self.ncclGetErrorString(result)
        message = f"{call} failed: {text.decode(errors='replace') if text else result}"
        detail = self.ncclGetLastError(comm)
        if detail:
            message += f" ({detail.decode(errors='replace').strip()})"
        raise RuntimeError(message)

    def unique_id(self):
        made = UniqueId()
        self.check(self.ncclGetUniqueId(ctypes.byref(made)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(made), NCCL_UNIQUE_ID_BYTES)

    def comm_init_rank(self, world, unique_id, rank):
        given = UniqueId()
        ctypes.memmove(ctypes.addressof(given), unique_id, NCCL_UNIQUE_ID_BYTES)
        comm = _ptr()
        self.check(
            self.ncclCommInitRank(ctypes.byref(comm), world, given, rank), "ncclCommInitRank"
        )
        return comm.value

    def mem_alloc(self, nbytes):
        pointer = _ptr()
        self.check(self.ncclMemAlloc(ctypes.byref(pointer), nbytes), f"ncclMemAlloc({nbytes})")
        return pointer.value

    def window_register(self, comm, pointer, nbytes, flags):
        window = _ptr()
        result = self.ncclCommWindowRegister(comm, pointer, nbytes, ctypes.byref(window), flags)
        self.check(result, "ncclCommWindowRegister", comm)
        return window.value


class Driver:
    """cuMemcpyAsync from the CUDA driver, for copies into and out of NCCL's buffer."""

    def __init__(self):
        self.library = ctypes.CDLL("libcuda.so.1")
        self.library.cuMemcpyAsync.restype = _int
        self.library.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, _size, _ptr]
        self.library.cuGetErrorName.restype = _int
        self.library.cuGetErrorName.argtypes = [_int, ctypes.POINTER(ctypes.c_char_p)]

    def copy(self, destination, source, nbytes, stream):
        result = self.library.cuMemcpyAsync(destination, source, nbytes, stream)
        if result != 0:
            name = ctypes.c_char_p()
            self.library.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(
                f"cuMemcpyAsync failed: {name.value.decode() if name.value else result}"
            )


class NcclSymmetric(Contender):
    """In place in a buffer from `ncclMemAlloc`, registered as a symmetric window."""

    name = "nccl_symmetric"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.nccl = None
        self.driver = None
        self.buffer = None  # device pointer from ncclMemAlloc
        self.capacity = 0  # bytes
        self.unique_id = None  # rank 0's, until the communicator is made
        self.comm = None
        self.window = None
        self.elements = 0

    def allocate(self, max_elements):
        path = loaded_nccl()
        self.nccl = Nccl(path)
        self.ctx.header["nccl_symmetric"] = {
            "library": path,
            "version": self.nccl.version,
            "version_code": self.nccl.version_code,
        }
        refusal = version_refusal(self.nccl.version_code)
        if refusal is not None:
            raise RuntimeError(refusal)
        self.nccl.bind()
        self.driver = Driver()
        self.capacity = max_elements * 2
        self.buffer = self.nccl.mem_alloc(self.capacity)
        if self.ctx.rank == 0:
            self.unique_id = self.nccl.unique_id()

    def connect(self, unique_id):
        """ncclCommInitRank with rank 0's id (collective: every rank calls it)."""
        if not isinstance(unique_id, bytes) or len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise RuntimeError(f"rank 0's ncclUniqueId did not arrive (got {unique_id!r:.40})")
        self.unique_id = None
        self.comm = self.nccl.comm_init_rank(self.ctx.world, unique_id, self.ctx.rank)

    def register_window(self):
        """The whole buffer as one symmetric window (collective)."""
        self.window = self.nccl.window_register(
            self.comm, self.buffer, self.capacity, NCCL_WIN_COLL_SYMMETRIC
        )

    def _stream(self):
        return self.ctx.torch.cuda.current_stream().cuda_stream

    def bind(self, elements):
        if elements * 2 > self.capacity:
            raise ValueError(f"{elements * 2} bytes do not fit the window ({self.capacity} bytes)")
        self.elements = elements

    def reset(self, pristine):
        if pristine.numel() != self.elements or not pristine.is_contiguous():
            raise ValueError(f"the input must be {self.elements} contiguous elements")
        self.driver.copy(self.buffer, pristine.data_ptr(), self.elements * 2, self._stream())

    def op(self):
        nccl = self.nccl
        result = nccl.ncclAllReduce(
            self.buffer,
            self.buffer,
            self.elements,
            NCCL_BFLOAT16,
            NCCL_SUM,
            self.comm,
            self._stream(),
        )
        nccl.check(result, "ncclAllReduce", self.comm)

    def result(self):
        """A copy of the buffer's message, in a tensor ordered after the op on this stream."""
        copy = self._empty(self.elements)
        self.driver.copy(copy.data_ptr(), self.buffer, self.elements * 2, self._stream())
        return copy

    def close(self):
        """Deregisters the window, frees the buffer and ends the communicator.

        The window calls are collective; every rank closes the contenders in the same order.
        A communicator whose set-up failed somewhere is aborted, which waits for no peer.
        """
        super().close()
        nccl = self.nccl
        calls = []
        if self.window is not None:
            calls.append(("ncclCommWindowDeregister", (self.comm, self.window)))
        if self.buffer is not None:
            calls.append(("ncclMemFree", (self.buffer,)))
        if self.comm is not None:
            end = "ncclCommDestroy" if self.error is None else "ncclCommAbort"
            calls.append((end, (self.comm,)))
        for call, arguments in calls:
            try:
                nccl.check(getattr(nccl, call)(*arguments), call)
            except Exception as exc:
                sys.stderr.write(f"rank {self.ctx.rank}: {self.name}: {describe(exc)}\n")
        self.window = None
        self.buffer = None
        self.comm = None
