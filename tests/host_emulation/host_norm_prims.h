// Host versions of prepare_norm.cuh's inline-PTX arithmetic and warp shuffle. x86-64 SSE
// multiplies, divides and takes square roots rounded to nearest even, keeping subnormals, like
// mul.rn, div.rn and sqrt.rn; volatile keeps the compiler from contracting or reassociating.
__device__ __forceinline__ float mul_round_nearest(float a, float b) {
    volatile float product = a * b;
    return product;
}
__device__ __forceinline__ float div_round_nearest(float a, float b) {
    volatile float quotient = a / b;
    return quotient;
}
__device__ __forceinline__ float sqrt_round_nearest(float a) {
    volatile float root = __builtin_sqrtf(a);
    return root;
}
// Through the block's exchange, one block barrier a call: every thread of the block calls it
// together (add_rms_norm_row does), where the GPU needs only the warp. Calls alternate between
// two halves, so a thread writes a half again only after every thread has passed the barrier
// of the call between, after reading it. The count is the block's (every thread of a block
// makes the same calls), not the OS thread's, which ran other blocks before with other counts.
__device__ __forceinline__ float shuffle_xor(float value, unsigned int mask) {
    float* half = emu_block->exchange[emu_block->shuffles[threadIdx.x]++ % 2];
    half[threadIdx.x] = value;
    __syncthreads();
    return half[threadIdx.x ^ mask];
}
