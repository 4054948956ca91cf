// all_reduce_one_shot.cu: one-shot all-reduce; every rank reduces the whole message.
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's):
//   all_reduce_one_shot_pull_<dtype>  reads every rank's input region and sums.
//       Scratch: none. Barriers: start (set 0), end (set 3).
//   all_reduce_one_shot_push_<dtype>  writes its input into its peer slot of every peer's
//       scratch, then sums its own input with the slots it received.
//       Scratch: world - 1 peer slots of round_up(elements * sizeof(T), 16) bytes. Barriers:
//       start (0), data (1).
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads, all resident at once; no cluster instructions, so a launch with
// cluster dimensions is fine; the pointers and scratch_offset 16-byte aligned. Pull reads every
// rank's message from its registered buffer, so the output must lie outside them; push reads
// its own message from `input` and writes each element of the output after reading it there,
// so the output may be the input (in place) but no registered buffer.
// Every rank sums in rank order from rank 0's value (prepare_element.cuh), so all write the
// same bytes.
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// Both begin with the start barrier: every peer's input is ready and its slots may be
// overwritten.
struct OneShotPull : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        sum_whole_message<T, N>(params.buffers, params.output, params.input_elements);
        // End: peers read this rank's input until they raise this flag; once this launch ends
        // the stream may overwrite the input, so no block leaves before its peers are done with
        // its elements (each peer's same-numbered block reads exactly the elements this block
        // reads).
        if (!block_barrier<N>(params, flags, kSetEnd)) {
            return;
        }
        block_end(params, flags);
    }
};

struct OneShotPush : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const u64 slot = message_bytes<T>(params.input_elements);
        const Range message = whole_message<T>(params.input_elements);
        const Workers workers = grid_workers();
        // Peers in the order rank+1, rank+2, ... so ranks start on different peers.
        scatter_owned<T, N>(params, params.input, params.scratch_offset, slot, message, workers);
        // Data: this block's elements are in every peer's slot, and what the peers'
        // same-numbered blocks sent is in this rank's. No peer reads this rank's input, and
        // peers write its slots again only after the next launch's start barrier, so no end
        // barrier is needed.
        if (!block_barrier<N>(params, flags, kSetData)) {
            return;
        }
        const unsigned char* sources[N];
        rank_sources<N>(rank, params.input, params.buffers[rank] + params.scratch_offset, slot,
                        sources);
        sum_owned<T, N>(sources, 0, static_cast<unsigned char*>(params.output), message, workers);
        block_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_one_shot_pull, block_kernel, prepare::OneShotPull)
PREPARE_ENTRY(all_reduce_one_shot_push, block_kernel, prepare::OneShotPush)
