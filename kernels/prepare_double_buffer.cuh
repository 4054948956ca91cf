// prepare_double_buffer.cuh: what the double-buffered kernels share: their launch counter,
// their scratch layout and their step flags.
//
// These kernels have no barrier. Each launch writes its data into its peers' scratch and waits
// only for what the peers write into its own. Two things make that safe:
//   - Parity. Launch c (the rank's c-th launch of any double-buffered kernel, the same count on
//     every rank) writes only the half of the scratch whose parity is c % 2. The last reader of
//     that half on a peer was the peer's launch c - 2 or earlier. This rank's launch c - 1
//     received data from every peer's launch c - 1 (every launch of these kernels receives
//     something from every peer, even for an empty message), and a peer starts launch c - 1
//     only after its launch c - 2 has ended, in stream order. So by the time launch c starts,
//     no peer still reads what it overwrites.
//   - Their own regions. Each such kernel has a scratch region no other kernel touches (the
//     host places them after the shared scratch, prepare_abi.cuh), so a barrier kernel's launch
//     that a peer is still running is never overwritten either.
// The halves interleave in chunks, so a parity's bytes are the same whatever the message size:
// slot byte i of rank q's slot, parity p, lives at
//   ((i / CHUNK * 2 + p) * world + q) * CHUNK + i % CHUNK
// and a region for slots of S bytes takes 2 * world * round_up(S, CHUNK) bytes, mirrored by
// `prepare::kernels::scratch_bytes`.
//
// The counter is state[PREPARE_STATE_LAUNCH_WORD]: every block reads it when it starts, and the
// last block to finish (counted in state[PREPARE_STATE_DONE_WORD]) stores the next value, so
// every block of a launch agrees on it and the next launch sees it.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_sync.cuh"

#define PREPARE_DOUBLE_BUFFER_CHUNK_BYTES 8192

namespace prepare {

// Every thread of the block calls it first; false means return at once. `flags.epoch` is then
// this launch's number, whose parity picks the scratch half.
__device__ __forceinline__ bool launch_begin(const AllReduceParams& params, BlockFlags& flags) {
    return begin_counted(params, flags, params.state + PREPARE_STATE_LAUNCH_WORD);
}

// Every thread of the block calls it last. The last block of the launch to get here (each read
// the counter before) advances the counter; a block that timed out leaves it, since the abort
// word already stops every later launch.
__device__ __forceinline__ void launch_end(const AllReduceParams& params, const BlockFlags& flags) {
    __syncthreads();
    if (threadIdx.x == 0 && !flags.timed_out) {
        const u64 finished = fetch_add_acq_rel_device(params.state + PREPARE_STATE_DONE_WORD, 1);
        if (finished + 1 == gridDim.x) {
            params.state[PREPARE_STATE_DONE_WORD] = 0;
            params.state[PREPARE_STATE_LAUNCH_WORD] = flags.epoch;
        }
    }
}

// Where byte `slot_byte` of rank `slot`'s slot, in the half of parity `parity`, lives in a
// double-buffered region.
template <int N>
__device__ __forceinline__ u64 double_buffer_offset(u64 slot_byte, u64 parity, unsigned int slot) {
    const u64 chunk = slot_byte / PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
    return ((chunk * 2 + parity) * N + slot) * PREPARE_DOUBLE_BUFFER_CHUNK_BYTES +
           slot_byte % PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
}

}  // namespace prepare
