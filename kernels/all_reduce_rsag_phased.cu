// all_reduce_rsag_phased.cu: reduce-scatter then all-gather all-reduce, one peer at a time, as
// a thread-block cluster kernel.
//
// Entry (takes AllReduceParams by value; `<dtype>` is the package's):
//   all_reduce_rsag_phased_<dtype>  cluster 0 does all the work; every other cluster returns
//       at once and joins no flag protocol. Slices as in all_reduce_rsag.cu (rank s owns slice
//       s and alone sums it, in rank order). In scatter phase k (1..world-1) rank r writes its
//       input's piece of slice (r+k) mod world into its peer slot of that owner's scratch and
//       nothing to anyone else; it then sums its own slice; in gather phase k it writes its reduced
//       slice into the gather region of rank (r+k) mod world. So a link or PCIe root complex
//       never carries all-to-all writes. Between phases the cluster synchronises and CTA 0
//       alone raises and waits for one flag pair (prepare_cluster.cuh).
//       Scratch: as all_reduce_rsag_push_<dtype>: world - 1 peer slots of
//       (ceil(vectors / world) + 1) * 16 bytes, then round_up(elements * sizeof(T), 16) bytes.
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
    __device__ static void run(const AllReduceParams& params, ClusterFlags& flags, int& outcome,
                               const ClusterPlace& place) {
        const unsigned int rank = params.rank;
        const u64 slot = slot_bytes<T, N>(params.elements);
        const u64 gathered_offset = params.scratch_offset + (N - 1) * slot;
        unsigned char* own_scratch = params.buffers[rank] + params.scratch_offset;
        unsigned char* output = static_cast<unsigned char*>(params.output);

        for (int k = 1; k < N; ++k) {
            copy_slice_to_owner<T, N>(params, (rank + k) % N, slot, place.workers);
            // Scatter phase k: the piece is in rank + k's slot, and rank - k's piece of this
            // rank's slice is in this rank's slot.
            if (!ring_exchange<N>(params, flags, outcome, place, kSetData, k)) {
                return;
            }
        }

        const Range own = slice_of<T, N>(rank, params.elements);
        const unsigned char* sources[N];
        rank_sources<N>(rank, params.input + own.begin_vector * 16, own_scratch, slot, sources);
        sum_owned<T, N>(sources, own.begin_vector, output, own, place.workers);

        const unsigned char* gathered = own_scratch + (N - 1) * slot;
        for (int k = 1; k < N; ++k) {
            // The same thread wrote these output elements above.
            copy_owned<T>(output, 0, params.buffers[(rank + k) % N] + gathered_offset, 0, own,
                          place.workers);
            // Gather phase k: this rank's slice is at rank + k, rank - k's slice here.
            if (!ring_exchange<N>(params, flags, outcome, place, kSetGather, k)) {
                return;
            }
            copy_owned<T>(gathered, 0, output, 0,
                          slice_of<T, N>((rank + N - k) % N, params.elements), place.workers);
        }
        // No end barrier: no peer reads this rank's memory, and peers write its scratch again
        // only after the next launch's start exchange.
        cluster_end(params, flags, place.cta);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_phased, cluster_kernel, prepare::RsagPhased)
