"""`Collectives`: prepare's serving handle for a PyTorch tensor-parallel server. torch is
imported when a `Collectives` is made, never by `import prepare`."""

import itertools
import json
import math
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ._shape import (
    EpilogueShape,
    RowShape,
    all_gather_shape,
    epilogue_shape,
    is_in_place,
    reduce_scatter_shape,
    spans_overlap,
)
from ._binding import (
    COLLECTIVE_CODES,
    DTYPE_CODES,
    InvalidArgument,
    NativeHandle,
    PrepareError,
    RuntimeFailure,
    error_class,
    start_arguments,
    unique_id,
)

PathLike = Union[str, "os.PathLike[str]"]

# The collective of `all_reduce` and the default of every keyword `collective`.
_ALL_REDUCE = COLLECTIVE_CODES["all_reduce"]


def _collective_code(collective: Any) -> int:
    """The C code of a collective's name; InvalidArgument listing the names otherwise."""
    if not isinstance(collective, str) or collective not in COLLECTIVE_CODES:
        names = ", ".join(repr(name) for name in COLLECTIVE_CODES)
        raise InvalidArgument(f"collective={collective!r}: give one of {names}")
    return COLLECTIVE_CODES[collective]

# Live handles by integer id: what the custom ops (`prepare::all_reduce`, ...) refer to, so a
# compiled graph holds a number rather than a Python object.
_REGISTRY: Dict[int, "Collectives"] = {}
_NEXT_ID = itertools.count(1)
_REGISTRY_LOCK = threading.Lock()
_OP_LOCK = threading.Lock()
_OP: Any = None


_TORCH: Any = None


def _torch():
    """torch, imported on first use (an attribute read afterwards, which tracing follows)."""
    global _TORCH
    if _TORCH is None:
        try:
            import torch
            import torch.distributed
        except ImportError as error:
            raise ImportError(
                "prepare.Collectives needs PyTorch (install torch); the rest of prepare does "
                "not") from error
        _TORCH = torch
    return _TORCH


def _dtype_names(torch) -> Dict[Any, str]:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _registered(handle: int) -> "Collectives":
    with _REGISTRY_LOCK:
        collectives = _REGISTRY.get(handle)
    if collectives is None:
        raise InvalidArgument(f"prepare handle {handle} is closed")
    return collectives


def _registered_op():
    """The custom ops, registered once per process, each with a fake implementation for
    tracing: `torch.ops.prepare.all_reduce(handle, output, input)` mutates `output`, `input`
    None meaning in place; `torch.ops.prepare.reduce_scatter(handle, output, input)` and
    `torch.ops.prepare.all_gather(handle, output, input)` mutate `output`, whose shape says the
    message's (the all-gather's total rows are its first dimension); their v-forms
    `torch.ops.prepare.reduce_scatter_v(handle, output, input, rows_per_rank)` and
    `torch.ops.prepare.all_gather_v(...)` take the per-rank rows too."""
    global _OP
    with _OP_LOCK:
        if _OP is not None:
            return _OP
        torch = _torch()

        @torch.library.custom_op("prepare::all_reduce", mutates_args=("output",),
                                 device_types="cuda")
        def all_reduce(handle: int, output: torch.Tensor,
                       input: Optional[torch.Tensor]) -> None:
            _registered(handle)._enqueue(output if input is None else input, output)

        @all_reduce.register_fake
        def _(handle: int, output: torch.Tensor, input: Optional[torch.Tensor]) -> None:
            return None

        @torch.library.custom_op("prepare::reduce_scatter", mutates_args=("output",),
                                 device_types="cuda")
        def reduce_scatter(handle: int, output: torch.Tensor, input: torch.Tensor) -> None:
            _registered(handle)._enqueue_rows("reduce_scatter", input, output)

        @reduce_scatter.register_fake
        def _(handle: int, output: torch.Tensor, input: torch.Tensor) -> None:
            # The shapes are checked as the eager call checks them; nothing is written.
            _registered(handle)._row_shape("reduce_scatter", input, output)

        @torch.library.custom_op("prepare::all_gather", mutates_args=("output",),
                                 device_types="cuda")
        def all_gather(handle: int, output: torch.Tensor, input: torch.Tensor) -> None:
            _registered(handle)._enqueue_rows("all_gather", input, output)

        @all_gather.register_fake
        def _(handle: int, output: torch.Tensor, input: torch.Tensor) -> None:
            _registered(handle)._row_shape("all_gather", input, output)

        @torch.library.custom_op("prepare::reduce_scatter_v", mutates_args=("output",),
                                 device_types="cuda")
        def reduce_scatter_v(handle: int, output: torch.Tensor, input: torch.Tensor,
                             rows_per_rank: List[int]) -> None:
            _registered(handle)._enqueue_rows("reduce_scatter", input, output, rows_per_rank)

        @reduce_scatter_v.register_fake
        def _(handle: int, output: torch.Tensor, input: torch.Tensor,
              rows_per_rank: List[int]) -> None:
            _registered(handle)._row_shape("reduce_scatter", input, output, rows_per_rank)

        @torch.library.custom_op("prepare::all_gather_v", mutates_args=("output",),
                                 device_types="cuda")
        def all_gather_v(handle: int, output: torch.Tensor, input: torch.Tensor,
                         rows_per_rank: List[int]) -> None:
            _registered(handle)._enqueue_rows("all_gather", input, output, rows_per_rank)

        @all_gather_v.register_fake
        def _(handle: int, output: torch.Tensor, input: torch.Tensor,
              rows_per_rank: List[int]) -> None:
            _registered(handle)._row_shape("all_gather", input, output, rows_per_rank)

        @torch.library.custom_op("prepare::all_reduce_add_rms_norm",
                                 mutates_args=("normed", "residual"), device_types="cuda")
        def all_reduce_add_rms_norm(handle: int, normed: torch.Tensor,
                                    residual: Optional[torch.Tensor], x: Optional[torch.Tensor],
                                    weight: torch.Tensor, eps: float) -> None:
            _registered(handle)._enqueue_epilogue(normed if x is None else x, residual, weight,
                                                  eps, normed)

        @all_reduce_add_rms_norm.register_fake
        def _(handle: int, normed: torch.Tensor, residual: Optional[torch.Tensor],
              x: Optional[torch.Tensor], weight: torch.Tensor, eps: float) -> None:
            _registered(handle)._epilogue_shape(normed if x is None else x, residual, weight,
                                                eps, normed)

        _OP = (all_reduce, reduce_scatter, all_gather, all_reduce_add_rms_norm,
               reduce_scatter_v, all_gather_v)
        return _OP


class _Region:
    """One view of the zero-copy region through `__cuda_array_interface__`. torch keeps this
    object alive as long as any tensor made from it, and it keeps the native handle alive."""

    def __init__(self, native: NativeHandle, address: int, nbytes: int):
        self.native = native
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
        }


class Collectives:
    """prepare's all-reduce, reduce-scatter, all-gather and fused all-reduce + residual add +
    RMSNorm for the ranks of a `torch.distributed` process group.

    Collective to create: every rank of `group` (default: the default group) calls it with
    the same packages and options, after `torch.distributed.init_process_group` and
    `torch.cuda.set_device`. One NCCL bootstrap: rank 0 of the group makes an NCCL unique id
    and it travels over `group`. `packages` is one package directory or several, at most one
    per (collective, dtype). `cache_dir` None uses the default cache (`$XDG_CACHE_HOME/prepare`
    or `~/.cache/prepare`), "" keeps none. `timeout` (seconds) bounds the bootstrap and every
    wait for a peer. `tuning` is "runtime" (cache, or check and time on this machine) or
    "static" (each bucket's default). `allow_inexact` False (the default) keeps every candidate
    whose output differs from the reference sum (plain NCCL beyond two ranks) out of the
    choice and of `force`; True keeps them, so the winner may change the output.

    Collectives must be made in the same order on every rank (a reduce-scatter or all-gather
    of the same rows and width), one stream at a time. `PREPARE_CHECK_CALLS=1` in every
    rank's environment before the handle starts checks that at every eager call, at the cost
    of a host round trip each (docs/serving.md, "The call check").
    """

    def __init__(self, packages: Union[PathLike, Sequence[PathLike]], group: Any = None,
                 cache_dir: Optional[PathLike] = None, timeout: float = 60,
                 tuning: str = "runtime", allow_inexact: bool = False):
        torch = _torch()
        dist = torch.distributed
        self._native: Optional[NativeHandle] = None
        self._id: Optional[int] = None
        # The same checks as the library's start, before any collective step.
        paths = start_arguments(packages, cache_dir, timeout, tuning, allow_inexact)[0]
        if not torch.cuda.is_available():
            raise RuntimeFailure("no CUDA GPU is visible to PyTorch; prepare needs one per rank")
        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidArgument(
                "torch.distributed is not initialized: call "
                "torch.distributed.init_process_group before prepare.Collectives")
        if group is None:
            group = dist.group.WORLD
        rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        if rank < 0:
            raise InvalidArgument("this process is not a member of the given group")
        self.group = group
        self.rank: int = rank
        self.world_size: int = world
        self.device: int = torch.cuda.current_device()
        self._names = _dtype_names(torch)

        # The one bootstrap: rank 0's unique id, or why it has none (its error's status, None
        # for a library that was refused), over the group; every rank raises that class.
        message: List[Any] = [None]
        if rank == 0:
            try:
                message = [(0, unique_id())]
            except PrepareError as error:
                message = [(error.status, f"rank 0 could not make an NCCL unique id: {error}")]
            except ImportError as error:
                message = [(None, f"rank 0: {error}")]
        root = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
        dist.broadcast_object_list(message, src=root, group=group)
        status, payload = message[0]
        if status is None:
            raise ImportError(payload)
        if status != 0:
            raise error_class(status)(payload)
        self._native = NativeHandle.open_unique_id(
            paths, payload, rank, world, self.device, cache_dir=cache_dir,
            timeout=timeout, tuning=tuning, allow_inexact=allow_inexact)
        self._served = [(collective, dtype) for collective, code in COLLECTIVE_CODES.items()
                        for dtype, name in self._names.items()
                        if self._native.serves(code, _code(name))]
        _registered_op()
        with _REGISTRY_LOCK:
            self._id = next(_NEXT_ID)
            _REGISTRY[self._id] = self

    # Checks, before anything reaches the library.

    def _live(self) -> NativeHandle:
        if self._native is None or self._native.closed:
            raise InvalidArgument("this prepare.Collectives is closed")
        return self._native

    def _pair(self, collective: Any, dtype: Any) -> Tuple[int, int]:
        """The C codes of (collective, dtype), which one of the handle's packages must hold."""
        collective_code = _collective_code(collective)
        name = self._names.get(dtype)
        if (collective, dtype) not in self._served:
            served = ", ".join(f"{held} {held_dtype}" for held, held_dtype in self._served)
            raise InvalidArgument(
                f"no package holds {collective} {dtype}"
                f"{'' if name else ' (prepare has no such dtype)'}; "
                f"this handle serves {served or 'nothing'}")
        return collective_code, _code(name)

    def _code(self, dtype: Any) -> int:
        """The C code of an all-reduce's dtype, which one of the handle's packages must hold."""
        return self._pair("all_reduce", dtype)[1]

    def _check_tensor(self, tensor: Any, what: str) -> None:
        torch = _torch()
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgument(f"{what} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.device.type != "cuda":
            raise InvalidArgument(
                f"{what} is on {tensor.device}: prepare all-reduces CUDA tensors "
                f"(this rank's GPU is cuda:{self.device})")
        if tensor.device.index != self.device:
            raise InvalidArgument(
                f"{what} is on {tensor.device}, but this handle drives cuda:{self.device}")
        if not tensor.is_contiguous():
            raise InvalidArgument(
                f"{what} is not contiguous (strides {tuple(tensor.stride())}); "
                "call .contiguous() or all-reduce a contiguous buffer")

    # The all-reduce.

    def all_reduce(self, tensor: Any, out: Any = None) -> Any:
        """Sums `tensor` over the ranks into `out` (default: in place) on the current CUDA
        stream; enqueue only, so it is captured by `torch.cuda.graph` and traced by
        `torch.compile` (as `torch.ops.prepare.all_reduce`). Returns the result tensor. A
        tensor from `empty()` is reduced without any copy."""
        self._live()
        self._check_tensor(tensor, "the tensor")
        self._code(tensor.dtype)
        torch = _torch()
        compiling = torch.compiler.is_compiling()
        if out is not None and out is not tensor:
            self._check_tensor(out, "out")
            if out.shape != tensor.shape or out.dtype != tensor.dtype:
                raise InvalidArgument(
                    f"out is {tuple(out.shape)} {out.dtype}, the tensor is "
                    f"{tuple(tensor.shape)} {tensor.dtype}: they must match")
            if not compiling:
                start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
                out_start, out_end = out.data_ptr(), out.data_ptr() + out.nbytes
                if out_start == start:
                    out = None
                elif out_start < end and start < out_end:
                    raise InvalidArgument(
                        "out overlaps the tensor without being the same memory")
        if compiling:
            torch.ops.prepare.all_reduce(self._id, tensor if out is None else out,
                                         None if out is None else tensor)
        else:
            self._enqueue(tensor, tensor if out is None else out)
        return tensor if out is None else out

    def _enqueue(self, input: Any, output: Any) -> None:
        torch = _torch()
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._live().all_reduce(input.data_ptr(), output.data_ptr(), input.numel(),
                                self._code(input.dtype), stream)

    # The reduce-scatter and the all-gather: rows are a tensor's first dimension, the width
    # the product of the others; rank r owns a contiguous run of rows (`prepare.owned_rows`).

    def reduce_scatter(self, input: Any, out: Any = None,
                       rows_per_rank: Optional[Sequence[int]] = None) -> Any:
        """Sums `input` (the whole message on every rank, rows its first dimension) over the
        ranks and writes this rank's rows of the sum (`prepare.owned_rows`: the first
        `rows % world` ranks own one row more, a rank may own none) into `out`, of shape
        (owned rows, *input.shape[1:]), allocated when None. In place when `out` is this
        rank's rows of `input` (`input[owned.start:owned.stop]`); any other overlap is
        refused. On the current CUDA stream, enqueue only: captured by `torch.cuda.graph`,
        traced by `torch.compile` (as `torch.ops.prepare.reduce_scatter`). Returns `out`.

        `rows_per_rank` (vLLM's `reduce_scatterv`): rank r owns `rows_per_rank[r]` rows
        instead, contiguous runs in rank order summing to the input's rows; every rank passes
        the same list (checked across the ranks only with `PREPARE_CHECK_CALLS=1`: the
        caller's contract, docs/serving.md). The rule's list goes exactly as the call without
        it; any other through the exact NCCL reduce-scatter (traced as
        `torch.ops.prepare.reduce_scatter_v`)."""
        self._live()
        self._check_tensor(input, "the input")
        self._pair("reduce_scatter", input.dtype)
        if out is not None:
            self._check_tensor(out, "out")
        shape = reduce_scatter_shape(input.shape, self.world_size, self.rank, rows_per_rank)
        return self._rows("reduce_scatter", input, out, shape)

    def all_gather(self, input: Any, out: Any = None, rows: Optional[int] = None,
                   rows_per_rank: Optional[Sequence[int]] = None) -> Any:
        """Gathers every rank's rows into `out`, the whole message in rank order: `input` is
        this rank's rows (`prepare.owned_rows` of the total). The total rows are `out`'s first
        dimension or `rows` (one is needed, since this rank's rows do not give the total; both
        must agree); `out`, of shape (rows, *input.shape[1:]), is allocated when None. In
        place when `input` is this rank's rows of `out`; any other overlap is refused. On the
        current CUDA stream, enqueue only: captured by `torch.cuda.graph`, traced by
        `torch.compile` (as `torch.ops.prepare.all_gather`). Returns `out`.

        `rows_per_rank` (vLLM's `all_gatherv`): rank r owns `rows_per_rank[r]` rows instead,
        the total their sum (so `out` and `rows` may be left out); every rank passes the same
        list. The rule's list goes exactly as the call without it; any other through NCCL's
        grouped sends and receives (traced as `torch.ops.prepare.all_gather_v`)."""
        self._live()
        self._check_tensor(input, "the input")
        self._pair("all_gather", input.dtype)
        if out is not None:
            self._check_tensor(out, "out")
        shape = all_gather_shape(input.shape, None if out is None else out.shape, rows,
                                 self.world_size, self.rank, rows_per_rank)
        return self._rows("all_gather", input, out, shape)

    def _rows(self, collective: str, input: Any, out: Any, shape: RowShape) -> Any:
        torch = _torch()
        if out is None:
            out = torch.empty(shape.output, dtype=input.dtype, device=input.device)
        else:
            if tuple(out.shape) != shape.output or out.dtype != input.dtype:
                raise InvalidArgument(
                    f"out is {tuple(out.shape)} {out.dtype}; this rank's {collective} of the "
                    f"input {tuple(input.shape)} {input.dtype} writes {shape.output} "
                    f"{input.dtype}")
        counts = shape.rows_per_rank
        if torch.compiler.is_compiling():
            if counts is None:
                getattr(torch.ops.prepare, collective)(self._id, out, input)
            else:
                getattr(torch.ops.prepare, f"{collective}_v")(self._id, out, input, list(counts))
        else:
            self._enqueue_rows(collective, input, out, counts)
        return out

    def _row_shape(self, collective: str, input: Any, output: Any,
                   rows_per_rank: Optional[Sequence[int]] = None) -> RowShape:
        """The message of a row collective from its operands' shapes (the all-gather's total
        rows are its output's first dimension) and the per-rank rows when given, checked."""
        if collective == "reduce_scatter":
            shape = reduce_scatter_shape(input.shape, self.world_size, self.rank, rows_per_rank)
        else:
            shape = all_gather_shape(input.shape, output.shape, None, self.world_size,
                                     self.rank, rows_per_rank)
        if tuple(output.shape) != shape.output:
            raise InvalidArgument(
                f"out is {tuple(output.shape)}; this rank's {collective} of the input "
                f"{tuple(input.shape)} writes {shape.output}")
        return shape

    def _enqueue_rows(self, collective: str, input: Any, output: Any,
                      rows_per_rank: Optional[Sequence[int]] = None) -> None:
        torch = _torch()
        shape = self._row_shape(collective, input, output, rows_per_rank)
        code = self._pair(collective, input.dtype)[1]
        # The library refuses any other overlap too; checked here to name the arguments.
        is_in_place(collective, (input.data_ptr(), input.nbytes),
                    (output.data_ptr(), output.nbytes), shape.own_offset(input.element_size()))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if shape.rows_per_rank is None:
            enqueue = getattr(self._live(), collective)
            enqueue(input.data_ptr(), output.data_ptr(), shape.rows, shape.width, code, stream)
        else:
            enqueue = getattr(self._live(), f"{collective}_v")
            enqueue(input.data_ptr(), output.data_ptr(), list(shape.rows_per_rank), shape.width,
                    code, stream)

    # The fused all-reduce + residual add + RMSNorm.

    def all_reduce_add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float,
                                out: Any = None) -> Any:
        """Sums `x` over the ranks, adds `residual` (None: nothing; otherwise updated in place
        to the sum plus the residual, as vLLM's `fused_add_rms_norm` does) and writes RMSNorm
        of that times `weight` into `out` (allocated when None; `out` may be `x` itself, which
        is then not kept). `x` and `residual` are (..., hidden), the hidden size the last
        dimension, a multiple of 8; `weight` is (hidden,); all of one dtype; `eps` at least 0,
        passed on as an f32. Every rank's outputs are the same bits, those of prepare's
        reference (docs/design.md), fused or not. On the current CUDA stream, enqueue only:
        captured by `torch.cuda.graph`, traced by `torch.compile` (as
        `torch.ops.prepare.all_reduce_add_rms_norm`). Returns `out`."""
        self._live()
        self._check_tensor(x, "x")
        self._pair("all_reduce_add_rms_norm", x.dtype)
        if residual is not None:
            self._check_tensor(residual, "the residual")
        self._check_tensor(weight, "the weight")
        # The shapes first, so a bad call allocates nothing.
        epilogue_shape(x.shape, None if residual is None else residual.shape, weight.shape, eps)
        torch = _torch()
        if out is None:
            out = torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        else:
            self._check_tensor(out, "out")
        self._epilogue_shape(x, residual, weight, eps, out)
        in_place = out.data_ptr() == x.data_ptr()
        if torch.compiler.is_compiling():
            torch.ops.prepare.all_reduce_add_rms_norm(self._id, out, residual,
                                                      None if in_place else x, weight,
                                                      float(eps))
        else:
            self._enqueue_epilogue(x, residual, weight, eps, out)
        return out

    def _epilogue_shape(self, x: Any, residual: Any, weight: Any, eps: Any,
                        normed: Any) -> EpilogueShape:
        """The epilogue's message from its operands, checked: shapes, one dtype, and where
        they lie (normed is x or apart from it; nothing written overlaps another operand)."""
        shape = epilogue_shape(x.shape, None if residual is None else residual.shape,
                               weight.shape, eps)
        for what, tensor in (("the residual", residual), ("the weight", weight),
                             ("out", normed)):
            if tensor is not None and tensor.dtype != x.dtype:
                raise InvalidArgument(
                    f"{what} is {tensor.dtype} and x {x.dtype}: they must have one dtype")
        if tuple(normed.shape) != shape.shape:
            raise InvalidArgument(
                f"out is {tuple(normed.shape)}; the epilogue of x {shape.shape} writes "
                f"{shape.shape}")
        if _torch().compiler.is_compiling():
            return shape
        spans = {"x": (x.data_ptr(), x.nbytes), "out": (normed.data_ptr(), normed.nbytes),
                 "the weight": (weight.data_ptr(), weight.nbytes)}
        if residual is not None:
            spans["the residual"] = (residual.data_ptr(), residual.nbytes)
        written = ["out"] + (["the residual"] if residual is not None else [])
        for what in written:
            for other, span in spans.items():
                if other == what or (what == "out" and other == "x" and span == spans["out"]):
                    continue
                if spans_overlap(spans[what], span):
                    raise InvalidArgument(
                        f"{what} overlaps {other}: the epilogue writes {what}, so it must lie "
                        "apart from every other operand (out may be x itself)")
        return shape

    def _enqueue_epilogue(self, x: Any, residual: Any, weight: Any, eps: Any,
                          normed: Any) -> None:
        torch = _torch()
        shape = self._epilogue_shape(x, residual, weight, eps, normed)
        code = self._pair("all_reduce_add_rms_norm", x.dtype)[1]
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._live().all_reduce_add_rms_norm(
            x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
            normed.data_ptr(), shape.rows, shape.hidden, float(eps), code, stream)

    # Zero copy.

    def empty(self, shape: Union[int, Sequence[int]], dtype: Any = None, *,
              collective: str = "all_reduce") -> Any:
        """A tensor in this rank's zero-copy region of (`collective`, `dtype`) (peer-visible
        memory, like `symm_mem.empty`): given to that collective as its input, it is read
        where it lies, copied by no candidate. Every tensor from `empty` starts at the region's
        first byte: the region holds one message at a time. Where only NCCL runs it is an
        ordinary `torch.empty`."""
        torch = _torch()
        dtype = torch.bfloat16 if dtype is None else dtype
        native = self._live()
        collective_code, code = self._pair(collective, dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(int(size) for size in shape)
        if any(size < 0 for size in shape):
            raise InvalidArgument(f"shape {shape} has a negative size")
        numel = math.prod(shape)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        address, capacity = native.zero_copy_region(collective_code, code)
        if address == 0 or numel == 0:
            return torch.empty(shape, dtype=dtype, device=f"cuda:{self.device}")
        if nbytes > capacity:
            raise InvalidArgument(
                f"{nbytes} bytes do not fit the {collective} {dtype} zero-copy region of "
                f"{capacity} bytes; a larger {collective} input goes in an ordinary tensor")
        with torch.cuda.device(self.device):
            raw = torch.as_tensor(_Region(native, address, nbytes), device=f"cuda:{self.device}")
        return raw.view(dtype).view(shape)

    def zero_copy_bytes(self, dtype: Any = None, *, collective: str = "all_reduce") -> int:
        """Bytes the zero-copy region of (`collective`, `dtype`) holds (0 where only NCCL
        runs)."""
        torch = _torch()
        dtype = torch.bfloat16 if dtype is None else dtype
        native = self._live()
        return native.zero_copy_region(*self._pair(collective, dtype))[1]

    # What was chosen.

    @property
    def dtypes(self) -> Tuple[Any, ...]:
        """The torch dtypes this handle all-reduces."""
        return tuple(dtype for collective, dtype in self._served if collective == "all_reduce")

    @property
    def served(self) -> Tuple[Tuple[str, Any], ...]:
        """Every (collective, torch dtype) one of this handle's packages holds."""
        return tuple(self._served)

    def choice(self, collective: str = "all_reduce") -> Dict[Any, Dict[str, Any]]:
        """The agreed choice of `collective` per torch dtype, as the choice file's JSON: per
        bucket its winner, and every candidate with its figures or why it was excluded."""
        _collective_code(collective)
        native = self._live()
        return {dtype: json.loads(native.choice_json(*self._pair(collective, dtype)))
                for held, dtype in self._served if held == collective}

    def route(self, nbytes: int, dtype: Any = None, *, collective: str = "all_reduce") -> str:
        """Which kernel a message of `nbytes` of (`collective`, `dtype`) goes to, e.g.
        "one_shot_push (bucket 2)"."""
        torch = _torch()
        dtype = torch.bfloat16 if dtype is None else dtype
        return self._live().route(*self._pair(collective, dtype), nbytes)

    def force(self, bucket: int, profile: str, dtype: Any = None, *,
              collective: str = "all_reduce") -> None:
        """Runs candidate `profile` for bucket `bucket` of (`collective`, `dtype`) instead of
        the agreed winner (the override tests use). Every rank must force the same, before the
        collectives run. A candidate dropped here, or one whose output differs from the
        reference sum unless this handle was made with `allow_inexact=True`, is refused with
        InvalidArgument naming it and the policy."""
        torch = _torch()
        dtype = torch.bfloat16 if dtype is None else dtype
        self._live().force(*self._pair(collective, dtype), bucket, profile)

    def check(self) -> None:
        """Raises `prepare.PeerTimeout`, naming the peer, when a kernel gave up waiting for
        one (the handle is then unusable on every rank). The next `all_reduce` checks too."""
        self._live().check()

    # Lifetime.

    def close(self) -> None:
        """Releases the handle; idempotent. Tensors from `empty()` keep its memory until they
        are gone. Work it enqueued must have run and graphs holding it must not replay."""
        with _REGISTRY_LOCK:
            if self._id is not None:
                _REGISTRY.pop(self._id, None)
        native, self._native = self._native, None
        if native is not None:
            # Views of the zero-copy region hold `native` too: it closes with the last one.
            del native

    @property
    def closed(self) -> bool:
        return self._native is None

    def __enter__(self) -> "Collectives":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "serving " + ", ".join(
            f"{collective} {dtype}" for collective, dtype in self._served)
        return (f"prepare.Collectives(rank {getattr(self, 'rank', '?')} of "
                f"{getattr(self, 'world_size', '?')}, cuda:{getattr(self, 'device', '?')}, "
                f"{state})")


def _code(name: str) -> int:
    return DTYPE_CODES[name]
