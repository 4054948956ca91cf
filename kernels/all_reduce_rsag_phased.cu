// all_reduce_rsag_phased.cu: reduce-scatter then all-gather all-reduce, one peer at a time, as
// a thread-block cluster kernel.
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
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
#include "prepare_phases.cuh"

namespace prepare {

struct RsagPhased {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, ClusterFlags& flags, int& outcome,
                               const ClusterPlace& place) {
        const auto slices = message_slices<T, N>(params);
        const u64 slot = slot_bytes<T, N>(params.input_elements);
        const u64 gathered_offset = params.scratch_offset + (N - 1) * slot;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // Scatter phase k: the piece is in rank + k's slot, and rank - k's piece of this rank's
        // slice is in this rank's slot. Gather phase k: this rank's slice is at rank + k,
        // rank - k's slice here.
        if (!reduce_scatter_ring<T, N>(
                params, slot, slices, place.workers,
                [&](int k) { return ring_exchange<N>(params, flags, outcome, place, kSetData, k); },
                [&](u64 v, const Vec16& sum) { store_vector(output, v, sum); },
                [&](u64 e, typename T::Bits sum) { store_element<T>(output, e, sum); }) ||
            // The same thread wrote the output elements it sends.
            !all_gather_ring<T, N>(params, output, gathered_offset, output, slices, place.workers,
                                   [&](int k) {
                                       return ring_exchange<N>(params, flags, outcome, place,
                                                               kSetGather, k);
                                   })) {
            return;
        }
        // No end barrier: no peer reads this rank's memory, and peers write its scratch again
        // only after the next launch's start exchange.
        cluster_end(params, flags, place.cta);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_phased, cluster_kernel, prepare::RsagPhased)
