// all_reduce_add_rms_norm_one_shot.cu: the fused all-reduce + residual add + RMSNorm, one-shot
// push with no barrier: the double-buffered protocols of all_reduce_one_shot_double_buffered.cu
// moving whole rows, then the epilogue of prepare_norm.cuh on them.
//
// Block b owns a contiguous run of rows (block_rows: rows / blocks each, one more for the first
// rows % blocks blocks). It writes this rank's part of its rows into its peer slot of every
// peer's scratch, waits for every peer's part of the same rows, and from their rank-ordered
// fp32 sum writes (store_fused_sum) residual_out = round(round(sum) + residual) into `residual`,
// or without a residual the sum, rounded once, into `normed` (its own space: rows x hidden of
// this rank); then, after a block barrier, runs add_rms_norm_row on each of its rows from there
// (fused_norm_of_row): the normalised row times `weight` into `normed`. So a row's bits are the
// all-reduce's sum followed by the add_rms_norm kernel, whatever block, grid or message it is
// in. Peers touch this rank's scratch only, never `x`, `residual` or `normed`.
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's, P its elements per
// 16-byte vector: 8 for bf16 and fp16, 4 for fp32):
//   all_reduce_add_rms_norm_one_shot_push_ll_<dtype>  flags in the data (the ll lines of
//       prepare_double_buffer.cuh): vector v of the message takes lines 2v and 2v + 1; an empty
//       message takes one line, block 0's. Scratch: that of all_reduce_one_shot_push_ll.
//   all_reduce_add_rms_norm_one_shot_push_simple_<dtype>  data then a flag, in steps of 4
//       vectors per thread, as all_reduce_one_shot_push_simple; every block, with rows or not,
//       takes at least one step. Scratch: that of all_reduce_one_shot_push_simple.
// The parity of prepare_double_buffer.cuh holds when blocks own different amounts of rows, or
// none: it asks of a launch only that this rank hear from every peer's same launch in some block
// (not in every block), since launch c of this rank starts after its whole launch c - 1 ended,
// and a peer began its launch c - 1 only after its whole launch c - 2, the last to read the half
// launch c writes, ended. With rows, the blocks that own them hear from every peer; without,
// block 0 (ll) or every block (simple) exchanges an empty line or step. A block with no rows
// writes no peer's scratch and reads none of its own. Every line sent is consumed in the same
// launch (the same rows go to the same block on every rank), so none is left to match a later
// flag; step flags carry the launch number, larger in every later launch.
// Requirements: the world size it was compiled for; the launch parameters of the fused
// epilogue (prepare_abi.cuh): input = x, input_elements = output_elements = rows x hidden,
// output = normed, width = hidden; the epilogue's (norm_launch_is_valid: a hidden size that is
// a multiple of 8 up to 2^24, weight and normed given, normed not overlapping the residual, eps
// 0 or more, blocks of a multiple of 32 threads); 1..1024 blocks of at least `world` threads,
// all resident at once; the pointers and scratch_offset 16-byte aligned; the scratch zeroed
// before the first launch and used by no other kernel. `normed` may be `x` (each element is
// read by the thread that then writes its sum, and the epilogue reads only its block's rows
// after the barrier); the residual may be `x` too (each element read by the thread that then
// writes residual_out there).
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"
#include "prepare_norm.cuh"

namespace prepare {

// An empty message's exchange in the ll protocol: thread 0 of block 0 sends every peer one line
// (line 0 of its slot) and consumes the line each peer sent it, so the launch hears from every
// peer.
template <int N>
__device__ __forceinline__ void exchange_empty_line(const LaunchParams& params,
                                                    BlockFlags& flags) {
    if (blockIdx.x != 0 || threadIdx.x != 0) {
        return;
    }
    const u64 parity = flags.epoch & 1;
    const unsigned int flag = line_flag(flags.epoch);
#pragma unroll 1
    for (int k = 1; k < N; ++k) {
        const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
        send_word_line<N>(peer.region, 0, parity, peer.slot, 0u, flag);
    }
#pragma unroll 1
    for (int k = 1; k < N; ++k) {
        unsigned int data[2];
        if (!receive_lines<N, 1>(params, flags, 0, parity, (params.rank + k) % N, flag, data)) {
            return;
        }
    }
}

// After the sums of the block's rows are stored (store_fused_sum): the norm of each of its
// rows, unless a peer timed out.
template <typename T>
__device__ __forceinline__ void normalise_block_rows(const LaunchParams& params,
                                                     const BlockFlags& flags,
                                                     const BlockRows& rows) {
    __shared__ NormShared norm_shared;
    // Every thread's sums are written, and every thread's timeout seen.
    __syncthreads();
    if (flags.timed_out) {
        return;
    }
#pragma unroll 1
    for (u64 row = rows.first; row < rows.end; ++row) {
        fused_norm_of_row<T>(params, row, norm_shared);
    }
}

// Where the sums of a vector go: store_fused_sum.
template <typename T>
__device__ __forceinline__ auto fused_sums(const LaunchParams& params) {
    return [&params](u64 v, const VectorSum<T>& sums) { store_fused_sum<T>(params, v, sums); };
}

struct FusedPushLl : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const BlockRows rows = block_rows(params.rows);
        if (params.rows == 0) {
            check_line_shapes<N>(params, flags);
            exchange_empty_line<N>(params, flags);
        } else {
            const u64 row_vectors = params.width / T::kPerVector;
            // Whole rows are whole vectors: no tail.
            const Range owned = {rows.first * row_vectors, rows.end * row_vectors, 0, 0};
            push_sum_lines<T, N>(params, flags, owned, params.input_elements,
                                 static_cast<unsigned char*>(params.normed), fused_sums<T>(params));
        }
        normalise_block_rows<T>(params, flags, rows);
        launch_end(params, flags);
    }
};

struct FusedPushSimple : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const BlockRows rows = block_rows(params.rows);
        const u64 row_vectors = params.width / T::kPerVector;
        push_sum_steps<T, N>(params, flags,
                             simple_share_between(rows.first * row_vectors,
                                                  rows.end * row_vectors),
                             static_cast<unsigned char*>(params.normed), fused_sums<T>(params));
        normalise_block_rows<T>(params, flags, rows);
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_add_rms_norm_one_shot_push_ll, fused_kernel, prepare::FusedPushLl)
PREPARE_ENTRY(all_reduce_add_rms_norm_one_shot_push_simple, fused_kernel, prepare::FusedPushSimple)
