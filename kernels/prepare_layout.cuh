// prepare_layout.cuh: how a message is cut into work, where each kernel keeps its scratch, and
// the loops that move and sum it.
//
// A message of E elements of type T is V = E / T::kPerVector whole 16-byte vectors plus a tail
// of E % T::kPerVector elements. Work is handed out by a fixed function of (element range,
// worker index, worker count), so the same block on every rank touches the same elements: a
// block's flags then cover all the data it shares with its peers' same-numbered block.
//
// RSAG slices: slice s of N covers vectors [min(s*P, V), min((s+1)*P, V)) with P = ceil(V / N);
// the last slice also owns the tail. Rank s reduces slice s.
//
// Scratch (at `scratch_offset` in every rank's buffer), mirrored by `prepare::kernels::
// scratch_bytes`:
//   message_bytes(E)  = round_up(E * sizeof(T), 16)
//   slot_bytes(E, N)  = (P + 1) * 16            a slice with its tail, any slice fits
//   one_shot push, full phased:  N - 1 peer slots of message_bytes
//   rsag pull:                   slot_bytes, this rank's reduced slice from its start
//   rsag push, rsag phased:      N - 1 peer slots of slot_bytes (a peer's piece of this rank's
//                                slice), then message_bytes of gathered slices at their positions
//   reduce_scatter push:         N - 1 peer slots of message_bytes (a rank may own every row)
//   all_gather push:             message_bytes, every peer's rows at their place in the message
// A rank keeps no slot for itself (it reads its own message where it is): the peer slots of a
// rank are ordered by distance, slot d - 1 holding what rank (rank + d) % N wrote (peer_slot).
//
// Rows (reduce_scatter, all_gather): a message of rows x width elements; rank q owns rows
// [first_row(q), first_row(q) + owned_rows(q)): rows / N each, one more for the first rows % N
// ranks (prepare::shape::owned_rows), so a rank may own none. Its run of elements [a, b) is a
// Range indexed like the message (run_of): whole vectors [a / P, b / P) and the tail from
// b / P * P when a starts a vector (a % P == 0, P = T::kPerVector); otherwise no vectors and
// every element in the tail, begin_vector a / P rounded down. So a run moves as 16-byte vectors
// only where both sides line up, and as elements where it starts off a 16-byte boundary.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_element.cuh"

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

__device__ __forceinline__ u64 min_u64(u64 a, u64 b) {
    return a < b ? a : b;
}

template <typename T>
__device__ __forceinline__ u64 whole_vectors(u64 elements) {
    return elements / T::kPerVector;
}

template <typename T>
__device__ __forceinline__ Range whole_message(u64 elements) {
    const u64 vectors = whole_vectors<T>(elements);
    return {0, vectors, vectors * T::kPerVector, elements};
}

template <typename T, int N>
__device__ __forceinline__ u64 slice_vectors(u64 elements) {
    return (whole_vectors<T>(elements) + N - 1) / N;
}

template <typename T, int N>
__device__ __forceinline__ Range slice_of(unsigned int slice, u64 elements) {
    const u64 vectors = whole_vectors<T>(elements);
    const u64 per_slice = slice_vectors<T, N>(elements);
    const bool last = slice == N - 1;
    const u64 begin = min_u64(slice * per_slice, vectors);
    const u64 end = last ? vectors : min_u64((slice + 1) * per_slice, vectors);
    return {begin, end, last ? vectors * T::kPerVector : 0, last ? elements : 0};
}

// Rows of `rows` that rank q owns, and the first of them (the rule of prepare::shape).
template <int N>
__device__ __forceinline__ u64 owned_rows(u64 rows, unsigned int q) {
    return rows / N + (q < rows % N ? 1 : 0);
}

template <int N>
__device__ __forceinline__ u64 first_row(u64 rows, unsigned int q) {
    return q * (rows / N) + min_u64(q, rows % N);
}

// The run of elements [first, end) of a message: whole vectors where `first` starts one, every
// element a tail element otherwise.
template <typename T>
__device__ __forceinline__ Range run_of(u64 first, u64 end) {
    const u64 vector = first / T::kPerVector;
    if (first % T::kPerVector != 0) {
        return {vector, vector, first, end};
    }
    const u64 end_vector = end / T::kPerVector;
    return {vector, end_vector, end_vector * T::kPerVector, end};
}

// The slot that rank `from` writes among the N - 1 peer slots of rank `to` (from != to).
template <int N>
__device__ __forceinline__ unsigned int peer_slot(unsigned int from, unsigned int to) {
    return (from + N - to) % N - 1;
}

// The slot this rank's data takes at rank + k: peer_slot(rank, (rank + k) % N), known at compile
// time in a loop over k that is unrolled.
template <int N>
__device__ __forceinline__ unsigned int slot_at_distance(int k) {
    return N - 1 - k;
}

// Where this rank's data goes at the peer at distance k (rank + k): that peer's buffer from
// `offset` (a scratch region), and the peer slot this rank takes there (slot_at_distance).
struct PeerSlot {
    unsigned char* region;
    unsigned int slot;
};

template <int N>
__device__ __forceinline__ PeerSlot peer_at_distance(const LaunchParams& params, int k,
                                                     u64 offset) {
    return {params.buffers[(params.rank + k) % N] + offset, slot_at_distance<N>(k)};
}

template <typename T>
__device__ __forceinline__ u64 message_bytes(u64 elements) {
    return (elements * sizeof(typename T::Bits) + 15) / 16 * 16;
}

template <typename T, int N>
__device__ __forceinline__ u64 slot_bytes(u64 elements) {
    return (slice_vectors<T, N>(elements) + 1) * 16;
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

// Copies the part of `range` this thread owns from `source`, where vector `source_first` is the
// first, to `destination`, where vector `destination_first` is the first (0 for a buffer
// indexed like the message).
template <typename T>
__device__ __forceinline__ void copy_owned(const unsigned char* source, u64 source_first,
                                           unsigned char* destination, u64 destination_first,
                                           const Range& range, const Workers& workers) {
    for_each_owned(
        range, workers,
        [&](u64 v) {
            store_vector(destination, v - destination_first,
                         load_vector(source, v - source_first));
        },
        [&](u64 e) {
            store_element<T>(destination, e - destination_first * T::kPerVector,
                             load_element<T>(source, e - source_first * T::kPerVector));
        });
}

// copy_owned for a row run (run_of): `source` holds the message from element `source_first`
// and `destination` from `destination_first` (0 for memory indexed like the message, the run's
// first element for memory that holds the run from its start). A run with whole vectors starts
// a vector, so both firsts are whole vectors where vectors move.
template <typename T>
__device__ __forceinline__ void copy_run(const unsigned char* source, u64 source_first,
                                         unsigned char* destination, u64 destination_first,
                                         const Range& range, const Workers& workers) {
    for_each_owned(
        range, workers,
        [&](u64 v) {
            store_vector(destination, v - destination_first / T::kPerVector,
                         load_vector(source, v - source_first / T::kPerVector));
        },
        [&](u64 e) {
            store_element<T>(destination, e - destination_first,
                             load_element<T>(source, e - source_first));
        });
}

// The RSAG scatter to one owner: the owner's slice of this rank's input goes to this rank's
// peer slot in the owner's scratch (slots of `slot` bytes), at its offset inside the slice.
template <typename T, int N>
__device__ __forceinline__ void copy_slice_to_owner(const LaunchParams& params,
                                                    unsigned int owner, const Range& slice,
                                                    u64 slot, const Workers& workers) {
    copy_owned<T>(params.input, 0,
                  params.buffers[owner] + params.scratch_offset +
                      peer_slot<N>(params.rank, owner) * slot,
                  slice.begin_vector, slice, workers);
}

// Sends the part of `range` this thread owns to every peer's buffer from `offset`, peers in the
// order rank+1, rank+2, ... (so ranks start on different peers), each vector or element read
// once: load_vector_op(v) and load_element_op(e) read it, then send_vector_op(peer, v, x) and
// send_element_op(peer, e, value) write it at each peer (its PeerSlot).
template <int N, typename LoadVector, typename LoadElement, typename SendVector,
          typename SendElement>
__device__ __forceinline__ void send_owned(const LaunchParams& params, u64 offset,
                                           const Range& range, const Workers& workers,
                                           LoadVector load_vector_op, LoadElement load_element_op,
                                           SendVector send_vector_op,
                                           SendElement send_element_op) {
    for_each_owned(
        range, workers,
        [&](u64 v) {
            const Vec16 x = load_vector_op(v);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                send_vector_op(peer_at_distance<N>(params, k, offset), v, x);
            }
        },
        [&](u64 e) {
            const auto value = load_element_op(e);
#pragma unroll
            for (int k = 1; k < N; ++k) {
                send_element_op(peer_at_distance<N>(params, k, offset), e, value);
            }
        });
}

// Copies the part of `range` this thread owns from `source` (indexed like the message) to every
// peer's buffer, at `offset` plus this rank's peer slot there times `slot` (0: the same offset
// at every peer), indexed like the message (send_owned).
template <typename T, int N>
__device__ __forceinline__ void scatter_owned(const LaunchParams& params,
                                              const unsigned char* source, u64 offset, u64 slot,
                                              const Range& range, const Workers& workers) {
    send_owned<N>(
        params, offset, range, workers, [&](u64 v) { return load_vector(source, v); },
        [&](u64 e) { return load_element<T>(source, e); },
        [&](const PeerSlot& peer, u64 v, const Vec16& x) {
            store_vector(peer.region + peer.slot * slot, v, x);
        },
        [&](const PeerSlot& peer, u64 e, typename T::Bits value) {
            store_element<T>(peer.region + peer.slot * slot, e, value);
        });
}

// The one summing loop: the rank-ordered sum of the N sources over the part of `range` this
// thread owns, handed to store_lanes(v, sums) for whole vectors (the fp32 sums, not yet
// rounded: VectorSum), then store_element(e, sum) for tail elements (rounded). Source q holds
// the range from vector `first_vector` on (0 when the sources are indexed like the message).
template <typename T, int N, typename StoreLanes, typename StoreElement>
__device__ __forceinline__ void sum_owned_lanes_into(const unsigned char* const (&sources)[N],
                                                     u64 first_vector, const Range& range,
                                                     const Workers& workers,
                                                     StoreLanes store_lanes_op,
                                                     StoreElement store_element_op) {
    for_each_owned(
        range, workers,
        [&](u64 v) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_vector(sources[q], v - first_vector);
            }
            store_lanes_op(v, sum_lanes<T, N>(x));
        },
        [&](u64 e) {
            typename T::Bits x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] = load_element<T>(sources[q], e - first_vector * T::kPerVector);
            }
            store_element_op(e, sum_elements<T, N>(x));
        });
}

// sum_owned_lanes_into with every vector's sums rounded: store_vector(v, sum).
template <typename T, int N, typename StoreVector, typename StoreElement>
__device__ __forceinline__ void sum_owned_into(const unsigned char* const (&sources)[N],
                                               u64 first_vector, const Range& range,
                                               const Workers& workers, StoreVector store_vector_op,
                                               StoreElement store_element_op) {
    sum_owned_lanes_into<T, N>(
        sources, first_vector, range, workers,
        [&](u64 v, const VectorSum<T>& sums) { store_vector_op(v, sums.result()); },
        store_element_op);
}

// sum_owned_into, written to `output` (indexed like the message).
template <typename T, int N>
__device__ __forceinline__ void sum_owned(const unsigned char* const (&sources)[N],
                                          u64 first_vector, unsigned char* output,
                                          const Range& range, const Workers& workers) {
    sum_owned_into<T, N>(
        sources, first_vector, range, workers,
        [&](u64 v, const Vec16& sum) { store_vector(output, v, sum); },
        [&](u64 e, typename T::Bits sum) { store_element<T>(output, e, sum); });
}

// Writes to `output` the rank-ordered sum of buffers[0..N) over a whole message of `elements`,
// every thread of the grid taking its share.
template <typename T, int N>
__device__ __forceinline__ void sum_whole_message(unsigned char* const* buffers, void* output,
                                                  u64 elements) {
    const unsigned char* sources[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = buffers[q];
    }
    sum_owned<T, N>(sources, 0, static_cast<unsigned char*>(output), whole_message<T>(elements),
                    grid_workers());
}

// Rank q's contribution, for q in rank order: this rank's own (`own`), or rank q's peer slot of
// `slots`.
template <int N>
__device__ __forceinline__ void rank_sources(unsigned int rank, const unsigned char* own,
                                             const unsigned char* slots, u64 slot,
                                             const unsigned char* (&sources)[N]) {
#pragma unroll
    for (int q = 0; q < N; ++q) {
        sources[q] = static_cast<unsigned int>(q) == rank
                         ? own
                         : slots + peer_slot<N>(static_cast<unsigned int>(q), rank) * slot;
    }
}

}  // namespace prepare
