// prepare_norm.cuh: the epilogue of all_reduce_add_rms_norm on whole rows, exact to
// prepare::reference::epilogue: the residual add, the row's sum of squares in the pinned order,
// and RMSNorm times the weight. prepare's unfused add_rms_norm kernel and the fused kernels
// (whichever block owns a row) call the same norm, so they give the same bits; the fused kernels
// add the residual as they store their sum (store_fused_sum), the same two roundings as the
// unfused kernel's add on a sum read from memory.
//
// Per element, every step an explicitly rounded fp32 operation (`.rn`: no flag can contract or
// flush it):
//   residual_out = round(x + residual)            (x alone without a residual)
//   r            = float(residual_out)
//   normed       = round((r * inv) * float(weight))
// Per row: inv = 1 / sqrt(ss / (float)hidden + eps), ss the sum of the squares r * r in the
// order of PREPARE_NORM_LANES (prepare_abi.cuh), which depends on the hidden size alone. A
// block computes it as 256 groups of 8 lanes: group g holds lanes 8g..8g+7 and sums, lane by
// lane from +0, the squares of elements 2048 s + 8 g + j for s = 0, 1, ... in increasing order
// (one 16-byte vector of bf16 or fp16, two of fp32, a step), then joins its 8 lanes as the
// tree's first three levels; a warp's butterfly (xor 1, 2, 4, 8, 16, in that order) joins 32
// consecutive groups (the next five levels) into one of 8 parts, and thread 0 joins the 8 parts
// (the last three). Thread t of a block of T threads (any multiple of 32) holds the groups
// t, t + T, ... below 256, so the order is the same for every block size, and each row is one
// block's alone: it does not depend on the rows, the blocks or the grid. Lanes past the row's
// end are +0 and add nothing (a sum of squares is never -0).
//
// Requirements (norm_launch_is_valid): the hidden size (`width`) a multiple of 8 from 8 to
// PREPARE_NORM_MAX_HIDDEN; weight and normed not null; every operand 16-byte aligned; normed not
// overlapping the residual (whose new value would be lost); eps 0 or more; 1-D blocks of a
// multiple of 32 threads, every thread of the block calling add_rms_norm_row (its barriers and
// shuffles are the block's). Each element of a row is read and written by one thread, which
// reads it before it writes it, so normed may be x itself and the residual may be x.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_element.cuh"
#include "prepare_entry.cuh"

// The largest hidden size: every size up to it is an exact f32, so `ss / (float)hidden` is the
// reference's division.
#define PREPARE_NORM_MAX_HIDDEN 16777216ull

namespace prepare {

// Lanes a group holds (one 16-byte vector of bf16 or fp16) and the groups of a row's lanes.
constexpr unsigned int kNormGroupLanes = 8;
constexpr unsigned int kNormGroups = PREPARE_NORM_LANES / kNormGroupLanes;
constexpr unsigned int kWarpThreads = 32;
constexpr unsigned int kNormParts = kNormGroups / kWarpThreads;

__device__ __forceinline__ float mul_round_nearest(float a, float b) {
    float product;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(product) : "f"(a), "f"(b));
    return product;
}

__device__ __forceinline__ float div_round_nearest(float a, float b) {
    float quotient;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(quotient) : "f"(a), "f"(b));
    return quotient;
}

__device__ __forceinline__ float sqrt_round_nearest(float a) {
    float root;
    asm("sqrt.rn.f32 %0, %1;" : "=f"(root) : "f"(a));
    return root;
}

// The value of the warp's thread whose lane index is this one's xor `mask`. Every thread of the
// warp calls it together.
__device__ __forceinline__ float shuffle_xor(float value, unsigned int mask) {
    unsigned int partner;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                 : "=r"(partner)
                 : "r"(__float_as_uint(value)), "r"(mask));
    return __uint_as_float(partner);
}

// ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)): three levels of the pairwise tree.
__device__ __forceinline__ float tree_of_eight(const float (&v)[8]) {
    return add_round_nearest(add_round_nearest(add_round_nearest(v[0], v[1]),
                                               add_round_nearest(v[2], v[3])),
                             add_round_nearest(add_round_nearest(v[4], v[5]),
                                               add_round_nearest(v[6], v[7])));
}

// The pairwise tree of the warp's 32 values, the lowest level first; every thread gets it (the
// two threads of a pair add the same two values).
__device__ __forceinline__ float warp_tree(float value) {
#pragma unroll
    for (unsigned int offset = 1; offset < kWarpThreads; offset <<= 1) {
        value = add_round_nearest(value, shuffle_xor(value, offset));
    }
    return value;
}

// 1 / sqrt(ss / hidden + eps), each operation rounded on its own.
__device__ __forceinline__ float inverse_rms(float sum_of_squares, u64 hidden, float eps) {
    const float mean = div_round_nearest(sum_of_squares, static_cast<float>(hidden));
    return div_round_nearest(1.0f, sqrt_round_nearest(add_round_nearest(mean, eps)));
}

// Eight consecutive elements from element `element` (a multiple of 8) of `base`: their bits.
template <typename T>
__device__ __forceinline__ void load_group(const unsigned char* base, u64 element,
                                           unsigned int (&bits)[8]) {
#pragma unroll
    for (unsigned int v = 0; v < kNormGroupLanes / T::kPerVector; ++v) {
        const Vec16 x = load_vector(base, element / T::kPerVector + v);
#pragma unroll
        for (unsigned int w = 0; w < 4; ++w) {
#pragma unroll
            for (unsigned int j = 0; j < T::kPerWord; ++j) {
                bits[v * T::kPerVector + w * T::kPerWord + j] =
                    T::kPerWord == 1 ? x.word[w] : (x.word[w] >> (16 * j)) & 0xffffu;
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void store_group(unsigned char* base, u64 element,
                                            const unsigned int (&bits)[8]) {
#pragma unroll
    for (unsigned int v = 0; v < kNormGroupLanes / T::kPerVector; ++v) {
        Vec16 x;
#pragma unroll
        for (unsigned int w = 0; w < 4; ++w) {
            unsigned int packed = 0;
#pragma unroll
            for (unsigned int j = 0; j < T::kPerWord; ++j) {
                packed |= bits[v * T::kPerVector + w * T::kPerWord + j] << (16 * j);
            }
            x.word[w] = packed;
        }
        store_vector(base, element / T::kPerVector + v, x);
    }
}

// What the threads of a block share while they normalise a row.
struct NormShared {
    float part[kNormParts];
    float inv;
};

// One row of `hidden` elements, each pointer at the row's first element (`residual` null
// without one): writes residual_out into `residual` and the normalised row into `normed`. Every
// thread of the block calls it with the same row; `shared` is the block's.
template <typename T>
__device__ __forceinline__ void add_rms_norm_row(const unsigned char* x, unsigned char* residual,
                                                 const unsigned char* weight,
                                                 unsigned char* normed, u64 hidden, float eps,
                                                 NormShared& shared) {
    const unsigned int threads = blockDim.x;
    const unsigned int rounds = (kNormGroups + threads - 1) / threads;
    // Where r is read again for the second pass: what this thread wrote, or x itself.
    const unsigned char* rounded = residual != nullptr ? residual : x;
    // Not unrolled: every round has a warp's shuffles and up to hidden / 2048 loads a lane.
#pragma unroll 1
    for (unsigned int round = 0; round < rounds; ++round) {
        const unsigned int group = threadIdx.x + round * threads;
        float part = 0.0f;
        if (group < kNormGroups) {
            float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
            for (u64 e = kNormGroupLanes * group; e < hidden; e += PREPARE_NORM_LANES) {
                unsigned int bits[8];
                load_group<T>(x, e, bits);
                if (residual != nullptr) {
                    unsigned int added[8];
                    load_group<T>(residual, e, added);
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        bits[j] = T::round(
                            add_round_nearest(T::to_float(bits[j]), T::to_float(added[j])));
                    }
                    store_group<T>(residual, e, bits);
                }
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float r = T::to_float(bits[j]);
                    lanes[j] = add_round_nearest(lanes[j], mul_round_nearest(r, r));
                }
            }
            part = tree_of_eight(lanes);
        }
        // Threads past the last group take part in the shuffles with nothing of their own.
        part = warp_tree(part);
        if (group < kNormGroups && group % kWarpThreads == 0) {
            shared.part[group / kWarpThreads] = part;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        shared.inv = inverse_rms(tree_of_eight(shared.part), hidden, eps);
    }
    __syncthreads();
    const float inv = shared.inv;
#pragma unroll 1
    for (unsigned int group = threadIdx.x; group < kNormGroups; group += threads) {
#pragma unroll 1
        for (u64 e = kNormGroupLanes * group; e < hidden; e += PREPARE_NORM_LANES) {
            unsigned int bits[8];
            unsigned int scale[8];
            load_group<T>(rounded, e, bits);
            load_group<T>(weight, e, scale);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float scaled = mul_round_nearest(T::to_float(bits[j]), inv);
                bits[j] = T::round(mul_round_nearest(scaled, T::to_float(scale[j])));
            }
            store_group<T>(normed, e, bits);
        }
    }
    // The next row's parts and inverse are written only after every thread passes its first
    // barrier, once every thread has read this row's.
}

__device__ __forceinline__ bool ranges_overlap(const void* a, const void* b, u64 bytes) {
    const u64 first = reinterpret_cast<u64>(a);
    const u64 second = reinterpret_cast<u64>(b);
    return first < second + bytes && second < first + bytes;
}

// The epilogue's own launch checks, for a message of params.rows x params.width (the hidden
// size) of T: see the requirements above. Every thread computes the same answer.
template <typename T>
__device__ __forceinline__ bool norm_launch_is_valid(const LaunchParams& params) {
    const u64 hidden = params.width;
    if (hidden == 0 || hidden % kNormGroupLanes != 0 || hidden > PREPARE_NORM_MAX_HIDDEN) {
        return false;
    }
    const u64 row_bytes = hidden * sizeof(typename T::Bits);
    if (params.rows > ~0ull / row_bytes) {
        return false;
    }
    // Not `eps < 0`: NaN is refused too.
    if (!(params.eps >= 0.0f) || params.weight == nullptr || params.normed == nullptr) {
        return false;
    }
    const u64 addresses = reinterpret_cast<u64>(params.weight) |
                          reinterpret_cast<u64>(params.normed) |
                          reinterpret_cast<u64>(params.residual);
    if (addresses % PREPARE_ALIGNMENT_BYTES != 0) {
        return false;
    }
    if (params.residual != nullptr &&
        ranges_overlap(params.normed, params.residual, params.rows * row_bytes)) {
        return false;
    }
    return blockDim.x % kWarpThreads == 0 && blockDim.x != 0;
}

// The epilogue of row `row` of the message, from `sum` (rows x width, the all-reduce's rounded
// sum) and the launch's residual, weight, normed and eps. Every thread of the block calls it.
template <typename T>
__device__ __forceinline__ void add_rms_norm_of_row(const LaunchParams& params,
                                                    const unsigned char* sum, u64 row,
                                                    NormShared& shared) {
    const u64 offset = row * params.width * sizeof(typename T::Bits);
    unsigned char* residual = static_cast<unsigned char*>(params.residual);
    add_rms_norm_row<T>(sum + offset, residual != nullptr ? residual + offset : nullptr,
                        static_cast<const unsigned char*>(params.weight),
                        static_cast<unsigned char*>(params.normed) + offset, params.width,
                        params.eps, shared);
}

// The residual add of a fused kernel, on a vector's rank-ordered fp32 sums (VectorSum, not yet
// rounded): each lane's sum rounded once to T, as the all-reduce's, then the residual's lane
// added in fp32 and rounded once: residual_out, the bits add_rms_norm_row gives from that
// rounded sum.
template <typename T>
__device__ __forceinline__ Vec16 add_residual(const VectorSum<T>& sums, const Vec16& residual) {
    VectorSum<T> added;
#pragma unroll
    for (unsigned int i = 0; i < 4 * T::kPerWord; ++i) {
        added.lane[i] = T::rounded(sums.lane[i]);
    }
    added.add(residual);
    return added.result();
}

// Where a fused kernel puts vector v of its message's sums: with a residual, residual_out into
// the residual (its vector v read first, by the same thread); without, the rounded sum into
// `normed`, its space for the sum. Then fused_norm_of_row normalises the row from there.
template <typename T>
__device__ __forceinline__ void store_fused_sum(const LaunchParams& params, u64 v,
                                                const VectorSum<T>& sums) {
    if (params.residual != nullptr) {
        unsigned char* residual = static_cast<unsigned char*>(params.residual);
        store_vector(residual, v, add_residual<T>(sums, load_vector(residual, v)));
    } else {
        store_vector(static_cast<unsigned char*>(params.normed), v, sums.result());
    }
}

// The norm of row `row` of a fused kernel once store_fused_sum wrote it: from residual_out (or
// the sum without a residual), which needs no residual added, into `normed`. Every thread of
// the block calls it.
template <typename T>
__device__ __forceinline__ void fused_norm_of_row(const LaunchParams& params, u64 row,
                                                  NormShared& shared) {
    const u64 offset = row * params.width * sizeof(typename T::Bits);
    const void* rows = params.residual != nullptr ? params.residual : params.normed;
    add_rms_norm_row<T>(static_cast<const unsigned char*>(rows) + offset, nullptr,
                        static_cast<const unsigned char*>(params.weight),
                        static_cast<unsigned char*>(params.normed) + offset, params.width,
                        params.eps, shared);
}

// The epilogue of every row of the message, a block per row at a time (block b takes rows b,
// b + blocks, ...), from `sum`.
template <typename T>
__device__ __forceinline__ void add_rms_norm_rows(const LaunchParams& params,
                                                  const unsigned char* sum, NormShared& shared) {
#pragma unroll 1
    for (u64 row = blockIdx.x; row < params.rows; row += gridDim.x) {
        add_rms_norm_of_row<T>(params, sum, row, shared);
    }
}

// The rows block b of the grid owns in a fused kernel: a contiguous run, rows / blocks each and
// one more for the first rows % blocks blocks, so a block may own none.
struct BlockRows {
    u64 first;
    u64 end;
};

__device__ __forceinline__ BlockRows block_rows(u64 rows) {
    const u64 each = rows / gridDim.x;
    const u64 more = rows % gridDim.x;
    const u64 block = blockIdx.x;
    const u64 first = block * each + (block < more ? block : more);
    return {first, first + each + (block < more ? 1 : 0)};
}

// A fused kernel's checks (all_reduce_add_rms_norm): every kernel's (launch_is_valid), the
// epilogue's (norm_launch_is_valid), the message rows x width elements on both sides, and the
// sum's place the launch's `normed` (`output` is `normed`).
struct EpilogueChecks {
    template <typename T, int N>
    __device__ __forceinline__ static bool valid(const LaunchParams& params) {
        // The epilogue's checks first: they bound rows x width.
        return norm_launch_is_valid<T>(params) && launch_is_valid<T, N>(params, gridDim.x) &&
               params.input_elements == params.rows * params.width &&
               params.output_elements == params.input_elements &&
               params.output == params.normed;
    }
};

// The body of a fused kernel's entry: block_kernel with the epilogue's checks.
template <typename Algorithm, typename T, int N>
__device__ __forceinline__ void fused_kernel(const LaunchParams& params) {
    block_kernel<Algorithm, T, N, EpilogueChecks>(params);
}

}  // namespace prepare
