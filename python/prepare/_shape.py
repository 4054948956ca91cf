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


class RowShape:
    """A reduce-scatter's or all-gather's message as this rank sees it: `rows` x `width`,
    this rank's `owned` rows, and the shape of the tensor the collective writes (`output`)."""

    def __init__(self, rows: int, width: int, owned: range, output: Tuple[int, ...]):
        self.rows = rows
        self.width = width
        self.owned = owned
        self.output = output

    def own_offset(self, element_size: int) -> int:
        """Bytes from the whole message's start to this rank's rows."""
        return self.owned.start * self.width * element_size


def reduce_scatter_shape(input_shape: Sequence[int], world: int, rank: int) -> RowShape:
    """A reduce-scatter of a tensor of `input_shape` (rows its first dimension) on `rank` of
    `world`: the output is this rank's rows, shape (owned rows, *the rest)."""
    rows, rest, width = _rows_and_width("input", input_shape)
    owned = owned_rows(rows, world, rank)
    return RowShape(rows, width, owned, (len(owned), *rest))


def all_gather_shape(input_shape: Sequence[int], out_shape: Optional[Sequence[int]],
                     rows: Any, world: int, rank: int) -> RowShape:
    """An all-gather of this rank's rows (a tensor of `input_shape`) into a message whose total
    rows are `out_shape`'s first dimension or `rows` (one is needed; both must agree): the
    input must hold the rows this rank owns of that total."""
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
