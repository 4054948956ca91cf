// all_reduce_one_shot_copy_engine.cu: the kernels of the one-shot all-reduce whose peer
// traffic the copy engines carry. The host (src/collective.rs) enqueues, per launch:
//   1. all_reduce_one_shot_copy_engine_start_bf16: a barrier (set 0) with every peer, so every
//      peer's input is written (it was, before its launch in stream order);
//   2. on a second stream, per chunk of the message, one copy per peer from the peer's input
//      into this rank's private scratch, then an event;
//   3. per chunk, once its copies are done, all_reduce_one_shot_copy_engine_bf16 over the chunk;
//   4. all_reduce_one_shot_copy_engine_end_bf16: a barrier (set 3), so no peer still copies
//      this rank's input when the stream goes on and may overwrite it.
// The start and end barriers use two flag sets: a peer may raise its end flag before this rank
// has seen its start flag, and the flags are compared for equality with the epoch.
// After an abort the barriers and the sums return at once, but the host-queued copies still
// run: they read the peers' registered buffers, which stay mapped until this rank unmaps them,
// and write only this rank's private scratch.
//
// Entries (each takes AllReduceParams by value):
//   all_reduce_one_shot_copy_engine_bf16  sums buffers[0..world) element-wise, in rank order,
//       into output: buffers[rank] is the chunk of this rank's input and every other entry the
//       chunk of a peer's input as copied into this rank's scratch, so it reads local memory
//       only and waits for nothing; after an abort it writes nothing. Scratch: none in the
//       registered buffer.
//   all_reduce_one_shot_copy_engine_start_bf16, all_reduce_one_shot_copy_engine_end_bf16  the
//       barriers; one block of at least `world` threads; `elements` is not read.
// Requirements: world 2..8; any element count; 1..1024 blocks of a multiple of 32 threads; no
// cluster instructions; the pointers 16-byte aligned; the output outside every buffer (peers'
// copy engines read this rank's registered input until the end barrier).
#include "prepare_abi.cuh"
#include "prepare_bf16.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

template <int N>
__device__ void copy_engine_sum(const AllReduceParams& params) {
    // After an abort (a barrier gave up) the copies may hold anything: write nothing, as every
    // other kernel returns at once then.
    if (load_relaxed_device(params.state) != 0) {
        return;
    }
    sum_whole_message<N>(params.buffers, params.output, params.elements);
}

template <int N>
__device__ void copy_engine_barrier(const AllReduceParams& params, BlockFlags& flags,
                                    unsigned int set) {
    if (!block_begin(params, flags)) {
        return;
    }
    if (!block_barrier<N>(params, flags, set)) {
        return;
    }
    block_end(params, flags);
}

}  // namespace prepare

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_copy_engine_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    PREPARE_DISPATCH_WORLD(prepare::copy_engine_sum, params)
}

extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_copy_engine_start_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::copy_engine_barrier, params, flags, prepare::kSetStart)
}

extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_copy_engine_end_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::copy_engine_barrier, params, flags, prepare::kSetEnd)
}
