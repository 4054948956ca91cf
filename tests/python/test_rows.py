"""The reduce-scatter and the all-gather without a GPU or torch: the shape rule in Python against
the library's (`prepare_owned_rows`, the Rust `prepare::shape::owned_rows`), the shapes and
layouts `Collectives` checks before any call (each error naming the argument), the binding's
integer checks, the library's own checks before the handle, and what `Collectives` hands the
library or, under torch.compile, the custom ops and their fake implementations, through a
stand-in for torch and for the native handle."""

import importlib.util
import json
import py_compile
import subprocess
import sys
import types
from pathlib import Path

import pytest

import prepare
from prepare import _binding, _shape, collectives

from stand_ins import FakeTensor, stand_in_collectives

SIZE = "from 0 to 18446744073709551615 (size_t)"


def refused(call, *needles, error=prepare.InvalidArgument):
    with pytest.raises(error) as caught:
        call()
    assert type(caught.value) is error
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)
    return caught.value


# The shape rule.

def test_owned_rows_is_the_librarys_rule():
    checked = 0
    for world in range(1, 10):
        for rows in [*range(0, 3 * world + 2), 2047, 2048, 4097, 1 << 40, (1 << 64) - 1]:
            for rank in range(world):
                assert prepare.owned_rows(rows, world, rank) == _binding.native_owned_rows(
                    rows, world, rank), (rows, world, rank)
                checked += 1
    assert checked > 500


@pytest.mark.parametrize(
    "rows, world, owned",
    [(10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]), (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),
     (0, 3, [(0, 0)] * 3), (8, 2, [(0, 4), (4, 8)]), (7, 1, [(0, 7)])],
)
def test_owned_rows_gives_the_first_rows_mod_world_ranks_one_more(rows, world, owned):
    assert [prepare.owned_rows(rows, world, rank) for rank in range(world)] == [
        range(start, stop) for start, stop in owned]


@pytest.mark.parametrize(
    "arguments, shown",
    [((10, 2, 2), "rank 2 is not below the world size 2"),
     ((10, 0, 0), "world=0: give an integer of at least 1"),
     ((-1, 2, 0), "rows=-1: give an integer of at least 0"),
     ((True, 2, 0), "rows is bool: give an integer"),
     ((4.0, 2, 0), "rows is float: give an integer"),
     ((4, 2, -1), "rank=-1")],
    ids=["rank-outside", "world-0", "rows-negative", "rows-bool", "rows-float", "rank-negative"],
)
def test_owned_rows_refuses_what_the_rule_has_no_answer_for(arguments, shown):
    refused(lambda: prepare.owned_rows(*arguments), shown)


def test_the_library_refuses_a_rank_outside_the_world_as_python_does():
    refused(lambda: _binding.native_owned_rows(10, 2, 2), "rank 2 is not below the world size 2")


# Shapes.

def test_a_reduce_scatter_writes_this_ranks_rows_of_every_dimension_after_the_first():
    shape = _shape.reduce_scatter_shape((10, 4, 3), world=4, rank=1)
    assert (shape.rows, shape.width, shape.owned, shape.output) == (10, 12, range(3, 6),
                                                                    (3, 4, 3))
    assert shape.own_offset(2) == 3 * 12 * 2
    flat = _shape.reduce_scatter_shape((5,), world=2, rank=1)
    assert (flat.rows, flat.width, flat.output) == (5, 1, (2,))
    none = _shape.reduce_scatter_shape((1, 7), world=2, rank=1)
    assert none.output == (0, 7) and none.owned == range(1, 1)
    empty = _shape.reduce_scatter_shape((0, 7), world=2, rank=0)
    assert (empty.rows, empty.output) == (0, (0, 7))


@pytest.mark.parametrize(
    "input_shape, shown",
    [((), "input is a 0-d tensor"), ((4, 0), "input is (4, 0): its rows are empty (width 0"),
     ((4, 3, 0), "input is (4, 3, 0)"), ((0, 0), "the width must be at least 1")],
)
def test_a_reduce_scatter_without_rows_or_width_is_refused_naming_the_input(input_shape, shown):
    refused(lambda: _shape.reduce_scatter_shape(input_shape, 2, 0), shown)


def test_an_all_gather_takes_its_total_rows_from_out_or_rows():
    by_out = _shape.all_gather_shape((2, 5), (7, 5), None, world=4, rank=0)
    by_rows = _shape.all_gather_shape((2, 5), None, 7, world=4, rank=0)
    both = _shape.all_gather_shape((2, 5), (7, 5), 7, world=4, rank=0)
    for shape in (by_out, by_rows, both):
        assert (shape.rows, shape.width, shape.owned, shape.output) == (7, 5, range(0, 2),
                                                                        (7, 5))
    last = _shape.all_gather_shape((1, 2, 3), None, 7, world=4, rank=3)
    assert (last.owned, last.output, last.width) == (range(6, 7), (7, 2, 3), 6)
    none = _shape.all_gather_shape((0, 3), None, 1, world=2, rank=1)
    assert none.owned == range(1, 1) and none.output == (1, 3)


@pytest.mark.parametrize(
    "input_shape, out_shape, rows, shown",
    [((2, 5), None, None, "all_gather needs the total rows"),
     ((2, 5), (7, 5), 8, "rows=8, but out has 7 rows"),
     ((2, 5), (7, 4), None, "out is (7, 4) and the input (2, 5)"),
     ((2, 5), (), None, "out is a 0-d tensor"),
     ((3, 5), (7, 5), None, "the input has 3 rows, but rank 0 of 4 owns 2 of 7 (rows 0:2"),
     ((2, 5), None, -1, "rows=-1"),
     ((2, 5), None, 2.0, "rows is float"),
     ((2, 0), None, 8, "input is (2, 0): its rows are empty"),
     ((), None, 8, "input is a 0-d tensor")],
    ids=["no-total", "rows-disagree", "row-shapes-differ", "out-0d", "input-not-owned",
         "rows-negative", "rows-float", "width-0", "input-0d"],
)
def test_an_all_gather_of_the_wrong_shape_is_refused_naming_the_argument(input_shape, out_shape,
                                                                         rows, shown):
    refused(lambda: _shape.all_gather_shape(input_shape, out_shape, rows, 4, 0), shown)


# Layouts.

def test_in_place_is_this_ranks_rows_of_the_other_operand():
    # A message of 4 rows of 8 bytes at 0x1000; rank 1 of 2 owns rows 2:4, 16 bytes in.
    message, rows = (0x1000, 32), (0x1010, 16)
    assert _shape.is_in_place("reduce_scatter", message, rows, 16)
    assert _shape.is_in_place("all_gather", rows, message, 16)
    assert not _shape.is_in_place("reduce_scatter", message, (0x2000, 16), 16)
    assert not _shape.is_in_place("all_gather", (0x2000, 16), message, 16)
    # Empty operands lie apart wherever they point.
    assert not _shape.is_in_place("reduce_scatter", message, (0x1010, 0), 16)
    assert not _shape.is_in_place("all_gather", (0, 0), message, 0)


@pytest.mark.parametrize(
    "collective, input_span, output_span, in_place",
    [("reduce_scatter", (0x1000, 32), (0x1000, 16), "out is this rank's rows of the input"),
     ("reduce_scatter", (0x1000, 32), (0x1018, 16), "out is this rank's rows of the input"),
     ("reduce_scatter", (0x1010, 32), (0x1000, 32), "out is this rank's rows of the input"),
     ("all_gather", (0x1000, 16), (0x1000, 32), "the input is this rank's rows of out"),
     ("all_gather", (0x1020, 16), (0x1018, 32), "the input is this rank's rows of out")],
    ids=["rs-rank-0-rows", "rs-off-by-8", "rs-same-length", "ag-rank-0-rows", "ag-straddling"],
)
def test_any_other_overlap_is_refused_naming_the_in_place_layout(collective, input_span,
                                                                 output_span, in_place):
    refused(lambda: _shape.is_in_place(collective, input_span, output_span, 16),
            f"out overlaps the input of the {collective}, and not in place", in_place)


# The binding and the library.

def closed_handle():
    return prepare.NativeHandle.__new__(prepare.NativeHandle)


@pytest.mark.parametrize("method", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize(
    "arguments, shown",
    [((0, 0, 2**64, 1, 0, None), "rows=18446744073709551616 is out of range: give an integer "
      + SIZE),
     ((0, 0, 4, -1, 0, None), "width=-1 is out of range"),
     ((0, 0, 4, 1.5, 0, None), "width is a float"),
     ((-1, 0, 4, 1, 0, None), "input=-1 is out of range"),
     ((0, 2**64, 4, 1, 0, None), "output=18446744073709551616 is out of range"),
     ((0, 0, 4, 1, 2**31, None), "dtype=2147483648 is out of range"),
     ((0, 0, 4, 1, 0, -1), "stream=-1 is out of range")],
    ids=["rows-2^64", "width-negative", "width-float", "input-negative", "output-2^64",
         "dtype-2^31", "stream-negative"],
)
def test_the_row_calls_refuse_integers_outside_their_c_type(method, arguments, shown):
    refused(lambda: getattr(closed_handle(), method)(*arguments), shown)


@pytest.mark.parametrize("method", ["reduce_scatter", "all_gather"])
def test_a_row_call_on_a_closed_handle_is_refused(method):
    refused(lambda: getattr(closed_handle(), method)(0, 0, 4, 1, 0, 0), "closed")


@pytest.mark.parametrize("name", ["prepare_reduce_scatter", "prepare_all_gather"])
def test_the_library_checks_the_dtype_and_the_shape_before_the_handle(name):
    call = getattr(_binding.library(), name)
    for arguments, shown in [((4, 0, 0), b"a message of 4 rows of width 0: the width must be "),
                             ((4, 3, 9), b"dtype 9 is not a PrepareDtype"),
                             ((4, 3, 0), b"handle is NULL")]:
        assert call(None, None, None, *arguments, None) == 1
        assert shown in _binding.library().prepare_last_error()


# What Collectives hands the library, through stand-ins for torch and the native handle.

class Recorder:
    """A native handle that records the calls it would make."""

    closed = False

    def __init__(self):
        self.calls = []

    def reduce_scatter(self, *arguments):
        self.calls.append(("reduce_scatter", *arguments))

    def all_gather(self, *arguments):
        self.calls.append(("all_gather", *arguments))


@pytest.fixture
def served(monkeypatch):
    """A `Collectives` of rank 1 of 4 serving both row collectives in bf16, on stand-ins."""
    return stand_in_collectives(monkeypatch, Recorder(),
                                [("reduce_scatter", "bf16 dtype"), ("all_gather", "bf16 dtype")])


def test_a_reduce_scatter_allocates_this_ranks_rows_and_passes_rows_and_width(served):
    message = FakeTensor((10, 4, 3), 0x1000)
    out = served.reduce_scatter(message)
    assert out is served.allocated[0] and out.shape == (3, 4, 3)
    assert served._native.calls == [("reduce_scatter", 0x1000, out.data_ptr(), 10, 12, 0, 77)]
    given = FakeTensor((3, 4, 3), 0x5000)
    assert served.reduce_scatter(message, out=given) is given
    # In place: rank 1 owns rows 3:6 of the input.
    in_place = message.rows(3, 6)
    assert served.reduce_scatter(message, out=in_place) is in_place
    assert served._native.calls[-1] == ("reduce_scatter", 0x1000, 0x1000 + 3 * 24, 10, 12, 0, 77)


def test_an_all_gather_allocates_the_whole_message_from_rows(served):
    own = FakeTensor((3, 4), 0x1000)
    out = served.all_gather(own, rows=10)
    assert out.shape == (10, 4)
    assert served._native.calls == [("all_gather", 0x1000, out.data_ptr(), 10, 4, 0, 77)]
    whole = FakeTensor((10, 4), 0x8000)
    assert served.all_gather(own, out=whole) is whole
    in_place = whole.rows(3, 6)
    assert served.all_gather(in_place, out=whole, rows=10) is whole
    assert served._native.calls[-1] == ("all_gather", 0x8000 + 3 * 8, 0x8000, 10, 4, 0, 77)


@pytest.mark.parametrize(
    "call, shown",
    [(lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), out=FakeTensor((2, 4), 0x5000)),
      "out is (2, 4) bf16 dtype; this rank's reduce_scatter of the input (10, 4) bf16 dtype "
      "writes (3, 4)"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000),
                                 out=FakeTensor((3, 4), 0x5000, "fp32 dtype", 4)),
      "out is (3, 4) fp32 dtype"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), out=FakeTensor((3, 4), 0x1000)),
      "out overlaps the input of the reduce_scatter, and not in place"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000, "fp32 dtype", 4)),
      "no package holds reduce_scatter fp32 dtype"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 4), 0x1000), out=[1]),
      "out is a list, not a torch.Tensor"),
     (lambda c: c.reduce_scatter(FakeTensor((10, 0), 0x1000)), "its rows are empty"),
     (lambda c: c.all_gather(FakeTensor((3, 4), 0x1000)), "all_gather needs the total rows"),
     (lambda c: c.all_gather(FakeTensor((2, 4), 0x1000), rows=10),
      "the input has 2 rows, but rank 1 of 4 owns 3 of 10"),
     (lambda c: c.all_gather(FakeTensor((3, 4), 0x1000), out=FakeTensor((10, 4), 0x8000),
                             rows=9), "rows=9, but out has 10 rows"),
     (lambda c: c.all_gather(FakeTensor((3, 4), 0x8000), out=FakeTensor((10, 4), 0x8000)),
      "out overlaps the input of the all_gather, and not in place"),
     (lambda c: c.all_gather(FakeTensor((3, 4), 0x1000),
                             out=FakeTensor((10, 4), 0x8000, "fp32 dtype", 4)),
      "out is (10, 4) fp32 dtype")],
    ids=["rs-out-shape", "rs-out-dtype", "rs-overlap", "rs-dtype-not-served", "rs-out-not-tensor",
         "rs-width-0", "ag-no-total", "ag-input-rows", "ag-rows-disagree", "ag-overlap",
         "ag-out-dtype"],
)
def test_bad_row_calls_are_refused_before_the_library(served, call, shown):
    refused(lambda: call(served), shown)
    assert served._native.calls == []


class Regions(Recorder):
    """A native handle whose every zero-copy region is 64 bytes at 0x40000."""

    def zero_copy_region(self, collective, dtype):
        self.calls.append(("zero_copy_region", collective, dtype))
        return 0x40000, 64


def test_empty_is_in_the_zero_copy_region_of_the_collective_it_names(monkeypatch):
    served = stand_in_collectives(monkeypatch, Regions(), [("reduce_scatter", "bf16 dtype")])
    monkeypatch.setattr(collectives._TORCH, "empty",
                        lambda shape, dtype, device=None: FakeTensor(shape, 0, dtype))
    refused(lambda: served.empty((8, 5), "bf16 dtype", collective="reduce_scatter"),
            "80 bytes do not fit the reduce_scatter bf16 dtype zero-copy region of 64 bytes; a "
            "larger reduce_scatter input goes in an ordinary tensor")
    assert served._native.calls == [("zero_copy_region", 1, 0)]
    refused(lambda: served.empty((8, 4), "bf16 dtype"), "no package holds all_reduce bf16 dtype")


def test_a_row_call_on_a_closed_collectives_is_refused():
    handle = object.__new__(collectives.Collectives)
    handle._native, handle._id = None, None
    for call in (lambda: handle.reduce_scatter(None), lambda: handle.all_gather(None, rows=2)):
        refused(call, "closed")


# Under torch.compile: the custom ops' fake implementations, and the calls traced to them.

class StandInOp:
    """What the stand-in `torch.library.custom_op` makes of a function: the op, and the fake
    implementation registered on it."""

    def __init__(self, function):
        self.function, self.fake = function, None

    def register_fake(self, fake):
        self.fake = fake
        return fake


@pytest.fixture
def fakes(monkeypatch, served):
    """The fake implementations `_registered_op` registers, by op name (`reduce_scatter`, ...),
    registered afresh through a stand-in `torch.library`, `served` live as handle 7."""
    ops = {}

    def custom_op(name, mutates_args, device_types):
        def register(function):
            ops[name] = StandInOp(function)
            return ops[name]
        return register

    monkeypatch.setattr(collectives._TORCH, "library", types.SimpleNamespace(custom_op=custom_op),
                        raising=False)
    monkeypatch.setattr(collectives, "_OP", None)
    monkeypatch.setitem(collectives._REGISTRY, 7, served)
    served._id = 7
    collectives._registered_op()
    return {name[len("prepare::"):]: op.fake for name, op in ops.items()}


# Rows of the message, and the rows each of the 4 ranks owns by the shape rule.
OWNED = pytest.mark.parametrize(
    "rows, owned",
    [(10, [3, 3, 2, 2]), (9, [3, 2, 2, 2]), (8, [2, 2, 2, 2]), (2, [1, 1, 0, 0]),
     (0, [0, 0, 0, 0])],
    ids=["two-longer", "one-longer", "even", "ranks-owning-none", "no-rows"],
)


@OWNED
def test_the_fake_reduce_scatter_writes_this_ranks_rows_of_the_inputs_first_dimension(
        served, fakes, rows, owned):
    message = FakeTensor((rows, 4, 3), 0x1000)
    for rank, count in enumerate(owned):
        served.rank = rank
        assert fakes["reduce_scatter"](7, FakeTensor((count, 4, 3), 0x5000), message) is None
        for wrong in (count - 1, count + 1):
            if wrong >= 0:
                refused(lambda: fakes["reduce_scatter"](7, FakeTensor((wrong, 4, 3), 0x5000),
                                                        message),
                        f"out is ({wrong}, 4, 3); this rank's reduce_scatter of the input "
                        f"({rows}, 4, 3) writes ({count}, 4, 3)")
    assert served._native.calls == []


@OWNED
def test_the_fake_all_gather_takes_the_total_rows_from_outs_first_dimension(served, fakes, rows,
                                                                            owned):
    whole = FakeTensor((rows, 4), 0x8000)
    for rank, count in enumerate(owned):
        served.rank = rank
        assert fakes["all_gather"](7, whole, FakeTensor((count, 4), 0x1000)) is None
        refused(lambda: fakes["all_gather"](7, whole, FakeTensor((count + 1, 4), 0x1000)),
                f"the input has {count + 1} rows, but rank {rank} of 4 owns {count} of {rows}")
    refused(lambda: fakes["all_gather"](7, FakeTensor((rows, 5), 0x8000),
                                        FakeTensor((owned[-1], 4), 0x1000)),
            f"out is ({rows}, 5) and the input ({owned[-1]}, 4): their rows must have the same "
            "shape")
    assert served._native.calls == []


class Tracer:
    """`torch.ops.prepare` while torch.compile traces: records every op called and runs its
    fake implementation, as tracing does."""

    def __init__(self, fakes):
        self.calls = []
        self._fakes = fakes

    def __getattr__(self, name):
        def call(*arguments):
            self.calls.append((name, *arguments))
            return self._fakes[name](*arguments)
        return call


def test_under_torch_compile_a_row_call_traces_its_op_on_the_output(monkeypatch, served, fakes):
    tracer = Tracer(fakes)
    monkeypatch.setattr(collectives._TORCH, "compiler",
                        types.SimpleNamespace(is_compiling=lambda: True))
    monkeypatch.setattr(collectives._TORCH, "ops", types.SimpleNamespace(prepare=tracer),
                        raising=False)
    # Rank 1 of 4 owns rows 3:5 of 9.
    message = FakeTensor((9, 4), 0x1000)
    mine = served.reduce_scatter(message)
    assert mine is served.allocated[0] and mine.shape == (2, 4)
    own = FakeTensor((2, 4), 0x2000)
    whole = served.all_gather(own, rows=9)
    assert whole is served.allocated[1] and whole.shape == (9, 4)
    given = FakeTensor((9, 4), 0x8000)
    assert served.all_gather(own, out=given) is given
    counts = served.reduce_scatter(message, rows_per_rank=[2, 5, 0, 2])
    assert counts is served.allocated[2] and counts.shape == (5, 4)
    # Rank 3 of 4 owns none of 2 rows.
    served.rank = 3
    pair = FakeTensor((2, 4), 0x3000)
    none = served.reduce_scatter(pair)
    assert none is served.allocated[3] and none.shape == (0, 4)
    assert tracer.calls == [("reduce_scatter", 7, mine, message), ("all_gather", 7, whole, own),
                            ("all_gather", 7, given, own),
                            ("reduce_scatter_v", 7, counts, message, [2, 5, 0, 2]),
                            ("reduce_scatter", 7, none, pair)]
    # Neither out nor rows: refused before anything is allocated or traced.
    refused(lambda: served.all_gather(FakeTensor((0, 4), 0x2000)),
            "all_gather needs the total rows, which this rank's own rows do not give: pass out= "
            "(the whole message) or rows=")
    assert len(tracer.calls) == 5 and len(served.allocated) == 4
    assert served._native.calls == []



# The GPU scripts and the example, as far as they run without torch or a GPU.

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_script_writes_its_ladders_without_torch(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tests/python/gpu_rows.py"),
                           "--write-ladders", str(tmp_path), "--world", "4"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    written = {path.name: json.loads(path.read_text()) for path in tmp_path.iterdir()}
    assert sorted(written) == [f"h200_nvlink_{collective}_{dtype}_tp4.json"
                               for collective in ("all_gather", "reduce_scatter")
                               for dtype in ("bf16", "fp32")]
    for name, ladder in written.items():
        assert ladder["world_size"] == 4 and name.startswith(f"h200_nvlink_{ladder['collective']}")
        ids = [profile["id"] for profile in ladder["profiles"]]
        # The rank-order NCCL profile is the reduce-scatter's only: an all-gather sums nothing.
        assert ("nccl_rank_order" in ids) == (ladder["collective"] == "reduce_scatter")
        assert all(bucket["candidates"] == ids for bucket in ladder["buckets"])


def test_the_gpu_checks_compile(tmp_path):
    for name in ("gpu_rows.py", "gpu_rows_checks.py"):
        py_compile.compile(str(ROOT / "tests/python" / name), doraise=True,
                           cfile=str(tmp_path / f"{name}c"))


def test_the_tp_mlp_example_parses_its_sequence_parallel_mode():
    spec = importlib.util.spec_from_file_location("torch_tp_mlp",
                                                  ROOT / "examples/torch_tp_mlp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parsed = example.parse_args(["rs_package", "ag_package", "--sequence-parallel"])
    assert parsed.packages == ["rs_package", "ag_package"] and parsed.sequence_parallel
    assert not example.parse_args(["package"]).sequence_parallel
    with pytest.raises(SystemExit):
        example.parse_args([])
