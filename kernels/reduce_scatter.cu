// reduce_scatter.cu: one-shot reduce-scatter of rows; every rank sums its own rows.
//
// A message is rows x width elements; rank r owns a contiguous run of whole rows in rank order,
// the first rows % world ranks one row more (prepare_layout.cuh: owned_rows, first_row), and
// writes the rank-order sum of every rank's copy of them (prepare_element.cuh, one rounding) to
// its output from the output's start. A run moves as 16-byte vectors where it starts on a
// vector boundary of the message, as elements otherwise (run_of).
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's):
//   reduce_scatter_one_shot_pull_<dtype>  reads its rows from every rank's input region (the
//       message from byte 0) and sums them into its output. Scratch: none. Barriers: start (0),
//       end (3).
//   reduce_scatter_one_shot_push_<dtype>  writes each peer's rows of its input into its peer
//       slot of that peer's scratch, then sums its own rows: its own input where it is, the
//       peers' from its slots. Scratch: world - 1 peer slots of round_up(input_elements *
//       sizeof(T), 16) bytes, a peer's rows in a slot from their offset inside their first
//       16-byte vector of the message (byte 0 where they start a vector). Barriers: start (0),
//       data (1).
// Fields read: input (rows x width; pull reads buffers[rank] instead), output (this rank's
// rows), input_elements (rows x width), output_elements (owned rows x width), rows, width, and
// what every kernel reads. Refused as an invalid launch: a width of 0, counts that do not match
// rows, width, rank and world, an input not 16-byte aligned, an output not 16-byte aligned where
// this rank's rows start a vector of the message (else not aligned to its elements), and what
// every kernel refuses (prepare_sync.cuh).
// Requirements: the world size it was compiled for; 1..1024 blocks of a multiple of 32
// threads, all resident at once; no cluster instructions. Every element of the output is
// written by the thread that read it from every rank, after reading it, and no peer reads this
// rank's rows of its input, so the output may be this rank's rows of its input (in place): for
// pull that is its rows in its input region, for push in `input`.
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases.cuh"

namespace prepare {

// Both begin with the start barrier: every peer's input is ready and its slots may be
// overwritten.
struct ReduceScatterPull : StartBarrier {
    static constexpr RowCollective kRows = kReduceScatter;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        const RowOutput<T> output(params.output, slices.first(params.rank));
        reduce_scatter_pull<T, N>(params, slices(params.rank), grid_workers(), output, output);
        // End: peers read this rank's input region until they raise this flag; once this
        // launch ends the stream may overwrite it.
        if (!block_barrier<N>(params, flags, kSetEnd)) {
            return;
        }
        block_end(params, flags);
    }
};

struct ReduceScatterPush : StartBarrier {
    static constexpr RowCollective kRows = kReduceScatter;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        const RowOutput<T> output(params.output, slices.first(params.rank));
        // reduce_scatter_push, but summing every source indexed like the message: its sum takes
        // the slots from the slice's first vector, one more value live in every load, and at
        // seven ranks in fp32 that spilled.
        const unsigned int rank = params.rank;
        const Workers workers = grid_workers();
        const u64 slot = message_bytes<T>(params.input_elements);
        const unsigned char* scratch = params.buffers[rank] + params.scratch_offset;
#pragma unroll
        for (int k = 1; k < N; ++k) {
            send_slice_to_owner<T, N>(params, rank, k, slot, slices, workers);
        }
        // Data: every peer's copy of this rank's rows (this block's part) is in its slot. No
        // peer reads this rank's input, and peers write its slots again only after the next
        // launch's start barrier, so no end barrier is needed.
        if (!block_barrier<N>(params, flags, kSetData)) {
            return;
        }
        // The slots hold this rank's rows from their first vector: as the address of the
        // message's element 0 (an integer, before the slots), every source is indexed alike.
        const Range own = slices(rank);
        const unsigned char* sources[N];
        rank_sources<N>(rank, params.input,
                        reinterpret_cast<const unsigned char*>(
                            reinterpret_cast<u64>(scratch) - own.begin_vector * 16),
                        slot, sources);
        sum_owned_into<T, N>(sources, 0, own, workers, output, output);
        block_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(reduce_scatter_one_shot_pull, row_kernel, prepare::ReduceScatterPull)
PREPARE_ENTRY(reduce_scatter_one_shot_push, row_kernel, prepare::ReduceScatterPush)
