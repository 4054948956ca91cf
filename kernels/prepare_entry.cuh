// prepare_entry.cuh: the kernels' entry points, written once.
//
// Every algorithm is a struct whose `run<T, N>` is a template over the element type T (Bf16,
// Fp16, Fp32: prepare_element.cuh) and the world size N. A package holds one dtype and one
// world size, so each of its cubins is compiled with
//   -DPREPARE_ELEMENT=<Bf16|Fp16|Fp32> -DPREPARE_DTYPE=<bf16|fp16|fp32> -DPREPARE_WORLD=<2..8>
// and PREPARE_ENTRY(name, shape, Algorithm) then defines the one extern "C" entry
// `<name>_<dtype>` of that instantiation; a launch whose `world` differs is refused. Without
// those defines (the host emulation) no entry is defined and the templates are instantiated
// directly.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_sync.cuh"

namespace prepare {

// The body of every block kernel's entry: waits for the previous kernel of the stream
// (prepare_sync.cuh), checks the launch, stamps the block's arrival, begins it as the
// algorithm's protocol does (`Algorithm::begin<N>`, which its base gives: StartBarrier,
// LaunchCounter or NoBegin), then runs the algorithm, unless the begin gave up.
template <typename Algorithm, typename T, int N, typename Checks = BlockChecks>
__device__ __forceinline__ void block_kernel(const LaunchParams& params) {
    wait_for_previous_grid();
    allow_next_grid();
    if (!block_launch_is_valid<T, N, Checks>(params)) {
        return;
    }
    record_arrival(params);
    __shared__ BlockFlags flags;
    if (Algorithm::template begin<N>(params, flags)) {
        Algorithm::template run<T, N>(params, flags);
    }
}

// The body of a row collective's entry (reduce_scatter, all_gather): block_kernel with the
// row checks of the collective the algorithm names (`Algorithm::kRows`).
template <typename Algorithm, typename T, int N>
__device__ __forceinline__ void row_kernel(const LaunchParams& params) {
    block_kernel<Algorithm, T, N, RowChecks<Algorithm::kRows>>(params);
}

// An algorithm that waits for nothing when it begins.
struct NoBegin {
    template <int N>
    __device__ __forceinline__ static bool begin(const LaunchParams&, BlockFlags&) {
        return true;
    }
};

}  // namespace prepare

#if defined(PREPARE_WORLD) && defined(PREPARE_ELEMENT) && defined(PREPARE_DTYPE)
#define PREPARE_ENTRY_NAME_(name, dtype) name##_##dtype
#define PREPARE_ENTRY_NAME(name, dtype) PREPARE_ENTRY_NAME_(name, dtype)
// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
#define PREPARE_ENTRY(name, shape, Algorithm)                                                  \
    extern "C" __global__ void __launch_bounds__(1024, 1)                                      \
        PREPARE_ENTRY_NAME(name, PREPARE_DTYPE)(LaunchParams params) {                      \
        prepare::shape<Algorithm, prepare::PREPARE_ELEMENT, PREPARE_WORLD>(params);            \
    }
#else
#define PREPARE_ENTRY(name, shape, Algorithm)
#endif
