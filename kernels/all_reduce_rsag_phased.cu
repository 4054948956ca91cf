// all_reduce_rsag_phased.cu: reduce-scatter then all-gather all-reduce of bf16, one peer at a
// time, as a thread-block cluster kernel.
//
// Entry (takes AllReduceParams by value):
//   all_reduce_rsag_phased_bf16  cluster 0 does all the work; every other cluster returns at
//       once and joins no flag protocol. Slices as in all_reduce_rsag.cu (rank s owns slice s
//       and alone sums it, in rank order). In scatter phase k (1..world-1) rank r writes its
//       input's piece of slice (r+k) mod world into slot r of that owner's scratch and nothing
//       to anyone else; it then sums its own slice; in gather phase k it writes its reduced
//       slice into the gather region of rank (r+k) mod world. So a link or PCIe root complex
//       never carries all-to-all writes. Between phases the cluster synchronises and CTA 0
//       alone raises and waits for one flag pair (prepare_cluster.cuh).
//       Scratch: as all_reduce_rsag_push_bf16: world slots of
//       (ceil(elements / 8 / world) + 1) * 16 bytes, then round_up(2 * elements, 16) bytes.
//       Barriers: start (set 0, all peers), one flag per scatter phase (set 1), one per gather
//       phase (set 2).
// Requirements: launched with cluster dimensions (the ladders use 64 blocks of 512 threads in
// clusters of 8), which the launch layer guarantees for this kernel; world 2..8; any element
// count; the pointers and scratch_offset 16-byte aligned; its own message read from `input`,
// every output element written by the thread that read it, after reading it, so the output may
// be the input (in place) but no scratch region.
#include "prepare_abi.cuh"
#include "prepare_bf16.cuh"
#include "prepare_cluster.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

template <int N>
__device__ void rsag_phased(const AllReduceParams& params, ClusterFlags& flags, int& outcome) {
    const unsigned int cta = cluster_cta_rank();
    const unsigned int ctas = cluster_cta_count();
    const unsigned int rank = params.rank;
    cluster_begin(params, flags, cta);
    // Start: every peer has finished its previous launch, which read its scratch, so it may be
    // overwritten.
    if (!cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetStart, all_peers<N>(rank),
                             all_peers<N>(rank))) {
        return;
    }
    const Workers workers = {static_cast<u64>(cta) * blockDim.x + threadIdx.x,
                             static_cast<u64>(ctas) * blockDim.x};
    const u64 slot = slot_bytes<N>(params.elements);
    const u64 gathered_offset = params.scratch_offset + N * slot;
    const unsigned char* input = params.input;
    unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
    unsigned char* output = static_cast<unsigned char*>(params.output);

    for (int k = 1; k < N; ++k) {
        const unsigned int destination_rank = (rank + k) % N;
        const unsigned int source_rank = (rank + N - k) % N;
        const Range slice = slice_of<N>(destination_rank, params.elements);
        unsigned char* destination =
            params.buffers[destination_rank] + params.scratch_offset + rank * slot;
        for_each_owned(
            slice, workers,
            [&](u64 v) {
                store_vector(destination, v - slice.begin_vector, load_vector(input, v));
            },
            [&](u64 e) {
                store_element(destination, e - slice.begin_vector * 8, load_element(input, e));
            });
        // Scatter phase k: the piece is in the destination's slot, and the source's piece of
        // this rank's slice is in this rank's slot.
        if (!cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetData,
                                 1u << destination_rank, 1u << source_rank)) {
            return;
        }
    }

    const Range own = slice_of<N>(rank, params.elements);
    const unsigned char* sources[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = static_cast<unsigned int>(q) == rank ? input + own.begin_vector * 16
                                                          : own_scratch + q * slot;
    }
    sum_owned<N>(sources, own.begin_vector, output, own, workers);

    const unsigned char* gathered = own_scratch + N * slot;
    for (int k = 1; k < N; ++k) {
        const unsigned int destination_rank = (rank + k) % N;
        const unsigned int source_rank = (rank + N - k) % N;
        unsigned char* destination = params.buffers[destination_rank] + gathered_offset;
        // The same thread wrote these output elements above.
        for_each_owned(
            own, workers, [&](u64 v) { store_vector(destination, v, load_vector(output, v)); },
            [&](u64 e) { store_element(destination, e, load_element(output, e)); });
        // Gather phase k: this rank's slice is at the destination, the source's slice here.
        if (!cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetGather,
                                 1u << destination_rank, 1u << source_rank)) {
            return;
        }
        for_each_owned(
            slice_of<N>(source_rank, params.elements), workers,
            [&](u64 v) { store_vector(output, v, load_vector(gathered, v)); },
            [&](u64 e) { store_element(output, e, load_element(gathered, e)); });
    }
    // No end barrier: no peer reads this rank's memory, and peers write its scratch again only
    // after the next launch's start exchange.
    cluster_end(params, flags, cta);
}

}  // namespace prepare

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_rsag_phased_bf16(AllReduceParams params) {
    // One active cluster: the others leave before any cluster barrier or flag.
    if (prepare::cluster_index() != 0) {
        return;
    }
    if (!prepare::cluster_launch_is_valid(params)) {
        if (prepare::cluster_cta_rank() == 0 && threadIdx.x == 0 && params.state != nullptr) {
            prepare::record_abort(params.state, PREPARE_ABORT_INVALID_LAUNCH, params.rank);
        }
        return;
    }
    __shared__ prepare::ClusterFlags flags;
    __shared__ int outcome;
    PREPARE_DISPATCH_WORLD(prepare::rsag_phased, params, flags, outcome)
}
