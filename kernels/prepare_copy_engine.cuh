// prepare_copy_engine.cuh: the barriers of the kernels whose peer traffic the copy engines carry
// (transfer "copy_engine": all_reduce_one_shot_copy_engine.cu, all_gather.cu). The host enqueues
// a start barrier (set 0), then the copies on a second stream forked after it, then joins that
// stream before an end barrier (set 3), so no peer still copies this rank's input region when
// the stream goes on and may overwrite it. The two barriers use two flag sets: a peer may raise
// its end flag before this rank has seen its start flag, and the flags are compared for
// equality with the epoch. The start barrier is the one every barrier kernel begins with
// (block_barrier), shape check included.
#pragma once

#include "prepare_sync.cuh"

namespace prepare {

// A barrier (set `Set`) and nothing else; one block of at least `world` threads.
template <unsigned int Set>
struct CopyEngineBarrier {
    template <int N>
    __device__ static bool begin(const LaunchParams& params, BlockFlags& flags) {
        return begin_with_barrier<N>(params, flags, Set);
    }
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        block_end(params, flags);
    }
};

}  // namespace prepare
