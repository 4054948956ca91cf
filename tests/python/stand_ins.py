"""Stand-ins for torch and for a tensor, shared by the torch-free tests of what `Collectives`
checks and hands the library."""

import math
import types

from prepare import collectives


class FakeTensor:
    """What `Collectives` reads of a tensor: its shape, dtype, device, layout and memory."""

    def __init__(self, shape, address, dtype="bf16 dtype", element_size=2):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = types.SimpleNamespace(type="cuda", index=0)
        self._address = address
        self._element_size = element_size

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._address

    def element_size(self):
        return self._element_size

    @property
    def nbytes(self):
        return math.prod(self.shape) * self._element_size

    def rows(self, start, stop):
        """The view of rows start:stop."""
        row = math.prod(self.shape[1:]) * self._element_size
        return FakeTensor((stop - start, *self.shape[1:]), self._address + start * row,
                          self.dtype, self._element_size)


def stand_in_collectives(monkeypatch, native, served):
    """A `Collectives` of rank 1 of 4 on stand-ins: torch (whose `empty` allocates FakeTensors,
    kept in the handle's `allocated`), the native handle `native`, serving `served` (pairs of
    collective and dtype, the dtypes "bf16 dtype" or "fp32 dtype")."""
    allocated = []

    def empty(shape, dtype, device):
        tensor = FakeTensor(shape, 0x90000 + 0x10000 * len(allocated), dtype)
        allocated.append(tensor)
        return tensor

    torch = types.SimpleNamespace(
        Tensor=FakeTensor, empty=empty,
        compiler=types.SimpleNamespace(is_compiling=lambda: False),
        cuda=types.SimpleNamespace(current_stream=lambda device: types.SimpleNamespace(
            cuda_stream=77)))
    monkeypatch.setattr(collectives, "_TORCH", torch)
    handle = object.__new__(collectives.Collectives)
    handle._native, handle._id = native, None
    handle.rank, handle.world_size, handle.device = 1, 4, 0
    handle._names = {"bf16 dtype": "bf16", "fp32 dtype": "fp32"}
    handle._served = list(served)
    handle.allocated = allocated
    return handle
