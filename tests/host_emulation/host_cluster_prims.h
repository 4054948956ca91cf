// Host versions of prepare_cluster.cuh's inline-PTX primitives.
__device__ __forceinline__ unsigned int cluster_cta_rank() {
    return emu_block->cta;
}
__device__ __forceinline__ unsigned int cluster_cta_count() {
    return emu_block->ctas;
}
__device__ __forceinline__ unsigned int cluster_index() {
    return emu_block->cluster;
}
__device__ __forceinline__ void cluster_sync() {
    emu_block->cluster_barrier->arrive_and_wait();
}
__device__ __forceinline__ void store_cluster_shared(const int* local, unsigned int cta,
                                                     int value) {
    const long offset = reinterpret_cast<const unsigned char*>(local) - &emu_block->shared[0][0];
    if (offset < 0 || offset >= static_cast<long>(sizeof emu_block->shared)) {
        std::abort();
    }
    *reinterpret_cast<int*>(&emu_block->cluster_blocks[cta]->shared[0][0] + offset) = value;
}
