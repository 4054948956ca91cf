"""The v-forms of the reduce-scatter and the all-gather (`rows_per_rank=`) without a GPU or
torch: the shapes `Collectives` derives from the per-rank rows, each bad list refused by name
before any call, the binding's integer checks, the library's own checks before the handle,
and what `Collectives` hands the library, through stand-ins for torch and the native handle."""

import ctypes

import pytest

import prepare
from prepare import _binding, _shape

from stand_ins import FakeTensor, stand_in_collectives


def refused(call, *needles, error=prepare.InvalidArgument):
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)
    return caught.value


# The shapes.

def test_a_reduce_scatter_v_gives_each_rank_its_count_of_rows():
    counts = [2, 0, 5, 3]
    for rank, (start, stop) in enumerate([(0, 2), (2, 2), (2, 7), (7, 10)]):
        shape = _shape.reduce_scatter_shape((10, 4, 3), 4, rank, counts)
        assert (shape.rows, shape.width, shape.owned) == (10, 12, range(start, stop))
        assert shape.output == (stop - start, 4, 3)
        assert shape.rows_per_rank == (2, 0, 5, 3)
        assert shape.own_offset(2) == start * 24
    # Without it: the shape rule, and no per-rank rows handed on.
    assert _shape.reduce_scatter_shape((10, 4), 4, 1).rows_per_rank is None


def test_an_all_gather_v_takes_its_total_from_the_counts():
    shape = _shape.all_gather_shape((5, 4), None, None, 4, 2, (2, 0, 5, 3))
    assert (shape.rows, shape.owned, shape.output) == (10, range(2, 7), (10, 4))
    assert _shape.all_gather_shape((5, 4), (10, 4), 10, 4, 2, [2, 0, 5, 3]).output == (10, 4)
    # A rank owning none gathers from an empty input.
    assert _shape.all_gather_shape((0, 4), None, None, 4, 1, [2, 0, 5, 3]).owned == range(2, 2)


@pytest.mark.parametrize(
    "call, shown",
    [(lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, 0, 5]),
      "rows_per_rank has 3 counts for a world of 4 ranks: give one count per rank"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, 0, 5, 3, 0]),
      "rows_per_rank has 5 counts for a world of 4 ranks"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, -1, 6, 3]),
      "rows_per_rank[1]=-1: give an integer of at least 0"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, 0, 5, 2]),
      "rows_per_rank [2, 0, 5, 2] sums to 9 rows, but the input has 10"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, 0.5, 5, 3]),
      "rows_per_rank[1] is float: give an integer"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, [2, True, 5, 3]),
      "rows_per_rank[1] is bool"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, 10), "rows_per_rank is int"),
     (lambda: _shape.reduce_scatter_shape((10, 4), 4, 1, "2053"), "rows_per_rank is str"),
     (lambda: _shape.all_gather_shape((5, 4), (9, 4), None, 4, 2, [2, 0, 5, 3]),
      "rows_per_rank [2, 0, 5, 3] sums to 10 rows, but the whole message (out or rows=) has 9"),
     (lambda: _shape.all_gather_shape((5, 4), None, 11, 4, 2, [2, 0, 5, 3]),
      "sums to 10 rows, but the whole message (out or rows=) has 11"),
     (lambda: _shape.all_gather_shape((4, 4), None, None, 4, 2, [2, 0, 5, 3]),
      "the input has 4 rows, but rows_per_rank gives rank 2 5"),
     (lambda: _shape.all_gather_shape((5, 4), None, None, 4, 2, [2, 0, 5]),
      "rows_per_rank has 3 counts for a world of 4 ranks")],
    ids=["short", "long", "negative", "wrong-sum", "float", "bool", "not-a-list", "string",
         "ag-out-disagrees", "ag-rows-disagree", "ag-input-rows", "ag-short"],
)
def test_a_bad_rows_per_rank_is_refused_by_name(call, shown):
    refused(call, shown)


# The binding and the library.

def closed_handle():
    return prepare.NativeHandle.__new__(prepare.NativeHandle)


@pytest.mark.parametrize("method", ["reduce_scatter_v", "all_gather_v"])
@pytest.mark.parametrize(
    "arguments, shown",
    [((0, 0, [1, 2**64], 1, 0, None), "rows_per_rank[1]=18446744073709551616 is out of range"),
     ((0, 0, [1, -1], 1, 0, None), "rows_per_rank[1]=-1 is out of range"),
     ((0, 0, 3, 1, 0, None), "rows_per_rank is an int"),
     ((0, 0, [1, 2], -1, 0, None), "width=-1 is out of range")],
    ids=["count-2^64", "count-negative", "not-a-list", "width-negative"],
)
def test_the_v_calls_refuse_integers_outside_their_c_type(method, arguments, shown):
    refused(lambda: getattr(closed_handle(), method)(*arguments), shown)


@pytest.mark.parametrize("method", ["reduce_scatter_v", "all_gather_v"])
def test_a_v_call_on_a_closed_handle_is_refused(method):
    refused(lambda: getattr(closed_handle(), method)(0, 0, [1, 2], 1, 0, 0), "closed")


@pytest.mark.parametrize("name", ["prepare_reduce_scatter_v", "prepare_all_gather_v"])
def test_the_library_checks_the_counts_dtype_and_shape_before_the_handle(name):
    call = getattr(_binding.library(), name)
    counts = (ctypes.c_size_t * 3)(2, 0, 5)
    overflowing = (ctypes.c_size_t * 2)(2**64 - 1, 1)
    for arguments, shown in [((counts, 3, 0, 0), b"a message of 7 rows of width 0"),
                             ((counts, 3, 4, 9), b"dtype 9 is not a PrepareDtype"),
                             ((None, 3, 4, 0), b"rows_per_rank is NULL"),
                             ((overflowing, 2, 4, 0), b"sum to more than 2^64 - 1 rows"),
                             ((counts, 3, 4, 0), b"handle is NULL")]:
        assert call(None, None, None, *arguments, None) == 1
        assert shown in _binding.library().prepare_last_error()


# What Collectives hands the library, through stand-ins for torch and the native handle.

class Recorder:
    """A native handle that records the calls it would make."""

    closed = False

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name in ("reduce_scatter", "all_gather", "reduce_scatter_v", "all_gather_v"):
            return lambda *arguments: self.calls.append((name, *arguments))
        raise AttributeError(name)


@pytest.fixture
def served(monkeypatch):
    """A `Collectives` of rank 1 of 4 serving both row collectives in bf16, on stand-ins."""
    return stand_in_collectives(monkeypatch, Recorder(),
                                [("reduce_scatter", "bf16 dtype"), ("all_gather", "bf16 dtype")])


def test_a_reduce_scatter_v_allocates_this_ranks_count_and_hands_the_list_on(served):
    message = FakeTensor((10, 4, 3), 0x1000)
    out = served.reduce_scatter(message, rows_per_rank=(2, 5, 0, 3))
    assert out is served.allocated[0] and out.shape == (5, 4, 3)
    assert served._native.calls == [
        ("reduce_scatter_v", 0x1000, out.data_ptr(), [2, 5, 0, 3], 12, 0, 77)]
    # In place: rank 1 owns rows 2:7 of the input.
    in_place = message.rows(2, 7)
    assert served.reduce_scatter(message, out=in_place, rows_per_rank=[2, 5, 0, 3]) is in_place
    assert served._native.calls[-1] == (
        "reduce_scatter_v", 0x1000, 0x1000 + 2 * 24, [2, 5, 0, 3], 12, 0, 77)
    # The rule's rows in place are not in place under other counts.
    refused(lambda: served.reduce_scatter(message, out=message.rows(3, 8),
                                          rows_per_rank=[2, 5, 0, 3]),
            "out overlaps the input of the reduce_scatter, and not in place")
    # Without the list: the ordinary call.
    served.reduce_scatter(message)
    assert served._native.calls[-1][0] == "reduce_scatter"


def test_an_all_gather_v_allocates_the_whole_message_from_the_counts(served):
    own = FakeTensor((5, 4), 0x1000)
    out = served.all_gather(own, rows_per_rank=[2, 5, 0, 3])
    assert out.shape == (10, 4)
    assert served._native.calls == [
        ("all_gather_v", 0x1000, out.data_ptr(), [2, 5, 0, 3], 4, 0, 77)]
    whole = FakeTensor((10, 4), 0x8000)
    in_place = whole.rows(2, 7)
    assert served.all_gather(in_place, out=whole, rows_per_rank=[2, 5, 0, 3]) is whole
    assert served._native.calls[-1] == (
        "all_gather_v", 0x8000 + 2 * 8, 0x8000, [2, 5, 0, 3], 4, 0, 77)


@pytest.mark.parametrize(
    "call, shown",
    [(lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), rows_per_rank=[2, 5, 3]),
      "rows_per_rank has 3 counts for a world of 4 ranks"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), rows_per_rank=[2, 5, 0, 2]),
      "sums to 9 rows, but the input has 10"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), rows_per_rank=[2, 6, -1, 3]),
      "rows_per_rank[2]=-1"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), out=FakeTensor((3, 4), 0x5000),
                                 rows_per_rank=[2, 5, 0, 3]),
      "out is (3, 4) bf16 dtype; this rank's reduce_scatter of the input (10, 4) bf16 dtype "
      "writes (5, 4)"),
     (lambda c: c.all_gather(FakeTensor((3, 4), 0x1000), rows_per_rank=[2, 5, 0, 3]),
      "the input has 3 rows, but rows_per_rank gives rank 1 5"),
     (lambda c: c.all_gather(FakeTensor((5, 4), 0x1000), out=FakeTensor((11, 4), 0x8000),
                             rows_per_rank=[2, 5, 0, 3]),
      "sums to 10 rows, but the whole message (out or rows=) has 11")],
    ids=["rs-short", "rs-sum", "rs-negative", "rs-out-length", "ag-input-rows", "ag-out-rows"],
)
def test_bad_v_calls_are_refused_before_the_library(served, call, shown):
    refused(lambda: call(served), shown)
    assert served._native.calls == []


def test_the_fake_implementations_check_the_v_forms_as_the_eager_calls(served):
    # What the custom ops' fake implementations run under torch.compile.
    message = FakeTensor((10, 4), 0x1000)
    shape = served._row_shape("reduce_scatter", message, FakeTensor((5, 4), 0x5000),
                              [2, 5, 0, 3])
    assert shape.output == (5, 4)
    refused(lambda: served._row_shape("reduce_scatter", message, FakeTensor((3, 4), 0x5000),
                                      [2, 5, 0, 3]), "out is (3, 4)")
    refused(lambda: served._row_shape("all_gather", FakeTensor((5, 4), 0x1000),
                                      FakeTensor((10, 4), 0x8000), [2, 5, 3]),
            "rows_per_rank has 3 counts")
    assert served._native.calls == []
