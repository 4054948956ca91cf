// all_reduce_rsag_double_buffered.cu: reduce-scatter then all-gather with no barrier.
//
// Rank s owns slice s of the message (prepare_layout.cuh: whole 16-byte vectors, the last slice
// also the tail). The owner alone sums its slice, in rank order, with one rounding; every other
// rank copies the owner's bytes, so all ranks write the same bytes. Like the simple one-shot
// (all_reduce_one_shot_double_buffered.cu), it has no start, middle or end barrier: data goes
// into the peers' scratch, then a flag per step, and each block waits only for its
// same-numbered block's flags.
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
//   all_reduce_rsag_push_simple_<dtype>  block b takes the same share of every slice: an equal
//       share of the longest slice's vectors, at the same place inside each slice, moved in
//       steps of 4 vectors per thread (the last block also the tail, in its last step). Step s
//       of block b goes through three stages, each one step behind the one before, so a
//       block's sums and copies overlap its transfers:
//         scatter  for every peer o, the step's vectors of slice o of this rank's input go into
//                  this rank's scatter slot at o; then o's step flag for (this rank, b) is
//                  raised to (launch << 24) | s + 1 in the step set (kSetStep).
//         reduce   once every peer's flag for step s arrived, this rank's own input and the
//                  peers' parts of its own slice are summed in rank order into the output and
//                  into this rank's gather slot at every peer; then every peer's flag for (this
//                  rank, b) is raised to the same value in the gather-step set (kSetGatherStep).
//         gather   once every peer's gather flag for step s arrived, each peer's reduced part of
//                  its slice is copied from its gather slot to the output.
//       Scratch: double-buffered (prepare_double_buffer.cuh) with two phases, a scatter slot
//       and a gather slot per peer, each a slice with its tail, ceil(ceil(elements / P) / world)
//       * 16 bytes (the tail counted as a vector; the last slice, which it follows, holds at
//       most that share less one whole vectors): 2 * 2 * (world - 1) * round_up(that,
//       8 KiB). That is
//       about 4 * (world - 1) / world message sizes against the simple one-shot's
//       2 * (world - 1): the same at two ranks, less beyond.
// Why no barrier is needed is prepare_double_buffer.cuh's argument for the simple one-shot:
// launch c writes only the half of parity c % 2 of the region; only the region's owner reads
// it; this rank's launch c - 1 heard from every peer's launch c - 1 (every block waits for
// every peer's scatter and gather flags, even for an empty message), which began after the
// peer's launch c - 2, the last reader of that half, ended. The flags grow with the launch
// count in their high bits, so a flag of an earlier launch never passes a wait; the gather
// flags have a set of their own, since they and the scatter flags from one peer to this rank
// advance independently.
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads, all resident at once; no cluster instructions, so a launch with
// cluster dimensions is fine; the pointers and scratch_offset 16-byte aligned; the scratch
// zeroed before the first launch and used by no other kernel. It reads its own message from
// `input`, and every output element is written by the thread that read it (the scatter or the
// reduce of the same step, same block, same thread), after reading it, so the output may be
// the input (in place) but no scratch region.
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases_simple.cuh"

namespace prepare {

// The RSAG's two phases, each with a peer slot per peer in every chunk row of the region
// (prepare_double_buffer.cuh): the scatter's slots, then the gather's.
constexpr int kRsagPhases = 2;

struct RsagPushSimple : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = message_slices<T, N>(params);
        // Block b's share of every slice: the same vectors, counted from each slice's start.
        const SimpleShare share =
            simple_share_of<T>(slice_vectors<T, N>(params.input_elements), params.input_elements);
        const u64 parity = flags.epoch & 1;
        // Steps fit the low 24 bits, as in the simple one-shot: a slice has fewer vectors than
        // the message.
        const u64 flag_base = flags.epoch << 24;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // The reduce's sums go to the output and to this rank's gather slot at every peer.
        const auto send_vector = [&](u64 v, u64 byte, const Vec16& sum) {
            store_vector(output, v, sum);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
                store_vector(peer_phase_byte<N, kRsagPhases>(
                                 peer, all_gather_slots<kRsagPhases>(), byte, parity),
                             0, sum);
            }
        };
        const auto send_element = [&](u64 e, u64 byte, typename T::Bits sum) {
            store_element<T>(output, e, sum);
#pragma unroll 1
            for (int k = 1; k < N; ++k) {
                const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
                store_element<T>(peer_phase_byte<N, kRsagPhases>(
                                     peer, all_gather_slots<kRsagPhases>(), byte, parity),
                                 0, sum);
            }
        };
        // In pass p: the scatter of step p, the reduce of step p - 1, the gather of step p - 2.
#pragma unroll 1
        for (u64 pass = 0; pass < share.steps + 2; ++pass) {
            if (pass < share.steps) {
                reduce_scatter_simple_send<T, N, kRsagPhases>(params, slices, share, parity, pass,
                                                              flag_base | (pass + 1));
            }
            if (pass == 0) {
                check_line_shapes<N>(params, flags);
            }
            if (pass >= 1 && pass <= share.steps) {
                if (!wait_step_flags<N>(params, flags, kSetStep, flag_base | pass)) {
                    break;
                }
                reduce_scatter_simple_sum<T, N, kRsagPhases>(params, slices, share, parity,
                                                             pass - 1, send_vector, send_element);
                raise_step_flags<N>(params, kSetGatherStep, flag_base | pass);
            }
            if (pass >= 2) {
                if (!wait_step_flags<N>(params, flags, kSetGatherStep, flag_base | (pass - 1))) {
                    break;
                }
                all_gather_simple_receive<T, N, kRsagPhases>(params, slices, share, parity,
                                                             pass - 2, output);
            }
        }
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_rsag_push_simple, block_kernel, prepare::RsagPushSimple)
