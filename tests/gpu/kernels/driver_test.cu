// driver_test.cu: small kernels that exercise the driver layer on real GPUs, each taking the
// launch contract's LaunchParams (prepended from kernels/prepare_abi.cuh by the test).
//
//   driver_pull_push        ordinary: reads every rank's input through peer pointers (u32 sums)
//                           and writes a rank stamp into the next rank's scratch region
//   driver_cluster_exchange cluster kernel: distributed shared memory between the blocks of an
//                           8-block cluster, behind cluster barriers
//   driver_flag_exchange    one thread per rank: epoch in state[1], release/acquire flags to and
//                           from every peer, bounded by timeout_ns, sticky abort in state[0]
//   driver_two_parameters, driver_small_parameter, driver_no_parameters: signatures the launch
//                           layer must refuse

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u64 global_timer() {
    u64 now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

__device__ __forceinline__ u64 load_acquire(const u64* address) {
    u64 value;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
    return value;
}

__device__ __forceinline__ void store_release(u64* address, u64 value) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

extern "C" __global__ void driver_pull_push(LaunchParams p) {
    const u32* inputs[PREPARE_MAX_RANKS];
    for (u32 r = 0; r < p.world; ++r) inputs[r] = (const u32*)p.buffers[r];
    u32* output = (u32*)p.output;
    u32* next_scratch = (u32*)(p.buffers[(p.rank + 1) % p.world] + p.scratch_offset);
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < p.input_elements; i += stride) {
        u32 sum = 0;
        for (u32 r = 0; r < p.world; ++r) sum += inputs[r][i];
        output[i] = sum;
        next_scratch[i] = (p.rank << 24) ^ (u32)i;
    }
}

extern "C" __global__ void driver_cluster_exchange(LaunchParams p) {
    __shared__ u32 slot[1024];
    u32 rank_in_cluster, cluster_blocks;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank_in_cluster));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster_blocks));
    slot[threadIdx.x] = rank_in_cluster * 100000u + threadIdx.x;
    cluster_sync();
    u32 neighbour = (rank_in_cluster + 1) % cluster_blocks;
    u32 local, remote, value;
    asm volatile("{ .reg .u64 generic; cvta.to.shared.u64 generic, %1; cvt.u32.u64 %0, generic; }"
                 : "=r"(local)
                 : "l"(&slot[threadIdx.x]));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(neighbour));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
    // No block may leave while a neighbour still reads its shared memory.
    cluster_sync();
    ((u32*)p.output)[(u64)blockIdx.x * blockDim.x + threadIdx.x] = value + cluster_blocks * 10000000u;
}

extern "C" __global__ void driver_flag_exchange(LaunchParams p) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64* state = p.state;
    if (state[0] != 0) return;
    u64 epoch = state[1] + 1;
    state[1] = epoch;
    // signals[set 0][source rank][block 0] in each peer's flags.
    for (u32 peer = 0; peer < p.world; ++peer) {
        if (peer == p.rank) continue;
        store_release(p.signals[peer] + (u64)p.rank * PREPARE_MAX_BLOCKS, epoch);
    }
    u64 start = global_timer();
    for (u32 peer = 0; peer < p.world; ++peer) {
        if (peer == p.rank) continue;
        const u64* flag = p.signals[p.rank] + (u64)peer * PREPARE_MAX_BLOCKS;
        while (load_acquire(flag) < epoch) {
            if (global_timer() - start > p.timeout_ns) {
                state[0] = PREPARE_ABORT_FLAG | (PREPARE_ABORT_PEER_TIMEOUT << 32) | peer;
                return;
            }
        }
    }
    ((u64*)p.output)[0] = epoch;
}

extern "C" __global__ void driver_two_parameters(int a, int b) {}
extern "C" __global__ void driver_small_parameter(int a) {}
extern "C" __global__ void driver_no_parameters() {}
