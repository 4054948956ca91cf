// all_reduce_rsag.cu: reduce-scatter then all-gather all-reduce of bf16.
//
// Rank s owns slice s of the message (prepare_layout.cuh: whole 16-byte vectors, the last slice
// also the tail). The owner alone sums its slice, in rank order; every other rank copies the
// owner's bytes, so all ranks write the same bytes.
//
// Entries (each takes AllReduceParams by value):
//   all_reduce_rsag_pull_bf16  the owner reads its slice from every rank's input, sums it into
//       its output and its scratch; then every rank reads the other slices from their owners'
//       scratch. Scratch: round_up(2 * elements, 16) bytes. Barriers: start (0), gather (2).
//   all_reduce_rsag_push_bf16  every rank writes each peer's slice of its input into slot `rank`
//       of that peer's scratch; the owner sums the slots with its own input and writes the result
//       into every peer's gather region; every rank copies the gathered slices to its output.
//       Scratch: world slots of (ceil(elements / 8 / world) + 1) * 16 bytes, then
//       round_up(2 * elements, 16) bytes of gathered slices. Barriers: start (0), data (1),
//       gather (2).
// Requirements: world 2..8; any element count; 1..1024 blocks of a multiple of 32 threads, all
// resident at once; no cluster instructions, so a launch with cluster dimensions is fine; the
// pointers and scratch_offset 16-byte aligned; the output outside every scratch region. Pull
// reads every rank's message from its registered buffer; an output that is this rank's input
// region is safe, since each element is written only after every peer's same-numbered block
// read it (the gather barrier). Push reads its own message from `input`, and every output
// element is written by the thread that read it, after reading it, so the output may be the
// input.
#include "prepare_abi.cuh"
#include "prepare_bf16.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

template <int N>
__device__ void rsag_pull(const AllReduceParams& params, BlockFlags& flags) {
    if (!block_begin(params, flags)) {
        return;
    }
    // Start: peers' inputs are ready (written before their launch), and every peer has finished
    // its previous launch, which read this rank's scratch.
    if (!block_barrier<N>(params, flags, kSetStart)) {
        return;
    }
    const unsigned int rank = params.rank;
    const Workers workers = grid_workers();
    const unsigned char* inputs[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        inputs[q] = params.buffers[q];
    }
    unsigned char* output = static_cast<unsigned char*>(params.output);
    unsigned char* reduced = params.buffers[rank] + params.scratch_offset;
    for_each_owned(
        slice_of<N>(rank, params.elements), workers,
        [&](u64 v) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_vector(inputs[q], v);
            }
            const Vec16 sum = sum_vectors<N>(x);
            store_vector(output, v, sum);
            store_vector(reduced, v, sum);
        },
        [&](u64 e) {
            unsigned short x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_element(inputs[q], e);
            }
            const unsigned short sum = sum_elements<N>(x);
            store_element(output, e, sum);
            store_element(reduced, e, sum);
        });
    // Gather: every owner's reduced slice (this block's part) is in its scratch, and every peer
    // has finished reading this rank's input. Peers read this rank's scratch until they finish
    // this launch, and it is written again only after the next launch's start barrier, so no end
    // barrier is needed.
    if (!block_barrier<N>(params, flags, kSetGather)) {
        return;
    }
#pragma unroll
    for (int k = 1; k < N; ++k) {
        const unsigned int owner = (rank + k) % N;
        const unsigned char* owner_reduced = params.buffers[owner] + params.scratch_offset;
        for_each_owned(
            slice_of<N>(owner, params.elements), workers,
            [&](u64 v) { store_vector(output, v, load_vector(owner_reduced, v)); },
            [&](u64 e) { store_element(output, e, load_element(owner_reduced, e)); });
    }
    block_end(params, flags);
}

template <int N>
__device__ void rsag_push(const AllReduceParams& params, BlockFlags& flags) {
    if (!block_begin(params, flags)) {
        return;
    }
    // Start: every peer has finished its previous launch, which read its scratch, so it may be
    // overwritten.
    if (!block_barrier<N>(params, flags, kSetStart)) {
        return;
    }
    const unsigned int rank = params.rank;
    const Workers workers = grid_workers();
    const u64 slot = slot_bytes<N>(params.elements);
    const u64 gathered_offset = params.scratch_offset + N * slot;
    const unsigned char* input = params.input;
    unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
    // Scatter: the owner's slice of this rank's input goes to slot `rank` of the owner's scratch,
    // at its offset inside the slice.
#pragma unroll
    for (int k = 1; k < N; ++k) {
        const unsigned int owner = (rank + k) % N;
        const Range slice = slice_of<N>(owner, params.elements);
        unsigned char* destination = params.buffers[owner] + params.scratch_offset + rank * slot;
        for_each_owned(
            slice, workers,
            [&](u64 v) {
                store_vector(destination, v - slice.begin_vector, load_vector(input, v));
            },
            [&](u64 e) {
                store_element(destination, e - slice.begin_vector * 8, load_element(input, e));
            });
    }
    // Data: every peer's piece of this rank's slice (this block's part) is in its slot.
    if (!block_barrier<N>(params, flags, kSetData)) {
        return;
    }
    const Range own = slice_of<N>(rank, params.elements);
    // Rank q's contribution to the own slice, indexed by position inside the slice.
    const unsigned char* sources[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = static_cast<unsigned int>(q) == rank ? input + own.begin_vector * 16
                                                          : own_scratch + q * slot;
    }
    unsigned char* output = static_cast<unsigned char*>(params.output);
    for_each_owned(
        own, workers,
        [&](u64 v) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_vector(sources[q], v - own.begin_vector);
            }
            const Vec16 sum = sum_vectors<N>(x);
            store_vector(output, v, sum);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                store_vector(params.buffers[(rank + k) % N] + gathered_offset, v, sum);
            }
        },
        [&](u64 e) {
            unsigned short x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_element(sources[q], e - own.begin_vector * 8);
            }
            const unsigned short sum = sum_elements<N>(x);
            store_element(output, e, sum);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                store_element(params.buffers[(rank + k) % N] + gathered_offset, e, sum);
            }
        });
    // Gather: every owner's reduced slice (this block's part) is in this rank's gather region.
    // No peer reads this rank's memory, and peers write its scratch again only after the next
    // launch's start barrier, so no end barrier is needed.
    if (!block_barrier<N>(params, flags, kSetGather)) {
        return;
    }
    const unsigned char* gathered = params.buffers[rank] + gathered_offset;
#pragma unroll
    for (int k = 1; k < N; ++k) {
        for_each_owned(
            slice_of<N>((rank + k) % N, params.elements), workers,
            [&](u64 v) { store_vector(output, v, load_vector(gathered, v)); },
            [&](u64 e) { store_element(output, e, load_element(gathered, e)); });
    }
    block_end(params, flags);
}

}  // namespace prepare

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_rsag_pull_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::rsag_pull, params, flags)
}

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_rsag_push_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::rsag_push, params, flags)
}
