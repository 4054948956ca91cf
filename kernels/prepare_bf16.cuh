// prepare_bf16.cuh: bf16 as raw bits and the exact reduction every custom kernel performs.
//
// The reduction of one element over N ranks is, in this order and nothing else:
//   acc = float(x[0]); acc += float(x[1]); ...; acc += float(x[N-1]);  (fp32, nearest even)
//   result = bf16(acc);                                                 (once, nearest even)
// Starting from rank 0's value (not 0.0) keeps -0; additions are explicit `add.rn.f32` (no FTZ,
// no contraction, whatever the compile flags); a NaN result becomes the canonical 0x7FFF. The
// host mirror is `prepare::reference::reference_sum_bf16`; the two must agree bit for bit.
#pragma once

namespace prepare {

typedef unsigned long long u64;

// Eight bf16 values, the unit every kernel moves: one 16-byte load or store.
struct alignas(16) Vec16 {
    unsigned int word[4];
};

__device__ __forceinline__ float bf16_bits_to_float(unsigned int bits) {
    return __uint_as_float(bits << 16);
}

// Round to nearest even; NaN becomes the canonical quiet NaN; overflow rounds to infinity.
__device__ __forceinline__ unsigned int float_to_bf16_bits(float value) {
    const unsigned int bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fffu;
    }
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ float add_round_nearest(float a, float b) {
    float sum;
    // Spelled out so no flag (fast math, -ftz) can flush subnormals or fuse anything.
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
}

// Sum of one bf16 from each of N ranks, in rank order.
template <int N>
__device__ __forceinline__ unsigned short sum_elements(const unsigned short (&x)[N]) {
    float acc = bf16_bits_to_float(x[0]);
#pragma unroll
    for (int q = 1; q < N; ++q) {
        acc = add_round_nearest(acc, bf16_bits_to_float(x[q]));
    }
    return static_cast<unsigned short>(float_to_bf16_bits(acc));
}

// Sum of eight bf16 lanes from each of N ranks, lane by lane in rank order.
template <int N>
__device__ __forceinline__ Vec16 sum_vectors(const Vec16 (&x)[N]) {
    Vec16 out;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        // Little endian: the low half of a word is the lower-addressed element.
        float low = bf16_bits_to_float(x[0].word[w] & 0xffffu);
        float high = __uint_as_float(x[0].word[w] & 0xffff0000u);
#pragma unroll
        for (int q = 1; q < N; ++q) {
            low = add_round_nearest(low, bf16_bits_to_float(x[q].word[w] & 0xffffu));
            high = add_round_nearest(high, __uint_as_float(x[q].word[w] & 0xffff0000u));
        }
        out.word[w] = float_to_bf16_bits(low) | (float_to_bf16_bits(high) << 16);
    }
    return out;
}

__device__ __forceinline__ Vec16 load_vector(const unsigned char* base, u64 vector) {
    return reinterpret_cast<const Vec16*>(base)[vector];
}

__device__ __forceinline__ void store_vector(unsigned char* base, u64 vector, const Vec16& value) {
    reinterpret_cast<Vec16*>(base)[vector] = value;
}

__device__ __forceinline__ unsigned short load_element(const unsigned char* base, u64 element) {
    return reinterpret_cast<const unsigned short*>(base)[element];
}

__device__ __forceinline__ void store_element(unsigned char* base, u64 element,
                                              unsigned short value) {
    reinterpret_cast<unsigned short*>(base)[element] = value;
}

}  // namespace prepare
