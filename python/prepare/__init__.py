"""prepare: the fastest exact all-reduce, reduce-scatter and all-gather on this machine, for
tensor-parallel servers.

`prepare.Collectives` serves PyTorch tensors (it imports torch when made); the low-level
binding of the C ABI (`prepare.NativeHandle`, `prepare.unique_id`) needs no torch.
"""

from ._binding import (
    DTYPE_CODES,
    InternalError,
    InvalidArgument,
    NativeHandle,
    PackageRefused,
    PeerTimeout,
    PrepareError,
    RuntimeFailure,
    library_path,
    native_version,
    unique_id,
)
from ._shape import owned_rows
from .collectives import Collectives

__version__ = "0.2.0"

__all__ = [
    "Collectives",
    "DTYPE_CODES",
    "InternalError",
    "InvalidArgument",
    "NativeHandle",
    "PackageRefused",
    "PeerTimeout",
    "PrepareError",
    "RuntimeFailure",
    "__version__",
    "library_path",
    "native_version",
    "owned_rows",
    "unique_id",
]
