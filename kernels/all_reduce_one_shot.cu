// all_reduce_one_shot.cu: one-shot all-reduce of bf16; every rank reduces the whole message.
//
// Entries (each takes AllReduceParams by value):
//   all_reduce_one_shot_pull_bf16  reads every rank's input region and sums.
//       Scratch: none. Barriers: start (set 0), end (set 3).
//   all_reduce_one_shot_push_bf16  writes its input into slot `rank` of every peer's scratch,
//       then sums its own input with the slots it received.
//       Scratch: world slots of round_up(2 * elements, 16) bytes. Barriers: start (0), data (1).
// Requirements: world 2..8; any element count; 1..1024 blocks of a multiple of 32 threads, all
// resident at once; no cluster instructions, so a launch with cluster dimensions is fine; the
// pointers and scratch_offset 16-byte aligned. Pull reads every rank's message from its
// registered buffer, so the output must lie outside them; push reads its own message from
// `input` and writes each element of the output after reading it there, so the output may be
// the input (in place) but no registered buffer.
// Every rank sums in rank order from rank 0's value (prepare_bf16.cuh), so all write the same
// bytes.
#include "prepare_abi.cuh"
#include "prepare_bf16.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

template <int N>
__device__ void one_shot_pull(const AllReduceParams& params, BlockFlags& flags) {
    if (!block_begin(params, flags)) {
        return;
    }
    // Start: a peer's input was written before its launch in stream order, so once its block
    // has started the input is ready to read.
    if (!block_barrier<N>(params, flags, kSetStart)) {
        return;
    }
    sum_whole_message<N>(params.buffers, params.output, params.elements);
    // End: peers read this rank's input until they raise this flag; once this launch ends the
    // stream may overwrite the input, so no block leaves before its peers are done with its
    // elements (each peer's same-numbered block reads exactly the elements this block reads).
    if (!block_barrier<N>(params, flags, kSetEnd)) {
        return;
    }
    block_end(params, flags);
}

template <int N>
__device__ void one_shot_push(const AllReduceParams& params, BlockFlags& flags) {
    if (!block_begin(params, flags)) {
        return;
    }
    // Start: every peer has finished its previous launch, which read its slots, so they may be
    // overwritten.
    if (!block_barrier<N>(params, flags, kSetStart)) {
        return;
    }
    const unsigned int rank = params.rank;
    const u64 slot = message_bytes(params.elements);
    const unsigned char* input = params.input;
    unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
    const Range message = whole_message(params.elements);
    const Workers workers = grid_workers();
    // Peers in the order rank+1, rank+2, ... so ranks start on different peers.
    for_each_owned(
        message, workers,
        [&](u64 v) {
            const Vec16 value = load_vector(input, v);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                const unsigned int peer = (rank + k) % N;
                store_vector(params.buffers[peer] + params.scratch_offset + rank * slot, v, value);
            }
        },
        [&](u64 e) {
            const unsigned short value = load_element(input, e);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                const unsigned int peer = (rank + k) % N;
                store_element(params.buffers[peer] + params.scratch_offset + rank * slot, e, value);
            }
        });
    // Data: this block's elements are in every peer's slot, and what the peers' same-numbered
    // blocks sent is in this rank's. No peer reads this rank's input, and peers write its slots
    // again only after the next launch's start barrier, so no end barrier is needed.
    if (!block_barrier<N>(params, flags, kSetData)) {
        return;
    }
    // Rank q's contribution: this rank's own input, or the slot rank q filled.
    const unsigned char* sources[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = static_cast<unsigned int>(q) == rank ? input : own_scratch + q * slot;
    }
    unsigned char* output = static_cast<unsigned char*>(params.output);
    sum_owned<N>(sources, 0, output, message, workers);
    block_end(params, flags);
}

}  // namespace prepare

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_pull_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::one_shot_pull, params, flags)
}

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_push_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::one_shot_push, params, flags)
}
