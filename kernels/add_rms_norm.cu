// add_rms_norm.cu: prepare's own residual add + RMSNorm, the unfused epilogue that follows an
// all-reduce kernel: the same bits as the fused kernels (prepare_norm.cuh).
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
//   add_rms_norm_<dtype>  reads `input`, the all-reduce's sum (rows x width, width the hidden
//       size), and writes residual_out = round(input + residual) into `residual` (nothing
//       without one: `residual` null, residual_out is the input), and the normalised rows times
//       `weight` (width elements) into `normed`. Fields read: input, rows, width, residual,
//       weight, normed, eps, rank, world, and state when it is not null (an invalid launch
//       records its code there). No peer, flag or scratch.
// Requirements: the world size it was compiled for; the epilogue's (norm_launch_is_valid in
// prepare_norm.cuh: a hidden size that is a multiple of 8 up to 2^24, weight and normed given,
// normed not overlapping the residual, eps 0 or more, blocks of a multiple of 32 threads); the
// input 16-byte aligned; any grid of 1-D blocks, a block per row at a time. `normed` may be the
// input itself.
#include "prepare_entry.cuh"
#include "prepare_norm.cuh"

namespace prepare {

// The body of an epilogue kernel that touches local memory only.
template <typename Algorithm, typename T, int N>
__device__ __forceinline__ void epilogue_kernel(const LaunchParams& params) {
    wait_for_previous_grid();
    allow_next_grid();
    const bool valid = params.world == N && params.rank < params.world &&
                       params.input != nullptr &&
                       reinterpret_cast<u64>(params.input) % PREPARE_ALIGNMENT_BYTES == 0 &&
                       norm_launch_is_valid<T>(params) && blockDim.y == 1 && blockDim.z == 1 &&
                       gridDim.y == 1 && gridDim.z == 1;
    if (!valid) {
        if (threadIdx.x == 0 && params.state != nullptr) {
            record_abort(params.state, PREPARE_ABORT_INVALID_LAUNCH, params.rank);
        }
        return;
    }
    Algorithm::template run<T, N>(params);
}

struct AddRmsNorm {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params) {
        __shared__ NormShared norm_shared;
        add_rms_norm_rows<T>(params, params.input, norm_shared);
    }
};

}  // namespace prepare

PREPARE_ENTRY(add_rms_norm, epilogue_kernel, prepare::AddRmsNorm)
