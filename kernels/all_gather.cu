// all_gather.cu: one-shot all-gather of rows; every rank gets every rank's rows.
//
// A message is rows x width elements; rank r owns a contiguous run of whole rows in rank order,
// the first rows % world ranks one row more (prepare_layout.cuh: owned_rows, first_row). Every
// rank's input is its own rows; every rank's output is the whole message, each rank's rows at
// their place, the inputs' bytes as they are. A run moves as 16-byte vectors where it starts on
// a vector boundary of the message, as elements otherwise (run_of).
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's):
//   all_gather_one_shot_pull_<dtype>  copies every rank's rows from its input region (the rows
//       from byte 0), its own included, to their place in its output. Scratch: none.
//       Barriers: start (0), end (3).
//   all_gather_one_shot_push_<dtype>  writes its rows into every peer's scratch at their place
//       in the message, copies them from `input` to its output, then copies the peers' rows from
//       its scratch. Scratch: round_up(output_elements * sizeof(T), 16) bytes, indexed like the
//       message (each rank's rows written only by their owner). Barriers: start (0), data (1).
//   all_gather_one_shot_copy_engine_<dtype>  copies this rank's rows from `input` to their
//       place in its output (nothing where the input is already there, in place); reads local
//       memory only, waits for nothing and after an abort writes nothing. The peers' rows are
//       not its: the host copies them (below). Scratch: none.
//   all_gather_one_shot_copy_engine_start_<dtype>, all_gather_one_shot_copy_engine_end_<dtype>
//       the copy engine's barriers (prepare_copy_engine.cuh), with the row checks: one block of
//       at least `world` threads.
// The copy engine's launch, as the host (src/collective/copy_engine.rs) enqueues it: the start
// barrier, so every peer's rows are in its input region (written before its launch, in stream
// order); on a second stream forked after it, one copy per peer with rows, from the peer's input
// region (its rows from byte 0) straight to their place in this rank's output; beside those,
// the own-rows copy; the join of the copy stream; the end barrier, so no peer still copies this
// rank's input region when the stream goes on. After an abort the barriers and the own-rows
// copy return at once, but the host-queued copies still run: they read the peers' registered
// buffers, which stay mapped until this rank unmaps them, and write the peers' rows of this
// rank's output, which then holds whatever those input regions held (an aborted launch's output
// is never a result).
// Fields read: input (this rank's rows; pull reads buffers[rank] instead), output (rows x
// width), input_elements (owned rows x width), output_elements (rows x width), rows, width, and
// what every kernel reads. Refused as an invalid launch: a width of 0, counts that do not match
// rows, width, rank and world, an output not 16-byte aligned, an input not 16-byte aligned where
// this rank's rows start a vector of the message (else not aligned to its elements), and what
// every kernel refuses (prepare_sync.cuh).
// Requirements: the world size it was compiled for; 1..1024 blocks of a multiple of 32
// threads, all resident at once; no cluster instructions. The input may be this rank's rows
// inside the output (in place): nothing else of the output is written from it, and push skips
// copying them onto themselves. Pull's output must lie outside the registered buffers (peers
// read this rank's input region until the end barrier), as the copy engine's.
#include "prepare_copy_engine.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases.cuh"

namespace prepare {

// Both begin with the start barrier: every peer's input is ready and its scratch may be
// overwritten.
struct AllGatherPull : StartBarrier {
    static constexpr RowCollective kRows = kAllGather;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        const Workers workers = grid_workers();
        unsigned char* output = static_cast<unsigned char*>(params.output);
        // This rank first, then rank + 1, rank + 2, ..., so ranks start on different peers.
#pragma unroll 1
        for (int k = 0; k < N; ++k) {
            const unsigned int owner = (params.rank + k) % N;
            copy_run<T>(params.buffers[owner], slices.first(owner), output, 0, slices(owner),
                        workers);
        }
        // End: peers read this rank's input region until they raise this flag; once this
        // launch ends the stream may overwrite it.
        if (!block_barrier<N>(params, flags, kSetEnd)) {
            return;
        }
        block_end(params, flags);
    }
};

struct AllGatherPush : StartBarrier {
    static constexpr RowCollective kRows = kAllGather;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const auto slices = row_slices<T, N>(params);
        const Workers workers = grid_workers();
        const unsigned char* input = params.input;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        const u64 first = slices.first(params.rank);
        const Range own = slices(params.rank);
        // This rank's rows, read once from `input` (which holds them from their first element),
        // go to every peer's scratch at their place in the message.
        send_owned<N>(
            params, params.scratch_offset, own, workers,
            [&](u64 v) { return load_vector(input, v - first / T::kPerVector); },
            [&](u64 e) { return load_element<T>(input, e - first); },
            [&](const PeerSlot& peer, u64 v, const Vec16& x) { store_vector(peer.region, v, x); },
            [&](const PeerSlot& peer, u64 e, typename T::Bits value) {
                store_element<T>(peer.region, e, value);
            });
        if (input != output + first * sizeof(typename T::Bits)) {
            copy_run<T>(input, first, output, 0, own, workers);
        }
        // Data: every peer's rows (this block's part) are in this rank's scratch. No peer reads
        // this rank's memory, and peers write its scratch again only after the next launch's
        // start barrier, so no end barrier is needed.
        if (!all_gather_push<T, N, false>(
                params, input, params.scratch_offset, output, slices, workers,
                [&] { return block_barrier<N>(params, flags, kSetData); })) {
            return;
        }
        block_end(params, flags);
    }
};

// The copy engine's own part: this rank's rows, copied locally while the copy engines bring the
// peers'.
struct AllGatherCopyEngine : NoBegin {
    static constexpr RowCollective kRows = kAllGather;

    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags&) {
        // After an abort (a barrier gave up) write nothing, as every other kernel.
        if (load_relaxed_device(params.state) != 0) {
            return;
        }
        const auto slices = row_slices<T, N>(params);
        const u64 first = slices.first(params.rank);
        unsigned char* output = static_cast<unsigned char*>(params.output);
        if (params.input != output + first * sizeof(typename T::Bits)) {
            copy_run<T>(params.input, first, output, 0, slices(params.rank), grid_workers());
        }
    }
};

// The copy engine's barriers, each with the all-gather's row checks.
template <unsigned int Set>
struct AllGatherCopyEngineBarrier : CopyEngineBarrier<Set> {
    static constexpr RowCollective kRows = kAllGather;
};

}  // namespace prepare

PREPARE_ENTRY(all_gather_one_shot_pull, row_kernel, prepare::AllGatherPull)
PREPARE_ENTRY(all_gather_one_shot_push, row_kernel, prepare::AllGatherPush)
PREPARE_ENTRY(all_gather_one_shot_copy_engine, row_kernel, prepare::AllGatherCopyEngine)
PREPARE_ENTRY(all_gather_one_shot_copy_engine_start, row_kernel,
              prepare::AllGatherCopyEngineBarrier<prepare::kSetStart>)
PREPARE_ENTRY(all_gather_one_shot_copy_engine_end, row_kernel,
              prepare::AllGatherCopyEngineBarrier<prepare::kSetEnd>)
