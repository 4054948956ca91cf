"""The torch-free parts of the PyTorch bench's `--epilogue` mode: the reference of the fused
all-reduce + residual add + RMSNorm in plain Python, the arguments, the ratios and notes."""

import importlib
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

BENCHES = Path(__file__).resolve().parents[2] / "benches"


def bench_module(name):
    if str(BENCHES) not in sys.path:
        sys.path.insert(0, str(BENCHES))
    return importlib.import_module(f"allreduce_bench.{name}")


def bf16(value):
    """The bf16 bits of a value that bf16 holds exactly."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    assert bits & 0xFFFF == 0, f"{value} is not a bf16"
    return bits >> 16


def test_bf16_rounds_to_nearest_even_and_nan_is_canonical():
    ref = bench_module("epilogue_reference")
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1.
    assert ref.bf16_bits([1 + 2**-8]) == [0x3F80]
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one.
    assert ref.bf16_bits([1 + 3 * 2**-8]) == [0x3F82]
    assert ref.bf16_bits([-0.0, math.inf]) == [0x8000, 0x7F80]
    assert ref.bf16_bits([math.nan, -math.nan]) == [0x7FC0, 0x7FC0]
    assert list(ref.bf16_values([0x3F80, 0xC000])) == [1.0, -2.0]


def test_the_squares_are_summed_in_lanes_then_a_tree():
    ref = bench_module("epilogue_reference")
    row = [0.0] * 4096
    # Lane 0 holds 1 + 2^24 (rounded to 2^24), lane 1 holds 1; the tree adds them: 2^24.
    # Summed in index order it would be 1 + 1 + 2^24 = 2^24 + 2.
    row[0], row[1], row[2048] = 1.0, 1.0, 4096.0
    assert ref.sum_of_squares(ref.f32(row)) == 2.0**24
    # A row shorter than the lanes: the tree over the squares alone.
    assert ref.sum_of_squares(ref.f32([1.0, 2.0, 3.0])) == 14.0


def test_the_sum_is_rounded_before_the_residual_is_added():
    ref = bench_module("epilogue_reference")
    hidden = 8
    x0 = [bf16(1.0)] * hidden
    x1 = [bf16(2**-8)] * hidden
    residual = [bf16(2**-8)] * hidden
    weight = [bf16(1.0)] * hidden
    normed, residual_out = ref.reference_epilogue([x0, x1], residual, weight, hidden, 0.0)
    # The sum 1 + 2^-8 rounds to 1; plus 2^-8 rounds to 1 again. Adding the residual before
    # rounding would give 1 + 2^-7.
    assert residual_out == [bf16(1.0)] * hidden
    # A row of ones: mean 1, inverse 1, normed = the weight.
    assert normed == [bf16(1.0)] * hidden
    # Without a residual the sum itself is normalised.
    normed, residual_out = ref.reference_epilogue([x0, x1], None, weight, hidden, 0.0)
    assert residual_out == [bf16(1.0)] * hidden


def test_the_norm_divides_by_the_root_mean_square_plus_eps_and_scales_by_the_weight():
    ref = bench_module("epilogue_reference")
    hidden = 8
    x = [bf16(2.0)] * 4 + [bf16(-2.0)] * 4
    weight = [bf16(0.5)] * 4 + [bf16(2.0)] * 4
    normed, residual_out = ref.reference_epilogue([x], None, weight, hidden, 0.0)
    # mean of squares 4, inverse 1/2: r * inv = +-1, times the weight.
    assert normed == [bf16(0.5)] * 4 + [bf16(-2.0)] * 4
    assert residual_out == x
    # eps enters in fp32: 4 + 12 = 16, inverse 1/4.
    normed, _ = ref.reference_epilogue([x], None, [bf16(1.0)] * hidden, hidden, 12.0)
    assert normed == [bf16(0.5)] * 4 + [bf16(-0.5)] * 4
    # Two rows are normalised each on its own.
    two = x + [bf16(4.0)] * hidden
    normed, _ = ref.reference_epilogue([two], None, [bf16(1.0)] * hidden, hidden, 0.0)
    assert normed[hidden:] == [bf16(1.0)] * hidden


@pytest.mark.parametrize(
    "inputs, residual, weight, eps, message",
    [
        ([], None, [0] * 8, 0.0, "at least one rank"),
        ([[0] * 12], None, [0] * 8, 0.0, "not whole rows of 8"),
        ([[0] * 8, [0] * 16], None, [0] * 8, 0.0, "rank 1 has 16"),
        ([[0] * 8], [0] * 16, [0] * 8, 0.0, "the residual has 16"),
        ([[0] * 8], None, [0] * 4, 0.0, "the weight has 4"),
        ([[0] * 8], None, [0] * 8, -1.0, "eps is -1.0"),
        ([[0] * 8], None, [0] * 8, math.nan, "eps is nan"),
    ],
)
def test_the_reference_refuses_operands_that_do_not_fit(inputs, residual, weight, eps, message):
    ref = bench_module("epilogue_reference")
    with pytest.raises(ValueError, match=message):
        ref.reference_epilogue(inputs, residual, weight, 8, eps)


def test_differing_counts_elements_and_refuses_other_lengths():
    ref = bench_module("epilogue_reference")
    assert ref.differing([1, 2, 3], [1, 5, 6]) == 2
    assert ref.differing([], []) == 0
    with pytest.raises(ValueError, match="2 elements against 3"):
        ref.differing([1, 2], [1, 2, 3])


def test_the_epilogue_takes_its_contenders_tokens_and_decode_batches():
    cli = bench_module("cli")
    args = cli.parse_args(["--epilogue"])
    assert args.tokens == [1, 2, 4, 8, 16, 32, 64]
    assert args.decode_batches == [1, 2, 4, 8, 16, 32, 64]
    assert args.hidden == 7168
    assert args.contenders == ["torch_nccl_rms_norm", "torch_nccl_triton",
                               "flashinfer_fp32_acc", "flashinfer_bf16_acc"]
    with_prepare = cli.parse_args(["--epilogue", "--prepare", "epi.tar", "--tokens", "4,1"])
    assert with_prepare.contenders == list(cli.EPILOGUE_CONTENDERS)
    assert with_prepare.tokens == [4, 1]
    # The sequence-parallel step keeps its own default tokens.
    assert cli.parse_args(["--sequence-parallel"]).tokens[-1] == 4096


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--epilogue", "--sequence-parallel"], "two runs"),
        (["--epilogue", "--contenders", "prepare_fused"], "need --prepare PACKAGE"),
        (["--epilogue", "--contenders", "torch_nccl"], "the epilogue has no contender torch_nccl"),
        (["--contenders", "torch_nccl_triton"], "the all_reduce has no contender"),
        (["--epilogue", "--hidden", "7170"], "--hidden must be a multiple of 8"),
        (["--epilogue", "--decode-batches", "0"], "not a token count"),
    ],
)
def test_the_epilogue_refuses_what_cannot_run(capsys, argv, message):
    cli = bench_module("cli")
    with pytest.raises(SystemExit) as caught:
        cli.parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_each_contender_is_set_against_prepare_fused_per_token_count():
    epilogue = bench_module("epilogue")
    rows = [
        {"tokens": 1, "contender": "prepare_fused", "median_us": 4.0},
        {"tokens": 1, "contender": "torch_nccl_rms_norm", "median_us": 20.0},
        {"tokens": 1, "contender": "flashinfer_fp32_acc", "median_us": None},
        {"tokens": 2, "contender": "torch_nccl_triton", "median_us": 9.0},
    ]
    summary = epilogue.epilogue_summary(rows)
    # No prepare_fused figure at 2 tokens: nothing to set against.
    assert summary == {1: {"torch_nccl_rms_norm": 5.0}}
    assert epilogue.summary_lines(summary) == [
        "1 tokens: over prepare_fused: torch_nccl_rms_norm 5.00x"
    ]
    assert epilogue.mismatch_note("14 KiB", "flashinfer_bf16_acc", [[3, 0], [5, 1]]) == (
        "14 KiB flashinfer_bf16_acc: not bit-exact against prepare's epilogue reference "
        "(rank 0: normed 3, residual_out 0, rank 1: normed 5, residual_out 1)"
    )


def test_flashinfer_is_unavailable_with_the_reason_when_it_does_not_import():
    code = (
        f"import sys; sys.path.insert(0, {str(BENCHES)!r})\n"
        "sys.modules['flashinfer'] = None\n"
        "from allreduce_bench import epilogue\n"
        "print(epilogue.flashinfer_refusal())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True)
    assert done.stdout.startswith("flashinfer cannot be imported: ModuleNotFoundError"), (
        done.stdout
    )


def test_the_script_prints_its_help_with_the_epilogue_mode():
    done = subprocess.run(
        [sys.executable, str(BENCHES / "pytorch_allreduce.py"), "--help"],
        check=True, capture_output=True, text=True,
    )
    assert "--epilogue" in done.stdout and "--decode-batches" in done.stdout
