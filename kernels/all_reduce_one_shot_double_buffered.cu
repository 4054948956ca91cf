// all_reduce_one_shot_double_buffered.cu: one-shot push all-reduce of bf16 with no barrier.
//
// Both kernels write this rank's input into slot `rank` of every peer's scratch and wait only
// for what the peers write into this rank's slots; there is no start or end barrier
// (prepare_double_buffer.cuh says why that is safe). Every rank sums its own input and the
// slots in rank order, so all write the same bytes.
//
// Entries (each takes AllReduceParams by value):
//   all_reduce_one_shot_push_ll_bf16  flags in the data: every 16-byte line carries 8 bytes of
//       data and the launch's flag twice, {low word, flag, high word, flag}, and is read until
//       both flags match, so no fence or separate flag is needed; a vector takes two lines and
//       each tail element one. Each block takes an equal share of the vectors (the last also
//       the tail), so even a small message spreads over every block. A reader zeroes each line
//       it consumed, so a line unwritten for 2^32 launches cannot match a later flag. A message
//       of E elements takes 2 * (E / 8) + E % 8 lines (one if empty), so a region for messages
//       up to E is sized for 2 * (E / 8) + 7: 2 * world * round_up(16 * that, 8 KiB) bytes.
//   all_reduce_one_shot_push_simple_bf16  data then a flag: block b moves its share of the
//       message in steps of 4 vectors per thread; after each step one thread per peer raises
//       that peer's step flag for (this rank, block b) to (launch << 24) | step + 1 with
//       st.release.sys, and the peer's block b waits until the flag reaches that value. A block
//       sends step s, then sums step s - 1, so its local sums overlap its transfers. Scratch:
//       2 * world * round_up(round_up(2 * elements, 16), 8 KiB).
// Requirements: world 2..8; any element count; 1..1024 blocks of a multiple of 32 threads, all
// resident at once; no cluster instructions, so a launch with cluster dimensions is fine; the
// pointers and scratch_offset 16-byte aligned; the scratch zeroed before the first launch and
// used by no other kernel. Each reads its own message from `input`, and every output element is
// written by the thread that read it, after reading it, so the output may be the input (in
// place) but no scratch region.
#include "prepare_abi.cuh"
#include "prepare_bf16.cuh"
#include "prepare_double_buffer.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

namespace prepare {

// Vectors a thread moves in one step of the simple protocol. Every step ends with a release
// that waits for the step's writes to land, so steps are as large as registers allow.
constexpr unsigned int kSimpleStepVectors = 4;

// Block b's part of the message in the simple protocol, the same on every rank.
struct SimpleShare {
    // Vectors [begin, end): an equal share, a whole multiple of the block's width.
    u64 begin;
    u64 end;
    // Step width in vectors, and steps (at least one, so every block hears from every peer
    // even with nothing to move).
    u64 step_vectors;
    u64 steps;
    // The last block also moves the tail, in its last step, through for_each_owned.
    bool tail_block;
    Range tail;
};

__device__ __forceinline__ SimpleShare simple_share(u64 elements) {
    SimpleShare share;
    const u64 vectors = elements / 8;
    const u64 threads = blockDim.x;
    const u64 equal = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 per_block = (equal + threads - 1) / threads * threads;
    share.begin = min_u64(blockIdx.x * per_block, vectors);
    share.end = min_u64(share.begin + per_block, vectors);
    share.step_vectors = threads * kSimpleStepVectors;
    share.steps = share.end > share.begin
                      ? (share.end - share.begin + share.step_vectors - 1) / share.step_vectors
                      : 1;
    share.tail_block = blockIdx.x == gridDim.x - 1;
    share.tail = {vectors, vectors, vectors * 8, elements};
    return share;
}

// Block b's part of the message in the flags-in-data protocol: an equal share of whole vectors
// (the last block also the tail), so a small message spreads over every block's multiprocessor.
__device__ __forceinline__ Range block_share(u64 elements) {
    const u64 vectors = elements / 8;
    const u64 equal = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 begin = min_u64(blockIdx.x * equal, vectors);
    const bool last = blockIdx.x == gridDim.x - 1;
    return {begin, last ? vectors : min_u64(begin + equal, vectors), last ? vectors * 8 : 0,
            last ? elements : 0};
}

// A line's flag: the launch number's low 32 bits, never 0 (consumed lines are zero).
__device__ __forceinline__ unsigned int line_flag(u64 launch) {
    const unsigned int low = static_cast<unsigned int>(launch);
    return low != 0 ? low : 1u;
}

template <int N>
__device__ __forceinline__ unsigned int* line_address(unsigned char* region, u64 line, u64 parity,
                                                      unsigned int slot) {
    return reinterpret_cast<unsigned int*>(region +
                                           double_buffer_offset<N>(line * 16, parity, slot));
}

// Waits for line `line` of `source`'s slot to carry `flag`, then takes its two data words and
// zeroes it. False (abort recorded) when the deadline passed first.
template <int N>
__device__ __forceinline__ bool receive_line(const AllReduceParams& params, BlockFlags& flags,
                                             u64 line, u64 parity, unsigned int source,
                                             unsigned int flag, unsigned int* data) {
    unsigned int* address =
        line_address<N>(params.buffers[params.rank] + params.scratch_offset, line, parity, source);
    unsigned int words[4];
    load_line_volatile(address, words);
    while (words[1] != flag || words[3] != flag) {
        if (global_timer_ns() > flags.deadline) {
            // One last look, so a line that landed with the deadline is not called late.
            load_line_volatile(address, words);
            if (words[1] == flag && words[3] == flag) {
                break;
            }
            record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, source);
            flags.timed_out = 1;
            return false;
        }
        load_line_volatile(address, words);
    }
    data[0] = words[0];
    data[1] = words[2];
    const unsigned int consumed[4] = {0, 0, 0, 0};
    store_line_volatile(address, consumed);
    return true;
}

// Whether a line carries `flag` in both its flag words.
__device__ __forceinline__ bool line_arrived(const unsigned int (&words)[4], unsigned int flag) {
    return words[1] == flag && words[3] == flag;
}

// receive_line for vector v's two lines (2v and 2v + 1), loaded together so they cost one
// round trip, not two: its four data words go to `data`.
template <int N>
__device__ __forceinline__ bool receive_vector(const AllReduceParams& params, BlockFlags& flags,
                                               u64 v, u64 parity, unsigned int source,
                                               unsigned int flag, unsigned int* data) {
    unsigned char* region = params.buffers[params.rank] + params.scratch_offset;
    unsigned int* low_address = line_address<N>(region, 2 * v, parity, source);
    unsigned int* high_address = line_address<N>(region, 2 * v + 1, parity, source);
    unsigned int low[4];
    unsigned int high[4];
    load_line_volatile(low_address, low);
    load_line_volatile(high_address, high);
    while (!line_arrived(low, flag) || !line_arrived(high, flag)) {
        if (global_timer_ns() > flags.deadline) {
            // One last look, so lines that landed with the deadline are not called late.
            load_line_volatile(low_address, low);
            load_line_volatile(high_address, high);
            if (line_arrived(low, flag) && line_arrived(high, flag)) {
                break;
            }
            record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, source);
            flags.timed_out = 1;
            return false;
        }
        // Only a line still missing is loaded again.
        if (!line_arrived(low, flag)) {
            load_line_volatile(low_address, low);
        }
        if (!line_arrived(high, flag)) {
            load_line_volatile(high_address, high);
        }
    }
    data[0] = low[0];
    data[1] = low[2];
    data[2] = high[0];
    data[3] = high[2];
    const unsigned int consumed[4] = {0, 0, 0, 0};
    store_line_volatile(low_address, consumed);
    store_line_volatile(high_address, consumed);
    return true;
}

template <int N>
__device__ void one_shot_push_ll(const AllReduceParams& params, BlockFlags& flags) {
    if (!launch_begin(params, flags)) {
        return;
    }
    const unsigned int rank = params.rank;
    const u64 parity = flags.epoch & 1;
    const unsigned int flag = line_flag(flags.epoch);
    const u64 elements = params.elements;
    // An empty message still sends one (empty) tail line, so this launch hears from every peer.
    const Range message = block_share(elements == 0 ? 1 : elements);
    // Lines 2v and 2v+1 carry vector v; tail element e follows at 2 * vectors + e - 8 * vectors.
    const u64 vectors = (elements == 0 ? 1 : elements) / 8;
    const u64 tail_line = 2 * vectors - 8 * vectors;
    const Workers workers = {threadIdx.x, blockDim.x};
    const unsigned char* input = params.input;
    unsigned char* output = static_cast<unsigned char*>(params.output);
    // Peers in the order rank+1, rank+2, ... so ranks start on different peers.
    for_each_owned(
        message, workers,
        [&](u64 v) {
            const Vec16 x = load_vector(input, v);
            const unsigned int low[4] = {x.word[0], flag, x.word[1], flag};
            const unsigned int high[4] = {x.word[2], flag, x.word[3], flag};
#pragma unroll
            for (int k = 1; k < N; ++k) {
                unsigned char* region = params.buffers[(rank + k) % N] + params.scratch_offset;
                store_line_volatile(line_address<N>(region, 2 * v, parity, rank), low);
                store_line_volatile(line_address<N>(region, 2 * v + 1, parity, rank), high);
            }
        },
        [&](u64 e) {
            const unsigned int value = e < elements ? load_element(input, e) : 0u;
            const unsigned int line[4] = {value, flag, 0u, flag};
#pragma unroll
            for (int k = 1; k < N; ++k) {
                unsigned char* region = params.buffers[(rank + k) % N] + params.scratch_offset;
                store_line_volatile(line_address<N>(region, tail_line + e, parity, rank), line);
            }
        });
    bool received = true;
    for_each_owned(
        message, workers,
        [&](u64 v) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                if (static_cast<unsigned int>(q) == rank) {
                    x[q] = load_vector(input, v);
                } else {
                    // Up to four ranks a vector's two lines are awaited together; beyond,
                    // one after the other, which keeps every rank's vector in registers.
                    if (N <= 4) {
                        received = received &&
                                   receive_vector<N>(params, flags, v, parity, q, flag, x[q].word);
                    } else {
                        received =
                            received &&
                            receive_line<N>(params, flags, 2 * v, parity, q, flag, x[q].word) &&
                            receive_line<N>(params, flags, 2 * v + 1, parity, q, flag,
                                            x[q].word + 2);
                    }
                }
            }
            if (received) {
                store_vector(output, v, sum_vectors<N>(x));
            }
        },
        [&](u64 e) {
            unsigned short x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                if (static_cast<unsigned int>(q) == rank) {
                    x[q] = e < elements ? load_element(input, e) : 0;
                } else {
                    unsigned int data[2] = {0, 0};
                    received = received &&
                               receive_line<N>(params, flags, tail_line + e, parity, q, flag, data);
                    x[q] = static_cast<unsigned short>(data[0]);
                }
            }
            if (received && e < elements) {
                store_element(output, e, sum_elements<N>(x));
            }
        });
    launch_end(params, flags);
}

// Raises `flag` for (this rank, this block) at every peer once every thread's stores of the
// step are issued; release is cumulative through bar.sync, as in block_barrier.
template <int N>
__device__ __forceinline__ void raise_step_flags(const AllReduceParams& params, u64 flag) {
    __syncthreads();
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank) {
        store_release_system(signal_word(params.signals[peer], kSetStep, params.rank, blockIdx.x),
                             flag);
    }
}

// Waits until every peer's step flag for this block reached `flag`. Every thread calls it;
// false (the same in every thread) means a peer timed out.
template <int N>
__device__ __forceinline__ bool wait_step_flags(const AllReduceParams& params, BlockFlags& flags,
                                                u64 flag) {
    // Every thread has read the previous outcome before anyone may change it.
    __syncthreads();
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank) {
        const u64* word = signal_word(params.signals[params.rank], kSetStep, peer, blockIdx.x);
        while (load_acquire_system(word) < flag) {
            if (global_timer_ns() > flags.deadline) {
                if (load_acquire_system(word) >= flag) {
                    break;
                }
                record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
                flags.timed_out = 1;
                break;
            }
        }
    }
    // The acquiring loads happen before every thread's later reads of the slots.
    __syncthreads();
    return !flags.timed_out;
}

// Sends step `step` of this block's share: this rank's vectors into slot `rank` of every peer,
// and the tail with the last block's last step; then raises the step's flags.
template <int N>
__device__ __forceinline__ void send_step(const AllReduceParams& params, const SimpleShare& share,
                                          u64 parity, u64 step, u64 flag) {
    const unsigned int rank = params.rank;
    const unsigned char* input = params.input;
    const u64 first = share.begin + step * share.step_vectors;
    Vec16 x[kSimpleStepVectors];
#pragma unroll
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < share.end) {
            x[u] = load_vector(input, v);
        }
    }
#pragma unroll
    for (int k = 1; k < N; ++k) {
        unsigned char* region = params.buffers[(rank + k) % N] + params.scratch_offset;
#pragma unroll
        for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
            const u64 v = first + u * blockDim.x + threadIdx.x;
            if (v < share.end) {
                store_vector(region + double_buffer_offset<N>(v * 16, parity, rank), 0, x[u]);
            }
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                const unsigned short value = load_element(input, e);
#pragma unroll
                for (int k = 1; k < N; ++k) {
                    unsigned char* region = params.buffers[(rank + k) % N] + params.scratch_offset;
                    store_element(region + double_buffer_offset<N>(e * 2, parity, rank), 0, value);
                }
            });
    }
    raise_step_flags<N>(params, flag);
}

// Sums step `step` of this block's share (its flags were awaited) into the output.
template <int N>
__device__ __forceinline__ void sum_step(const AllReduceParams& params, const SimpleShare& share,
                                         u64 parity, u64 step) {
    const unsigned int rank = params.rank;
    const unsigned char* input = params.input;
    const unsigned char* own_region = params.buffers[rank] + params.scratch_offset;
    unsigned char* output = static_cast<unsigned char*>(params.output);
    const u64 first = share.begin + step * share.step_vectors;
#pragma unroll 1
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < share.end) {
            Vec16 x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                x[q] =
                    static_cast<unsigned int>(q) == rank
                        ? load_vector(input, v)
                        : load_vector(own_region + double_buffer_offset<N>(v * 16, parity, q), 0);
            }
            store_vector(output, v, sum_vectors<N>(x));
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                unsigned short x[N];
#pragma unroll
                for (int q = 0; q < N; ++q) {
                    x[q] = static_cast<unsigned int>(q) == rank
                               ? load_element(input, e)
                               : load_element(
                                     own_region + double_buffer_offset<N>(e * 2, parity, q), 0);
                }
                store_element(output, e, sum_elements<N>(x));
            });
    }
}

template <int N>
__device__ void one_shot_push_simple(const AllReduceParams& params, BlockFlags& flags) {
    if (!launch_begin(params, flags)) {
        return;
    }
    const SimpleShare share = simple_share(params.elements);
    const u64 parity = flags.epoch & 1;
    // Steps fit the low 24 bits: a bucket holds at most 4 GiB, 2^28 vectors, and a step at least
    // 32 threads x 4 vectors, so a block never has more than 2^21 steps.
    const u64 flag_base = flags.epoch << 24;
    // Step s is sent, then step s - 1 summed, so the local sum of one step overlaps the
    // transfer of the next.
#pragma unroll 1
    for (u64 step = 0; step <= share.steps; ++step) {
        if (step < share.steps) {
            send_step<N>(params, share, parity, step, flag_base | (step + 1));
        }
        if (step > 0) {
            if (!wait_step_flags<N>(params, flags, flag_base | step)) {
                break;
            }
            sum_step<N>(params, share, parity, step - 1);
        }
    }
    launch_end(params, flags);
}

}  // namespace prepare

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_push_ll_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::one_shot_push_ll, params, flags)
}

// Up to 1024 threads per block (the most a ladder bucket may ask for) must be launchable.
extern "C" __global__ void __launch_bounds__(1024)
    all_reduce_one_shot_push_simple_bf16(AllReduceParams params) {
    if (!prepare::block_launch_is_valid(params)) {
        return;
    }
    __shared__ prepare::BlockFlags flags;
    PREPARE_DISPATCH_WORLD(prepare::one_shot_push_simple, params, flags)
}
