// prepare_phases.cuh: the two halves of the RSAG, written once for every collective made of
// them: the reduce-scatter phase (the owner of a slice sums it from every rank's message, in
// rank order, with one rounding) and the all-gather phase (every rank gets every rank's slice).
//
// A phase is data movement and the waits inside it; how a launch begins and ends, which flag
// set a wait uses and what a sum is stored into are the caller's. Waits come in as callables
// that return false when a peer timed out (the phase then returns false at once); sums are
// handed to store callables. Rank s's slice is slices(s), a Range indexed like the message
// (message_slices: the all-reduce's, prepare_layout.cuh's slice_of; row_slices: the
// reduce-scatter's and the all-gather's rows). Each phase is written per transfer and protocol
// the kernels use:
//   pull    peers read each other's registered buffers (barrier kernels)
//   push    each rank writes into its peers' scratch (barrier kernels)
//   ring    push, one peer at a time, an exchange after each (the phased cluster kernels)
//   simple  push through double-buffered slots, one step of the pipeline at a time
//           (prepare_phases_simple.cuh, for the double-buffered kernels alone)
// Peers go in the order rank + 1, rank + 2, ..., so ranks start on different peers.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// The all-reduce's slices: rank s owns slice_of(s) of the whole message. A functor rather than
// a lambda so that it is inlined as early as the rest (__forceinline__).
template <typename T, int N>
struct MessageSlices {
    const LaunchParams& params;

    __device__ __forceinline__ Range operator()(unsigned int slice) const {
        return slice_of<T, N>(slice, params.input_elements);
    }
};

template <typename T, int N>
__device__ __forceinline__ MessageSlices<T, N> message_slices(const LaunchParams& params) {
    return {params};
}

// The row collectives' slices: rank s owns its rows (prepare_layout.cuh's run_of), indexed like
// the message; first(s) is the first element of them, end(s) one past the last.
template <typename T, int N>
struct RowSlices {
    const LaunchParams& params;

    __device__ __forceinline__ u64 first(unsigned int slice) const {
        return first_row<N>(params.rows, slice) * params.width;
    }

    __device__ __forceinline__ u64 end(unsigned int slice) const {
        return first(slice) + owned_rows<N>(params.rows, slice) * params.width;
    }

    __device__ __forceinline__ Range operator()(unsigned int slice) const {
        return run_of<T>(first(slice), end(slice));
    }
};

template <typename T, int N>
__device__ __forceinline__ RowSlices<T, N> row_slices(const LaunchParams& params) {
    return {params};
}

// Where a reduce-scatter's sum of this rank's rows goes: its output, which holds them from their
// first element. Kept as one address, that of the message's element 0 were the output indexed
// like the message (an integer: it may lie before the output), so that the eight-rank sums fit
// the registers.
template <typename T>
struct RowOutput {
    u64 base;

    __device__ __forceinline__ RowOutput(void* output, u64 first)
        : base(reinterpret_cast<u64>(output) - first * sizeof(typename T::Bits)) {}

    __device__ __forceinline__ void operator()(u64 v, const Vec16& sum) const {
        store_vector(reinterpret_cast<unsigned char*>(base), v, sum);
    }
    __device__ __forceinline__ void operator()(u64 e, typename T::Bits sum) const {
        store_element<T>(reinterpret_cast<unsigned char*>(base), e, sum);
    }
};

// Reduce-scatter, pull: this rank's slice `own`, read from every rank's registered buffer
// (the message from byte 0), summed in rank order; each vector's fp32 sums, not yet rounded, go
// to store_lanes(v, sums) and tail elements' sums to store_element(e, sum).
template <typename T, int N, typename StoreLanes, typename StoreElement>
__device__ __forceinline__ void reduce_scatter_pull_lanes(const LaunchParams& params,
                                                          const Range& own,
                                                          const Workers& workers,
                                                          StoreLanes store_lanes_op,
                                                          StoreElement store_element_op) {
    const unsigned char* inputs[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        inputs[q] = params.buffers[q];
    }
    sum_owned_lanes_into<T, N>(inputs, 0, own, workers, store_lanes_op, store_element_op);
}

// The same, each vector's sum rounded: store_vector(v, sum).
template <typename T, int N, typename StoreVector, typename StoreElement>
__device__ __forceinline__ void reduce_scatter_pull(const LaunchParams& params,
                                                    const Range& own, const Workers& workers,
                                                    StoreVector store_vector_op,
                                                    StoreElement store_element_op) {
    reduce_scatter_pull_lanes<T, N>(
        params, own, workers,
        [&](u64 v, const VectorSum<T>& sums) { store_vector_op(v, sums.result()); },
        store_element_op);
}

// All-gather, pull: every other rank's slice, read from that rank's buffer at `offset` (where
// the slice lies from its start) into `output` (indexed like the message).
template <typename T, int N, typename Slices>
__device__ __forceinline__ void all_gather_pull(const LaunchParams& params, u64 offset,
                                                unsigned char* output, const Slices& slices,
                                                const Workers& workers) {
#pragma unroll
    for (int k = 1; k < N; ++k) {
        const unsigned int owner = (params.rank + k) % N;
        const Range slice = slices(owner);
        copy_owned<T>(params.buffers[owner] + offset, slice.begin_vector, output, 0, slice,
                      workers);
    }
}

// The reduce-scatter's send to the peer at distance k: that peer's slice of this rank's input
// into this rank's peer slot (slots of `slot` bytes) in the peer's scratch.
template <typename T, int N, typename Slices>
__device__ __forceinline__ void send_slice_to_owner(const LaunchParams& params,
                                                    unsigned int rank, int k, u64 slot,
                                                    const Slices& slices,
                                                    const Workers& workers) {
    const unsigned int owner = (rank + k) % N;
    copy_slice_to_owner<T, N>(params, owner, slices(owner), slot, workers);
}

// The reduce-scatter's sum once every peer's piece of this rank's slice is in its peer slot of
// `scratch` (this rank's): this rank's own part from `input`, the rest from the slots, in rank
// order; the sums go to store_vector(v, sum) and store_element(e, sum).
template <typename T, int N, typename Slices, typename StoreVector, typename StoreElement>
__device__ __forceinline__ void sum_own_slice(const LaunchParams& params, unsigned int rank,
                                              const unsigned char* scratch, u64 slot,
                                              const Slices& slices, const Workers& workers,
                                              StoreVector store_vector_op,
                                              StoreElement store_element_op) {
    const Range own = slices(rank);
    const unsigned char* sources[N];
    rank_sources<N>(rank, params.input + own.begin_vector * 16, scratch, slot, sources);
    sum_owned_into<T, N>(sources, own.begin_vector, own, workers, store_vector_op,
                         store_element_op);
}

// Reduce-scatter, push: every peer's slice of this rank's input goes to its owner's scratch;
// once wait() says every peer's piece of this rank's slice arrived, the slice is summed
// (sum_own_slice). False when wait() gave up.
template <typename T, int N, typename Slices, typename Wait, typename StoreVector,
          typename StoreElement>
__device__ __forceinline__ bool reduce_scatter_push(const LaunchParams& params, u64 slot,
                                                    const Slices& slices, const Workers& workers,
                                                    Wait wait, StoreVector store_vector_op,
                                                    StoreElement store_element_op) {
    // Taken before the wait, whose fences make every later read of the parameters a reload.
    const unsigned int rank = params.rank;
    const unsigned char* scratch = params.buffers[rank] + params.scratch_offset;
#pragma unroll
    for (int k = 1; k < N; ++k) {
        send_slice_to_owner<T, N>(params, rank, k, slot, slices, workers);
    }
    if (!wait()) {
        return false;
    }
    sum_own_slice<T, N>(params, rank, scratch, slot, slices, workers, store_vector_op,
                        store_element_op);
    return true;
}

// All-gather, push: this rank's slice of `source` (indexed like the message) goes to every
// peer's gather region at `gathered_offset` (indexed like the message), unless Send is false
// (the caller's sums already went there); once wait() says every peer's slice is in this
// rank's gather region, the other slices are copied from there to `output` (indexed like the
// message). False when wait() gave up.
template <typename T, int N, bool Send, typename Slices, typename Wait>
__device__ __forceinline__ bool all_gather_push(const LaunchParams& params,
                                                const unsigned char* source, u64 gathered_offset,
                                                unsigned char* output, const Slices& slices,
                                                const Workers& workers, Wait wait) {
    if constexpr (Send) {
        scatter_owned<T, N>(params, source, gathered_offset, 0, slices(params.rank), workers);
    }
    if (!wait()) {
        return false;
    }
    const unsigned char* gathered = params.buffers[params.rank] + gathered_offset;
#pragma unroll
    for (int k = 1; k < N; ++k) {
        copy_owned<T>(gathered, 0, output, 0, slices((params.rank + k) % N), workers);
    }
    return true;
}

// Reduce-scatter, ring: in exchange k (1..N-1) this rank's piece of the slice of rank + k goes
// into its peer slot there, then exchange(k) waits until rank + k has it and rank - k's piece
// of this rank's slice is here; then the slice is summed (sum_own_slice). So a link carries one
// peer's writes at a time. False when an exchange gave up.
template <typename T, int N, typename Slices, typename Exchange, typename StoreVector,
          typename StoreElement>
__device__ __forceinline__ bool reduce_scatter_ring(const LaunchParams& params, u64 slot,
                                                    const Slices& slices, const Workers& workers,
                                                    Exchange exchange,
                                                    StoreVector store_vector_op,
                                                    StoreElement store_element_op) {
    const unsigned int rank = params.rank;
    const unsigned char* scratch = params.buffers[rank] + params.scratch_offset;
    for (int k = 1; k < N; ++k) {
        send_slice_to_owner<T, N>(params, rank, k, slot, slices, workers);
        if (!exchange(k)) {
            return false;
        }
    }
    sum_own_slice<T, N>(params, rank, scratch, slot, slices, workers, store_vector_op,
                        store_element_op);
    return true;
}

// All-gather, ring: in exchange k (1..N-1) this rank's slice of `source` (indexed like the
// message) goes into the gather region of rank + k at `gathered_offset`, exchange(k) waits
// until rank + k has it and rank - k's slice is in this rank's gather region, and that slice
// is copied to `output` (indexed like the message). False when an exchange gave up.
template <typename T, int N, typename Slices, typename Exchange>
__device__ __forceinline__ bool all_gather_ring(const LaunchParams& params,
                                                const unsigned char* source, u64 gathered_offset,
                                                unsigned char* output, const Slices& slices,
                                                const Workers& workers, Exchange exchange) {
    const Range own = slices(params.rank);
    const unsigned char* gathered = params.buffers[params.rank] + gathered_offset;
    for (int k = 1; k < N; ++k) {
        copy_owned<T>(source, 0, params.buffers[(params.rank + k) % N] + gathered_offset, 0, own,
                      workers);
        if (!exchange(k)) {
            return false;
        }
        copy_owned<T>(gathered, 0, output, 0, slices((params.rank + N - k) % N), workers);
    }
    return true;
}

}  // namespace prepare
