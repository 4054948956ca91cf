// nccl_rank_order_sum.cu: the local sum of the exact NCCL all-reduce.
//
// The host cuts the message into the RSAG's slices (slice_of in prepare_layout.cuh) and sends
// slice s of every rank's message to rank s with grouped ncclSend/ncclRecv, so this rank holds
// N slots of slot_bytes(elements) bytes, slot q rank q's copy of this rank's slice from the
// slice's first element. This kernel writes the rank-order sum of the slots (the reference sum,
// prepare_element.cuh) and the host all-gathers the sums with ncclAllGather.
//
// Entry (takes LaunchParams by value; `<dtype>` is the package's):
//   nccl_rank_order_sum_<dtype>  reads `input` (the N slots, slot q at q * slot_bytes(elements))
//       and writes this rank's slice of the sum to `output`, indexed from the slice's first
//       element. Fields read: input, output, elements (the whole message), rank, world, and
//       state when it is not null (an invalid launch records its code there; between hosts
//       there is no state buffer).
// Requirements: the world size it was compiled for; any element count; any grid of 1-D blocks
// (no flags, no spin: it waits for no peer, touches no peer memory and may run between hosts);
// input and output 16-byte aligned. Each output element is written by the thread that read it
// from every slot, after reading it, so the output may be this rank's own slot (in place).
#include "prepare_entry.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// The body of a kernel that only reads and writes local memory.
template <typename Algorithm, typename T, int N>
__device__ __forceinline__ void local_kernel(const LaunchParams& params) {
    wait_for_previous_grid();
    allow_next_grid();
    const u64 addresses = reinterpret_cast<u64>(params.input) |
                          reinterpret_cast<u64>(params.output);
    const bool valid = params.world == N && params.rank < params.world &&
                       params.input != nullptr && params.output != nullptr &&
                       addresses % PREPARE_ALIGNMENT_BYTES == 0 && blockDim.y == 1 &&
                       blockDim.z == 1 && gridDim.y == 1 && gridDim.z == 1;
    if (!valid) {
        if (threadIdx.x == 0 && params.state != nullptr) {
            record_abort(params.state, PREPARE_ABORT_INVALID_LAUNCH, params.rank);
        }
        return;
    }
    Algorithm::template run<T, N>(params);
}

struct RankOrderSum {
    template <typename T, int N>
    __device__ static void run(const LaunchParams& params) {
        const Range slice = slice_of<T, N>(params.rank, params.input_elements);
        const u64 slot = slot_bytes<T, N>(params.input_elements);
        const unsigned char* sources[N];
#pragma unroll
        for (int q = 0; q < N; ++q) {
            sources[q] = params.input + q * slot;
        }
        unsigned char* output = static_cast<unsigned char*>(params.output);
        const u64 first = slice.begin_vector;
        sum_owned_into<T, N>(
            sources, first, slice, grid_workers(),
            [&](u64 v, const Vec16& sum) { store_vector(output, v - first, sum); },
            [&](u64 e, typename T::Bits sum) {
                store_element<T>(output, e - first * T::kPerVector, sum);
            });
    }
};

}  // namespace prepare

PREPARE_ENTRY(nccl_rank_order_sum, local_kernel, prepare::RankOrderSum)
