// all_reduce_one_shot_copy_engine.cu: the kernels of the one-shot all-reduce whose peer
// traffic the copy engines carry. The host (src/collective/copy_engine.rs) enqueues, per launch:
//   1. all_reduce_one_shot_copy_engine_start_<dtype>: a barrier (set 0) with every peer, so
//      every peer's input is written (it was, before its launch in stream order);
//   2. on a second stream, per chunk of the message, one copy per peer from the peer's input
//      into this rank's private scratch, then an event;
//   3. per chunk, once its copies are done, all_reduce_one_shot_copy_engine_<dtype> over the
//      chunk;
//   4. all_reduce_one_shot_copy_engine_end_<dtype>: a barrier (set 3), so no peer still copies
//      this rank's input when the stream goes on and may overwrite it.
// The barriers are prepare_copy_engine.cuh's.
// After an abort the barriers and the sums return at once, but the host-queued copies still
// run: they read the peers' registered buffers, which stay mapped until this rank unmaps them,
// and write only this rank's private scratch.
//
// Entries (each takes LaunchParams by value):
//   all_reduce_one_shot_copy_engine_<dtype>  sums buffers[0..world) element-wise, in rank order,
//       into output: buffers[rank] is the chunk of this rank's input and every other entry the
//       chunk of a peer's input as copied into this rank's scratch, so it reads local memory
//       only and waits for nothing; after an abort it writes nothing. Scratch: none in the
//       registered buffer.
//   all_reduce_one_shot_copy_engine_start_<dtype>, all_reduce_one_shot_copy_engine_end_<dtype>
//       the barriers; one block of at least `world` threads; `elements` is not read.
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads; no cluster instructions; the pointers 16-byte aligned; the output
// outside every buffer (peers' copy engines read this rank's registered input until the end
// barrier).
#include "prepare_copy_engine.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

struct CopyEngineSum : NoBegin {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags&) {
        // After an abort (a barrier gave up) the copies may hold anything: write nothing, as
        // every other kernel returns at once then.
        if (load_relaxed_device(params.state) != 0) {
            return;
        }
        sum_whole_message<T, N>(params.buffers, params.output, params.input_elements);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_one_shot_copy_engine, block_kernel, prepare::CopyEngineSum)
PREPARE_ENTRY(all_reduce_one_shot_copy_engine_start, block_kernel,
              prepare::CopyEngineBarrier<prepare::kSetStart>)
PREPARE_ENTRY(all_reduce_one_shot_copy_engine_end, block_kernel,
              prepare::CopyEngineBarrier<prepare::kSetEnd>)
