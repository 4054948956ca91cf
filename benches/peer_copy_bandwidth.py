#!/usr/bin/env python3
"""Measure how fast the copy engines move bytes between two GPUs of one host.

An all-reduce over two GPUs has to bring every rank S bytes (S/2 for the reduce-scatter and
S/2 for the all-gather), with both directions of the link busy at once. So its bus bandwidth
(S x 2(n-1)/n / time = S / time) cannot beat the per-direction rate of copies that run both
ways at once. This script measures that rate for the copy engines, which no SM kernel uses.

One process drives both GPUs through the CUDA driver API (ctypes) with peer access enabled:

* `pull`: each copy runs on a stream of the GPU that receives the bytes (its copy engine reads
  the peer's memory);
* `push`: each copy runs on a stream of the GPU that sends them (its copy engine writes to the
  peer);
* `one_way`: only GPU 0 receives, for comparison; `both_ways`: both GPUs receive at once;
* `streams`: the copy is split into that many parts on as many streams per GPU, in case one
  stream does not keep every copy engine busy.

Each figure is the median of `--rounds` samples; a sample is the wall time of `--reps` copies
of `--bytes` each (per direction), enqueued on every stream at once after both GPUs are idle,
until both GPUs are idle again. GB/s are 10^9 bytes per second per direction.

    python3 benches/peer_copy_bandwidth.py --json peer_copy.json
"""

import argparse
import ctypes
import json
import statistics
import sys
import time

import torch


def check(result, what):
    if result != 0:
        name = ctypes.c_char_p()
        libcuda.cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else result}")


libcuda = ctypes.CDLL("libcuda.so.1")
libcuda.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
libcuda.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
libcuda.cuCtxEnablePeerAccess.argtypes = [ctypes.c_void_p, ctypes.c_uint]
libcuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
# CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
ALREADY_ENABLED = 704


def context(device):
    torch.cuda.set_device(device)
    torch.cuda.synchronize(device)
    handle = ctypes.c_void_p()
    check(libcuda.cuCtxGetCurrent(ctypes.byref(handle)), f"cuCtxGetCurrent on GPU {device}")
    return handle


def enable_peer_access(contexts):
    for device, _ in enumerate(contexts):
        for peer, peer_context in enumerate(contexts):
            if peer == device:
                continue
            torch.cuda.set_device(device)
            result = libcuda.cuCtxEnablePeerAccess(peer_context, 0)
            if result not in (0, ALREADY_ENABLED):
                check(result, f"cuCtxEnablePeerAccess from GPU {device} to GPU {peer}")


def measure(contexts, buffers, streams, mode, directions, parts, size, reps, rounds):
    """Median GB/s per direction over `rounds` samples."""
    receivers = [0, 1] if directions == "both_ways" else [0]
    plan = []
    for receiver in receivers:
        sender = 1 - receiver
        engine = receiver if mode == "pull" else sender
        for part in range(parts):
            chunk = size // parts
            offset = part * chunk
            plan.append(
                (
                    buffers[receiver]["dst"].data_ptr() + offset,
                    buffers[sender]["src"].data_ptr() + offset,
                    chunk,
                    streams[engine][part].cuda_stream,
                    contexts[engine],
                )
            )
    samples = []
    for round_index in range(rounds + 1):
        for device in (0, 1):
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(reps):
            for dst, src, count, stream, engine_context in plan:
                # The copy is enqueued with its stream's context current.
                check(libcuda.cuCtxSetCurrent(engine_context), "cuCtxSetCurrent")
                check(libcuda.cuMemcpyAsync(dst, src, count, stream), "cuMemcpyAsync")
        for device in (0, 1):
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        if round_index > 0:
            samples.append(size * reps / elapsed / 1e9)
    return statistics.median(samples), min(samples), max(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=256 << 20, help="bytes per copy and direction")
    parser.add_argument("--reps", type=int, default=10, help="copies per sample")
    parser.add_argument("--rounds", type=int, default=9, help="samples per figure")
    parser.add_argument("--streams", default="1,2,4", help="streams per GPU to try")
    parser.add_argument("--json", help="write the results there")
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        sys.exit("peer_copy_bandwidth.py needs two GPUs")
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        sys.exit("GPUs 0 and 1 have no peer access to each other")
    stream_counts = [int(text) for text in args.streams.split(",")]
    contexts = [context(device) for device in (0, 1)]
    enable_peer_access(contexts)
    buffers = []
    streams = []
    for device in (0, 1):
        with torch.cuda.device(device):
            buffers.append(
                {
                    "src": torch.randint(0, 255, (args.bytes,), dtype=torch.uint8, device=device),
                    "dst": torch.empty(args.bytes, dtype=torch.uint8, device=device),
                }
            )
            streams.append([torch.cuda.Stream(device=device) for _ in range(max(stream_counts))])
    rows = []
    for directions in ("one_way", "both_ways"):
        for mode in ("pull", "push"):
            for parts in stream_counts:
                median, low, high = measure(
                    contexts,
                    buffers, streams, mode, directions, parts, args.bytes, args.reps, args.rounds
                )
                row = {
                    "directions": directions,
                    "mode": mode,
                    "streams": parts,
                    "bytes": args.bytes,
                    "median_gbps": median,
                    "min_gbps": low,
                    "max_gbps": high,
                }
                rows.append(row)
                print(
                    f"{directions:9} {mode:4} streams {parts}: {median:7.1f} GB/s per direction "
                    f"(min {low:.1f}, max {high:.1f})",
                    flush=True,
                )
    # Copies are checked once, both ways, after the timing.
    for receiver in (0, 1):
        sender = 1 - receiver
        if not torch.equal(buffers[receiver]["dst"].cpu(), buffers[sender]["src"].cpu()):
            sys.exit(f"the copy into GPU {receiver} differs from GPU {sender}'s bytes")
    result = {
        "gpus": [torch.cuda.get_device_name(device) for device in (0, 1)],
        "torch": torch.__version__,
        "reps": args.reps,
        "rounds": args.rounds,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
