// all_reduce_rsag_phased.cu: reduce-scatter then all-gather all-reduce, one peer at a time, as
// a thread-block cluster kernel.
//
// Entry (takes AllReduceParams by value; `<dtype>` is the package's):
//   all_reduce_rsag_phased_<dtype>  cluster 0 does all the work; every other cluster returns
//       at once and joins no flag protocol. Slices as in all_reduce_rsag.cu (rank s owns slice
//       s and alone sums it, in rank order). In scatter phase k (1..world-1) rank r writes its
//       input's piece of slice (r+k) mod world into slot r of that owner's scratch and nothing
//       to anyone else; it then sums its own slice; in gather phase k it writes its reduced
//       slice into the gather region of rank (r+k) mod world. So a link or PCIe root complex
//       never carries all-to-all writes. Between phases the cluster synchronises and CTA 0
//       alone raises and waits for one flag pair (prepare_cluster.cuh).
//       Scratch: as all_reduce_rsag_push_<dtype>: world slots of (ceil(vectors / world) + 1) *
//       16 bytes, then round_up(elements * sizeof(T), 16) bytes.
//       Barriers: start (set 0, all peers), one flag per scatter phase (set 1), one per gather
//       phase (set 2).
// Requirements: launched with cluster dimensions (the ladders use 64 blocks of 512 threads in
// clusters of 8), which the launch layer guarantees for this kernel; the world size it was
// compiled for; any element count; the pointers and scratch_offset 16-byte aligned; its own
// message read from `input`, every output element written by the thread that read it, after
// reading it, so the output may be the input (in place) but no scratch region.
#include "prepare_cluster.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

struct RsagPhased {
    template <typename T, int N>
    __device__ static void run(const AllReduceParams& params, ClusterFlags& flags, int& outcome) {
        const unsigned int cta = cluster_cta_rank();
        const unsigned int ctas = cluster_cta_count();
        const unsigned int rank = params.rank;
        // Start: every peer has finished its previous launch, which read its scratch, so it
        // may be overwritten.
        if (!cluster_begin_with_start<N>(params, flags, outcome, cta, ctas)) {
            return;
        }
        const Workers workers = cluster_workers(cta, ctas);
        const u64 slot = slot_bytes<T, N>(params.elements);
        const u64 gathered_offset = params.scratch_offset + N * slot;
        unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
        unsigned char* output = static_cast<unsigned char*>(params.output);

        for (int k = 1; k < N; ++k) {
            const unsigned int destination_rank = (rank + k) % N;
            const unsigned int source_rank = (rank + N - k) % N;
            const Range slice = slice_of<T, N>(destination_rank, params.elements);
            copy_owned<T>(params.input,
                          params.buffers[destination_rank] + params.scratch_offset + rank * slot,
                          slice.begin_vector, slice, workers);
            // Scatter phase k: the piece is in the destination's slot, and the source's piece
            // of this rank's slice is in this rank's slot.
            if (!cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetData,
                                     1u << destination_rank, 1u << source_rank)) {
                return;
            }
        }

        const Range own = slice_of<T, N>(rank, params.elements);
        const unsigned char* sources[N];
        rank_sources<N>(rank, params.input + own.begin_vector * 16, own_scratch, slot, sources);
        sum_owned<T, N>(sources, own.begin_vector, output, own, workers);

        const unsigned char* gathered = own_scratch + N * slot;
        for (int k = 1; k < N; ++k) {
            const unsigned int destination_rank = (rank + k) % N;
            const unsigned int source_rank = (rank + N - k) % N;
            // The same thread wrote these output elements above.
            copy_owned<T>(output, params.buffers[destination_rank] + gathered_offset, 0, own,
                          workers);
            // Gather phase k: this rank's slice is at the destination, the source's slice here.
            if (!cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetGather,
                                     1u << destination_rank, 1u << source_rank)) {
                return;
            }
            copy_owned<T>(gathered, output, 0, slice_of<T, N>(source_rank, params.elements),
                          workers);
        }
        // No end barrier: no peer reads this rank's memory, and peers write its scratch again
        // only after the next launch's start exchange.
        cluster_end(params, flags, cta);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_phased, cluster_kernel, prepare::RsagPhased)
