"""The fused all-reduce + residual add + RMSNorm without a GPU or torch: the shapes, dtypes and
layouts `Collectives.all_reduce_add_rms_norm` checks before any call (each error naming the
argument), and what it hands the library, through stand-ins for torch and the native handle."""

import math

import pytest

import prepare
from prepare import _shape

from stand_ins import FakeTensor, stand_in_collectives


def refused(call, *needles):
    with pytest.raises(prepare.InvalidArgument) as caught:
        call()
    assert type(caught.value) is prepare.InvalidArgument
    for needle in needles:
        assert needle in str(caught.value), str(caught.value)


# Shapes.

def test_the_hidden_size_is_the_last_dimension_and_the_rows_the_others():
    shape = _shape.epilogue_shape((4, 3, 16), (4, 3, 16), (16,), 1e-6)
    assert (shape.rows, shape.hidden, shape.shape) == (12, 16, (4, 3, 16))
    flat = _shape.epilogue_shape((7168,), None, (7168,), 0)
    assert (flat.rows, flat.hidden) == (1, 7168)
    empty = _shape.epilogue_shape((0, 8), None, (8,), 0.5)
    assert (empty.rows, empty.hidden) == (0, 8)


@pytest.mark.parametrize(
    "x, residual, weight, eps, shown",
    [((), None, (8,), 0.0, "x is a 0-d tensor"),
     ((2, 12), None, (12,), 0.0, "hidden size (the last dimension) 12 is not a positive "
                                 "multiple of 8"),
     ((2, 0), None, (0,), 0.0, "hidden size (the last dimension) 0"),
     ((2, 8), (2, 16), (8,), 0.0, "the residual is (2, 16) and x (2, 8)"),
     ((2, 8), (16,), (8,), 0.0, "the residual is (16,) and x (2, 8)"),
     ((2, 8), None, (16,), 0.0, "the weight is (16,): give (8,)"),
     ((2, 8), None, (1, 8), 0.0, "the weight is (1, 8)"),
     ((2, 8), None, (8,), -1e-6, "eps=-1e-06: give a number of at least 0"),
     ((2, 8), None, (8,), math.nan, "eps=nan"),
     ((2, 8), None, (8,), "1e-6", "eps is str: give a real number"),
     ((2, 8), None, (8,), True, "eps is bool")],
    ids=["x-0d", "hidden-12", "hidden-0", "residual-shape", "residual-flat", "weight-length",
         "weight-2d", "eps-negative", "eps-nan", "eps-str", "eps-bool"],
)
def test_a_bad_epilogue_shape_is_refused_naming_the_argument(x, residual, weight, eps, shown):
    refused(lambda: _shape.epilogue_shape(x, residual, weight, eps), shown)


# What Collectives hands the library, through stand-ins for torch and the native handle.

class Recorder:
    """A native handle that records the calls it would make."""

    closed = False

    def __init__(self):
        self.calls = []

    def all_reduce_add_rms_norm(self, *arguments):
        self.calls.append(arguments)


@pytest.fixture
def served(monkeypatch):
    """A `Collectives` of rank 1 of 4 serving the epilogue in bf16, on stand-ins."""
    return stand_in_collectives(monkeypatch, Recorder(),
                                [("all_reduce_add_rms_norm", "bf16 dtype")])


X, RESIDUAL, WEIGHT, OUT = 0x10000, 0x20000, 0x30000, 0x40000


def test_the_epilogue_passes_rows_hidden_and_eps_and_allocates_out(served):
    x, residual = FakeTensor((3, 2, 16), X), FakeTensor((3, 2, 16), RESIDUAL)
    weight = FakeTensor((16,), WEIGHT)
    out = served.all_reduce_add_rms_norm(x, residual, weight, 1e-5)
    assert out is served.allocated[0] and out.shape == (3, 2, 16)
    assert served._native.calls == [(X, RESIDUAL, WEIGHT, out.data_ptr(), 6, 16, 1e-5, 0, 77)]
    # Without a residual the library gets a null one; out may be x itself.
    assert served.all_reduce_add_rms_norm(x, None, weight, 0, out=x) is x
    assert served._native.calls[-1] == (X, 0, WEIGHT, X, 6, 16, 0.0, 0, 77)
    given = FakeTensor((3, 2, 16), OUT)
    assert served.all_reduce_add_rms_norm(x, residual, weight, 2, out=given) is given
    assert served._native.calls[-1] == (X, RESIDUAL, WEIGHT, OUT, 6, 16, 2.0, 0, 77)


@pytest.mark.parametrize(
    "arguments, shown",
    [(dict(out=FakeTensor((3, 16), OUT)), "out is (3, 16); the epilogue of x (6, 16) writes"),
     (dict(out=FakeTensor((6, 16), OUT, "fp32 dtype", 4)), "out is fp32 dtype and x bf16 dtype"),
     (dict(residual=FakeTensor((6, 16), RESIDUAL, "fp32 dtype", 4)),
      "the residual is fp32 dtype and x bf16 dtype"),
     (dict(weight=FakeTensor((16,), WEIGHT, "fp32 dtype", 4)), "the weight is fp32 dtype"),
     (dict(out=FakeTensor((6, 16), RESIDUAL)), "out overlaps the residual"),
     (dict(out=FakeTensor((6, 16), X + 32)), "out overlaps x"),
     (dict(out=FakeTensor((6, 16), WEIGHT - 16)), "out overlaps the weight"),
     (dict(residual=FakeTensor((6, 16), X)), "the residual overlaps x"),
     (dict(x=FakeTensor((6, 16), X, "fp32 dtype", 4)),
      "no package holds all_reduce_add_rms_norm fp32 dtype"),
     (dict(weight=[1.0]), "the weight is a list, not a torch.Tensor"),
     (dict(eps=-1.0), "eps=-1.0"),
     (dict(x=FakeTensor((6, 12), X), residual=None, weight=FakeTensor((12,), WEIGHT)),
      "hidden size (the last dimension) 12")],
    ids=["out-shape", "out-dtype", "residual-dtype", "weight-dtype", "out-on-residual",
         "out-inside-x", "out-on-weight", "residual-on-x", "dtype-not-served",
         "weight-not-tensor", "eps-negative", "hidden-12"],
)
def test_bad_epilogue_calls_are_refused_before_the_library(served, arguments, shown):
    call = dict(x=FakeTensor((6, 16), X), residual=FakeTensor((6, 16), RESIDUAL),
                weight=FakeTensor((16,), WEIGHT), eps=1e-6)
    call.update(arguments)
    refused(lambda: served.all_reduce_add_rms_norm(**call), shown)
    assert served._native.calls == []


# The binding and the library, before any handle.

@pytest.mark.parametrize(
    "arguments, shown",
    [((0, 0, 0, 0, 2**64, 8, 0.0, 0, None), "rows=18446744073709551616 is out of range"),
     ((0, 0, 0, 0, 1, -8, 0.0, 0, None), "hidden=-8 is out of range"),
     ((-1, 0, 0, 0, 1, 8, 0.0, 0, None), "x=-1 is out of range"),
     ((0, 0, 0, 0, 1, 8, "0", 0, None), "eps is a str"),
     ((0, 0, 0, 0, 1, 8, 0.0, 2**31, None), "dtype=2147483648 is out of range")],
    ids=["rows-2^64", "hidden-negative", "x-negative", "eps-str", "dtype-2^31"],
)
def test_the_epilogue_call_refuses_arguments_outside_their_c_type(arguments, shown):
    handle = prepare.NativeHandle.__new__(prepare.NativeHandle)
    refused(lambda: handle.all_reduce_add_rms_norm(*arguments), shown)


def test_the_library_checks_the_epilogue_s_shape_eps_and_operands_before_the_handle():
    from prepare import _binding
    call = _binding.library().prepare_all_reduce_add_rms_norm
    for arguments, shown in [((4, 12, 0.0, 0), b"a hidden size of 12 elements is not taken"),
                             ((4, 8, -1.0, 0), b"eps is -1"),
                             ((4, 8, 0.0, 9), b"dtype 9 is not a PrepareDtype"),
                             ((4, 8, 1e-6, 0), b"x is NULL")]:
        assert call(None, None, None, None, None, *arguments, None) == 1
        assert shown in _binding.library().prepare_last_error(), arguments
