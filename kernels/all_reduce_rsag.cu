// all_reduce_rsag.cu: reduce-scatter then all-gather all-reduce.
//
// Rank s owns slice s of the message (prepare_layout.cuh: whole 16-byte vectors, the last slice
// also the tail). The owner alone sums its slice, in rank order; every other rank copies the
// owner's bytes, so all ranks write the same bytes.
//
// Entries (each takes AllReduceParams by value; `<dtype>` is the package's):
//   all_reduce_rsag_pull_<dtype>  the owner reads its slice from every rank's input, sums it
//       into its output and into its scratch, from the scratch's start; then every rank reads
//       the other slices from their owners' scratch. Scratch: one slot of
//       (ceil(vectors / world) + 1) * 16 bytes. Barriers: start (0), gather (2).
//   all_reduce_rsag_push_<dtype>  every rank writes each peer's slice of its input into its
//       peer slot of that peer's scratch; the owner sums the slots with its own input and
//       writes the result into every peer's gather region; every rank copies the gathered
//       slices to its output. Scratch: world - 1 peer slots of (ceil(vectors / world) + 1) * 16
//       bytes, then round_up(elements * sizeof(T), 16) bytes of gathered slices. Barriers:
//       start (0), data (1), gather (2).
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads, all resident at once; no cluster instructions, so a launch with
// cluster dimensions is fine; the pointers and scratch_offset 16-byte aligned; the output
// outside every scratch region. Pull reads every rank's message from its registered buffer; an
// output that is this rank's input region is safe, since each element is written only after
// every peer's same-numbered block read it (the gather barrier). Push reads its own message
// from `input`, and every output element is written by the thread that read it, after reading
// it, so the output may be the input.
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// Copies every slice but this rank's from `gathered` (indexed like the message) to the output.
template <typename T, int N>
__device__ __forceinline__ void copy_other_slices(const AllReduceParams& params,
                                                  const unsigned char* gathered,
                                                  const Workers& workers) {
#pragma unroll
    for (int k = 1; k < N; ++k) {
        copy_owned<T>(gathered, 0, static_cast<unsigned char*>(params.output), 0,
                      slice_of<T, N>((params.rank + k) % N, params.elements), workers);
    }
}

// Both begin with the start barrier: every peer's input is ready and its scratch may be
// overwritten.
struct RsagPull : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const AllReduceParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const Workers workers = grid_workers();
        const unsigned char* inputs[N];
#pragma unroll
        for (int q = 0; q < N; ++q) {
            inputs[q] = params.buffers[q];
        }
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // The reduced slice goes to the scratch from its start.
        const Range own = slice_of<T, N>(rank, params.elements);
        unsigned char* reduced = params.buffers[rank] + params.scratch_offset;
        sum_owned_into<T, N>(
            inputs, 0, own, workers,
            [&](u64 v, const Vec16& sum) {
                store_vector(output, v, sum);
                store_vector(reduced, v - own.begin_vector, sum);
            },
            [&](u64 e, typename T::Bits sum) {
                store_element<T>(output, e, sum);
                store_element<T>(reduced, e - own.begin_vector * T::kPerVector, sum);
            });
        // Gather: every owner's reduced slice (this block's part) is in its scratch, and every
        // peer has finished reading this rank's input. Peers read this rank's scratch until
        // they finish this launch, and it is written again only after the next launch's start
        // barrier, so no end barrier is needed.
        if (!block_barrier<N>(params, flags, kSetGather)) {
            return;
        }
#pragma unroll
        for (int k = 1; k < N; ++k) {
            const unsigned int owner = (rank + k) % N;
            const Range slice = slice_of<T, N>(owner, params.elements);
            copy_owned<T>(params.buffers[owner] + params.scratch_offset, slice.begin_vector,
                          output, 0, slice, workers);
        }
        block_end(params, flags);
    }
};

struct RsagPush : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const AllReduceParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const Workers workers = grid_workers();
        const u64 slot = slot_bytes<T, N>(params.elements);
        const u64 gathered_offset = params.scratch_offset + (N - 1) * slot;
        unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
        // Scatter: the owner's slice of this rank's input goes to this rank's peer slot in the
        // owner's scratch, at its offset inside the slice.
#pragma unroll
        for (int k = 1; k < N; ++k) {
            copy_slice_to_owner<T, N>(params, (rank + k) % N, slot, workers);
        }
        // Data: every peer's piece of this rank's slice (this block's part) is in its slot.
        if (!block_barrier<N>(params, flags, kSetData)) {
            return;
        }
        const Range own = slice_of<T, N>(rank, params.elements);
        const unsigned char* sources[N];
        rank_sources<N>(rank, params.input + own.begin_vector * 16, own_scratch, slot, sources);
        unsigned char* output = static_cast<unsigned char*>(params.output);
        if constexpr (N <= 4) {
            // The sum goes to every peer as it is made.
            sum_owned_into<T, N>(
                sources, own.begin_vector, own, workers,
                [&](u64 v, const Vec16& sum) {
                    store_vector(output, v, sum);
#pragma unroll
                    for (int k = 1; k < N; ++k) {
                        store_vector(params.buffers[(rank + k) % N] + gathered_offset, v, sum);
                    }
                },
                [&](u64 e, typename T::Bits sum) {
                    store_element<T>(output, e, sum);
#pragma unroll
                    for (int k = 1; k < N; ++k) {
                        store_element<T>(params.buffers[(rank + k) % N] + gathered_offset, e,
                                         sum);
                    }
                });
        } else {
            // Beyond four ranks the peers' addresses and every rank's vector do not fit the
            // registers together: the sum goes to the output first, and from there (read back by
            // the thread that wrote it) to the peers.
            sum_owned<T, N>(sources, own.begin_vector, output, own, workers);
            scatter_owned<T, N>(params, output, gathered_offset, 0, own, workers);
        }
        // Gather: every owner's reduced slice (this block's part) is in this rank's gather
        // region. No peer reads this rank's memory, and peers write its scratch again only
        // after the next launch's start barrier, so no end barrier is needed.
        if (!block_barrier<N>(params, flags, kSetGather)) {
            return;
        }
        copy_other_slices<T, N>(params, own_scratch + (N - 1) * slot, workers);
        block_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_pull, block_kernel, prepare::RsagPull)
PREPARE_ENTRY(all_reduce_rsag_push, block_kernel, prepare::RsagPush)
