"""A rank killed while serving makes the other raise within the timeout plus one second,
never hang.

    python3 tests/python/gpu_peer_death.py PACKAGE_DIR [--timeout 5]

It starts its two ranks itself, like torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), because torchrun ends the surviving ranks as soon as one dies, which is the very
moment this test is about.

Both ranks all-reduce in a loop at a size whose agreed kernel is a custom one (not NCCL,
which cannot time out); rank 1 sends itself SIGKILL after a number of steps. Rank 0 must
raise `prepare.PeerTimeout` (naming rank 1) from `check()` or the next `all_reduce`, or a
RuntimeError, within timeout + 1 s of the kill (the kill time is shared through a file,
as rank 1 cannot say it after dying). Prints the measured time; exit 0 when that holds.
A watchdog ends rank 0 with exit 2 if it hangs.
"""

import argparse
import os
import signal
import sys
import tempfile
import threading
import time

from gpu_common import init, random_bf16

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import prepare  # noqa: E402

STEPS_BEFORE_KILL = 200


def custom_size(collectives):
    """Elements of a message whose agreed kernel is custom, preferring decode-like sizes."""
    for elements in (7168, 8 * 7168, 32 * 7168, 1024, 256 * 1024):
        route = collectives.route(elements * 2)
        if not route.startswith("nccl"):
            return elements, route
    raise SystemExit("no size tried is routed to a custom kernel: " +
                     collectives.route(7168 * 2))


def launch(argv):
    """Starts rank 0 and rank 1 of this script; the result is rank 0's."""
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    children = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        children.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                         env=env))
    code = children[0].wait()
    rank1 = children[1].wait()
    print(f"rank 0 exited with {code}; rank 1 with {rank1} (-9: killed, as planned)",
          flush=True)
    return code


def main():
    if "RANK" not in os.environ:
        return launch(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--stamp", default=os.path.join(tempfile.gettempdir(),
                                                       "prepare_peer_death.stamp"))
    args = parser.parse_args()

    rank, world, device = init()
    if world != 2:
        raise SystemExit("run with --nproc-per-node 2")
    if rank == 0 and os.path.exists(args.stamp):
        os.remove(args.stamp)
    collectives = prepare.Collectives(args.package, cache_dir=args.cache_dir,
                                      timeout=args.timeout)
    elements, route = custom_size(collectives)
    tensor = collectives.empty(elements)
    tensor.copy_(random_bf16(elements, 99 + rank, device))
    dist.barrier()
    if rank == 0:
        print(f"serving {elements} elements with {route}; timeout {args.timeout} s",
              flush=True)

    if rank == 1:
        for _ in range(STEPS_BEFORE_KILL):
            collectives.all_reduce(tensor)
        torch.cuda.synchronize()
        with open(args.stamp + ".tmp", "w") as stamp:
            stamp.write(repr(time.time()))
        os.replace(args.stamp + ".tmp", args.stamp)
        os.kill(os.getpid(), signal.SIGKILL)

    # Rank 0: a watchdog so that a hang is a failure, not a stuck job.
    limit = args.timeout + 30

    def hung():
        print(f"FAIL: rank 0 still running {limit:.0f} s after starting to serve: a hang",
              flush=True)
        os._exit(2)

    watchdog = threading.Timer(limit, hung)
    watchdog.daemon = True
    watchdog.start()

    raised = None
    steps = 0
    try:
        while True:
            collectives.all_reduce(tensor)
            steps += 1
            if steps % 50 == 0:
                # Waits for the work queued so far, then reads the abort word.
                torch.cuda.current_stream().synchronize()
                collectives.check()
    except (prepare.PeerTimeout, RuntimeError) as error:
        raised = error
    noticed = time.time()
    watchdog.cancel()
    killed = None
    for _ in range(100):
        if os.path.exists(args.stamp):
            with open(args.stamp) as stamp:
                killed = float(stamp.read())
            break
        time.sleep(0.05)
    if killed is None:
        print(f"FAIL: rank 0 raised before rank 1 was killed: {raised!r}", flush=True)
        os._exit(1)
    elapsed = noticed - killed
    within = elapsed <= args.timeout + 1.0
    print(f"rank 0 raised {type(raised).__name__} after {steps} steps, {elapsed:.2f} s after "
          f"the kill (limit {args.timeout + 1.0:.1f} s): {raised}", flush=True)
    if isinstance(raised, prepare.PeerTimeout) and "rank 1" not in str(raised):
        print("FAIL: the PeerTimeout does not name rank 1", flush=True)
        within = False
    print("PASS" if within else "FAIL: too slow", flush=True)
    # The communicators cannot be torn down with a dead peer: leave at once.
    os._exit(0 if within else 1)


if __name__ == "__main__":
    sys.exit(main())
