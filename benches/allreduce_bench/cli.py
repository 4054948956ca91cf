"""The command line and the environment checks of the PyTorch all-reduce bench (no torch)."""

import argparse
import os
import re
import sys

from .rules import COLLECTIVES

DEFAULT_SIZES = "8K,16K,32K,64K,256K,1M,4M,16M,64M"
# The contenders that need only torch and the NCCL it loaded.
TORCH_CONTENDERS = ("torch_nccl", "nccl_symmetric", "symm_mem_one_shot", "symm_mem_two_shot")
PREPARE_CONTENDERS = ("prepare_zero_copy", "prepare_any_tensor")
CONTENDERS = TORCH_CONTENDERS + PREPARE_CONTENDERS
# What times a reduce-scatter or an all-gather: NCCL through torch, and prepare.
ROW_CONTENDERS = ("torch_nccl",) + PREPARE_CONTENDERS
# The sequence-parallel step against all-reduce then RMSNorm, prepare's and PyTorch's.
STEP_CONTENDERS = ("torch_all_reduce", "torch_sequence_parallel", "prepare_all_reduce",
                   "prepare_sequence_parallel")
# Decode (1 to 64 tokens) and prefill sizes.
DEFAULT_TOKENS = "1,2,4,8,16,32,64,256,1024,4096"
# The fused all-reduce + residual add + RMSNorm against its peers, at decode sizes.
EPILOGUE_CONTENDERS = ("torch_nccl_rms_norm", "torch_nccl_triton", "prepare_fused",
                       "flashinfer_fp32_acc", "flashinfer_bf16_acc")
EPILOGUE_TOKENS = "1,2,4,8,16,32,64"
DECODE_BATCHES = "1,2,4,8,16,32,64"
MULTICAST_OFF = {"1", "true", "TRUE"}


def parse_size(text):
    """Bytes from '8K', '4M', '1G' (powers of 1024) or a plain number; 'KiB'/'KB' also read."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:[iI]?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 8K, 4M, 1G or bytes)")
    value = int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[
        match.group(2).upper()
    ]
    if value <= 0 or value % 2 != 0:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is {value} bytes: it must be a positive whole number of bf16 "
            "elements (an even byte count)"
        )
    return value


def parse_sizes(text):
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    unique = []
    for size in sizes:
        if size not in unique:
            unique.append(size)
    return unique


def parse_contenders(text):
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = CONTENDERS + STEP_CONTENDERS + EPILOGUE_CONTENDERS
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {unknown}; choose from {', '.join(known)}"
        )
    return [name for name in known if name in names]


def parse_tokens(text):
    tokens = []
    for part in text.split(","):
        if not part.strip():
            continue
        if not part.strip().isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(f"not a token count of at least 1: {part!r}")
        if int(part) not in tokens:
            tokens.append(int(part))
    if not tokens:
        raise argparse.ArgumentTypeError("no token counts given")
    return tokens


def default_contenders(args):
    """The contenders a run takes when none are named: those its collective has, the prepare
    ones only with a package."""
    if args.epilogue:
        return [name for name in EPILOGUE_CONTENDERS
                if args.prepare or not name.startswith("prepare")]
    if args.sequence_parallel:
        return [name for name in STEP_CONTENDERS
                if args.prepare or not name.startswith("prepare")]
    if args.collective != "all_reduce":
        return [name for name in ROW_CONTENDERS if args.prepare or name == "torch_nccl"]
    return list(CONTENDERS if args.prepare else TORCH_CONTENDERS)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time PyTorch all-reduce paths (NCCL, NCCL's symmetric kernels, "
        "symmetric-memory one-shot and two-shot) with prepare bench's method. Start with "
        "torchrun, one process per GPU."
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        help=f"message sizes in bytes, K/M/G = powers of 1024 (default {DEFAULT_SIZES})",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    parser.add_argument(
        "--contenders",
        type=parse_contenders,
        default=None,
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default all; the prepare "
        "ones need --prepare)",
    )
    parser.add_argument(
        "--prepare",
        metavar="PACKAGE",
        nargs="+",
        help="also time prepare's Python path (prepare.Collectives) with these packages (one "
        "per collective: the sequence-parallel step needs the all-reduce's, the "
        "reduce-scatter's and the all-gather's)",
    )
    parser.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default="all_reduce",
        help="what is timed (default all_reduce); a reduce-scatter or an all-gather of a size "
        "is rows of 4096 elements (fewer where that gives every rank a row)",
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="time the sequence-parallel step (reduce-scatter, RMSNorm on the owned rows, "
        "all-gather) beside all-reduce then RMSNorm, at --tokens x --hidden bf16, instead of "
        "--sizes",
    )
    parser.add_argument(
        "--epilogue",
        action="store_true",
        help="time the all-reduce + residual add + RMSNorm (NCCL then torch's rms_norm, NCCL "
        "then a Triton add + RMSNorm, prepare's all_reduce_add_rms_norm, FlashInfer's "
        "allreduce_fusion) at --tokens x --hidden bf16 and in the decode emulation "
        "(--decode-batches), instead of --sizes",
    )
    parser.add_argument(
        "--tokens",
        type=parse_tokens,
        default=None,
        help=f"token counts of the sequence-parallel step (default {DEFAULT_TOKENS}) or of "
        f"--epilogue (default {EPILOGUE_TOKENS})",
    )
    parser.add_argument(
        "--decode-batches",
        type=parse_tokens,
        default=parse_tokens(DECODE_BATCHES),
        help=f"--epilogue's decode emulation: 61 layers x 2 calls of batch x hidden in one "
        f"graph per batch (default {DECODE_BATCHES})",
    )
    parser.add_argument(
        "--hidden", type=int, default=7168, help="hidden width of that step (default 7168)"
    )
    parser.add_argument(
        "--prepare-cache-dir",
        metavar="DIR",
        default=None,
        help="prepare's choice cache (default: its own default)",
    )
    parser.add_argument("--rounds", type=int, default=25, help="timed rounds (default 25)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up rounds (default 2)")
    parser.add_argument(
        "--sample-us",
        type=float,
        default=150.0,
        help="a replay takes about this long, microseconds (default 150)",
    )
    parser.add_argument(
        "--max-ops", type=int, default=200, help="at most this many ops per replay (default 200)"
    )
    parser.add_argument(
        "--pause-us",
        type=float,
        default=20.0,
        help="GPU-side pause after each barrier, outside the timed span, so the host has "
        "queued the replay before its start event fires; 0 disables (default 20)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds any one step may take before the run is ended (default 300)",
    )
    args = parser.parse_args(argv)
    if args.epilogue and args.sequence_parallel:
        parser.error("--epilogue and --sequence-parallel are two runs; give one")
    if args.tokens is None:
        args.tokens = parse_tokens(EPILOGUE_TOKENS if args.epilogue else DEFAULT_TOKENS)
    if args.sequence_parallel or args.epilogue:
        args.collective = "all_reduce"
    if args.contenders is None:
        args.contenders = default_contenders(args)
    if args.epilogue:
        allowed, what = EPILOGUE_CONTENDERS, "the epilogue"
    elif args.sequence_parallel:
        allowed, what = STEP_CONTENDERS, "the sequence-parallel step"
    elif args.collective != "all_reduce":
        allowed, what = ROW_CONTENDERS, f"the {args.collective}"
    else:
        allowed, what = CONTENDERS, "the all_reduce"
    others = [name for name in args.contenders if name not in allowed]
    if others:
        parser.error(f"{what} has no contender {', '.join(others)}; it has {', '.join(allowed)}")
    if not args.prepare and any(name.startswith("prepare") for name in args.contenders):
        parser.error("the prepare contenders need --prepare PACKAGE")
    bounds = [
        ("--rounds", args.rounds >= 1, "must be at least 1"),
        ("--warmup", args.warmup >= 0, "must not be negative"),
        ("--sample-us", args.sample_us > 0, "must be positive"),
        ("--max-ops", args.max_ops >= 1, "must be at least 1"),
        ("--pause-us", args.pause_us >= 0, "must not be negative"),
        ("--timeout", args.timeout > 0, "must be positive"),
        ("--hidden", args.hidden >= 1, "must be at least 1"),
        ("--hidden", not args.epilogue or args.hidden % 8 == 0,
         "must be a multiple of 8 with --epilogue"),
    ]
    for flag, within, bound in bounds:
        if not within:
            parser.error(f"{flag} {bound}")
    return args


def check_multicast_off():
    """Refuses to run with NVLS or symmetric-memory multicast switched on."""
    nvls = os.environ.get("NCCL_NVLS_ENABLE")
    symm = os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST")
    problems = []
    if nvls != "0":
        problems.append(f"NCCL_NVLS_ENABLE={nvls!r} (must be 0)")
    if symm not in MULTICAST_OFF:
        problems.append(f"TORCH_SYMM_MEM_DISABLE_MULTICAST={symm!r} (must be 1)")
    if problems:
        sys.stderr.write(
            "pytorch_allreduce: multicast must stay off: " + "; ".join(problems) + "\n"
        )
        sys.exit(2)
