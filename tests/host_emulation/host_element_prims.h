// Host version of prepare_element.cuh's inline-PTX add: x86-64 SSE adds round to nearest even and
// keep subnormals, like add.rn.f32; volatile keeps the compiler from reassociating.
__device__ __forceinline__ float add_round_nearest(float a, float b) {
    volatile float sum = a + b;
    return sum;
}
