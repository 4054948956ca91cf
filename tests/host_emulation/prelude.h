// Host emulation of the CUDA built-ins the kernels use: one OS thread per CUDA thread, with
// blockIdx/threadIdx as thread-locals, __syncthreads as a per-block barrier, and a block's
// __shared__ variables in its EmuBlock. Included before the kernel sources (-include).
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

struct EmuDim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(threads)

// One CUDA block: its barrier, its cluster's barrier and blocks, its shared memory.
struct EmuBlock {
    std::barrier<>* block_barrier;
    std::barrier<>* cluster_barrier;
    unsigned cta, ctas, cluster;
    EmuBlock** cluster_blocks;
    alignas(16) unsigned char shared[2][64];
    // One value a thread for an emulated warp shuffle, in two halves, and each thread's calls
    // so far in this block (host_norm_prims.h): zero when the block starts.
    float exchange[2][1024];
    unsigned shuffles[1024];
};
inline thread_local EmuBlock* emu_block;

inline void __syncthreads() {
    emu_block->block_barrier->arrive_and_wait();
}
inline float __uint_as_float(unsigned bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}
inline unsigned __float_as_uint(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, 4);
    return bits;
}
// `__shared__ T name;` in a kernel becomes `T& name = emu_shared<T>(slot);`.
template <typename T>
T& emu_shared(int slot) {
    return *reinterpret_cast<T*>(emu_block->shared[slot]);
}
// The deadline of a launch that must succeed, generous because the emulated ranks share the
// host's cores with whatever else runs. A wait ends at what it waits for, so this bounds only
// how long a hang takes to be reported.
constexpr unsigned long long kHealthyTimeoutNs = 60'000'000'000ull;
