// prepare_cluster.cuh: thread-block cluster primitives (inline PTX) and the cluster-wide flag
// exchange of the phased kernels.
//
// Only cluster kernels include this file: these instructions need a launch with cluster
// dimensions. In a cluster kernel CTA 0 alone talks to peers, using the flags and epoch of its
// block number; it broadcasts the outcome of each exchange into every CTA's shared memory
// (distributed shared memory), so the whole cluster continues or returns at the same barrier.
#pragma once

#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

__device__ __forceinline__ unsigned int cluster_cta_rank() {
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

__device__ __forceinline__ unsigned int cluster_cta_count() {
    unsigned int count;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(count));
    return count;
}

__device__ __forceinline__ unsigned int cluster_index() {
    unsigned int index;
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(index));
    return index;
}

// Every thread of every CTA in the cluster; memory operations before it (this CTA's stores to
// peers, its reads of scratch) happen before those after it in any CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release;\n\t"
        "barrier.cluster.wait.acquire;" ::
            : "memory");
}

// Stores `value` into the copy of the shared variable `local` that CTA `cta` of the cluster has.
__device__ __forceinline__ void store_cluster_shared(const int* local, unsigned int cta,
                                                     int value) {
    unsigned int own_address;
    asm("{\n\t.reg .u64 generic_address;\n\t"
        "cvta.to.shared.u64 generic_address, %1;\n\t"
        "cvt.u32.u64 %0, generic_address;\n\t}"
        : "=r"(own_address)
        : "l"(reinterpret_cast<u64>(local)));
    unsigned int remote_address;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote_address)
                 : "r"(own_address), "r"(cta));
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote_address), "r"(value) : "memory");
}

// Flag state of a cluster kernel; meaningful in CTA 0 only.
struct ClusterFlags {
    u64 epoch;
    u64 deadline;
    int stopped;
    int timed_out;
};

// The cluster kernel's checks: the common ones plus a real cluster (a launch without cluster
// dimensions reports one CTA per cluster) whose CTAs each have a thread to receive the outcome.
template <typename T, int N>
__device__ __forceinline__ bool cluster_launch_is_valid(const LaunchParams& params) {
    const unsigned int ctas = cluster_cta_count();
    return launch_is_valid<T, N>(params, gridDim.x) && ctas >= 2 && ctas <= blockDim.x;
}

// Every thread of every CTA calls it; CTA 0 reads the abort word and its epoch.
__device__ __forceinline__ void cluster_begin(const LaunchParams& params, ClusterFlags& flags,
                                              unsigned int cta) {
    if (cta == 0) {
        if (threadIdx.x == 0) {
            flags.stopped = load_relaxed_device(params.state) != 0;
            flags.timed_out = 0;
            flags.epoch = params.state[1 + blockIdx.x] + 1;
            flags.deadline = deadline_after(global_timer_ns(), params.timeout_ns);
        }
        __syncthreads();
    }
}

// CTA 0 raises its flag at every rank in `send_to` and waits for the flag of every rank in
// `wait_for` (bit q = rank q), then tells every CTA whether to go on. Every thread of every CTA
// calls it with the same arguments; false (the same everywhere) means return at once. Once it
// returns false no CTA touches another's shared memory again, so returning is safe.
template <int N>
__device__ __forceinline__ bool cluster_exchange(const LaunchParams& params, ClusterFlags& flags,
                                                 int& outcome, unsigned int cta, unsigned int ctas,
                                                 unsigned int set, unsigned int send_to,
                                                 unsigned int wait_for) {
    // Every CTA's stores to peers and reads of its own scratch are done before CTA 0 raises a
    // flag; st.release.sys is cumulative over what the cluster barrier made visible to it.
    cluster_sync();
    if (cta == 0) {
        const unsigned int peer = threadIdx.x;
        if (set == kSetStart && peer < N && peer != params.rank) {
            // The start exchange is the start barrier's, shape check included (send_to and
            // wait_for are every peer); stopped after this rank's shape mismatch, CTA 0 still
            // shows its line, as a barrier kernel's block does.
            if (!flags.stopped &&
                !start_exchange(params, flags.epoch, flags.deadline, peer, blockIdx.x)) {
                flags.timed_out = 1;
            } else if (flags.stopped) {
                show_shape_after_mismatch<N>(params, flags.epoch);
            }
        } else if (!flags.stopped && peer < N && peer != params.rank) {
            if ((send_to >> peer) & 1u) {
                store_release_system(
                    signal_word(params.signals[peer], set, params.rank, blockIdx.x), flags.epoch);
            }
            if (((wait_for >> peer) & 1u) &&
                !wait_flag(signal_word(params.signals[params.rank], set, peer, blockIdx.x),
                           flags.epoch, flags.deadline)) {
                record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
                flags.timed_out = 1;
            }
        }
        __syncthreads();
        if (threadIdx.x < ctas) {
            store_cluster_shared(&outcome, threadIdx.x, flags.stopped | flags.timed_out);
        }
    }
    // The outcome has reached every CTA, and what CTA 0 acquired from peers is visible to all.
    cluster_sync();
    return outcome == 0;
}

__device__ __forceinline__ void cluster_end(const LaunchParams& params,
                                            const ClusterFlags& flags, unsigned int cta) {
    if (cta == 0 && threadIdx.x == 0) {
        params.state[1 + blockIdx.x] = flags.epoch;
    }
}

// Every rank but this one, as a bit set.
template <int N>
__device__ __forceinline__ unsigned int all_peers(unsigned int rank) {
    return ((1u << N) - 1u) & ~(1u << rank);
}

// A cluster kernel's begin and its start exchange with every peer (set 0), which checks that
// every rank passed the same message as the start barrier does (start_exchange): false means
// return at once.
template <int N>
__device__ __forceinline__ bool cluster_begin_with_start(const LaunchParams& params,
                                                         ClusterFlags& flags, int& outcome,
                                                         unsigned int cta, unsigned int ctas) {
    cluster_begin(params, flags, cta);
    return cluster_exchange<N>(params, flags, outcome, cta, ctas, kSetStart,
                               all_peers<N>(params.rank), all_peers<N>(params.rank));
}

// Where a thread of a phased kernel is: its CTA in the cluster, the cluster's CTAs, and the
// cluster's threads as the phased kernels hand out work.
struct ClusterPlace {
    unsigned int cta;
    unsigned int ctas;
    Workers workers;
};

__device__ __forceinline__ ClusterPlace cluster_place() {
    const unsigned int cta = cluster_cta_rank();
    const unsigned int ctas = cluster_cta_count();
    const Workers workers = {static_cast<u64>(cta) * blockDim.x + threadIdx.x,
                             static_cast<u64>(ctas) * blockDim.x};
    return {cta, ctas, workers};
}

// Phase k (1 to N - 1) of a ring of exchanges in flag set `set`: this rank wrote what goes to
// rank + k, and waits until that peer has it and rank - k's part for this rank is here. False
// (the same in every thread) means a peer timed out: return at once.
template <int N>
__device__ __forceinline__ bool ring_exchange(const LaunchParams& params, ClusterFlags& flags,
                                              int& outcome, const ClusterPlace& place,
                                              unsigned int set, int k) {
    return cluster_exchange<N>(params, flags, outcome, place.cta, place.ctas, set,
                               1u << ((params.rank + k) % N), 1u << ((params.rank + N - k) % N));
}

// The body of every cluster kernel's entry: waits for the previous kernel of the stream
// (prepare_sync.cuh); cluster 0 begins with the start exchange (set 0) with every peer (every
// peer's launch has begun, so its input is ready, and has finished its previous launch, which
// read this rank's scratch, so it may be overwritten) and runs `Algorithm::run<T, N>`; every
// other cluster returns at once, joining no flag protocol.
template <typename Algorithm, typename T, int N>
__device__ __forceinline__ void cluster_kernel(const LaunchParams& params) {
    wait_for_previous_grid();
    allow_next_grid();
    if (cluster_index() != 0) {
        return;
    }
    if (!cluster_launch_is_valid<T, N>(params)) {
        if (cluster_cta_rank() == 0 && threadIdx.x == 0 && params.state != nullptr) {
            record_abort(params.state, PREPARE_ABORT_INVALID_LAUNCH, params.rank);
        }
        return;
    }
    record_arrival(params);
    __shared__ ClusterFlags flags;
    __shared__ int outcome;
    const ClusterPlace place = cluster_place();
    if (cluster_begin_with_start<N>(params, flags, outcome, place.cta, place.ctas)) {
        Algorithm::template run<T, N>(params, flags, outcome, place);
    }
}

}  // namespace prepare
