// all_reduce_rsag.cu: reduce-scatter then all-gather all-reduce.
//
// Rank s owns slice s of the message (prepare_layout.cuh: whole 16-byte vectors, the last slice
// also the tail). The owner alone sums its slice, in rank order; every other rank copies the
// owner's bytes, so all ranks write the same bytes.
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's):
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
#include "prepare_phases.cuh"

namespace prepare {

// Both begin with the start barrier: every peer's input is ready and its scratch may be
// overwritten.
struct RsagPull : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const Workers workers = grid_workers();
        const auto slices = message_slices<T, N>(params);
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // The reduced slice goes to the scratch from its start.
        const Range own = slices(rank);
        unsigned char* reduced = params.buffers[rank] + params.scratch_offset;
        reduce_scatter_pull<T, N>(
            params, own, workers,
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
        all_gather_pull<T, N>(params, params.scratch_offset, output, slices, workers);
        block_end(params, flags);
    }
};

struct RsagPush : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const Workers workers = grid_workers();
        const auto slices = message_slices<T, N>(params);
        const u64 slot = slot_bytes<T, N>(params.input_elements);
        const u64 gathered_offset = params.scratch_offset + (N - 1) * slot;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // Data: every peer's piece of this rank's slice (this block's part) is in its slot.
        const auto data = [&] { return block_barrier<N>(params, flags, kSetData); };
        // Gather: every owner's reduced slice (this block's part) is in this rank's gather
        // region. No peer reads this rank's memory, and peers write its scratch again only
        // after the next launch's start barrier, so no end barrier is needed.
        const auto gather = [&] { return block_barrier<N>(params, flags, kSetGather); };
        if constexpr (N <= 4) {
            // The sum goes to every peer as it is made.
            if (!reduce_scatter_push<T, N>(
                    params, slot, slices, workers, data,
                    [&](u64 v, const Vec16& sum) {
                        store_vector(output, v, sum);
#pragma unroll
                        for (int k = 1; k < N; ++k) {
                            store_vector(params.buffers[(rank + k) % N] + gathered_offset, v,
                                         sum);
                        }
                    },
                    [&](u64 e, typename T::Bits sum) {
                        store_element<T>(output, e, sum);
#pragma unroll
                        for (int k = 1; k < N; ++k) {
                            store_element<T>(params.buffers[(rank + k) % N] + gathered_offset,
                                             e, sum);
                        }
                    })) {
                return;
            }
        } else {
            // Beyond four ranks the peers' addresses and every rank's vector do not fit the
            // registers together: the sum goes to the output first, and from there (read back by
            // the thread that wrote it) to the peers.
            if (!reduce_scatter_push<T, N>(
                    params, slot, slices, workers, data,
                    [&](u64 v, const Vec16& sum) { store_vector(output, v, sum); },
                    [&](u64 e, typename T::Bits sum) { store_element<T>(output, e, sum); })) {
                return;
            }
        }
        if (!all_gather_push<T, N, (N > 4)>(params, output, gathered_offset, output, slices,
                                            workers, gather)) {
            return;
        }
        block_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_pull, block_kernel, prepare::RsagPull)
PREPARE_ENTRY(all_reduce_rsag_push, block_kernel, prepare::RsagPush)
