#!/usr/bin/env python3
"""Time PyTorch's all-reduce paths the way `prepare bench` times its contenders.

Started by torchrun, one process per GPU:

    torchrun --nproc-per-node 2 benches/pytorch_allreduce.py --sizes 8K,256K,4M,64M --json OUT.json

Contenders, each a bf16 sum all-reduce of the same random data:

* torch_nccl: torch.distributed.all_reduce (NCCL backend), in place;
* nccl_symmetric: NCCL's symmetric-memory kernels (NCCL 2.27 and later), called directly in the
  libnccl torch loaded (found in /proc/self/maps): a communicator of its own (ncclGetUniqueId
  on rank 0, the id broadcast through torch.distributed, ncclCommInitRank), one buffer of the
  largest message from ncclMemAlloc registered with ncclCommWindowRegister(...,
  NCCL_WIN_COLL_SYMMETRIC), and ncclAllReduce in place in it on torch's current stream; an
  older NCCL, or one without those entry points, makes it unavailable with the reason, and the
  JSON header records the library and its ncclGetVersion;
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
the median over rounds. Bus bandwidth is bytes x 2(n-1)/n / time (x (n-1)/n for the
reduce-scatter and the all-gather). The code is in benches/allreduce_bench/, one module per
concern.

`--collective reduce_scatter` or `all_gather` times `reduce_scatter_tensor` or
`all_gather_into_tensor` (and with --prepare, prepare's) at rows x width by `prepare bench`'s
rule; `--sequence-parallel` times reduce-scatter, RMSNorm on the owned rows, all-gather beside
all-reduce then RMSNorm at --tokens x --hidden (docs/benchmarks.md).

Multicast (NVLS) is never used: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are
set before torch is imported unless already set, and any other value is refused.
"""

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import sys  # noqa: E402

from allreduce_bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
