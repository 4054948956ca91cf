// all_reduce_one_shot_double_buffered.cu: one-shot push all-reduce with no barrier.
//
// Both kernels write this rank's input into its peer slot of every peer's scratch and wait only
// for what the peers write into this rank's slots; there is no start or end barrier
// (prepare_double_buffer.cuh says why that is safe). Every rank sums its own input and the
// slots in rank order, so all write the same bytes.
//
// Entries (each takes LaunchParams by value; `<dtype>` is the package's, P its elements per
// 16-byte vector: 8 for bf16 and fp16, 4 for fp32):
//   all_reduce_one_shot_push_ll_<dtype>  flags in the data (the ll lines of
//       prepare_double_buffer.cuh): a vector takes two lines and each tail element one. Each
//       block takes an equal share of the vectors (the last also the tail), so even a small
//       message spreads over every block. A message of E elements takes 2 * (E / P) + E % P
//       lines (one if empty), so a region for messages up to E is sized for
//       2 * (E / P) + P - 1: 2 * (world - 1) * round_up(16 * that, 8 KiB) bytes.
//   all_reduce_one_shot_push_simple_<dtype>  data then a flag: block b moves its share of the
//       message in steps of 4 vectors per thread; after each step one thread per peer raises
//       that peer's step flag for (this rank, block b) to (launch << 24) | step + 1 with
//       st.release.sys, and the peer's block b waits until the flag reaches that value. A block
//       sends step s, then sums step s - 1, so its local sums overlap its transfers. Scratch:
//       2 * (world - 1) * round_up(round_up(elements * sizeof(T), 16), 8 KiB).
// Requirements: the world size it was compiled for; any element count; 1..1024 blocks of a
// multiple of 32 threads, all resident at once; no cluster instructions, so a launch with
// cluster dimensions is fine; the pointers and scratch_offset 16-byte aligned; the scratch
// zeroed before the first launch and used by no other kernel. Each reads its own message from
// `input`, and every output element is written by the thread that read it, after reading it, so
// the output may be the input (in place) but no scratch region.
#include "prepare_double_buffer.cuh"
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// Block b's part of the message in the ll protocol: an equal share of whole vectors (the last
// block also the tail), so a small message spreads over every block's multiprocessor.
template <typename T>
__device__ __forceinline__ Range block_share(u64 elements) {
    const u64 vectors = whole_vectors<T>(elements);
    const u64 equal = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 begin = min_u64(blockIdx.x * equal, vectors);
    const bool last = blockIdx.x == gridDim.x - 1;
    return {begin, last ? vectors : min_u64(begin + equal, vectors),
            last ? vectors * T::kPerVector : 0, last ? elements : 0};
}

struct OneShotPushLl : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const unsigned int rank = params.rank;
        const u64 parity = flags.epoch & 1;
        const unsigned int flag = line_flag(flags.epoch);
        const u64 elements = params.input_elements;
        // An empty message still sends one (empty) tail line, so this launch hears from every
        // peer.
        const Range message = block_share<T>(elements == 0 ? 1 : elements);
        // Lines 2v and 2v+1 carry vector v; tail element e follows at
        // 2 * vectors + e - P * vectors.
        const u64 vectors = whole_vectors<T>(elements == 0 ? 1 : elements);
        const u64 tail_line = 2 * vectors - T::kPerVector * vectors;
        const Workers workers = {threadIdx.x, blockDim.x};
        const unsigned char* input = params.input;
        unsigned char* output = static_cast<unsigned char*>(params.output);
        send_owned<N>(
            params, params.scratch_offset, message, workers,
            [&](u64 v) { return load_vector(input, v); },
            [&](u64 e) { return e < elements ? load_element<T>(input, e) : 0u; },
            [&](const PeerSlot& peer, u64 v, const Vec16& x) {
                send_vector_lines<N>(peer.region, v, parity, peer.slot, x, flag);
            },
            [&](const PeerSlot& peer, u64 e, unsigned int value) {
                send_word_line<N>(peer.region, tail_line + e, parity, peer.slot, value, flag);
            });
        bool received = true;
        for_each_owned(
            message, workers,
            [&](u64 v) {
                // Every rank's part received before the sum up to four ranks; beyond, each rank's
                // part is summed as it arrives, which keeps the registers to one vector.
                const auto part = [&](int q) {
                    Vec16 x = {};
                    if (static_cast<unsigned int>(q) == rank) {
                        x = load_vector(input, v);
                    } else {
                        received = received && receive_lines<N, 2>(params, flags, 2 * v, parity,
                                                                   q, flag, x.word);
                    }
                    return x;
                };
                Vec16 sum;
                if constexpr (N <= 4) {
                    Vec16 x[N];
#pragma unroll
                    for (int q = 0; q < N; ++q) {
                        x[q] = part(q);
                    }
                    sum = sum_vectors<T, N>(x);
                } else {
                    sum = sum_vectors_from<T, N>(part);
                }
                if (received) {
                    store_vector(output, v, sum);
                }
            },
            [&](u64 e) {
                // Every rank's element received (each line exactly once) before the sum.
                typename T::Bits x[N];
#pragma unroll
                for (int q = 0; q < N; ++q) {
                    unsigned int data[2] = {0, 0};
                    if (static_cast<unsigned int>(q) == rank) {
                        data[0] = e < elements ? load_element<T>(input, e) : 0u;
                    } else {
                        received = received && receive_lines<N, 1>(params, flags, tail_line + e,
                                                                   parity, q, flag, data);
                    }
                    x[q] = static_cast<typename T::Bits>(data[0]);
                }
                if (received && e < elements) {
                    store_element<T>(output, e, sum_elements<T, N>(x));
                }
            });
        launch_end(params, flags);
    }
};

// Sends step `step` of this block's share: this rank's vectors into its peer slot of every peer
// (slot_at_distance), and the tail with the last block's last step; then raises the step's
// flags.
template <typename T, int N>
__device__ __forceinline__ void send_step(const LaunchParams& params, const SimpleShare& share,
                                          u64 parity, u64 step, u64 flag) {
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
        const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
#pragma unroll
        for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
            const u64 v = first + u * blockDim.x + threadIdx.x;
            if (v < share.end) {
                store_vector(slot_byte<N>(peer.region, v * 16, parity, peer.slot), 0, x[u]);
            }
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                const typename T::Bits value = load_element<T>(input, e);
#pragma unroll
                for (int k = 1; k < N; ++k) {
                    const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
                    store_element<T>(
                        slot_byte<N>(peer.region, e * sizeof(typename T::Bits), parity, peer.slot),
                        0, value);
                }
            });
    }
    raise_step_flags<N>(params, kSetStep, flag);
}

// Sums step `step` of this block's share (its flags were awaited) into the output.
template <typename T, int N>
__device__ __forceinline__ void sum_step(const LaunchParams& params, const SimpleShare& share,
                                         u64 parity, u64 step) {
    unsigned char* output = static_cast<unsigned char*>(params.output);
    const u64 first = share.begin + step * share.step_vectors;
#pragma unroll 1
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < share.end) {
            store_vector(output, v, sum_received_vector<T, N>(params, parity, v, v * 16));
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                store_element<T>(output, e,
                                 sum_received_element<T, N>(params, parity, e,
                                                            e * sizeof(typename T::Bits)));
            });
    }
}

struct OneShotPushSimple : LaunchCounter {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params, BlockFlags& flags) {
        const SimpleShare share = simple_share<T>(params.input_elements);
        const u64 parity = flags.epoch & 1;
        // Steps fit the low 24 bits: a bucket holds at most 4 GiB, 2^28 vectors, and a step at
        // least 32 threads x 4 vectors, so a block never has more than 2^21 steps.
        const u64 flag_base = flags.epoch << 24;
        // Step s is sent, then step s - 1 summed, so the local sum of one step overlaps the
        // transfer of the next.
#pragma unroll 1
        for (u64 step = 0; step <= share.steps; ++step) {
            if (step < share.steps) {
                send_step<T, N>(params, share, parity, step, flag_base | (step + 1));
            }
            if (step > 0) {
                if (!wait_step_flags<N>(params, flags, kSetStep, flag_base | step)) {
                    break;
                }
                sum_step<T, N>(params, share, parity, step - 1);
            }
        }
        launch_end(params, flags);
    }
};

}  // namespace prepare

PREPARE_ENTRY(all_reduce_one_shot_push_ll, block_kernel, prepare::OneShotPushLl)
PREPARE_ENTRY(all_reduce_one_shot_push_simple, block_kernel, prepare::OneShotPushSimple)
