"""One run of the bench: the ranks' agreement helpers, the set-up of every contender, and the
loop over sizes (torch comes from the caller)."""

import gc
import os
import warnings

from .common import describe, exponent_range, format_bytes, log, torch_at_least
from .contenders import (
    PrepareAnyTensor,
    PrepareZeroCopy,
    SymmMemBase,
    SymmMemOneShot,
    SymmMemTwoShot,
    TorchNccl,
)
from .nccl_symmetric import NcclSymmetric
from .report import Report
from .row_contenders import ROW_CONTENDER_TYPES
from .rules import ROW_COLLECTIVES, bench_shape
from .timing import Timing

BARRIER_ELEMENTS = 64
# torch.cuda._sleep spins for a number of GPU clock cycles; H200 SMs run at up to 1.98 GHz.
ASSUMED_CYCLES_PER_US = 2000

CONTENDER_TYPES = {
    "torch_nccl": TorchNccl,
    "nccl_symmetric": NcclSymmetric,
    "symm_mem_one_shot": SymmMemOneShot,
    "symm_mem_two_shot": SymmMemTwoShot,
    "prepare_zero_copy": PrepareZeroCopy,
    "prepare_any_tensor": PrepareAnyTensor,
}


class Bench(Timing, Report):
    """One run on this rank: set-up, the sizes one after the other, release."""

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
            "collective": self.args.collective,
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
                "routes": self.prepare_routes(),
            }
            for nbytes, route in self.header["prepare"]["routes"].items():
                self.notes.append(f"prepare routes {format_bytes(int(nbytes))} to {route}")
        return self.prepare

    def prepare_routes(self):
        """Where prepare routes each size's full message, by collective."""
        if getattr(self.args, "epilogue", False):
            collective = "all_reduce_add_rms_norm"
            sizes = list(self.args.tokens) + list(self.args.decode_batches)
            routes = {}
            for n in sorted(set(sizes)):
                nbytes = n * self.args.hidden * 2
                try:
                    routes[f"{collective} {nbytes}"] = self.prepare.route(
                        nbytes, collective=collective
                    )
                except Exception as exc:  # noqa: BLE001 - the route is a note, not a step
                    routes[f"{collective} {nbytes}"] = f"unknown: {describe(exc)}"
            return routes
        if self.args.sequence_parallel:
            routes = {}
            for collective in ("all_reduce",) + ROW_COLLECTIVES:
                if collective not in {c for c, _ in self.prepare.served}:
                    continue
                for tokens in self.args.tokens:
                    nbytes = tokens * self.args.hidden * 2
                    routes[f"{collective} {nbytes}"] = self.prepare.route(
                        nbytes, collective=collective
                    )
            return routes
        collective = self.args.collective
        routes = {}
        for nbytes in self.args.sizes:
            if collective in ROW_COLLECTIVES:
                rows, width = bench_shape(nbytes, 2, self.world)
                nbytes = rows * width * 2
            routes[str(nbytes)] = self.prepare.route(nbytes, collective=collective)
        return routes

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
        types = ROW_CONTENDER_TYPES if self.args.collective in ROW_COLLECTIVES else CONTENDER_TYPES
        for name in self.args.contenders:
            contender = types[name](self)
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
            if contender.error is None and isinstance(contender, NcclSymmetric):
                contender.error = self.nccl_rendezvous(contender)
        for contender in contenders:
            if contender.error is not None:
                log(self.rank, f"{contender.name} unavailable: {contender.error}")
        return contenders

    def nccl_rendezvous(self, contender):
        """NCCL's own communicator and symmetric window, each step agreed by every rank.

        Returns the agreed error, or None when every rank holds the registered window.
        """
        self.kick(f"{contender.name}: ncclCommInitRank")
        # Rank 0 made the id while allocating; every rank's allocation succeeded.
        unique_id = [contender.unique_id]
        self.dist.broadcast_object_list(unique_id, src=0)
        error = self.agreed_error(self.attempt(lambda: contender.connect(unique_id[0])))
        if error is not None:
            return error
        self.kick(f"{contender.name}: ncclCommWindowRegister")
        error = self.agreed_error(self.attempt(contender.register_window))
        if error is None:
            nccl = contender.nccl
            log(self.rank, f"{contender.name}: NCCL {nccl.version} from {nccl.path}")
        return error

    # -- everything ---------------------------------------------------------------------------

    def drop_graphs(self):
        for contender in self.contenders:
            contender.drop_graphs()

    def run(self):
        args = self.args
        self.describe_run()
        if args.epilogue:
            from .epilogue import run_epilogue

            run_epilogue(self)
            return
        if args.sequence_parallel:
            from .sequence_parallel import run_steps

            run_steps(self)
            return
        self.import_symm_mem()
        max_elements = max(args.sizes) // 2
        if args.collective in ROW_COLLECTIVES:
            # A shape's message is at most a row (4096 elements) past its size.
            max_elements = max(
                rows * width for rows, width in (bench_shape(n, 2, self.world) for n in args.sizes)
            )
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
