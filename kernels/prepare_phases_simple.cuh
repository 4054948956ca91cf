// prepare_phases_simple.cuh: the RSAG's halves (prepare_phases.cuh) through the simple
// protocol's double-buffered slots (prepare_double_buffer.cuh), one step of the pipeline at a
// time: block b takes the same share of every slice (SimpleShare, counted from each slice's
// start), moved in steps of kSimpleStepVectors vectors per thread, and the last slice holds the
// message's tail. The waits for the step flags, and raising the all-gather's, are the caller's.
// Apart from prepare_phases.cuh, since only the double-buffered kernels include the protocol.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_double_buffer.cuh"
#include "prepare_layout.cuh"
#include "prepare_phases.cuh"

namespace prepare {

// The simple phases' slots: a double-buffered region of `Phases` phases whose first holds the
// reduce-scatter's pieces and whose last the all-gather's slices (the RSAG has both: 2).
__device__ __forceinline__ constexpr unsigned int reduce_scatter_slots() {
    return 0;
}

template <int Phases>
__device__ __forceinline__ constexpr unsigned int all_gather_slots() {
    return Phases - 1;
}

// Where byte `byte` of this rank's slot of slot phase `phase` lies at `peer`.
template <int N, int Phases>
__device__ __forceinline__ unsigned char* peer_phase_byte(const PeerSlot& peer, unsigned int phase,
                                                          u64 byte, u64 parity) {
    return slot_byte<N, Phases>(peer.region, byte, parity, phase * (N - 1) + peer.slot);
}

// Moves this thread's vectors of step `step` of `share` whose place inside the slice is below
// `limit`: all loaded (load(v)), then all stored (store(v, x)), so a step's loads are in flight
// together.
template <typename Load, typename Store>
__device__ __forceinline__ void move_step(const SimpleShare& share, u64 step, u64 limit,
                                          Load load, Store store) {
    const u64 first = share.begin + step * share.step_vectors;
    const u64 end = min_u64(share.end, limit);
    Vec16 x[kSimpleStepVectors];
#pragma unroll
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < end) {
            x[u] = load(v);
        }
    }
#pragma unroll
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < end) {
            store(v, x[u]);
        }
    }
}

// Calls op(e, byte) for the tail elements this thread moves in step `step`, with the byte each
// takes inside the last slice, in the last block's last step only.
template <typename T, int N, typename Slices, typename Op>
__device__ __forceinline__ void for_each_tail_element(const Slices& slices,
                                                      const SimpleShare& share, u64 step, Op op) {
    if (!share.tail_block || step + 1 != share.steps) {
        return;
    }
    // The tail's range from the element count, so that it takes no registers through the steps.
    const Range last = slices(N - 1);
    const u64 first = last.begin_vector * T::kPerVector;
    for_each_owned(
        Range{0, 0, last.tail_begin, last.tail_end}, Workers{threadIdx.x, blockDim.x}, [](u64) {},
        [&](u64 e) { op(e, (e - first) * sizeof(typename T::Bits)); });
}

// Reduce-scatter, simple, the send of step `step` of `share` (block b's share of every slice,
// counted from each slice's start): slice o's vectors of this rank's input into this rank's
// reduce-scatter slot at o, for every peer o, and the tail to the last rank; then the step flags
// (kSetStep) at `flag`.
template <typename T, int N, int Phases, typename Slices>
__device__ __forceinline__ void reduce_scatter_simple_send(const LaunchParams& params,
                                                           const Slices& slices,
                                                           const SimpleShare& share, u64 parity,
                                                           u64 step, u64 flag) {
    const unsigned char* input = params.input;
#pragma unroll
    for (int k = 1; k < N; ++k) {
        const Range slice = slices((params.rank + k) % N);
        const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
        move_step(
            share, step, slice.end_vector - slice.begin_vector,
            [&](u64 v) { return load_vector(input, slice.begin_vector + v); },
            [&](u64 v, const Vec16& x) {
                store_vector(
                    peer_phase_byte<N, Phases>(peer, reduce_scatter_slots(), v * 16, parity), 0,
                    x);
            });
    }
    if (params.rank != N - 1) {
        const PeerSlot owner =
            peer_at_distance<N>(params, N - 1 - params.rank, params.scratch_offset);
        for_each_tail_element<T, N>(slices, share, step, [&](u64 e, u64 byte) {
            store_element<T>(peer_phase_byte<N, Phases>(owner, reduce_scatter_slots(), byte, parity),
                             0, load_element<T>(input, e));
        });
    }
    raise_step_flags<N>(params, kSetStep, flag);
}

// Reduce-scatter, simple, the sum of step `step` (its step flags awaited): this rank's slice,
// its own part from `input`, every peer's from its reduce-scatter slot, summed in rank order;
// the sums go to store_vector(v, byte, sum) and store_element(e, byte, sum), with the byte each
// takes inside the slice.
template <typename T, int N, int Phases, typename Slices, typename StoreVector,
          typename StoreElement>
__device__ __forceinline__ void reduce_scatter_simple_sum(const LaunchParams& params,
                                                          const Slices& slices,
                                                          const SimpleShare& share, u64 parity,
                                                          u64 step, StoreVector store_vector_op,
                                                          StoreElement store_element_op) {
    const Range own = slices(params.rank);
    const u64 first = share.begin + step * share.step_vectors;
    const u64 end = min_u64(share.end, own.end_vector - own.begin_vector);
#pragma unroll 1
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < end) {
            const Vec16 sum = sum_received_vector<T, N, Phases>(params, parity,
                                                                own.begin_vector + v, v * 16);
            store_vector_op(own.begin_vector + v, v * 16, sum);
        }
    }
    if (params.rank == N - 1) {
        for_each_tail_element<T, N>(slices, share, step, [&](u64 e, u64 byte) {
            store_element_op(e, byte,
                             sum_received_element<T, N, Phases>(params, parity, e, byte));
        });
    }
}

// All-gather, simple, the receive of step `step` (its gather flags awaited): every peer's part
// of its slice from its all-gather slot of this rank's region to `output` (indexed like the
// message).
template <typename T, int N, int Phases, typename Slices>
__device__ __forceinline__ void all_gather_simple_receive(const LaunchParams& params,
                                                          const Slices& slices,
                                                          const SimpleShare& share, u64 parity,
                                                          u64 step, unsigned char* output) {
    // Peers one at a time (and in the tail's sums): with these loops unrolled the kernel spills
    // at some world sizes under the 64 registers of 1024-thread blocks.
#pragma unroll 1
    for (int k = 1; k < N; ++k) {
        const int owner = (params.rank + k) % N;
        const Range slice = slices(owner);
        move_step(
            share, step, slice.end_vector - slice.begin_vector,
            [&](u64 v) {
                return load_vector(received_byte<N, Phases>(params, owner, v * 16, parity,
                                                            all_gather_slots<Phases>()),
                                   0);
            },
            [&](u64 v, const Vec16& x) { store_vector(output, slice.begin_vector + v, x); });
    }
    if (params.rank != N - 1) {
        for_each_tail_element<T, N>(slices, share, step, [&](u64 e, u64 byte) {
            store_element<T>(output, e,
                             load_element<T>(received_byte<N, Phases>(params, N - 1, byte, parity,
                                                                      all_gather_slots<Phases>()),
                                             0));
        });
    }
}

}  // namespace prepare
