// Host version of prepare_element.cuh's inline-PTX add: x86-64 SSE adds round to nearest even and
// keep subnormals, like add.rn.f32; volatile keeps the compiler from reassociating.
__device__ __forceinline__ float add_round_nearest(float a, float b) {
    volatile float sum = a + b;
    return sum;
}

// Host versions of prepare_element.cuh's fp16 conversions (cvt.f32.f16, cvt.rn.f16.f32), in bit
// arithmetic: exact to fp32; back to nearest even, subnormals kept, overflow to infinity.
__device__ __forceinline__ float fp16_bits_to_float(unsigned int bits) {
    const unsigned int sign = (bits & 0x8000u) << 16;
    const unsigned int exponent = (bits >> 10) & 0x1fu;
    const unsigned int mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent != 0) {
        return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    }
    // Zero or subnormal: mantissa x 2^-24, exact in fp32 (an integer below 2^10 times a
    // power of two whose product is a normal fp32).
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return __uint_as_float(sign | __float_as_uint(magnitude));
}

// Nearest even, subnormals kept; past the largest fp16 (65504) by half an ulp or more it is
// infinity, as IEEE conversion does; NaN becomes 0x7FFF.
__device__ __forceinline__ unsigned int float_to_fp16_bits(float value) {
    const unsigned int bits = __float_as_uint(value);
    const unsigned int sign = (bits >> 16) & 0x8000u;
    const unsigned int magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return 0x7fffu;
    }
    if (magnitude >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (magnitude >= 0x38800000u) {
        // A normal fp16: rebias the exponent (127 - 15 = 112), then round the 13 bits that
        // go, as bf16 does with 16.
        const unsigned int rebased = magnitude - 0x38000000u;
        return sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13);
    }
    if (magnitude <= 0x33000000u) {
        // At most half the smallest subnormal (2^-25): a tie goes to the even zero.
        return sign;
    }
    // A subnormal fp16, in units of 2^-24: the significand shifted right by 14 to 24 bits.
    const unsigned int shift = 126u - (magnitude >> 23);
    const unsigned int significand = (magnitude & 0x7fffffu) | 0x800000u;
    const unsigned int kept = significand >> shift;
    const unsigned int rest = significand & ((1u << shift) - 1u);
    const unsigned int half = 1u << (shift - 1u);
    return sign | (kept + ((rest > half || (rest == half && (kept & 1u) != 0)) ? 1u : 0u));
}
