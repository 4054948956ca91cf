// prepare_element.cuh: the element types as raw bits, and the exact reduction every custom
// kernel performs.
//
// The reduction of one element over N ranks is, in this order and nothing else:
//   acc = float(x[0]); acc += float(x[1]); ...; acc += float(x[N-1]);  (fp32, nearest even)
//   result = T(acc);                     (bf16 and fp16: once, to nearest even; fp32: as is)
// Starting from rank 0's value (not 0.0) keeps -0; additions are explicit `add.rn.f32` (no FTZ,
// no contraction, whatever the compile flags); subnormals are kept and overflow gives infinity.
// A NaN result becomes the type's canonical NaN: 0x7FFF (bf16), 0x7FFF (fp16), 0x7FFFFFFF
// (fp32). The host mirror is `prepare::reference`; the two must agree bit for bit.
//
// Each element type gives its bits (`Bits`), how many fill a 32-bit word and a 16-byte vector,
// the fp32 value of lane j of a word, and the rounding of an fp32 sum back to its bits. bf16's
// conversions are bit arithmetic; fp16's are the hardware's `cvt` (the host emulation replaces
// them, as it does every other line of PTX).
#pragma once

namespace prepare {

typedef unsigned long long u64;

// The unit every kernel moves: one 16-byte load or store (8 bf16 or fp16, or 4 fp32 values).
struct alignas(16) Vec16 {
    unsigned int word[4];
};

__device__ __forceinline__ float add_round_nearest(float a, float b) {
    float sum;
    // Spelled out so no flag (fast math, -ftz) can flush subnormals or fuse anything.
    asm("add.rn.f32 %0, %1, %2;" : "=f"(sum) : "f"(a), "f"(b));
    return sum;
}

// What bf16 and fp16 share: 16-bit elements, two to a word and eight to a vector; lane 0 of a
// word is its low half (the lower-addressed element, little endian).
template <typename Type>
struct Half {
    typedef unsigned short Bits;
    static constexpr unsigned int kPerWord = 2;
    static constexpr unsigned int kPerVector = 8;

    __device__ __forceinline__ static float lane(unsigned int word, unsigned int j) {
        return Type::to_float(j == 0 ? word & 0xffffu : word >> 16);
    }
    // The value of an fp32 sum once rounded to the type.
    __device__ __forceinline__ static float rounded(float value) {
        return Type::to_float(Type::round(value));
    }
};

// bfloat16: the upper half of an fp32.
struct Bf16 : Half<Bf16> {
    __device__ __forceinline__ static float to_float(unsigned int bits) {
        return __uint_as_float(bits << 16);
    }
    // Nearest even; NaN becomes 0x7FFF; overflow rounds to infinity.
    __device__ __forceinline__ static unsigned int round(float value) {
        const unsigned int bits = __float_as_uint(value);
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            return 0x7fffu;
        }
        return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    }
};

// fp16 to fp32 and back by the hardware's conversions: exact one way; to nearest even the other,
// subnormals kept and infinity past the largest fp16 (65504) by half an ulp or more, as IEEE
// conversion does (no .ftz, no .satfinite).
__device__ __forceinline__ float fp16_bits_to_float(unsigned int bits) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(static_cast<unsigned short>(bits)));
    return value;
}

__device__ __forceinline__ unsigned int float_to_fp16_bits(float value) {
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
}

// IEEE binary16.
struct Fp16 : Half<Fp16> {
    __device__ __forceinline__ static float to_float(unsigned int bits) {
        return fp16_bits_to_float(bits);
    }
    // Nearest even, subnormals kept, overflow to infinity; NaN becomes 0x7FFF.
    __device__ __forceinline__ static unsigned int round(float value) {
        const unsigned int bits = __float_as_uint(value);
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            return 0x7fffu;
        }
        return float_to_fp16_bits(value);
    }
};

// IEEE binary32: the sum is the result.
struct Fp32 {
    typedef unsigned int Bits;
    static constexpr unsigned int kPerWord = 1;
    static constexpr unsigned int kPerVector = 4;

    __device__ __forceinline__ static float to_float(unsigned int bits) {
        return __uint_as_float(bits);
    }
    __device__ __forceinline__ static float lane(unsigned int word, unsigned int) {
        return __uint_as_float(word);
    }
    // No rounding; NaN becomes 0x7FFFFFFF.
    __device__ __forceinline__ static unsigned int round(float value) {
        const unsigned int bits = __float_as_uint(value);
        return (bits & 0x7fffffffu) > 0x7f800000u ? 0x7fffffffu : bits;
    }
    // The sum itself: a NaN's payload is left to the rounding of whatever it is added to, which
    // makes every NaN the canonical one.
    __device__ __forceinline__ static float rounded(float value) {
        return value;
    }
};

// The rank-ordered sum of one element from each of N ranks, rank q's taken from source(q):
// the one element summing loop of every kernel.
template <typename T, int N, typename Source>
__device__ __forceinline__ typename T::Bits sum_elements_from(Source source) {
    float acc = T::to_float(source(0));
#pragma unroll
    for (int q = 1; q < N; ++q) {
        acc = add_round_nearest(acc, T::to_float(source(q)));
    }
    return static_cast<typename T::Bits>(T::round(acc));
}

// The fp32 sums of a vector's lanes, one rank at a time.
template <typename T>
struct VectorSum {
    float lane[4 * T::kPerWord];

    __device__ __forceinline__ void start(const Vec16& x) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
            for (unsigned int j = 0; j < T::kPerWord; ++j) {
                lane[w * T::kPerWord + j] = T::lane(x.word[w], j);
            }
        }
    }

    __device__ __forceinline__ void add(const Vec16& x) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
            for (unsigned int j = 0; j < T::kPerWord; ++j) {
                lane[w * T::kPerWord + j] =
                    add_round_nearest(lane[w * T::kPerWord + j], T::lane(x.word[w], j));
            }
        }
    }

    __device__ __forceinline__ Vec16 result() const {
        Vec16 out;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            unsigned int packed = 0;
#pragma unroll
            for (unsigned int j = 0; j < T::kPerWord; ++j) {
                packed |= T::round(lane[w * T::kPerWord + j]) << (j * 16);
            }
            out.word[w] = packed;
        }
        return out;
    }
};

// The rank-ordered fp32 sums of a vector from each of N ranks, lane by lane, rank q's taken
// from source(q), not yet rounded: the one vector summing loop of every kernel.
template <typename T, int N, typename Source>
__device__ __forceinline__ VectorSum<T> sum_lanes_from(Source source) {
    VectorSum<T> acc;
    acc.start(source(0));
#pragma unroll
    for (int q = 1; q < N; ++q) {
        acc.add(source(q));
    }
    return acc;
}

// The same sums, rounded once.
template <typename T, int N, typename Source>
__device__ __forceinline__ Vec16 sum_vectors_from(Source source) {
    return sum_lanes_from<T, N>(source).result();
}

// Sum of one element from each of N ranks, in rank order.
template <typename T, int N>
__device__ __forceinline__ typename T::Bits sum_elements(const typename T::Bits (&x)[N]) {
    return sum_elements_from<T, N>([&](int q) { return x[q]; });
}

// The fp32 sums of a vector from each of N ranks, lane by lane in rank order, not yet rounded.
template <typename T, int N>
__device__ __forceinline__ VectorSum<T> sum_lanes(const Vec16 (&x)[N]) {
    return sum_lanes_from<T, N>([&](int q) { return x[q]; });
}

// Sum of a vector from each of N ranks, lane by lane in rank order.
template <typename T, int N>
__device__ __forceinline__ Vec16 sum_vectors(const Vec16 (&x)[N]) {
    return sum_lanes<T, N>(x).result();
}

__device__ __forceinline__ Vec16 load_vector(const unsigned char* base, u64 vector) {
    return reinterpret_cast<const Vec16*>(base)[vector];
}

__device__ __forceinline__ void store_vector(unsigned char* base, u64 vector, const Vec16& value) {
    reinterpret_cast<Vec16*>(base)[vector] = value;
}

template <typename T>
__device__ __forceinline__ typename T::Bits load_element(const unsigned char* base, u64 element) {
    return reinterpret_cast<const typename T::Bits*>(base)[element];
}

template <typename T>
__device__ __forceinline__ void store_element(unsigned char* base, u64 element,
                                              typename T::Bits value) {
    reinterpret_cast<typename T::Bits*>(base)[element] = value;
}

}  // namespace prepare
