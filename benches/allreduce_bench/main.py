"""The entry point: arguments, torch and the process group, the watchdog, and the exit code."""

import datetime
import os
import sys
import traceback

from .bench import Bench
from .cli import check_multicast_off, parse_args
from .common import Fatal, Watchdog, describe


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
