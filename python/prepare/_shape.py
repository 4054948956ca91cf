"""The shape rule of the reduce-scatter and the all-gather, in pure Python (no torch, no
library): what `Collectives` checks before any call, and what its custom ops' fake
implementations use for the shapes. The same rule as the library's (`prepare_owned_rows`),
which a test holds it to."""

import math
import operator
from typing import Any, Optional, Sequence, Tuple

from ._binding import InvalidArgument


def _count(name: str, value: Any, least: int) -> int:
    """`value` as an int of at least `least`, or InvalidArgument naming `name`."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise InvalidArgument(f"{name} is {type(value).__name__}: give an integer")
    number = operator.index(value)
    if number < least:
        raise InvalidArgument(f"{name}={number}: give an integer of at least {least}")
    return number


def owned_rows(rows: int, world: int, rank: int) -> range:
    """The rows of a message of `rows` that `rank` of `world` owns in a reduce-scatter or an
    all-gather: a contiguous run in rank order, `rows // world` long and one more for the
    first `rows % world` ranks (empty for a rank past the rows). Where the world divides the
    rows this is `torch.distributed.reduce_scatter_tensor`'s and `all_gather_into_tensor`'s
    layout."""
    rows = _count("rows", rows, 0)
    world = _count("world", world, 1)
    rank = _count("rank", rank, 0)
    if rank >= world:
        raise InvalidArgument(f"rank {rank} is not below the world size {world}")
    each, longer = divmod(rows, world)
    start = rank * each + min(rank, longer)
    return range(start, start + each + (1 if rank < longer else 0))


def _rows_and_width(what: str, shape: Sequence[int]) -> Tuple[int, Tuple[int, ...], int]:
    """(rows, the shape of a row, width) of a tensor of `shape`: rows its first dimension,
    width the product of the others, at least 1."""
    shape = tuple(shape)
    if not shape:
        raise InvalidArgument(f"{what} is a 0-d tensor: give rows as its first dimension")
    rest = shape[1:]
    width = math.prod(rest)
    if width == 0:
        raise InvalidArgument(
            f"{what} is {shape}: its rows are empty (width 0, the product of the dimensions "
            "after the first); the width must be at least 1")
    return shape[0], rest, width


def rows_per_rank_counts(rows_per_rank: Any, world: int) -> Tuple[int, ...]:
    """The caller's per-rank row counts (a v-form's `rows_per_rank`) checked as a list: a
    sequence of one integer of at least 0 per rank."""
    if isinstance(rows_per_rank, (str, bytes)) or not isinstance(rows_per_rank, Sequence):
        raise InvalidArgument(
            f"rows_per_rank is {type(rows_per_rank).__name__}: give a list of {world} row "
            "counts, one per rank")
    counts = tuple(_count(f"rows_per_rank[{index}]", count, 0)
                   for index, count in enumerate(rows_per_rank))
    if len(counts) != world:
        raise InvalidArgument(
            f"rows_per_rank has {len(counts)} counts for a world of {world} ranks: give one "
            "count per rank")
    return counts


def _given_owned(counts: Tuple[int, ...], rank: int) -> range:
    """The rows `rank` owns when rank r owns `counts[r]`, the runs back to back in rank
    order."""
    start = sum(counts[:rank])
    return range(start, start + counts[rank])


class RowShape:
    """A reduce-scatter's or all-gather's message as this rank sees it: `rows` x `width`,
    this rank's `owned` rows, the shape of the tensor the collective writes (`output`), and
    the caller's per-rank rows (`rows_per_rank`, None for the shape rule's)."""

    def __init__(self, rows: int, width: int, owned: range, output: Tuple[int, ...],
                 rows_per_rank: Optional[Tuple[int, ...]] = None):
        self.rows = rows
        self.width = width
        self.owned = owned
        self.output = output
        self.rows_per_rank = rows_per_rank

    def own_offset(self, element_size: int) -> int:
        """Bytes from the whole message's start to this rank's rows."""
        return self.owned.start * self.width * element_size


def reduce_scatter_shape(input_shape: Sequence[int], world: int, rank: int,
                         rows_per_rank: Any = None) -> RowShape:
    """A reduce-scatter of a tensor of `input_shape` (rows its first dimension) on `rank` of
    `world`: the output is this rank's rows, shape (owned rows, *the rest). Rank r owns
    `rows_per_rank[r]` rows when given (their sum must be the input's rows), the shape rule's
    otherwise."""
    rows, rest, width = _rows_and_width("input", input_shape)
    if rows_per_rank is None:
        owned = owned_rows(rows, world, rank)
        return RowShape(rows, width, owned, (len(owned), *rest))
    counts = rows_per_rank_counts(rows_per_rank, world)
    if sum(counts) != rows:
        raise InvalidArgument(
            f"rows_per_rank {list(counts)} sums to {sum(counts)} rows, but the input has "
            f"{rows}")
    owned = _given_owned(counts, rank)
    return RowShape(rows, width, owned, (len(owned), *rest), counts)


def all_gather_shape(input_shape: Sequence[int], out_shape: Optional[Sequence[int]],
                     rows: Any, world: int, rank: int, rows_per_rank: Any = None) -> RowShape:
    """An all-gather of this rank's rows (a tensor of `input_shape`) into a message whose total
    rows are `out_shape`'s first dimension or `rows` (one is needed; both must agree): the
    input must hold the rows this rank owns of that total. With `rows_per_rank`, rank r owns
    `rows_per_rank[r]` rows and the total is their sum (`out` and `rows` may be left out; given,
    they must agree)."""
    counts = None if rows_per_rank is None else rows_per_rank_counts(rows_per_rank, world)
    if counts is not None and rows is None and out_shape is None:
        rows = sum(counts)
    if out_shape is None and rows is None:
        raise InvalidArgument(
            "all_gather needs the total rows, which this rank's own rows do not give: pass "
            "out= (the whole message) or rows=")
    own_rows, rest, width = _rows_and_width("input", input_shape)
    if rows is not None:
        rows = _count("rows", rows, 0)
    if out_shape is not None:
        out_shape = tuple(out_shape)
        if not out_shape:
            raise InvalidArgument("out is a 0-d tensor: give the rows as its first dimension")
        if out_shape[1:] != rest:
            raise InvalidArgument(
                f"out is {out_shape} and the input {tuple(input_shape)}: their rows must have "
                "the same shape (every dimension after the first)")
        if rows is not None and rows != out_shape[0]:
            raise InvalidArgument(
                f"rows={rows}, but out has {out_shape[0]} rows: give one of them, or agree")
        rows = out_shape[0]
    if counts is not None:
        if sum(counts) != rows:
            raise InvalidArgument(
                f"rows_per_rank {list(counts)} sums to {sum(counts)} rows, but the whole "
                f"message (out or rows=) has {rows}")
        owned = _given_owned(counts, rank)
        if own_rows != len(owned):
            raise InvalidArgument(
                f"the input has {own_rows} rows, but rows_per_rank gives rank {rank} "
                f"{len(owned)}")
        return RowShape(rows, width, owned, (rows, *rest), counts)
    owned = owned_rows(rows, world, rank)
    if own_rows != len(owned):
        raise InvalidArgument(
            f"the input has {own_rows} rows, but rank {rank} of {world} owns {len(owned)} of "
            f"{rows} (rows {owned.start}:{owned.stop}; the first rows % world ranks own one more)")
    return RowShape(rows, width, owned, (rows, *rest))


def is_in_place(collective: str, input_span: Tuple[int, int], output_span: Tuple[int, int],
                own_offset: int) -> bool:
    """Whether a reduce-scatter's or all-gather's operands, each (address, bytes), are in place:
    this rank's rows of the other operand (the reduce-scatter's output inside its input, the
    all-gather's input inside its output). False when they lie apart; any other overlap is
    refused, as the library refuses it."""
    (input, input_bytes), (output, output_bytes) = input_span, output_span
    if input_bytes > 0 and output_bytes > 0:
        partner = (output == input + own_offset if collective == "reduce_scatter"
                   else input == output + own_offset)
        if partner:
            return True
        if input < output + output_bytes and output < input + input_bytes:
            in_place = ("out is this rank's rows of the input" if collective == "reduce_scatter"
                        else "the input is this rank's rows of out")
            raise InvalidArgument(
                f"out overlaps the input of the {collective}, and not in place (in place, "
                f"{in_place})")
    return False


class EpilogueShape:
    """The fused all-reduce + residual add + RMSNorm's message: `rows` x `hidden`, `hidden`
    being the last dimension of `x` (the one RMSNorm normalises) and `rows` the product of
    the others."""

    def __init__(self, rows: int, hidden: int, shape: Tuple[int, ...]):
        self.rows = rows
        self.hidden = hidden
        self.shape = shape


def epilogue_shape(x_shape: Sequence[int], residual_shape: Optional[Sequence[int]],
                   weight_shape: Sequence[int], eps: Any) -> EpilogueShape:
    """The message of `all_reduce_add_rms_norm` from its operands' shapes, checked: `x` at
    least 1-d with a last dimension (the hidden size) that is a multiple of 8, `residual` None
    or of `x`'s shape, `weight` of shape (hidden,), `eps` a real number, 0 or more (it is
    passed on as an f32). The library checks the largest hidden size its kernels take."""
    shape = tuple(x_shape)
    if not shape:
        raise InvalidArgument("x is a 0-d tensor: its last dimension is the hidden size")
    hidden = shape[-1]
    if hidden == 0 or hidden % 8 != 0:
        raise InvalidArgument(
            f"x is {shape}: its hidden size (the last dimension) {hidden} is not a positive "
            "multiple of 8 elements")
    if residual_shape is not None and tuple(residual_shape) != shape:
        raise InvalidArgument(
            f"the residual is {tuple(residual_shape)} and x {shape}: they must have one shape")
    if tuple(weight_shape) != (hidden,):
        raise InvalidArgument(
            f"the weight is {tuple(weight_shape)}: give ({hidden},), one element per hidden "
            "element")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise InvalidArgument(f"eps is {type(eps).__name__}: give a real number")
    if math.isnan(eps) or eps < 0:
        raise InvalidArgument(f"eps={eps}: give a number of at least 0")
    return EpilogueShape(math.prod(shape[:-1]), hidden, shape)


def spans_overlap(first: Tuple[int, int], second: Tuple[int, int]) -> bool:
    """Whether two non-empty (address, bytes) spans share a byte."""
    (a, a_bytes), (b, b_bytes) = first, second
    return a_bytes > 0 and b_bytes > 0 and a < b + b_bytes and b < a + a_bytes
