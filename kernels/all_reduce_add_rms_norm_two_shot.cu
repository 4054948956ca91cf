// all_reduce_add_rms_norm_two_shot.cu: the fused all-reduce + residual add + RMSNorm in two
// shots: a reduce-scatter of whole rows, the norm on each owner's rows, then an all-gather of
// both outputs.
//
// A message is rows x hidden (`width`) elements; rank r owns a contiguous run of whole rows in
// rank order, the first rows % world ranks one row more (prepare_layout.cuh: owned_rows,
// first_row; prepare_phases.cuh: RowSlices), so a rank may own none. A row is one block's:
// block b of every rank takes owned rows b, b + blocks, ... of every owner, so the
// same-numbered blocks of the ranks share all the data they exchange. For each row it owns, the
// owner's block
//   1. sums the row of every rank's input region in rank order, in fp32, and stores it
//      (prepare_norm.cuh's store_fused_sum): with this rank's residual, residual_out =
//      round(round(sum) + residual) into `residual`; without, the sum rounded once into
//      `normed`, the epilogue's own space for it;
//   2. normalises the row from there with prepare_norm.cuh's add_rms_norm_row
//      (fused_norm_of_row), the normalised row into `normed` (the unfused add_rms_norm's code,
//      so the same bits);
//   3. copies both output rows into its scratch, at their place in the message.
// After the gather barrier every rank copies every other owner's rows of both outputs from
// that owner's scratch into its own `residual` and `normed`: every rank ends with the owners'
// bytes.
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
//   all_reduce_add_rms_norm_two_shot_<dtype>  Scratch: two message-sized regions of
//       round_up(input_elements * sizeof(T), 16) bytes, normed then residual_out (the second
//       unused without a residual), each owner's rows at their place in the message. Barriers:
//       start (0), gather (2).
// Fields read: buffers[q] (every rank's x, the message from byte 0: the host copies x there),
// input_elements and output_elements (both rows x width), rows, width, residual, weight,
// normed, eps, and what every kernel reads; `input` and `output` are checked, not read.
// Refused as an invalid launch: what every fused kernel refuses (prepare_norm.cuh's
// EpilogueChecks: the epilogue's and every kernel's checks, counts that are not rows x width,
// `output` not `normed`).
// Requirements: the world size it was compiled for; 1..1024 blocks of a multiple of 32 threads
// (at least the world's), all resident at once; no cluster instructions; the residual the same
// on every rank (a row is computed on its owner, with its residual) and given on every rank or
// on none. `normed` may be this rank's input region (x in place): peers read only their own
// rows of it, before they raise the gather flag, and this rank writes another owner's rows of
// `normed` only after that owner's same-numbered block (the one that read them) raised it; its
// own rows each thread writes after reading them. No end barrier: peers finished reading this
// rank's input region at the gather barrier, and read its scratch until they end this launch,
// which is written again only after the next launch's start barrier.
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_norm.cuh"
#include "prepare_phases.cuh"

namespace prepare {

// Calls row_op(e), e the first element of the row, for each row of rank q's run that this
// block takes: the owner's rows blockIdx.x, blockIdx.x + gridDim.x, ... of its run.
template <typename T, int N, typename RowOp>
__device__ __forceinline__ void for_each_block_row(const RowSlices<T, N>& slices, unsigned int q,
                                                   u64 width, RowOp row_op) {
    const u64 end = slices.end(q);
    const u64 stride = static_cast<u64>(gridDim.x) * width;
#pragma unroll 1
    for (u64 row = slices.first(q) + blockIdx.x * width; row < end; row += stride) {
        row_op(row);
    }
}

// Begins with the start barrier: every peer's input is ready and its scratch may be
// overwritten.
struct AddRmsNormTwoShot : StartBarrier {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        __shared__ NormShared norm_shared;
        const unsigned int rank = params.rank;
        const u64 width = params.width;
        const auto slices = row_slices<T, N>(params);
        // A row is this block's alone: its threads share it.
        const Workers workers = {threadIdx.x, blockDim.x};
        unsigned char* normed = static_cast<unsigned char*>(params.normed);
        unsigned char* residual = static_cast<unsigned char*>(params.residual);
        // The residual_out region follows the normed one.
        const u64 second = message_bytes<T>(params.input_elements);
        unsigned char* scratch = params.buffers[rank] + params.scratch_offset;
        for_each_block_row(slices, rank, width, [&](u64 first) {
            const Range row = run_of<T>(first, first + width);
            // Whole rows are whole vectors: no tail element.
            reduce_scatter_pull_lanes<T, N>(
                params, row, workers,
                [&](u64 v, const VectorSum<T>& sums) { store_fused_sum<T>(params, v, sums); },
                [](u64, typename T::Bits) {});
            // The norm reads the sum by other threads than wrote it.
            __syncthreads();
            fused_norm_of_row<T>(params, first / width, norm_shared);
            __syncthreads();
            copy_owned<T>(normed, 0, scratch, 0, row, workers);
            if (residual != nullptr) {
                copy_owned<T>(residual, 0, scratch + second, 0, row, workers);
            }
        });
        // Gather: every owner's rows of this block (both outputs) are in its scratch, and every
        // peer has finished reading this rank's input region.
        if (!block_barrier<N>(params, flags, kSetGather)) {
            return;
        }
#pragma unroll 1
        for (int k = 1; k < N; ++k) {
            const unsigned int owner = (params.rank + k) % N;
            const unsigned char* outputs = params.buffers[owner] + params.scratch_offset;
            for_each_block_row(slices, owner, width, [&](u64 first) {
                const Range row = run_of<T>(first, first + width);
                copy_owned<T>(outputs, 0, normed, 0, row, workers);
                if (residual != nullptr) {
                    copy_owned<T>(outputs + second, 0, residual, 0, row, workers);
                }
            });
        }
        block_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_add_rms_norm_two_shot, fused_kernel, prepare::AddRmsNormTwoShot)
