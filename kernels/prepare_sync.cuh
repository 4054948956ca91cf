// prepare_sync.cuh: flags between ranks, the deadline, the sticky abort word and launch checks.
//
// Protocol (see prepare_abi.cuh for the memory): block b of rank r raises a flag at rank q by
// writing its epoch into q's signals[set][r][b] with st.release.sys, and waits for q's flag by
// spinning with ld.acquire.sys on its own signals[set][q][b] until it equals the epoch. Every
// kernel starts with such a barrier (set 0) before touching any peer memory or its own scratch,
// so no launch can overwrite data a peer's previous launch still reads; epochs are unique per
// launch and block, so a stale flag never matches. Every spin ends at the deadline: the waiting
// thread records PEER_TIMEOUT and the whole block returns together after its __syncthreads.
// The start barrier also checks that every rank passed the same message (shape_line): a
// rank whose peer's elements or rows differ records SHAPE_MISMATCH and returns before any data
// moves, without waiting out the deadline (start_exchange, show_shape_after_mismatch); the
// cluster kernels' start exchange (prepare_cluster.cuh) runs the same check.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_element.cuh"
#include "prepare_layout.cuh"

namespace prepare {

// Flag sets; one per barrier of a launch.
enum : unsigned int {
    kSetStart = 0,
    kSetData = 1,
    kSetGather = 2,
    kSetEnd = 3,
    // The double-buffered kernels' step flags (prepare_double_buffer.cuh); a kernel with a
    // second phase (the RSAG's gather) raises that phase's in the next set.
    kSetStep = 4,
    kSetGatherStep = kSetStep + 1,
};

__device__ __forceinline__ u64 global_timer_ns() {
    u64 now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

__device__ __forceinline__ u64 deadline_after(u64 start, u64 timeout_ns) {
    return timeout_ns > ~0ull - start ? ~0ull : start + timeout_ns;
}

__device__ __forceinline__ void store_release_system(u64* address, u64 value) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ u64 load_acquire_system(const u64* address) {
    u64 value;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
    return value;
}

__device__ __forceinline__ u64 load_relaxed_device(const u64* address) {
    u64 value;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
    return value;
}

// 16 bytes as four words, moved by one instruction as two 64-bit halves {words[0], words[1]}
// and {words[2], words[3]} (low word first). Each aligned half is one 64-bit access, so
// single-copy atomic: the flags-in-data kernels rely on no more. Volatile, so every read goes
// to memory and every write is issued in order.
__device__ __forceinline__ void store_line_volatile(unsigned int* address,
                                                    const unsigned int (&words)[4]) {
    const u64 low = words[0] | (static_cast<u64>(words[1]) << 32);
    const u64 high = words[2] | (static_cast<u64>(words[3]) << 32);
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(address), "l"(low), "l"(high)
                 : "memory");
}

__device__ __forceinline__ void load_line_volatile(const unsigned int* address,
                                                   unsigned int (&words)[4]) {
    u64 low;
    u64 high;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(low), "=l"(high)
                 : "l"(address)
                 : "memory");
    words[0] = static_cast<unsigned int>(low);
    words[1] = static_cast<unsigned int>(low >> 32);
    words[2] = static_cast<unsigned int>(high);
    words[3] = static_cast<unsigned int>(high >> 32);
}

// Keeps the first abort code (later failures are its consequences); returns the word it found.
__device__ __forceinline__ u64 record_abort(u64* state, u64 reason, unsigned int rank) {
    const u64 code = PREPARE_ABORT_FLAG | (reason << 32) | rank;
    const u64 unset = 0;
    u64 previous;
    asm volatile("atom.relaxed.gpu.global.cas.b64 %0, [%1], %2, %3;"
                 : "=l"(previous)
                 : "l"(state), "l"(unset), "l"(code)
                 : "memory");
    return previous;
}

__device__ __forceinline__ u64* signal_word(u64* signals, unsigned int set, unsigned int source,
                                            unsigned int block) {
    return signals + (static_cast<u64>(set) * PREPARE_MAX_RANKS + source) * PREPARE_MAX_BLOCKS +
           block;
}

// The one spin of every protocol: polls `arrived()` until it is true or the deadline passes,
// then takes one last look, so what landed with the deadline is not called late. True when it
// arrived in time.
template <typename Poll>
__device__ __forceinline__ bool spin_until(u64 deadline, Poll arrived) {
    while (!arrived()) {
        if (global_timer_ns() > deadline) {
            return arrived();
        }
    }
    return true;
}

// A block's deadline (flags.deadline, in shared memory) can be ended early by one of its
// threads: end_deadline stores 0 after the thread recorded why in the abort word (the fence puts
// that record first, so the waits that end record nothing over it: record_abort keeps the first
// code), and deadline_ended tells a waiting thread.
__device__ __forceinline__ void end_deadline(u64& deadline) {
    __threadfence();
    *static_cast<volatile u64*>(&deadline) = 0;
}

__device__ __forceinline__ bool deadline_ended(const u64& deadline) {
    return *static_cast<const volatile u64*>(&deadline) == 0;
}

// spin_until on a block's deadline, read again after each poll that found nothing (so it holds
// no registers and an arrival costs no extra load), that also ends, false, once a thread of the
// block ended it. With `state`, this rank's abort word, it also gives up when that is set (a
// sibling block gave up, so the launch can no longer succeed), looked at after every 16th such
// poll.
template <typename Poll>
__device__ __forceinline__ bool spin_until_ended(const u64& deadline, Poll arrived,
                                                 const u64* state = nullptr) {
    unsigned int polls = 0;
    while (!arrived()) {
        const u64 now = *static_cast<const volatile u64*>(&deadline);
        if (now == 0 ||
            (state != nullptr && (++polls & 15) == 0 && load_relaxed_device(state) != 0)) {
            return false;
        }
        if (global_timer_ns() > now) {
            return arrived();
        }
    }
    return true;
}

// Programmatic dependent launch. The kernels are launched allowing it, so a launch may begin
// while the previous kernel of its stream is still ending: every entry first waits here, before
// touching any memory, until that kernel has completed and its writes are visible; then lets the
// next kernel of the stream begin the same way (which waits in turn). Only the launch and the
// block scheduling overlap, never two kernels' work. Both are no-ops for a launch without the
// attribute, and before sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// True when the flag reached `epoch` before the deadline.
__device__ __forceinline__ bool wait_flag(const u64* flag, u64 epoch, u64 deadline) {
    return spin_until(deadline, [&] { return load_acquire_system(flag) == epoch; });
}

// Checks what the kernels rely on; every thread computes the same answer, so a refusal is a
// uniform return. `blocks` is the grid's block count (each has its own epoch and flags); a
// block needs a thread per rank to raise and wait for flags. N is the world size the kernel was
// compiled for, T its element type. `aligned()` gives the or of the local addresses that must
// be 16-byte aligned besides the buffers, signals, state and scratch offset.
template <typename T, int N, typename Aligned>
__device__ __forceinline__ bool launch_is_valid_with(const LaunchParams& params,
                                                     unsigned int blocks, Aligned aligned) {
    if (params.world != N || params.rank >= params.world) {
        return false;
    }
    if (blocks > PREPARE_MAX_BLOCKS || blockDim.x < params.world || blockDim.y != 1 ||
        blockDim.z != 1 || gridDim.y != 1 || gridDim.z != 1) {
        return false;
    }
    if (params.input_elements > params.scratch_offset / sizeof(typename T::Bits) ||
        params.state == nullptr || params.output == nullptr || params.input == nullptr) {
        return false;
    }
    for (unsigned int q = 0; q < params.world; ++q) {
        if (params.buffers[q] == nullptr || params.signals[q] == nullptr) {
            return false;
        }
    }
    u64 addresses = aligned() | params.scratch_offset | reinterpret_cast<u64>(params.state);
    for (unsigned int q = 0; q < params.world; ++q) {
        addresses |=
            reinterpret_cast<u64>(params.buffers[q]) | reinterpret_cast<u64>(params.signals[q]);
    }
    return (addresses % PREPARE_ALIGNMENT_BYTES) == 0;
}

// Every kernel's checks: launch_is_valid_with `output` and `input` 16-byte aligned.
template <typename T, int N>
__device__ __forceinline__ bool launch_is_valid(const LaunchParams& params,
                                                unsigned int blocks) {
    return launch_is_valid_with<T, N>(params, blocks, [&] {
        return reinterpret_cast<u64>(params.output) | reinterpret_cast<u64>(params.input);
    });
}

// The row collectives, by which side holds the whole message: the reduce-scatter's input, the
// all-gather's output; the other side holds this rank's rows alone.
enum RowCollective : unsigned int { kReduceScatter, kAllGather };

// A row collective's checks: launch_is_valid_with the whole side 16-byte aligned; a width of at
// least 1 and rows x width that fits 64 bits; the whole side's count rows x width and this
// rank's side its owned rows x width; this rank's side 16-byte aligned where its run starts a
// vector of the message (it moves as vectors), else aligned to its elements.
template <typename T, int N, RowCollective Rows>
__device__ __forceinline__ bool row_launch_is_valid(const LaunchParams& params,
                                                    unsigned int blocks) {
    const bool scatter = Rows == kReduceScatter;
    const auto whole_address = [&] {
        return reinterpret_cast<u64>(scatter ? params.input : params.output);
    };
    if (!launch_is_valid_with<T, N>(params, blocks, whole_address) || params.width == 0 ||
        params.rows > ~0ull / params.width) {
        return false;
    }
    const u64 whole = scatter ? params.input_elements : params.output_elements;
    const u64 own = scatter ? params.output_elements : params.input_elements;
    if (whole != params.rows * params.width ||
        own != owned_rows<N>(params.rows, params.rank) * params.width) {
        return false;
    }
    const u64 own_address = reinterpret_cast<u64>(scatter ? params.output : params.input);
    const u64 first = first_row<N>(params.rows, params.rank) * params.width;
    const u64 own_alignment =
        first % T::kPerVector == 0 ? PREPARE_ALIGNMENT_BYTES : sizeof(typename T::Bits);
    return own_address % own_alignment == 0;
}

// What an entry checks before it begins: every kernel's launch_is_valid, or a row collective's.
struct BlockChecks {
    template <typename T, int N>
    __device__ __forceinline__ static bool valid(const LaunchParams& params) {
        return launch_is_valid<T, N>(params, gridDim.x);
    }
};

template <RowCollective Rows>
struct RowChecks {
    template <typename T, int N>
    __device__ __forceinline__ static bool valid(const LaunchParams& params) {
        return row_launch_is_valid<T, N, Rows>(params, gridDim.x);
    }
};

// Per-block flag state, in shared memory.
struct BlockFlags {
    // This launch's number for the block: its epoch (barrier kernels) or the double-buffered
    // kernels' launch count, from 1.
    u64 epoch;
    u64 deadline;
    // The abort word was set when the block began (by an earlier launch, or by a sibling block
    // of this one): return without touching anything but, after a shape mismatch, the peers'
    // shape lines (show_shape_after_mismatch).
    int stopped;
    // A wait in this launch passed the deadline, or the start barrier found a peer's shape
    // another than this rank's.
    int timed_out;
};

// Every thread of the block calls it first, with the state word that counts the launches this
// one follows; false means return at once.
__device__ __forceinline__ bool begin_counted(const LaunchParams& params, BlockFlags& flags,
                                              const u64* counter) {
    if (threadIdx.x == 0) {
        flags.stopped = load_relaxed_device(params.state) != 0;
        flags.timed_out = 0;
        flags.epoch = *counter + 1;
        flags.deadline = deadline_after(global_timer_ns(), params.timeout_ns);
    }
    __syncthreads();
    return !flags.stopped;
}

// A barrier kernel's begin: the block's own epoch counts.
__device__ __forceinline__ bool block_begin(const LaunchParams& params, BlockFlags& flags) {
    return begin_counted(params, flags, params.state + 1 + blockIdx.x);
}

// The start barrier's shape check. A launch's shape line is two words: the message's element
// count (its larger side: a reduce-scatter's input, an all-gather's output, an all-reduce's
// message; with the rows it fixes the width) and its rows (an all-reduce's 1), each in the low
// PREPARE_SHAPE_BITS bits below a tag of the block's epoch (bit 63 and the epoch's low 15
// bits: no word is zero, consecutive epochs' words differ). The thread that raises the start
// flag at a peer first stores the line there, at (this rank, this block) of the peer's shape
// lines, as one 16-byte store; while it waits for the peer's flag it loads the peer's line from
// its own signals in the same poll (issued before the flag's acquiring load, so the two cost
// one round trip), until both words carry this epoch's tag. A peer's line holds this launch's
// words or its previous launch's, never a later one's (as for the flag: the peer ends this
// launch only after a later barrier or launch this rank joins once its start barrier passed),
// so a tagged line is this launch's.
__device__ __forceinline__ u64 shape_tag(u64 epoch) {
    return (0x8000ull | (epoch & 0x7fffull)) << PREPARE_SHAPE_BITS;
}

__device__ __forceinline__ void shape_line(const LaunchParams& params, u64 epoch,
                                           unsigned int (&words)[4]) {
    const u64 mask = (1ull << PREPARE_SHAPE_BITS) - 1;
    const u64 tag = shape_tag(epoch);
    const u64 larger = params.input_elements > params.output_elements ? params.input_elements
                                                                       : params.output_elements;
    const u64 elements = tag | (larger & mask);
    const u64 rows = tag | (params.rows & mask);
    words[0] = static_cast<unsigned int>(elements);
    words[1] = static_cast<unsigned int>(elements >> 32);
    words[2] = static_cast<unsigned int>(rows);
    words[3] = static_cast<unsigned int>(rows >> 32);
}

__device__ __forceinline__ unsigned int* shape_line_address(u64* signals, unsigned int source,
                                                            unsigned int block) {
    return reinterpret_cast<unsigned int*>(
        signals + static_cast<u64>(PREPARE_SHAPE_SET) * PREPARE_MAX_RANKS * PREPARE_MAX_BLOCKS +
        2 * (static_cast<u64>(source) * PREPARE_MAX_BLOCKS + block));
}

// Whether both words of a shape line carry the tag of `epoch`.
__device__ __forceinline__ bool shape_line_tagged(const unsigned int (&words)[4], u64 epoch) {
    const unsigned int tag = static_cast<unsigned int>(shape_tag(epoch) >> 32);
    return (words[1] & 0xffff0000u) == tag && (words[3] & 0xffff0000u) == tag;
}

// Whether two tagged shape lines say different shapes: the start barrier's one comparison.
__device__ __forceinline__ bool shape_lines_differ(const unsigned int (&a)[4],
                                                   const unsigned int (&b)[4]) {
    return a[0] != b[0] || a[1] != b[1] || a[2] != b[2] || a[3] != b[3];
}

// The start barrier's exchange with `peer`, by the thread of this rank's block `block` that
// serves it: it stores this rank's shape line at the peer, raises the start flag there, and
// waits for the peer's flag and line. The wait ends early in two cases, so a shape mismatch
// costs no deadline anywhere: the peer's line carries this epoch's tag but another shape (the
// peer may raise no flag at all: a block that begins after its rank's mismatch only shows its
// line, show_shape_after_mismatch), or this rank's abort word is set (a sibling thread or block
// already gave up, so this launch can no longer succeed; the abort word keeps its first code).
// Neither passes: only the flag does. False (abort recorded) when the peer timed out, the wait
// was given up, or the shapes differ.
__device__ __forceinline__ bool start_exchange(const LaunchParams& params, u64 epoch,
                                               u64 deadline, unsigned int peer,
                                               unsigned int block) {
    unsigned int mine[4];
    shape_line(params, epoch, mine);
    store_line_volatile(shape_line_address(params.signals[peer], params.rank, block), mine);
    store_release_system(signal_word(params.signals[peer], kSetStart, params.rank, block), epoch);
    const u64* flag = signal_word(params.signals[params.rank], kSetStart, peer, block);
    const unsigned int* line = shape_line_address(params.signals[params.rank], peer, block);
    unsigned int theirs[4];
    bool given_up = false;
    const bool ended = spin_until(deadline, [&] {
        // The relaxed and volatile loads go before the acquiring one, which would delay
        // them: the poll stays one round trip.
        const bool aborted = load_relaxed_device(params.state) != 0;
        load_line_volatile(line, theirs);
        const bool flagged = load_acquire_system(flag) == epoch;
        if (shape_line_tagged(theirs, epoch) && (flagged || shape_lines_differ(mine, theirs))) {
            return true;
        }
        given_up = aborted;
        return aborted;
    });
    if (!ended || given_up) {
        // Given up: the abort word is set already and keeps its code.
        record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
        return false;
    }
    if (shape_lines_differ(mine, theirs)) {
        record_abort(params.state, PREPARE_ABORT_SHAPE_MISMATCH, peer);
        return false;
    }
    return true;
}

// A barrier between this block and the same-numbered block of every peer. Every thread of the
// block calls it; false (the same in every thread) means a peer timed out, or (the start
// barrier, start_exchange) passed another shape: return at once.
template <int N>
__device__ __forceinline__ bool block_barrier(const LaunchParams& params, BlockFlags& flags,
                                              unsigned int set) {
    // Every thread's loads and stores before the barrier are done before its flags go out;
    // st.release.sys then carries them to the peers (release is cumulative through bar.sync).
    __syncthreads();
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank && set == kSetStart) {
        if (!start_exchange(params, flags.epoch, flags.deadline, peer, blockIdx.x)) {
            flags.timed_out = 1;
        }
    } else if (peer < N && peer != params.rank) {
        store_release_system(signal_word(params.signals[peer], set, params.rank, blockIdx.x),
                             flags.epoch);
        if (!wait_flag(signal_word(params.signals[params.rank], set, peer, blockIdx.x), flags.epoch,
                       flags.deadline)) {
            record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
            flags.timed_out = 1;
        }
    }
    // The acquiring loads happen before every thread's later accesses to peer data.
    __syncthreads();
    return !flags.timed_out;
}

// A block whose begin found the abort word set, in a kernel with the start barrier: when the
// word says this rank found a shape mismatch (in a sibling block of this launch, as a rank's
// blocks start at different times), the block still stores its shape line at every peer, as
// the barrier would, but raises no flag. A peer's same-numbered block, which may not have
// seen any other line of this rank, then sees the other shape at once instead of waiting out
// its deadline for a flag that never comes. The line touches no data: only the peers' start
// barriers read it, and without the flag none of them passes.
// Whether this rank's abort word says it found a shape mismatch.
__device__ __forceinline__ bool stopped_for_shape(const LaunchParams& params) {
    const u64 mismatch = PREPARE_ABORT_FLAG | (PREPARE_ABORT_SHAPE_MISMATCH << 32);
    return (load_relaxed_device(params.state) & ~0xffffffffull) == mismatch;
}

template <int N>
__device__ __forceinline__ void show_shape_after_mismatch(const LaunchParams& params, u64 epoch) {
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank && stopped_for_shape(params)) {
        unsigned int mine[4];
        shape_line(params, epoch, mine);
        store_line_volatile(shape_line_address(params.signals[peer], params.rank, blockIdx.x),
                            mine);
    }
}

// A barrier kernel's begin and its barrier of set `set` (the start barrier with set 0): false
// means return at once.
template <int N>
__device__ __forceinline__ bool begin_with_barrier(const LaunchParams& params, BlockFlags& flags,
                                                   unsigned int set) {
    if (!block_begin(params, flags)) {
        if (set == kSetStart) {
            show_shape_after_mismatch<N>(params, flags.epoch);
        }
        return false;
    }
    return block_barrier<N>(params, flags, set);
}

// A barrier kernel's begin and its start barrier (set 0): false means return at once.
template <int N>
__device__ __forceinline__ bool begin_with_start_barrier(const LaunchParams& params,
                                                         BlockFlags& flags) {
    return begin_with_barrier<N>(params, flags, kSetStart);
}

// The begin of the algorithms that start with the start barrier: once it passed, every peer's
// launch has begun, so its input (written before its launch, in stream order) is ready, and
// every peer has finished its previous launch, which read this rank's buffers, so they may be
// overwritten.
struct StartBarrier {
    template <int N>
    __device__ __forceinline__ static bool begin(const LaunchParams& params, BlockFlags& flags) {
        return begin_with_start_barrier<N>(params, flags);
    }
};

// The launch finished: the next launch of this block number uses the next epoch.
__device__ __forceinline__ void block_end(const LaunchParams& params, const BlockFlags& flags) {
    if (threadIdx.x == 0) {
        params.state[1 + blockIdx.x] = flags.epoch;
    }
}

// Stamps the block's arrival word with when this launch began (%globaltimer), once the launch
// checks passed; only this block writes it, and only the host reads it, after the launch.
__device__ __forceinline__ void record_arrival(const LaunchParams& params) {
    if (threadIdx.x == 0) {
        params.state[PREPARE_STATE_ARRIVAL_WORDS + blockIdx.x] = global_timer_ns();
    }
}

// Refuses an invalid launch (by Checks) for every block and records why once per block.
template <typename T, int N, typename Checks = BlockChecks>
__device__ __forceinline__ bool block_launch_is_valid(const LaunchParams& params) {
    if (Checks::template valid<T, N>(params)) {
        return true;
    }
    if (threadIdx.x == 0 && params.state != nullptr) {
        record_abort(params.state, PREPARE_ABORT_INVALID_LAUNCH, params.rank);
    }
    return false;
}

}  // namespace prepare
