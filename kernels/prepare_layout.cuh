// prepare_layout.cuh: how a message is cut into work and where each kernel keeps its scratch.
//
// A message of E elements is V = E / 8 whole 16-byte vectors plus a tail of E % 8 elements.
// Work is handed out by a fixed function of (element range, worker index, worker count), so the
// same block on every rank touches the same elements: a block's flags then cover all the data
// it shares with its peers' same-numbered block.
//
// RSAG slices: slice s of N covers vectors [min(s*P, V), min((s+1)*P, V)) with P = ceil(V / N);
// the last slice also owns the tail. Rank s reduces slice s.
//
// Scratch (at `scratch_offset` in every rank's buffer), mirrored by `prepare::kernels::
// scratch_bytes`:
//   message_bytes(E)  = round_up(2E, 16)
//   slot_bytes(E, N)  = (P + 1) * 16            a slice with its tail, any slice fits
//   one_shot push, full phased:  N slots of message_bytes, slot q written by rank q
//   rsag pull:                   message_bytes, this rank's reduced slice at its own position
//   rsag push, rsag phased:      N slots of slot_bytes (slot q: rank q's piece of this rank's
//                                slice), then message_bytes of gathered slices at their positions
#pragma once

#include "prepare_bf16.cuh"

namespace prepare {

// Elements [tail_begin, tail_end) follow the vectors [begin_vector, end_vector).
struct Range {
    u64 begin_vector;
    u64 end_vector;
    u64 tail_begin;
    u64 tail_end;
};

// The threads sharing a range: this thread's index among them and how many there are.
struct Workers {
    u64 index;
    u64 count;
};

__device__ __forceinline__ Workers grid_workers() {
    return {static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x,
            static_cast<u64>(gridDim.x) * blockDim.x};
}

__device__ __forceinline__ Range whole_message(u64 elements) {
    const u64 vectors = elements / 8;
    return {0, vectors, vectors * 8, elements};
}

__device__ __forceinline__ u64 min_u64(u64 a, u64 b) {
    return a < b ? a : b;
}

template <int N>
__device__ __forceinline__ u64 slice_vectors(u64 elements) {
    return (elements / 8 + N - 1) / N;
}

template <int N>
__device__ __forceinline__ Range slice_of(unsigned int slice, u64 elements) {
    const u64 vectors = elements / 8;
    const u64 per_slice = slice_vectors<N>(elements);
    const bool last = slice == N - 1;
    const u64 begin = min_u64(slice * per_slice, vectors);
    const u64 end = last ? vectors : min_u64((slice + 1) * per_slice, vectors);
    return {begin, end, last ? vectors * 8 : 0, last ? elements : 0};
}

__device__ __forceinline__ u64 message_bytes(u64 elements) {
    return (elements * 2 + 15) / 16 * 16;
}

template <int N>
__device__ __forceinline__ u64 slot_bytes(u64 elements) {
    return (slice_vectors<N>(elements) + 1) * 16;
}

// Calls vector_op(v) for every vector of the range this thread owns, then element_op(e) for its
// tail elements. Every caller on every rank hands out a range identically.
template <typename VectorOp, typename ElementOp>
__device__ __forceinline__ void for_each_owned(const Range& range, const Workers& workers,
                                               VectorOp vector_op, ElementOp element_op) {
    // Not unrolled: every kernel must fit 64 registers (1024-thread blocks) without spilling;
    // each iteration already has a load per rank in flight.
#pragma unroll 1
    for (u64 v = range.begin_vector + workers.index; v < range.end_vector; v += workers.count) {
        vector_op(v);
    }
#pragma unroll 1
    for (u64 e = range.tail_begin + workers.index; e < range.tail_end; e += workers.count) {
        element_op(e);
    }
}

// Writes to `output` the rank-ordered sum of the N sources over the part of `range` this
// thread owns: whole 16-byte vectors, then tail elements. Source q holds the range from vector
// `first_vector` on (0 when the sources are indexed like the output).
template <int N>
__device__ __forceinline__ void sum_owned(const unsigned char* const (&sources)[N],
                                          u64 first_vector, unsigned char* output,
                                          const Range& range, const Workers& workers) {
    for_each_owned(
        range, workers,
        [&](u64 v) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_vector(sources[q], v - first_vector);
            }
            store_vector(output, v, sum_vectors<N>(x));
        },
        [&](u64 e) {
            unsigned short x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_element(sources[q], e - first_vector * 8);
            }
            store_element(output, e, sum_elements<N>(x));
        });
}

// Writes to `output` the rank-ordered sum of buffers[0..N) over a whole message of `elements`,
// every thread of the grid taking its share.
template <int N>
__device__ __forceinline__ void sum_whole_message(unsigned char* const* buffers, void* output,
                                                  u64 elements) {
    const unsigned char* sources[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = buffers[q];
    }
    sum_owned<N>(sources, 0, static_cast<unsigned char*>(output), whole_message(elements),
                 grid_workers());
}

}  // namespace prepare
