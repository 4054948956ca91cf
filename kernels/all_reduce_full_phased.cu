// all_reduce_full_phased.cu: full all-reduce by whole-message exchange, one peer at a time, as
// a thread-block cluster kernel.
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
//   all_reduce_full_phased_<dtype>  cluster 0 does all the work; every other cluster returns
//       at once and joins no flag protocol. In phase k (1..world-1) rank r writes its whole
//       input into its peer slot of rank (r+k) mod world's scratch and nothing to anyone else, so a
//       link or PCIe root complex never carries all-to-all writes; then every rank sums its
//       input and the slots in rank order, so all write the same bytes. Between phases the
//       cluster synchronises and CTA 0 alone raises and waits for one flag pair
//       (prepare_cluster.cuh).
//       Scratch: world - 1 peer slots of round_up(elements * sizeof(T), 16) bytes.
//       Barriers: start (set 0, all peers), one flag per phase (set 1).
// Requirements: launched with cluster dimensions (the ladders use 64 blocks of 512 threads in
// clusters of 8), which the launch layer guarantees for this kernel; the world size it was
// compiled for; any element count; the pointers and scratch_offset 16-byte aligned; its own
// message read from `input`, every output element written by the thread that read it, after
// reading it, so the output may be the input (in place) but no scratch region.
#include "prepare_cluster.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

struct FullPhased {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, ClusterFlags& flags, int& outcome,
                               const ClusterPlace& place) {
        const Range message = whole_message<T>(params.input_elements);
        const u64 slot = message_bytes<T>(params.input_elements);

        for (int k = 1; k < N; ++k) {
            copy_owned<T>(params.input, 0,
                          params.buffers[(params.rank + k) % N] + params.scratch_offset +
                              slot_at_distance<N>(k) * slot,
                          0, message, place.workers);
            // Phase k: this rank's input is at rank + k, rank - k's in this rank's slot.
            if (!ring_exchange<N>(params, flags, outcome, place, kSetData, k)) {
                return;
            }
        }

        const unsigned char* sources[N];
        rank_sources<N>(params.rank, params.input,
                        params.buffers[params.rank] + params.scratch_offset, slot, sources);
        sum_owned<T, N>(sources, 0, static_cast<unsigned char*>(params.output), message,
                        place.workers);
        // No end barrier: no peer reads this rank's memory, and peers write its slots again
        // only after the next launch's start exchange.
        cluster_end(params, flags, place.cta);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_full_phased, cluster_kernel, prepare::FullPhased)
