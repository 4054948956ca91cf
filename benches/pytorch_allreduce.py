#!/usr/bin/env python3
"""Time PyTorch's all-reduce paths the way `prepare bench` times its contenders.

Started by torchrun, one process per GPU:

    torchrun --nproc-per-node 2 benches/pytorch_allreduce.py --sizes 8K,256K,4M,64M --json OUT.json

Contenders, each a bf16 sum all-reduce of the same random data:

* torch_nccl: torch.distributed.all_reduce (NCCL backend), in place;
* symm_mem_one_shot: torch.ops.symm_mem.one_shot_all_reduce_out, from a symmetric-memory input
  into a separate output;
* symm_mem_two_shot: torch.ops.symm_mem.two_shot_all_reduce_, in place in symmetric memory;
* with --prepare PACKAGE, prepare's Python path (`prepare.Collectives`, the agreed choice):
  prepare_zero_copy, in place in the zero-copy region from `Collectives.empty` (sizes above the
  region are reported as errors), and prepare_any_tensor, in place in an ordinary tensor (what
  peers read is copied into the registered buffer inside the enqueued work).

Method (benches/README.md has the details): per message size and contender, a CUDA graph of K
back-to-back operations, K chosen so a replay takes about 150 us (at most 200 ops) from the
slowest rank's one-op replay; interleaved rounds (A B C A B C ...), each sample preceded by a
barrier (a 64-element NCCL all-reduce on the same stream) and timed with CUDA events around
the replay; 2 warm-up rounds, then 25 rounds; per round the slowest rank counts; the figure is
the median over rounds. Bus bandwidth is bytes x 2(n-1)/n / time.

Multicast (NVLS) is never used: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are
set before torch is imported unless already set, and any other value is refused.
"""

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

DEFAULT_SIZES = "8K,16K,32K,64K,256K,1M,4M,16M,64M"
TORCH_CONTENDERS = ("torch_nccl", "symm_mem_one_shot", "symm_mem_two_shot")
PREPARE_CONTENDERS = ("prepare_zero_copy", "prepare_any_tensor")
CONTENDERS = TORCH_CONTENDERS + PREPARE_CONTENDERS
BARRIER_ELEMENTS = 64
CALIBRATION_ROUNDS = 3
# torch.cuda._sleep spins for a number of GPU clock cycles; H200 SMs run at up to 1.98 GHz.
ASSUMED_CYCLES_PER_US = 2000
ERROR_CHARS = 2000
MULTICAST_OFF = {"1", "true", "TRUE"}


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


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
    unknown = [name for name in names if name not in CONTENDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}"
        )
    return [name for name in CONTENDERS if name in names]


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time PyTorch all-reduce paths (NCCL, symmetric-memory one-shot and "
        "two-shot) with prepare bench's method. Start with torchrun, one process per GPU."
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
        help="also time prepare's Python path (prepare.Collectives) with this package",
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
    if args.contenders is None:
        args.contenders = list(CONTENDERS if args.prepare else TORCH_CONTENDERS)
    if not args.prepare and any(name in PREPARE_CONTENDERS for name in args.contenders):
        parser.error("the prepare contenders need --prepare PACKAGE")
    bounds = [
        ("--rounds", args.rounds >= 1, "must be at least 1"),
        ("--warmup", args.warmup >= 0, "must not be negative"),
        ("--sample-us", args.sample_us > 0, "must be positive"),
        ("--max-ops", args.max_ops >= 1, "must be at least 1"),
        ("--pause-us", args.pause_us >= 0, "must not be negative"),
        ("--timeout", args.timeout > 0, "must be positive"),
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


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def describe(exc):
    """One error's text without the C++ stack torch appends."""
    text = f"{type(exc).__name__}: {exc}"
    cut = text.find("Exception raised from")
    if cut > 0:
        text = text[:cut]
    text = " ".join(text.split())
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS - 3] + "..."
    return text


def format_bytes(value):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


def log(rank, message):
    if rank == 0:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
        sys.stderr.flush()


def torch_at_least(torch_version, major, minor):
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    if not match:
        return True
    return (int(match.group(1)), int(match.group(2))) >= (major, minor)


def exponent_range(world, max_ops):
    """bf16 exponent fields [lo, hi] for the random inputs.

    In-place contenders feed each op's result to the next, so within one replay values grow by
    up to world**ops. The range keeps the largest value finite after max_ops ops and keeps
    every input normal (never zero, never subnormal); eight exponents apart at most, so a sum
    of two inputs is exact in fp32 and the reference rounds once.
    """
    growth = math.ceil(math.log2(max(world, 2))) * (max_ops + 1)
    hi = min(131, 253 - growth)
    lo = hi - 7
    if lo < 1:
        lo, hi = 1, 8
    return lo, hi


class Watchdog:
    """Ends the process when one step takes longer than `timeout` seconds.

    A Python thread reports the stuck step and calls `on_expire` (which writes what was measured)
    before os._exit; faulthandler, which needs no interpreter lock, is armed a little later as a
    backstop. torchrun then stops the other ranks.
    """

    def __init__(self, rank, timeout, on_expire):
        self.rank = rank
        self.timeout = timeout
        self.on_expire = on_expire
        self.lock = threading.Lock()
        self.step = "start-up"
        self.last = time.monotonic()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="bench-watchdog", daemon=True)
        self.thread.start()
        self._arm_faulthandler()

    def _arm_faulthandler(self):
        try:
            faulthandler.cancel_dump_traceback_later()
            faulthandler.dump_traceback_later(self.timeout + 30.0, exit=True)
        except Exception:
            pass

    def kick(self, step, timeout=None):
        with self.lock:
            self.step = step
            self.last = time.monotonic()
            if timeout is not None:
                self.timeout = timeout
        self._arm_faulthandler()

    def stop(self):
        self.stopped = True
        try:
            faulthandler.cancel_dump_traceback_later()
        except Exception:
            pass

    def _run(self):
        while not self.stopped:
            time.sleep(0.5)
            with self.lock:
                idle = time.monotonic() - self.last
                step = self.step
                timeout = self.timeout
            if self.stopped or idle <= timeout:
                continue
            sys.stderr.write(
                f"rank {self.rank}: no progress for {idle:.0f} s during {step}; ending the run\n"
            )
            sys.stderr.flush()
            try:
                self.on_expire(f"no progress for {idle:.0f} s during {step}")
            except Exception:
                pass
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(3)


class Fatal(Exception):
    """A failure after which the ranks may no longer issue the same collectives."""


# ---------------------------------------------------------------------------------------------
# Contenders
# ---------------------------------------------------------------------------------------------


class Contender:
    """One all-reduce path. `allocate` is local; `rendezvous` is collective."""

    name = ""

    def __init__(self, ctx):
        self.ctx = ctx
        self.error = None
        self.single = None  # one-op graph of the current size
        self.graph = None  # K-op graph of the current size
        self.ops = 0

    def allocate(self, max_elements):
        raise NotImplementedError

    def rendezvous(self):
        pass

    def bind(self, elements):
        """Views for a message of `elements` bf16 values."""
        raise NotImplementedError

    def reset(self, pristine):
        """Copies the size's input into the buffer the op reads (on the current stream)."""
        raise NotImplementedError

    def op(self):
        """Enqueues one all-reduce on the current stream."""
        raise NotImplementedError

    def result(self):
        raise NotImplementedError

    def drop_graphs(self):
        self.single = None
        self.graph = None
        self.ops = 0

    def close(self):
        self.drop_graphs()


class ViewContender(Contender):
    """A contender whose all-reduce works in place on `view`, the message's slice of `buffer`."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.buffer = None
        self.view = None

    def bind(self, elements):
        self.view = self.buffer[:elements]

    def reset(self, pristine):
        self.view.copy_(pristine)

    def result(self):
        return self.view

    def close(self):
        super().close()
        self.view = None
        self.buffer = None


class TorchNccl(ViewContender):
    name = "torch_nccl"

    def allocate(self, max_elements):
        torch = self.ctx.torch
        self.buffer = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)

    def op(self):
        self.ctx.dist.all_reduce(self.view)


class SymmMemBase(Contender):
    def _symm_empty(self, elements):
        torch = self.ctx.torch
        return self.ctx.symm_mem.empty(elements, dtype=torch.bfloat16, device=self.ctx.device)

    def _rendezvous(self, tensor):
        return self.ctx.symm_mem.rendezvous(tensor, self.ctx.group_name)


class SymmMemOneShot(SymmMemBase, ViewContender):
    """Reads `view` in symmetric memory, writes the sum to `output_view` in ordinary memory."""

    name = "symm_mem_one_shot"

    def allocate(self, max_elements):
        torch = self.ctx.torch
        self.buffer = self._symm_empty(max_elements)
        self.out = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)
        self.handle = None
        self.output_view = None

    def rendezvous(self):
        self.handle = self._rendezvous(self.buffer)

    def bind(self, elements):
        super().bind(elements)
        self.output_view = self.out[:elements]

    def op(self):
        self.ctx.torch.ops.symm_mem.one_shot_all_reduce_out(
            self.view, "sum", self.ctx.group_name, self.output_view
        )

    def result(self):
        return self.output_view

    def close(self):
        super().close()
        self.output_view = None
        self.handle = None
        self.out = None


class SymmMemTwoShot(SymmMemBase, ViewContender):
    name = "symm_mem_two_shot"

    def allocate(self, max_elements):
        self.buffer = self._symm_empty(max_elements)
        self.handle = None

    def rendezvous(self):
        self.handle = self._rendezvous(self.buffer)

    def op(self):
        self.ctx.torch.ops.symm_mem.two_shot_all_reduce_(self.view, "sum", self.ctx.group_name)

    def close(self):
        super().close()
        self.handle = None


class PrepareBase(ViewContender):
    """prepare's Python path: one `prepare.Collectives` shared by both prepare contenders."""

    def collectives(self):
        return self.ctx.prepare_collectives()

    def op(self):
        self.collectives().all_reduce(self.view)


class PrepareZeroCopy(PrepareBase):
    name = "prepare_zero_copy"

    def allocate(self, max_elements):
        collectives = self.collectives()
        capacity = collectives.zero_copy_bytes() // 2
        self.buffer = collectives.empty(min(max_elements, capacity) if capacity else max_elements)

    def bind(self, elements):
        if elements > self.buffer.numel():
            raise ValueError(
                f"{elements * 2} bytes do not fit the zero-copy region "
                f"({self.buffer.numel() * 2} bytes)"
            )
        super().bind(elements)


class PrepareAnyTensor(PrepareBase):
    name = "prepare_any_tensor"

    def allocate(self, max_elements):
        torch = self.ctx.torch
        self.collectives()
        self.buffer = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)


CONTENDER_TYPES = {
    "torch_nccl": TorchNccl,
    "symm_mem_one_shot": SymmMemOneShot,
    "symm_mem_two_shot": SymmMemTwoShot,
    "prepare_zero_copy": PrepareZeroCopy,
    "prepare_any_tensor": PrepareAnyTensor,
}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args, torch, dist):
        self.args = args
        self.torch = torch
        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.group_name = None
        self.symm_mem = None
        self.symm_mem_error = None
        self.prepare = None
        self.rows = []
        self.notes = []
        self.header = {}
        self.watchdog = None
        self.barrier_buffer = torch.zeros(
            BARRIER_ELEMENTS, dtype=torch.bfloat16, device=self.device
        )
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.pause_cycles = int(args.pause_us * ASSUMED_CYCLES_PER_US)
        self.exponents = exponent_range(self.world, args.max_ops)
        self.printed_header = False
        self.contenders = []

    # -- collective helpers -------------------------------------------------------------------

    def agree(self, local):
        """Every rank's value, the same list on every rank."""
        gathered = [None] * self.world
        self.dist.all_gather_object(gathered, local)
        return gathered

    def combine(self, errors):
        """One text for the ranks' errors (None where a rank succeeded), or None."""
        failing = [(rank, error) for rank, error in enumerate(errors) if error is not None]
        if not failing:
            return None
        if len(failing) == self.world and len({error for _, error in failing}) == 1:
            return failing[0][1]
        return "; ".join(f"rank {rank}: {error}" for rank, error in failing)

    def agreed_error(self, local_error):
        """Every rank's outcome of one step, as one text; None when every rank succeeded."""
        return self.combine(self.agree(local_error))

    @staticmethod
    def attempt(action):
        try:
            action()
            return None
        except Exception as exc:  # recorded, then agreed on by every rank
            return describe(exc)

    def barrier(self):
        """A tiny NCCL all-reduce ordered on the current stream, as prepare's timer does."""
        self.dist.all_reduce(self.barrier_buffer)

    def pause(self):
        if self.sleep is not None and self.pause_cycles > 0:
            self.sleep(self.pause_cycles)

    def kick(self, step):
        if self.watchdog is not None:
            self.watchdog.kick(step)

    # -- set-up -------------------------------------------------------------------------------

    def describe_run(self):
        torch = self.torch
        try:
            import torch.cuda.nccl

            version = torch.cuda.nccl.version()
            if isinstance(version, tuple):
                nccl = ".".join(str(part) for part in version[:3])
                if len(version) > 3 and version[3]:
                    nccl += f"-{version[3]}"
            else:
                nccl = str(version)
        except Exception as exc:
            nccl = f"unknown ({describe(exc)})"
        gpus = self.agree(torch.cuda.get_device_name(self.device))
        self.header = {
            "torch": str(torch.__version__),
            "nccl": nccl,
            "world_size": self.world,
            "gpus": gpus,
            "rounds": self.args.rounds,
            "warmup_rounds": self.args.warmup,
            "sample_us": self.args.sample_us,
            "max_ops": self.args.max_ops,
            "env": {
                "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
                "TORCH_SYMM_MEM_DISABLE_MULTICAST": os.environ.get(
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST"
                ),
            },
        }
        if self.sleep is None and self.pause_cycles > 0:
            self.notes.append("torch.cuda._sleep is missing: samples ran without the pause")

    def prepare_collectives(self):
        """The prepare handle, started (collectively) on first use."""
        if self.prepare is None:
            import prepare

            self.prepare = prepare.Collectives(
                self.args.prepare, cache_dir=self.args.prepare_cache_dir
            )
            self.header["prepare"] = {
                "package": self.args.prepare,
                "version": prepare.__version__,
                "routes": {
                    str(nbytes): self.prepare.route(nbytes) for nbytes in self.args.sizes
                },
            }
            for nbytes, route in self.header["prepare"]["routes"].items():
                self.notes.append(f"prepare routes {format_bytes(int(nbytes))} to {route}")
        return self.prepare

    def import_symm_mem(self):
        error = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            self.symm_mem = symm_mem
        except Exception as exc:
            error = describe(exc)
        self.symm_mem_error = self.agreed_error(error)

    def enable_symm_mem_for_group(self):
        """Registers the group on torch releases before 2.11; 2.11 deprecates the call."""
        enable = getattr(self.symm_mem, "enable_symm_mem_for_group", None)
        if enable is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            enable(self.group_name)

    def make_contenders(self, max_elements):
        """Contenders that allocated and met on every rank; the others keep their error."""
        contenders = []
        for name in self.args.contenders:
            contender = CONTENDER_TYPES[name](self)
            contenders.append(contender)
            if name.startswith("symm_mem") and self.symm_mem_error is not None:
                contender.error = f"torch.distributed._symmetric_memory: {self.symm_mem_error}"
                continue
            self.kick(f"allocating {name}")
            contender.error = self.agreed_error(
                self.attempt(lambda c=contender: c.allocate(max_elements))
            )
        symm = [c for c in contenders if c.error is None and isinstance(c, SymmMemBase)]
        if symm:
            old_torch = not torch_at_least(str(self.torch.__version__), 2, 11)
            if old_torch:
                self.kick("enable_symm_mem_for_group")
                error = self.agreed_error(self.attempt(self.enable_symm_mem_for_group))
                if error is not None:
                    for contender in symm:
                        contender.error = f"enable_symm_mem_for_group: {error}"
                    symm = []
            for contender in symm:
                self.kick(f"rendezvous of {contender.name}")
                errors = self.agree(self.attempt(contender.rendezvous))
                if (
                    not old_torch
                    and all(error is not None for error in errors)
                    and getattr(self.symm_mem, "enable_symm_mem_for_group", None) is not None
                ):
                    # Every rank failed: register the group the pre-2.11 way and try once more.
                    self.kick(f"rendezvous of {contender.name} after enable_symm_mem_for_group")

                    def retry(c=contender):
                        self.enable_symm_mem_for_group()
                        c.rendezvous()

                    retried = self.agree(self.attempt(retry))
                    if all(error is None for error in retried):
                        self.notes.append(
                            f"{contender.name}: rendezvous needed enable_symm_mem_for_group"
                        )
                        errors = retried
                contender.error = self.combine(errors)
                if contender.error is None:
                    handle = contender.handle
                    multicast = getattr(handle, "multicast_ptr", 0) if handle is not None else 0
                    if multicast:
                        self.notes.append(
                            f"{contender.name}: the symmetric allocation has a multicast "
                            "mapping; the ops timed here do not use it"
                        )
            if any(c.error is None for c in symm):
                try:
                    self.header["symm_mem_backend"] = self.symm_mem.get_backend(self.device)
                except Exception:
                    self.header["symm_mem_backend"] = None
        for contender in contenders:
            if contender.error is not None:
                log(self.rank, f"{contender.name} unavailable: {contender.error}")
        return contenders

    # -- data ---------------------------------------------------------------------------------

    def random_input(self, elements, seed):
        torch = self.torch
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        lo, hi = self.exponents
        shape = (elements,)
        exponent = torch.randint(
            lo, hi + 1, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        mantissa = torch.randint(
            0, 128, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        negative = torch.randint(
            0, 2, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        magnitude = ((exponent << 7) | mantissa).to(torch.int16).view(torch.bfloat16)
        return torch.where(negative.bool(), -magnitude, magnitude).contiguous()

    def reference(self, pristine):
        """fp32 sum in rank order from rank 0's value, rounded once to bf16 (nearest even)."""
        torch = self.torch
        gathered = [torch.empty_like(pristine) for _ in range(self.world)]
        self.dist.all_gather(gathered, pristine)
        total = gathered[0].float()
        for part in gathered[1:]:
            total.add_(part.float())
        reference = total.to(torch.bfloat16)
        torch.cuda.synchronize()
        return reference

    # -- graphs and timing --------------------------------------------------------------------

    def capture(self, contender, ops):
        torch = self.torch
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(ops):
                contender.op()
        torch.cuda.synchronize()
        return graph

    def round(self, contenders, pristine, use_single):
        """One interleaved round: per contender reset, barrier, pause, event, replay, event.

        Returns microseconds per replay, in `contenders` order.
        """
        torch = self.torch
        events = []
        for contender in contenders:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            graph = contender.single if use_single else contender.graph
            contender.reset(pristine)
            self.barrier()
            self.pause()
            start.record()
            graph.replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1000.0 for start, end in events]

    def calibrate(self, contenders, pristine):
        """Operations per replay, from the slowest rank's best one-op replay."""
        torch = self.torch
        best = [math.inf] * len(contenders)
        for index in range(CALIBRATION_ROUNDS):
            self.kick(f"calibration round {index + 1}")
            for slot, value in enumerate(self.round(contenders, pristine, use_single=True)):
                if math.isfinite(value) and value > 0:
                    best[slot] = min(best[slot], value)
        estimate = torch.tensor(
            [value if math.isfinite(value) else 1e9 for value in best],
            dtype=torch.float64,
            device=self.device,
        )
        self.dist.all_reduce(estimate, op=self.dist.ReduceOp.MAX)
        ops = []
        for value in estimate.tolist():
            wanted = math.ceil(self.args.sample_us / max(value, 0.1))
            ops.append(max(1, min(self.args.max_ops, wanted)))
        return ops

    def check_exact(self, contender, pristine, reference):
        """Mismatched elements of one captured op against the reference, on this rank."""
        torch = self.torch
        contender.reset(pristine)
        self.barrier()
        contender.single.replay()
        torch.cuda.synchronize()
        result = contender.result()
        mismatched = (result.view(torch.int16) != reference.view(torch.int16)).sum().item()
        return int(mismatched)

    # -- one size -----------------------------------------------------------------------------

    def error_row(self, nbytes, contender, error):
        return {
            "bytes": nbytes,
            "contender": contender.name,
            "median_us": None,
            "min_us": None,
            "max_us": None,
            "rounds": 0,
            "ops_per_sample": 0,
            "bus_gbps": None,
            "exact": None,
            "error": error,
        }

    def bench_size(self, nbytes, contenders, size_index):
        torch = self.torch
        elements = nbytes // 2
        label = format_bytes(nbytes)
        rows = {}
        exact = {}

        # Local steps and collective steps are agreed on separately, so that a rank that failed
        # locally never leaves its peers inside a collective it did not join.
        self.kick(f"{label}: inputs")
        state = {}

        def make_input():
            seed = 0x5EED0000 + 7919 * size_index + 104729 * self.rank
            state["pristine"] = self.random_input(elements, seed)
            torch.cuda.synchronize()

        def make_reference():
            state["reference"] = self.reference(state["pristine"])

        error = self.agreed_error(self.attempt(make_input))
        if error is None:
            self.kick(f"{label}: reference sum")
            error = self.agreed_error(self.attempt(make_reference))
        if error is not None:
            for contender in contenders:
                rows[contender.name] = self.error_row(
                    nbytes, contender, contender.error or f"inputs: {error}"
                )
            return [rows[c.name] for c in contenders]
        pristine = state["pristine"]
        reference = state["reference"]

        live = []
        for contender in contenders:
            if contender.error is not None:
                rows[contender.name] = self.error_row(nbytes, contender, contender.error)
                continue
            name = contender.name

            def prepare(c=contender):
                c.bind(elements)
                c.reset(pristine)
                torch.cuda.synchronize()

            def warm_up(c=contender):
                self.barrier()
                c.op()
                torch.cuda.synchronize()

            self.kick(f"{label}: {name} input")
            error = self.agreed_error(self.attempt(prepare))
            if error is not None:
                rows[name] = self.error_row(nbytes, contender, f"input: {error}")
                continue
            self.kick(f"{label}: {name} eager op")
            error = self.agreed_error(self.attempt(warm_up))
            if error is not None:
                rows[name] = self.error_row(nbytes, contender, f"eager op: {error}")
                continue

            def capture_single(c=contender):
                c.single = self.capture(c, 1)

            self.kick(f"{label}: {name} one-op capture")
            error = self.agreed_error(self.attempt(capture_single))
            if error is not None:
                contender.drop_graphs()
                rows[name] = self.error_row(nbytes, contender, f"graph capture: {error}")
                continue

            self.kick(f"{label}: {name} exactness check")
            try:
                local = (self.check_exact(contender, pristine, reference), None)
            except Exception as exc:
                local = (None, describe(exc))
            outcome = self.agree(local)
            failures = [(r, e) for r, (_, e) in enumerate(outcome) if e is not None]
            if failures:
                contender.drop_graphs()
                text = "; ".join(f"rank {r}: {e}" for r, e in failures)
                rows[name] = self.error_row(nbytes, contender, f"exactness check: {text}")
                continue
            mismatched = [count for count, _ in outcome]
            exact[name] = all(count == 0 for count in mismatched)
            if not exact[name]:
                self.notes.append(
                    f"{label} {name}: not bit-exact against the fp32 rank-order reference "
                    f"(mismatched elements per rank: {mismatched})"
                )
            live.append(contender)

        if live:
            try:
                ops = self.calibrate(live, pristine)
            except Exception as exc:
                raise Fatal(f"{label}: calibration: {describe(exc)}") from exc
            timed = []
            for contender, count in zip(live, ops, strict=True):
                name = contender.name

                def capture_many(c=contender, n=count):
                    c.graph = self.capture(c, n)
                    c.ops = n

                self.kick(f"{label}: {name} capture of {count} ops")
                error = self.agreed_error(self.attempt(capture_many))
                contender.single = None
                if error is not None:
                    contender.drop_graphs()
                    rows[name] = self.error_row(nbytes, contender, f"graph capture: {error}")
                    continue
                timed.append(contender)
            torch.cuda.synchronize()

            if timed:
                for row in self.time_rounds(nbytes, timed, pristine, exact):
                    rows[row["contender"]] = row
            for contender in live:
                contender.drop_graphs()
            torch.cuda.synchronize()

        return [rows[c.name] for c in contenders]

    def time_rounds(self, nbytes, timed, pristine, exact):
        torch = self.torch
        label = format_bytes(nbytes)
        rounds = self.args.rounds
        local = [[math.nan] * rounds for _ in timed]
        try:
            for index in range(self.args.warmup + rounds):
                self.kick(f"{label}: timing round {index + 1}")
                times = self.round(timed, pristine, use_single=False)
                if index < self.args.warmup:
                    continue
                for slot, (contender, value) in enumerate(zip(timed, times, strict=True)):
                    local[slot][index - self.args.warmup] = value / contender.ops
            self.kick(f"{label}: gathering timings")
            mine = torch.tensor(local, dtype=torch.float64, device=self.device)
            gathered = [torch.empty_like(mine) for _ in range(self.world)]
            self.dist.all_gather(gathered, mine)
            everyone = [tensor.tolist() for tensor in gathered]
        except Exception as exc:
            raise Fatal(f"{label}: timing: {describe(exc)}") from exc

        rows = []
        for slot, contender in enumerate(timed):
            per_round = []
            for index in range(rounds):
                values = [everyone[rank][slot][index] for rank in range(self.world)]
                if all(math.isfinite(value) and value > 0 for value in values):
                    per_round.append(max(values))
            row = {
                "bytes": nbytes,
                "contender": contender.name,
                "median_us": None,
                "min_us": None,
                "max_us": None,
                "rounds": len(per_round),
                "ops_per_sample": contender.ops,
                "bus_gbps": None,
                "exact": exact.get(contender.name),
                "error": None,
            }
            if per_round:
                median = statistics.median(per_round)
                row["median_us"] = median
                row["min_us"] = min(per_round)
                row["max_us"] = max(per_round)
                factor = 2.0 * (self.world - 1) / self.world
                row["bus_gbps"] = nbytes * factor / (median * 1e-6) / 1e9
            else:
                row["error"] = "no round had a valid sample from every rank"
            rows.append(row)
        return rows

    # -- output -------------------------------------------------------------------------------

    def table_line(self, row):
        def number(value, width, digits):
            return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

        if row["exact"] is None:
            exact = "-"
        else:
            exact = "yes" if row["exact"] else "NO"
        return (
            f"{row['bytes']:>11}  {row['contender']:<20}"
            f"{number(row['median_us'], 10, 2)}{number(row['min_us'], 10, 2)}"
            f"{number(row['max_us'], 10, 2)}{number(row['bus_gbps'], 9, 1)}  {exact}"
        )

    def print_rows(self, rows):
        if self.rank != 0:
            return
        if not self.printed_header:
            print(
                f"{'bytes':>11}  {'contender':<20}{'median_us':>10}{'min_us':>10}"
                f"{'max_us':>10}{'busbw':>9}  exact"
            )
            self.printed_header = True
        for row in rows:
            print(self.table_line(row))
        sys.stdout.flush()

    def print_notes(self):
        if self.rank != 0:
            return
        errors = [row for row in self.rows if row["error"]]
        print()
        print("times: microseconds per all-reduce (median, fastest and slowest round);")
        print("busbw: GB/s at the median; exact: bit-exact against the fp32 rank-order sum")
        for row in errors:
            print(f"unavailable: {row['bytes']} {row['contender']}: {row['error']}")
        for note in self.notes:
            print(f"note: {note}")
        sys.stdout.flush()

    def document(self, complete, failure=None):
        doc = dict(self.header)
        doc["rows"] = list(self.rows)
        doc["complete"] = complete
        if failure is not None:
            doc["failure"] = failure
        if self.notes:
            doc["notes"] = list(self.notes)
        return doc

    def write_json(self, complete, failure=None):
        if self.rank != 0 or not self.args.json:
            return
        path = self.args.json
        temporary = f"{path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.document(complete, failure), handle, indent=2)
            handle.write("\n")
        os.replace(temporary, path)
        log(self.rank, f"wrote {path}")

    # -- everything ---------------------------------------------------------------------------

    def drop_graphs(self):
        for contender in self.contenders:
            contender.drop_graphs()

    def run(self):
        args = self.args
        self.describe_run()
        self.import_symm_mem()
        max_elements = max(args.sizes) // 2
        self.contenders = self.make_contenders(max_elements)
        for size_index, nbytes in enumerate(args.sizes):
            log(self.rank, f"{format_bytes(nbytes)} ({nbytes} bytes)")
            rows = self.bench_size(nbytes, self.contenders, size_index)
            self.rows.extend(rows)
            self.print_rows(rows)
        self.print_notes()
        self.write_json(complete=True)
        self.kick("releasing buffers")
        self.drop_graphs()
        self.torch.cuda.synchronize()
        # Every rank is past its last kernel before any rank frees symmetric memory.
        self.agree(None)
        for contender in self.contenders:
            contender.close()
        if self.prepare is not None:
            self.prepare.close()
            self.prepare = None
        self.barrier_buffer = None
        gc.collect()
        self.torch.cuda.synchronize()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_multicast_off()

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        sys.stderr.write("pytorch_allreduce: CUDA is not available\n")
        return 2
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.stderr.write(
            "pytorch_allreduce: start with torchrun, e.g. "
            "torchrun --nproc-per-node 2 benches/pytorch_allreduce.py\n"
        )
        return 2

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    holder = {"bench": None}

    def on_expire(reason):
        bench = holder["bench"]
        if bench is not None:
            bench.write_json(complete=False, failure=reason)

    watchdog = Watchdog(rank, args.timeout, on_expire)
    watchdog.kick("init_process_group")
    nccl_timeout = datetime.timedelta(seconds=max(600.0, 2 * args.timeout))
    try:
        dist.init_process_group(backend="nccl", device_id=device, timeout=nccl_timeout)
    except TypeError:
        dist.init_process_group(backend="nccl", timeout=nccl_timeout)

    bench = Bench(args, torch, dist)
    holder["bench"] = bench
    bench.watchdog = watchdog
    try:
        group = dist.group.WORLD
        bench.group_name = group.group_name
    except Exception:
        bench.group_name = dist.distributed_c10d._get_default_group().group_name

    code = 0
    try:
        watchdog.kick("first barrier")
        bench.barrier()
        torch.cuda.synchronize()
        bench.run()
    except Exception as exc:
        reason = str(exc) if isinstance(exc, Fatal) else describe(exc)
        sys.stderr.write(f"rank {rank}: the run failed: {reason}\n")
        traceback.print_exc()
        sys.stderr.flush()
        try:
            bench.print_notes()
            bench.write_json(complete=False, failure=reason)
        except Exception:
            traceback.print_exc()
        code = 1
        # A peer that already left can make what follows wait; the watchdog bounds it.
        watchdog.kick("cleaning up after the failure", timeout=60.0)
        try:
            bench.drop_graphs()
        except Exception:
            traceback.print_exc()
    watchdog.kick("destroy_process_group", timeout=60.0 if code else args.timeout)
    try:
        dist.destroy_process_group()
    except Exception:
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        # Skip interpreter teardown, which would free CUDA state a failed peer may still hold.
        os._exit(code)
    watchdog.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
