// all_reduce_one_shot_double_buffered.cu: one-shot push all-reduce with no barrier.
//
// Both kernels write this rank's input into its peer slot of every peer's scratch and wait only
// for what the peers write into this rank's slots; there is no start or end barrier
// (prepare_double_buffer.cuh says why that is safe). Every rank sums its own input and the
// slots in rank order, so all write the same bytes.
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's, P its elements per
// 16-byte vector: 8 for bf16 and fp16, 4 for fp32):
//   all_reduce_one_shot_push_ll_<dtype>  flags in the data (the ll lines of
//       prepare_double_buffer.cuh): a vector takes two lines and each tail element one. Each
//       block takes an equal share of the vectors (the last also the tail), so even a small
//       message spreads over every block. A message of E elements takes 2 * (E / P) + E % P
//       lines (one if empty), so a region for messages up to E is sized for
//       2 * (E / P) + P - 1: 2 * (world - 1) * round_up(16 * that, 8 KiB) bytes.
//   all_reduce_one_shot_push_simple_<dtype>  data then a flag: block b moves its share of the
//       message in steps of 4 vectors per thread; after each step one thread per peer raises
//       that peer's step flag for (this rank, block b) to (launch << 24) | step + 1 with
//       st.release.sys, and the peer's block b waits until the flag reaches that value. A block
//       sends step s, then sums step s - 1, so its local sums overlap its transfers. Scratch:
//       2 * (world - 1) * round_up(round_up(elements * sizeof(T), 16), 8 KiB).
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads, all resident at once; no cluster instructions, so a launch with
// cluster dimensions is fine; the pointers and scratch_offset 16-byte aligned; the scratch
// zeroed before the first launch and used by no other kernel. Each reads its own message from
// `input`, and every output element is written by the thread that read it, after reading it, so
// the output may be the input (in place) but no scratch region.
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// Block b's part of the message in the ll protocol: an equal share of whole vectors (the last
// block also the tail), so a small message spreads over every block's multiprocessor.
template <typename T>
__device__ __forceinline__ Range block_share(u64 elements) {
    const u64 vectors = whole_vectors<T>(elements);
    const u64 equal = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 begin = min_u64(blockIdx.x * equal, vectors);
    const bool last = blockIdx.x == gridDim.x - 1;
    return {begin, last ? vectors : min_u64(begin + equal, vectors),
            last ? vectors * T::kPerVector : 0, last ? elements : 0};
}

struct OneShotPushLl : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const u64 elements = params.input_elements;
        // An empty message still sends one (empty) tail line, so this launch hears from every
        // peer.
        push_sum_lines<T, N>(params, flags, block_share<T>(elements == 0 ? 1 : elements),
                             elements, static_cast<unsigned char*>(params.output));
        launch_end(params, flags);
    }
};

struct OneShotPushSimple : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        push_sum_steps<T, N>(params, flags, simple_share<T>(params.input_elements),
                             static_cast<unsigned char*>(params.output));
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_one_shot_push_ll, block_kernel, prepare::OneShotPushLl)
PREPARE_ENTRY(all_reduce_one_shot_push_simple, block_kernel, prepare::OneShotPushSimple)
