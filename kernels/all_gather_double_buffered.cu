// all_gather_double_buffered.cu: one-shot push all-gather of rows with no barrier; every rank
// gets every rank's rows.
//
// A message is rows x width elements; rank r owns a contiguous run of whole rows in rank order,
// the first rows % world ranks one row more (prepare_layout.cuh: owned_rows, first_row). Every
// rank's input is its own rows; every rank's output is the whole message, each rank's rows at
// their place, the inputs' bytes as they are. There is no start or end barrier: each rank
// writes into its peers' scratch and waits only for what they write into its own
// (prepare_double_buffer.cuh says why that is safe).
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's, P its elements per
// 16-byte vector: 8 for bf16 and fp16, 4 for fp32):
//   all_gather_one_shot_push_ll_<dtype>  flags in the data (the ll lines of
//       prepare_double_buffer.cuh): this rank's rows go as the run's lines into its peer slot at
//       every peer (a whole vector two lines, the tail P / 2 elements to a line, a rank owning
//       no rows one empty line), and from `input` to its output; then it waits for every peer's
//       lines and copies them out to their place in its output. Each block takes an equal share
//       of a run's vectors and one of its tail lines, the same on every rank. A run of n
//       elements takes at most 2 * (n / P) + 2 lines, so a region for messages up to E elements
//       is sized as the all-reduce's ll one: 2 * (world - 1) * round_up(16 * (2 * (E / P) + P -
//       1), 8 KiB) bytes.
// Fields read: input (this rank's rows), output (rows x width), input_elements (owned rows x
// width), output_elements (rows x width), rows, width, and what every kernel reads. Refused as
// an invalid launch: what all_gather.cu's kernels refuse (prepare_sync.cuh's row checks).
// Requirements: the world size it was compiled for; 1..1024 blocks of a multiple of 32 threads,
// all resident at once; no cluster instructions; the scratch zeroed before the first launch and
// used by no other kernel; every rank launching every message, a rank owning no rows included.
// The input may be this rank's rows inside the output (in place): nothing else of the output is
// written from it, and copying them onto themselves is skipped.
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases.cuh"

namespace prepare {

struct AllGatherPushLl : LaunchCounter {
    static constexpr RowCollective kRows = kAllGather;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        // Taken before the waits, whose volatile loads make every later read of the parameters
        // a reload.
        const unsigned int rank = params.rank;
        const unsigned char* input = params.input;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        const u64 parity = flags.epoch & 1;
        const unsigned int flag = line_flag(flags.epoch);
        const u64 first = slices.first(rank);
        const Range own = slices(rank);
        // This rank's rows, read once from `input` (which holds them from their first element),
        // go to every peer, peers in the order rank + 1, rank + 2, ...
        send_run_lines<T, N>(
            own, parity, flag, [&](u64 v) { return load_vector(input, v - first / T::kPerVector); },
            [&](u64 e) { return load_element<T>(input, e - first); },
            [&](auto send) {
#pragma unroll
                for (int k = 1; k < N; ++k) {
                    send(peer_at_distance<N>(params, k, params.scratch_offset));
                }
            });
        if (input != output + first * sizeof(typename T::Bits)) {
            copy_run<T>(input, first, output, 0, own, grid_workers());
        }
        check_line_shapes<N>(params, flags);
        bool received = true;
#pragma unroll 1
        for (int k = 1; k < N; ++k) {
            const unsigned int owner = (rank + k) % N;
            const Range run = slices(owner);
            for_each_run_line<T>(
                run,
                [&](u64 v, u64 line) {
                    Vec16 x;
                    received = received && receive_lines<N, 2>(params, flags, line, parity, owner,
                                                               flag, x.word);
                    if (received) {
                        store_vector(output, v, x);
                    }
                },
                [&](u64 from, u64 line) {
                    Vec16 x = {};
                    received = received && receive_lines<N, 1>(params, flags, line, parity, owner,
                                                               flag, x.word);
#pragma unroll
                    for (unsigned int i = 0; i < line_elements<T>(); ++i) {
                        if (received && from + i < run.tail_end) {
                            store_element<T>(output, from + i, line_element<T>(x, i));
                        }
                    }
                });
        }
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_gather_one_shot_push_ll, row_kernel, prepare::AllGatherPushLl)
