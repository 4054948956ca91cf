// reduce_scatter_double_buffered.cu: one-shot push reduce-scatter of rows with no barrier; every
// rank sums its own rows.
//
// A message is rows x width elements; rank r owns a contiguous run of whole rows in rank order,
// the first rows % world ranks one row more (prepare_layout.cuh: owned_rows, first_row), and
// writes the rank-order sum of every rank's copy of them (prepare_element.cuh, one rounding) to
// its output from the output's start. There is no start or end barrier: each rank writes into
// its peers' scratch and waits only for what they write into its own (prepare_double_buffer.cuh
// says why that is safe).
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's, P its elements per
// 16-byte vector: 8 for bf16 and fp16, 4 for fp32):
//   reduce_scatter_one_shot_push_ll_<dtype>  flags in the data (the ll lines of
//       prepare_double_buffer.cuh): each owner's rows of this rank's input go as the run's lines
//       into this rank's peer slot at the owner (a whole vector two lines, the tail P / 2
//       elements to a line, a run with nothing in it one empty line); then this rank waits for
//       every peer's lines of its own rows and sums them in rank order, its own part read from
//       `input` where it is. Each block takes an equal share of a run's vectors and one of its
//       tail lines, the same on every rank. A run of n elements takes at most 2 * (n / P) + 2
//       lines, so a region for messages up to E elements is sized as the all-reduce's ll one:
//       2 * (world - 1) * round_up(16 * (2 * (E / P) + P - 1), 8 KiB) bytes.
// Fields read: input (rows x width), output (this rank's rows), input_elements (rows x width),
// output_elements (owned rows x width), rows, width, and what every kernel reads. Refused as an
// invalid launch: what reduce_scatter.cu's kernels refuse (prepare_sync.cuh's row checks).
// Requirements: the world size it was compiled for; 1..1024 blocks of a multiple of 32 threads,
// all resident at once; no cluster instructions; the scratch zeroed before the first launch and
// used by no other kernel; every rank launching every message, a rank owning no rows included.
// Every element of the output is written by the thread that read this rank's copy of it, after
// reading it, and no peer reads this rank's input, so the output may be this rank's rows of its
// input (in place).
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases.cuh"

namespace prepare {

struct ReduceScatterPushLl : LaunchCounter {
    static constexpr RowCollective kRows = kReduceScatter;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        // Taken before the waits, whose volatile loads make every later read of the parameters
        // a reload.
        const unsigned int rank = params.rank;
        const unsigned char* input = params.input;
        const u64 parity = flags.epoch & 1;
        const unsigned int flag = line_flag(flags.epoch);
        // The owner at distance k gets its rows of this rank's input in this rank's slot there.
#pragma unroll
        for (int k = 1; k < N; ++k) {
            const PeerSlot owner = peer_at_distance<N>(params, k, params.scratch_offset);
            send_run_lines<T, N>(
                slices((rank + k) % N), parity, flag, [&](u64 v) { return load_vector(input, v); },
                [&](u64 e) { return load_element<T>(input, e); },
                [&](auto send) { send(owner); });
        }
        check_line_shapes<N>(params, flags);
        const Range own = slices(rank);
        const RowOutput<T> output(params.output, slices.first(rank));
        bool received = true;
        for_each_run_line<T>(
            own,
            [&](u64 v, u64 line) {
                const Vec16 sum = receive_vector_sum<T, N>(params, flags, rank, input, v, line,
                                                           parity, flag, received)
                                      .result();
                if (received) {
                    output(v, sum);
                }
            },
            [&](u64 first, u64 line) {
                // A tail line's elements sum as the low lanes of a vector, each rank's line as it
                // arrives.
                const Vec16 sum = sum_vectors_from<T, N>([&](int q) {
                    Vec16 x = {};
                    if (static_cast<unsigned int>(q) == rank) {
                        x = pack_line<T>(first, own.tail_end,
                                         [&](u64 e) { return load_element<T>(input, e); });
                    } else {
                        received = received && receive_lines<N, 1>(params, flags, line, parity,
                                                                   q, flag, x.word);
                    }
                    return x;
                });
#pragma unroll
                for (unsigned int i = 0; i < line_elements<T>(); ++i) {
                    if (received && first + i < own.tail_end) {
                        output(first + i, line_element<T>(sum, i));
                    }
                }
            });
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(reduce_scatter_one_shot_push_ll, row_kernel, prepare::ReduceScatterPushLl)
