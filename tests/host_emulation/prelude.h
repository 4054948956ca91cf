// Host emulation of the CUDA built-ins the kernels use: one OS thread per CUDA thread, with
// blockIdx/threadIdx as thread-locals, __syncthreads as a per-block barrier, and a block's
// __shared__ variables in its EmuBlock. Included before the kernel sources (-include).
#pragma once
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// The late rank's waits (stalls.h). The kernels' stores of data (prepare_element.cuh's
// store_vector and store_element, prepare_double_buffer.cuh's data lines) call emu_store_pause
// in the emulation only: a thread of the late rank's launch stores its first data only when
// every rank has stalled.
#include "stalls.h"
inline void emu_store_pause() {
    emu_stall::before_data_store();
}

struct EmuDim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx, blockDim, gridDim;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(threads)

// A barrier of `count` threads, reusable, as std::barrier but blocking at once: std::barrier's
// waiters first spin and yield the core a dozen times each, and with hundreds of emulated
// threads on a few cores those yields cost more system time than the kernels' own work. A
// waiter sleeps on the phase word (a futex on Linux, where each waiter wakes once, with no lock
// to contend for; elsewhere the standard atomic wait); the last thread to arrive starts the
// next phase and wakes them all. The acquire-release counter orders every thread's accesses
// before its arrival before every thread's return, as bar.sync orders a block's.
class EmuBarrier {
  public:
    explicit EmuBarrier(unsigned count) : count_(count) {}
    void arrive_and_wait() {
        emu_stall::barrier_arrives();
        const unsigned phase = phase_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
            arrived_.store(0, std::memory_order_relaxed);
            emu_stall::barrier_releases(count_);
            phase_.store(phase + 1, std::memory_order_release);
            wake_all();
            return;
        }
        while (phase_.load(std::memory_order_acquire) == phase)
            sleep_while(phase);
    }

  private:
#ifdef __linux__
    void sleep_while(unsigned phase) {
        syscall(SYS_futex, reinterpret_cast<unsigned*>(&phase_), FUTEX_WAIT_PRIVATE, phase,
                nullptr, nullptr, 0);
    }
    void wake_all() {
        syscall(SYS_futex, reinterpret_cast<unsigned*>(&phase_), FUTEX_WAKE_PRIVATE, INT_MAX,
                nullptr, nullptr, 0);
    }
#else
    void sleep_while(unsigned phase) { phase_.wait(phase, std::memory_order_acquire); }
    void wake_all() { phase_.notify_all(); }
#endif
    const unsigned count_;
    std::atomic<unsigned> arrived_{0};
    std::atomic<unsigned> phase_{0};
};

// One CUDA block: its barrier, its cluster's barrier and blocks, its shared memory.
struct EmuBlock {
    EmuBarrier* block_barrier;
    EmuBarrier* cluster_barrier;
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
