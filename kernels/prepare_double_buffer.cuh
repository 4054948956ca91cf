// prepare_double_buffer.cuh: the protocols of the double-buffered kernels: their launch
// counter, their scratch layout, the `ll` lines (flags in the data) and the `simple` step flags.
//
// These kernels have no barrier. Each launch writes its data into its peers' scratch and waits
// only for what the peers write into its own. Two things make that safe:
//   - Parity. Launch c (the rank's c-th launch of any double-buffered kernel, the same count on
//     every rank) writes only the half of the scratch whose parity is c % 2. The last reader of
//     that half on a peer was the peer's launch c - 2 or earlier. This rank's launch c - 1
//     received data from every peer's launch c - 1 (every launch of these kernels receives
//     something from every peer, even for an empty message), and a peer starts launch c - 1
//     only after its launch c - 2 has ended, in stream order. So by the time launch c starts,
//     no peer still reads what it overwrites.
//   - Their own regions. Each such kernel has a scratch region no other kernel touches (the
//     host places them after the shared scratch, prepare_abi.cuh), so a barrier kernel's launch
//     that a peer is still running is never overwritten either.
// A rank keeps one slot per peer (peer_slot in prepare_layout.cuh: slot d - 1 holds what rank
// (rank + d) % world wrote), none for itself, for each of the kernel's F phases (1, or 2 for the
// RSAG: phase f's peer slot s is slot f * (world - 1) + s). The halves interleave in chunks, so
// a parity's bytes are the same whatever the message size: byte i of slot s, parity p, lives at
//   ((i / CHUNK * 2 + p) * F * (world - 1) + s) * CHUNK + i % CHUNK
// and a region for slots of S bytes takes 2 * F * (world - 1) * round_up(S, CHUNK) bytes,
// mirrored by `prepare::kernels::scratch_bytes`.
//
// The counter has one copy per block number, state[PREPARE_STATE_LAUNCH_WORDS + b], all equal
// between launches: block b reads its copy when it starts, and when it ends it writes the new
// count into every copy whose number is b modulo the grid's size, which together cover every
// block number whatever the next launch's grid. No other block of the launch reads those
// copies, so the count needs no atomic and no fence; the next launch sees it through the kernel
// boundary. (A counter shared by the blocks needs the last block to finish to advance it, which
// takes an atomic with acquire-release order in every block: on 2x H200 that cost 0.35 us per
// launch.)
//
// The shape check. With no start barrier, ranks that passed different shapes would each read
// lines the others never send (a rank with more waits out the deadline) or take the first lines
// of a longer message as their own (a rank with fewer ends as if nothing were wrong). So every
// block shows its shape to every peer when it begins and checks the peers' between its sends
// and its receives:
//   - Each block's last N lanes each serve one peer (lane blockDim.x - N + q serves peer q;
//     for this rank's own number none). When the block begins, the lane stores this rank's
//     shape line at the peer: the message's element count (its larger side, as the start
//     barrier's) and its rows, each beside the launch's line flag, {elements, flag, rows, flag},
//     at (parity, this rank, this block) of the peer's PREPARE_LINE_SHAPE_SET signals. A block
//     that begins stopped after its rank's SHAPE_MISMATCH still shows its line, as the start
//     barrier's blocks do.
//   - After its sends, the lane waits for the peer's line like an ll line (both flags this
//     launch's), zeroes it, and compares; lines that differ record SHAPE_MISMATCH naming the
//     peer and end the block's deadline (end_deadline), so every other wait of the block ends
//     at its next poll (spin_until_ended). The lane's own wait also ends once this rank's
//     abort word is set: a block whose peer block never shows a line (another grid)
//     learns of the mismatch from its sibling blocks. So no rank waits out a deadline.
//   - The lines alternate by parity like the scratch halves, for the same reason: a peer may
//     show launch c + 1's line before this rank has read launch c's, never launch c + 2's.
// The lanes check in parallel with the block's other lanes, whose receives may meanwhile store
// part of the output, so after a mismatch a rank's output and region may hold partial data; no
// rank writes outside them (each writes only lines of its own message, which its bucket's
// region holds) or reads outside its own region. A bucket holds at most 4 GiB, so both counts
// are below 2^32 and a line carries them whole.
#pragma once

#include "prepare_abi.cuh"
#include "prepare_element.cuh"
#include "prepare_layout.cuh"
#include "prepare_sync.cuh"

#define PREPARE_DOUBLE_BUFFER_CHUNK_BYTES 8192

namespace prepare {

// Every thread of the block calls it first; false means return at once. `flags.epoch` is then
// this launch's number, whose parity picks the scratch half.
__device__ __forceinline__ bool launch_begin(const LaunchParams& params, BlockFlags& flags) {
    return begin_counted(params, flags, params.state + PREPARE_STATE_LAUNCH_WORDS + blockIdx.x);
}

// Every thread of the block calls it last: the block writes this launch's count into the
// counter copies b, b + grid, b + 2 * grid, ... (its own was read when it began, in thread 0,
// before the barrier here). A block that timed out leaves them, since the abort word already
// stops every later launch.
__device__ __forceinline__ void launch_end(const LaunchParams& params, const BlockFlags& flags) {
    __syncthreads();
    if (flags.timed_out) {
        return;
    }
    u64* counters = params.state + PREPARE_STATE_LAUNCH_WORDS;
    const u64 stride = static_cast<u64>(blockDim.x) * gridDim.x;
#pragma unroll 1
    for (u64 copy = blockIdx.x + static_cast<u64>(threadIdx.x) * gridDim.x;
         copy < PREPARE_MAX_BLOCKS; copy += stride) {
        counters[copy] = flags.epoch;
    }
}

// Where byte `slot_byte` of slot `slot`, in the half of parity `parity`, lives in a
// double-buffered region of a kernel with `Phases` phases (Phases * (N - 1) slots).
template <int N, int Phases = 1>
__device__ __forceinline__ u64 double_buffer_offset(u64 slot_byte, u64 parity, unsigned int slot) {
    const u64 chunk = slot_byte / PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
    return ((chunk * 2 + parity) * (Phases * (N - 1)) + slot) * PREPARE_DOUBLE_BUFFER_CHUNK_BYTES +
           slot_byte % PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
}

// The ll protocol: every 16-byte line carries 8 bytes of data and the launch's flag twice,
// {low word, flag, high word, flag}, and is read until both flags match, so no fence or
// separate flag is needed. A reader zeroes each line it consumed, so a line unwritten for 2^32
// launches cannot match a later flag.

// A line's flag: the launch number's low 32 bits, never 0 (consumed lines are zero).
__device__ __forceinline__ unsigned int line_flag(u64 launch) {
    const unsigned int low = static_cast<unsigned int>(launch);
    return low != 0 ? low : 1u;
}

template <int N>
__device__ __forceinline__ unsigned int* line_address(unsigned char* region, u64 line, u64 parity,
                                                      unsigned int slot) {
    return reinterpret_cast<unsigned int*>(region +
                                           double_buffer_offset<N>(line * 16, parity, slot));
}

// Whether a line carries `flag` in both its flag words.
__device__ __forceinline__ bool line_arrived(const unsigned int (&words)[4], unsigned int flag) {
    return words[1] == flag && words[3] == flag;
}

// Where the shape line of `source`'s block `block`, in its launch of parity `parity`, lies in
// a rank's signals.
__device__ __forceinline__ unsigned int* line_shape_address(u64* signals, u64 parity,
                                                            unsigned int source,
                                                            unsigned int block) {
    return reinterpret_cast<unsigned int*>(
        signals +
        static_cast<u64>(PREPARE_LINE_SHAPE_SET) * PREPARE_MAX_RANKS * PREPARE_MAX_BLOCKS +
        2 * ((parity * PREPARE_MAX_RANKS + source) * PREPARE_MAX_BLOCKS + block));
}

// This rank's shape line for a launch whose line flag is `flag`.
__device__ __forceinline__ void line_shape(const LaunchParams& params, unsigned int flag,
                                           unsigned int (&words)[4]) {
    const u64 larger = params.input_elements > params.output_elements ? params.input_elements
                                                                       : params.output_elements;
    words[0] = static_cast<unsigned int>(larger);
    words[1] = flag;
    words[2] = static_cast<unsigned int>(params.rows);
    words[3] = flag;
}

// The peer the calling thread shows its shape to and checks, as one of the block's last N
// lanes; N or more for every other thread.
template <int N>
__device__ __forceinline__ unsigned int shape_lane_peer() {
    return threadIdx.x + N - blockDim.x;
}

// The shape lanes store this rank's line at their peers (the header's shape check).
template <int N>
__device__ __forceinline__ void show_line_shape(const LaunchParams& params,
                                                const BlockFlags& flags) {
    const unsigned int peer = shape_lane_peer<N>();
    if (peer < N && peer != params.rank) {
        unsigned int mine[4];
        line_shape(params, line_flag(flags.epoch), mine);
        store_line_volatile(
            line_shape_address(params.signals[peer], flags.epoch & 1, params.rank, blockIdx.x),
            mine);
    }
}

// Every thread calls it after its sends and before its first receive: each shape lane waits for
// its peer's line, zeroes it and compares it with this rank's. A line that differs records
// SHAPE_MISMATCH naming the peer; no line by the deadline (or by when this rank's abort word
// was set), PEER_TIMEOUT; either sets flags.timed_out and ends the block's deadline, so every
// wait of the block ends at its next poll. The other threads go on at once.
template <int N>
__device__ __forceinline__ void check_line_shapes(const LaunchParams& params, BlockFlags& flags) {
    const unsigned int peer = shape_lane_peer<N>();
    if (peer >= N || peer == params.rank) {
        return;
    }
    const unsigned int flag = line_flag(flags.epoch);
    unsigned int* line =
        line_shape_address(params.signals[params.rank], flags.epoch & 1, peer, blockIdx.x);
    unsigned int theirs[4] = {};
    if (!spin_until_ended(
            flags.deadline,
            [&] {
                load_line_volatile(line, theirs);
                return line_arrived(theirs, flag);
            },
            params.state)) {
        // No line by the deadline, or given up (the abort word set, or the block's deadline
        // ended by a sibling lane): a word set already keeps its code.
        record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
        flags.timed_out = 1;
        end_deadline(flags.deadline);
        return;
    }
    const unsigned int consumed[4] = {0, 0, 0, 0};
    store_line_volatile(line, consumed);
    unsigned int mine[4];
    line_shape(params, flag, mine);
    if (shape_lines_differ(mine, theirs)) {
        record_abort(params.state, PREPARE_ABORT_SHAPE_MISMATCH, peer);
        flags.timed_out = 1;
        end_deadline(flags.deadline);
    }
}

// The begin of the double-buffered algorithms: the launch counter, no barrier; the block shows
// its shape to every peer, also when it begins stopped after its rank's shape mismatch.
struct LaunchCounter {
    template <int N>
    __device__ __forceinline__ static bool begin(const LaunchParams& params, BlockFlags& flags) {
        const bool begun = launch_begin(params, flags);
        if (begun || stopped_for_shape(params)) {
            show_line_shape<N>(params, flags);
        }
        return begun;
    }
};

// Sends a vector as lines 2v and 2v + 1 of peer slot `slot` in a peer's region.
template <int N>
__device__ __forceinline__ void send_vector_lines(unsigned char* region, u64 v, u64 parity,
                                                  unsigned int slot, const Vec16& x,
                                                  unsigned int flag) {
    const unsigned int low[4] = {x.word[0], flag, x.word[1], flag};
    const unsigned int high[4] = {x.word[2], flag, x.word[3], flag};
    store_line_volatile(line_address<N>(region, 2 * v, parity, slot), low);
    store_line_volatile(line_address<N>(region, 2 * v + 1, parity, slot), high);
}

// Sends two 32-bit data words as line `line` of peer slot `slot` in a peer's region.
template <int N>
__device__ __forceinline__ void send_data_line(unsigned char* region, u64 line, u64 parity,
                                               unsigned int slot, unsigned int low,
                                               unsigned int high, unsigned int flag) {
    const unsigned int words[4] = {low, flag, high, flag};
    store_line_volatile(line_address<N>(region, line, parity, slot), words);
}

// Sends one 32-bit word (a tail element) as line `line` of peer slot `slot` in a peer's region.
template <int N>
__device__ __forceinline__ void send_word_line(unsigned char* region, u64 line, u64 parity,
                                               unsigned int slot, unsigned int value,
                                               unsigned int flag) {
    send_data_line<N>(region, line, parity, slot, value, 0u, flag);
}

// Waits for `count` (1 or 2) consecutive lines from `first` of `source`'s peer slot in this
// rank's region to carry `flag`, loaded together so they cost one round trip; then takes their
// data words (two per line) into `data` and zeroes them. A line still missing is the only one
// loaded again. False (abort recorded) when the deadline passed first, or was ended by the
// block's shape check (check_line_shapes).
template <int N, int Count>
__device__ __forceinline__ bool receive_lines(const LaunchParams& params, BlockFlags& flags,
                                              u64 first, u64 parity, unsigned int source,
                                              unsigned int flag, unsigned int* data) {
    unsigned char* region = params.buffers[params.rank] + params.scratch_offset;
    unsigned int* addresses[Count];
    // Zero words: flag 0 never arrives, so the first poll loads every line.
    unsigned int words[Count][4] = {};
#pragma unroll
    for (int i = 0; i < Count; ++i) {
        addresses[i] =
            line_address<N>(region, first + i, parity, peer_slot<N>(source, params.rank));
    }
    const bool arrived = spin_until_ended(flags.deadline, [&] {
        bool all = true;
#pragma unroll
        for (int i = 0; i < Count; ++i) {
            if (!line_arrived(words[i], flag)) {
                load_line_volatile(addresses[i], words[i]);
                all = all && line_arrived(words[i], flag);
            }
        }
        return all;
    });
    if (!arrived) {
        record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, source);
        flags.timed_out = 1;
        return false;
    }
    const unsigned int consumed[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < Count; ++i) {
        data[2 * i] = words[i][0];
        data[2 * i + 1] = words[i][2];
        store_line_volatile(addresses[i], consumed);
    }
    return true;
}

// The rank-ordered fp32 sums, not yet rounded, of vector `v`'s lanes: this rank's (`rank`) part
// from `input` (indexed like the message), every peer's from lines `line` and `line + 1` of its
// peer slot, which it waits for.
// Every rank's part is received before the sum up to four ranks; beyond, each rank's part is summed as
// it arrives, which keeps the registers to one vector. `received` goes false (and stays so: no
// later line is awaited) when a peer timed out; the sum is then not to be stored.
template <typename T, int N>
__device__ __forceinline__ VectorSum<T> receive_vector_sum(const LaunchParams& params,
                                                           BlockFlags& flags, unsigned int rank,
                                                           const unsigned char* input, u64 v,
                                                           u64 line, u64 parity,
                                                           unsigned int flag, bool& received) {
    const auto part = [&](int q) {
        Vec16 x = {};
        if (static_cast<unsigned int>(q) == rank) {
            x = load_vector(input, v);
        } else {
            received =
                received && receive_lines<N, 2>(params, flags, line, parity, q, flag, x.word);
        }
        return x;
    };
    if constexpr (N <= 4) {
        Vec16 x[N];
#pragma unroll
        for (int q = 0; q < N; ++q) {
            x[q] = part(q);
        }
        return sum_lanes<T, N>(x);
    } else {
        return sum_lanes_from<T, N>(part);
    }
}

// Sends this thread's part of `range` (vectors and tail elements of a message of `elements`)
// to every peer as lines, then waits for every peer's same lines and hands each vector's
// rank-ordered fp32 sums, not yet rounded, to store_lanes(v, sums) and writes each tail
// element's rounded sum to `output` (indexed like the message), each element by the thread that
// read it, after reading it. Lines 2v and 2v + 1 carry vector v; tail element e follows at
// 2 * vectors + e - P * vectors, vectors those of a message of max(elements, 1) (an empty one
// sends an empty tail line). A peer that times out ends the receiving (abort recorded,
// flags.timed_out set); nothing is stored past it.
template <typename T, int N, typename StoreLanes>
__device__ __forceinline__ void push_sum_lines(const LaunchParams& params, BlockFlags& flags,
                                               const Range& range, u64 elements,
                                               unsigned char* output, StoreLanes store_lanes_op) {
    const unsigned int rank = params.rank;
    const u64 parity = flags.epoch & 1;
    const unsigned int flag = line_flag(flags.epoch);
    const u64 vectors = whole_vectors<T>(elements == 0 ? 1 : elements);
    const u64 tail_line = 2 * vectors - T::kPerVector * vectors;
    const Workers workers = {threadIdx.x, blockDim.x};
    const unsigned char* input = params.input;
    send_owned<N>(
        params, params.scratch_offset, range, workers,
        [&](u64 v) { return load_vector(input, v); },
        [&](u64 e) { return e < elements ? load_element<T>(input, e) : 0u; },
        [&](const PeerSlot& peer, u64 v, const Vec16& x) {
            send_vector_lines<N>(peer.region, v, parity, peer.slot, x, flag);
        },
        [&](const PeerSlot& peer, u64 e, unsigned int value) {
            send_word_line<N>(peer.region, tail_line + e, parity, peer.slot, value, flag);
        });
    check_line_shapes<N>(params, flags);
    bool received = true;
    for_each_owned(
        range, workers,
        [&](u64 v) {
            const VectorSum<T> sums = receive_vector_sum<T, N>(params, flags, rank, input, v,
                                                               2 * v, parity, flag, received);
            if (received) {
                store_lanes_op(v, sums);
            }
        },
        [&](u64 e) {
            // Every rank's element received (each line exactly once) before the sum.
            typename T::Bits x[N];
#pragma unroll
            for (int q = 0; q < N; ++q) {
                unsigned int data[2] = {0, 0};
                if (static_cast<unsigned int>(q) == rank) {
                    data[0] = e < elements ? load_element<T>(input, e) : 0u;
                } else {
                    received = received && receive_lines<N, 1>(params, flags, tail_line + e,
                                                               parity, q, flag, data);
                }
                x[q] = static_cast<typename T::Bits>(data[0]);
            }
            if (received && e < elements) {
                store_element<T>(output, e, sum_elements<T, N>(x));
            }
        });
}

// push_sum_lines with every sum rounded into `output`.
template <typename T, int N>
__device__ __forceinline__ void push_sum_lines(const LaunchParams& params, BlockFlags& flags,
                                               const Range& range, u64 elements,
                                               unsigned char* output) {
    push_sum_lines<T, N>(params, flags, range, elements, output,
                         [&](u64 v, const VectorSum<T>& sums) {
                             store_vector(output, v, sums.result());
                         });
}

// The ll lines of a row run (prepare_layout.cuh's run_of; the row collectives): whole vector v
// of the run takes lines 2 (v - begin_vector) and one more, as send_vector_lines; then its tail
// elements follow, line_elements of them to a line (8 bytes, lowest element in the low bits of
// the first data word), so a run that starts off a vector boundary, all tail, takes no more
// lines than one that starts on one. A run with nothing in it still takes one (empty) tail line,
// so every launch hears from every peer. A run of n elements then takes at most
// 2 * (n / P) + 2 lines, within the all-reduce's line capacity for a message of n elements.
template <typename T>
__device__ __forceinline__ constexpr unsigned int line_elements() {
    return 2 * T::kPerWord;
}

template <typename T>
__device__ __forceinline__ u64 run_tail_lines(const Range& run) {
    const u64 lines = (run.tail_end - run.tail_begin + line_elements<T>() - 1) / line_elements<T>();
    return lines == 0 && run.end_vector == run.begin_vector ? 1 : lines;
}

// Block b's part of a run's lines: an equal share of its whole vectors, then an equal share of
// its tail lines as the range's "elements" (for_each_owned hands out tail line numbers), so a
// short run, or one all tail, still spreads over the blocks. The same on every rank.
template <typename T>
__device__ __forceinline__ Range block_lines(const Range& run) {
    const u64 vectors = run.end_vector - run.begin_vector;
    const u64 lines = run_tail_lines<T>(run);
    const u64 vector_share = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 line_share = (lines + gridDim.x - 1) / gridDim.x;
    const u64 vector = min_u64(blockIdx.x * vector_share, vectors);
    const u64 line = min_u64(blockIdx.x * line_share, lines);
    return {run.begin_vector + vector, run.begin_vector + min_u64(vector + vector_share, vectors),
            line, min_u64(line + line_share, lines)};
}

// Calls vector_op(v, line) for each whole vector of `run` this thread takes (lines `line` and
// `line + 1`), then line_op(first, line) for each of its tail lines (the elements from `first`,
// as far as the run goes, in line `line`); the block's threads share the block's part.
template <typename T, typename VectorOp, typename LineOp>
__device__ __forceinline__ void for_each_run_line(const Range& run, VectorOp vector_op,
                                                  LineOp line_op) {
    const u64 vectors = run.end_vector - run.begin_vector;
    for_each_owned(
        block_lines<T>(run), Workers{threadIdx.x, blockDim.x},
        [&](u64 v) { vector_op(v, 2 * (v - run.begin_vector)); },
        [&](u64 t) { line_op(run.tail_begin + t * line_elements<T>(), 2 * vectors + t); });
}

// The tail line whose elements start at `first`, as the low half of a vector (its two data
// words; the high half zero): load(e) for each element of the run from there (up to `end`),
// packed as in memory; zero where the run ends. So a line's elements sum as a vector's lanes.
template <typename T, typename Load>
__device__ __forceinline__ Vec16 pack_line(u64 first, u64 end, Load load) {
    Vec16 x = {};
#pragma unroll
    for (unsigned int i = 0; i < line_elements<T>(); ++i) {
        if (first + i < end) {
            x.word[i / T::kPerWord] |= static_cast<unsigned int>(load(first + i))
                                       << (i % T::kPerWord * 16);
        }
    }
    return x;
}

// Element i of a tail line held as pack_line's vector.
template <typename T>
__device__ __forceinline__ typename T::Bits line_element(const Vec16& x, unsigned int i) {
    return static_cast<typename T::Bits>(x.word[i / T::kPerWord] >> (i % T::kPerWord * 16));
}

// Sends this block's part of `run` as lines, each vector or element read once:
// load_vector_op(v) reads a whole vector of it, load_element_op(e) an element, and
// each_peer(send) calls send(peer) with the PeerSlot of every peer it goes to.
template <typename T, int N, typename LoadVector, typename LoadElement, typename EachPeer>
__device__ __forceinline__ void send_run_lines(const Range& run, u64 parity, unsigned int flag,
                                               LoadVector load_vector_op,
                                               LoadElement load_element_op, EachPeer each_peer) {
    for_each_run_line<T>(
        run,
        [&](u64 v, u64 line) {
            const Vec16 x = load_vector_op(v);
            each_peer([&](const PeerSlot& peer) {
                send_vector_lines<N>(peer.region, line / 2, parity, peer.slot, x, flag);
            });
        },
        [&](u64 first, u64 line) {
            const Vec16 x = pack_line<T>(first, run.tail_end, load_element_op);
            each_peer([&](const PeerSlot& peer) {
                send_data_line<N>(peer.region, line, parity, peer.slot, x.word[0], x.word[1], flag);
            });
        });
}

// The simple protocol: data, then one flag per step. After each step one thread per peer
// raises that peer's step flag for (this rank, this block); the peer's same-numbered block
// waits until the flag reaches the step's value.

// Vectors a thread moves in one step of the simple protocol. Every step ends with a release
// that waits for the step's writes to land, so steps are as large as registers allow.
constexpr unsigned int kSimpleStepVectors = 4;

// Block b's part of the vectors in the simple protocol, the same on every rank.
struct SimpleShare {
    // Vectors [begin, end): an equal share, a whole multiple of the block's width.
    u64 begin;
    u64 end;
    // Step width in vectors, and steps (at least one, so every block hears from every peer
    // even with nothing to move).
    u64 step_vectors;
    u64 steps;
    // The last block also moves the message's tail, in its last step, through for_each_owned.
    bool tail_block;
    Range tail;
};

// Block b's share of `vectors` vectors (the whole message, or the longest slice), with the
// tail of a message of `elements`.
// A block's share of vectors [begin, end) with no tail, in steps of the block's width.
__device__ __forceinline__ SimpleShare simple_share_between(u64 begin, u64 end) {
    SimpleShare share;
    share.begin = begin;
    share.end = end;
    share.step_vectors = static_cast<u64>(blockDim.x) * kSimpleStepVectors;
    share.steps = end > begin ? (end - begin + share.step_vectors - 1) / share.step_vectors : 1;
    share.tail_block = false;
    share.tail = {0, 0, 0, 0};
    return share;
}

template <typename T>
__device__ __forceinline__ SimpleShare simple_share_of(u64 vectors, u64 elements) {
    const u64 threads = blockDim.x;
    const u64 equal = (vectors + gridDim.x - 1) / gridDim.x;
    const u64 per_block = (equal + threads - 1) / threads * threads;
    const u64 begin = min_u64(blockIdx.x * per_block, vectors);
    SimpleShare share = simple_share_between(begin, min_u64(begin + per_block, vectors));
    share.tail_block = blockIdx.x == gridDim.x - 1;
    const u64 whole = whole_vectors<T>(elements);
    share.tail = {whole, whole, whole * T::kPerVector, elements};
    return share;
}

// Block b's part of the whole message.
template <typename T>
__device__ __forceinline__ SimpleShare simple_share(u64 elements) {
    return simple_share_of<T>(whole_vectors<T>(elements), elements);
}

// Where byte `byte` of slot `slot`, in the half of parity `parity`, lies in `region` (a
// kernel with `Phases` phases).
template <int N, int Phases = 1>
__device__ __forceinline__ unsigned char* slot_byte(unsigned char* region, u64 byte, u64 parity,
                                                    unsigned int slot) {
    return region + double_buffer_offset<N, Phases>(byte, parity, slot);
}

// Where rank q's part of slot byte `byte` lies in this rank's region (q not this rank), in the
// slots of phase `phase` of a kernel with `Phases` phases.
template <int N, int Phases = 1>
__device__ __forceinline__ const unsigned char* received_byte(const LaunchParams& params,
                                                              int q, u64 byte, u64 parity,
                                                              unsigned int phase = 0) {
    return slot_byte<N, Phases>(
        params.buffers[params.rank] + params.scratch_offset, byte, parity,
        phase * (N - 1) + peer_slot<N>(static_cast<unsigned int>(q), params.rank));
}

// The rank-ordered fp32 sums of one vector, not yet rounded: this rank's part from `input` at
// vector `input_vector`, every peer's from its peer slot of this rank's region (phase 0) at
// slot byte `byte`.
template <typename T, int N, int Phases = 1>
__device__ __forceinline__ VectorSum<T> sum_received_lanes(const LaunchParams& params,
                                                           u64 parity, u64 input_vector,
                                                           u64 byte) {
    return sum_lanes_from<T, N>([&](int q) {
        return static_cast<unsigned int>(q) == params.rank
                   ? load_vector(params.input, input_vector)
                   : load_vector(received_byte<N, Phases>(params, q, byte, parity), 0);
    });
}

// The same sum, rounded.
template <typename T, int N, int Phases = 1>
__device__ __forceinline__ Vec16 sum_received_vector(const LaunchParams& params, u64 parity,
                                                     u64 input_vector, u64 byte) {
    return sum_received_lanes<T, N, Phases>(params, parity, input_vector, byte).result();
}

// The rank-ordered sum of element `e`, every peer's part at slot byte `byte` (phase 0).
template <typename T, int N, int Phases = 1>
__device__ __forceinline__ typename T::Bits sum_received_element(const LaunchParams& params,
                                                                 u64 parity, u64 e, u64 byte) {
    typename T::Bits x[N];
#pragma unroll
    for (int q = 0; q < N; ++q) {
        x[q] = static_cast<unsigned int>(q) == params.rank
                   ? load_element<T>(params.input, e)
                   : load_element<T>(received_byte<N, Phases>(params, q, byte, parity), 0);
    }
    return sum_elements<T, N>(x);
}

// Raises `flag` in flag set `set` (kSetStep, or kSetGatherStep for a second phase) for (this
// rank, this block) at every peer once every thread's stores of the step are issued; release
// is cumulative through bar.sync, as in block_barrier.
template <int N>
__device__ __forceinline__ void raise_step_flags(const LaunchParams& params, unsigned int set,
                                                 u64 flag) {
    __syncthreads();
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank) {
        store_release_system(signal_word(params.signals[peer], set, params.rank, blockIdx.x),
                             flag);
    }
}

// Waits until every peer's step flag in set `set` for this block reached `flag`. Every thread
// calls it; false (the same in every thread) means a peer timed out, or this block's shape
// check failed.
template <int N>
__device__ __forceinline__ bool wait_step_flags(const LaunchParams& params, BlockFlags& flags,
                                                unsigned int set, u64 flag) {
    // Every thread has read the previous outcome before anyone may change it.
    __syncthreads();
    const unsigned int peer = threadIdx.x;
    if (peer < N && peer != params.rank) {
        const u64* word = signal_word(params.signals[params.rank], set, peer, blockIdx.x);
        if (!spin_until_ended(flags.deadline,
                              [&] { return load_acquire_system(word) >= flag; })) {
            record_abort(params.state, PREPARE_ABORT_PEER_TIMEOUT, peer);
            flags.timed_out = 1;
        }
    }
    // The acquiring loads happen before every thread's later reads of the slots.
    __syncthreads();
    return !flags.timed_out;
}

// Sends step `step` of this block's share: this rank's vectors into its peer slot of every peer
// (slot_at_distance), and the tail with the last block's last step; then raises the step's
// flags.
template <typename T, int N>
__device__ __forceinline__ void send_step(const LaunchParams& params, const SimpleShare& share,
                                          u64 parity, u64 step, u64 flag) {
    const unsigned char* input = params.input;
    const u64 first = share.begin + step * share.step_vectors;
    Vec16 x[kSimpleStepVectors];
#pragma unroll
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < share.end) {
            x[u] = load_vector(input, v);
        }
    }
#pragma unroll
    for (int k = 1; k < N; ++k) {
        const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
#pragma unroll
        for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
            const u64 v = first + u * blockDim.x + threadIdx.x;
            if (v < share.end) {
                store_vector(slot_byte<N>(peer.region, v * 16, parity, peer.slot), 0, x[u]);
            }
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                const typename T::Bits value = load_element<T>(input, e);
#pragma unroll
                for (int k = 1; k < N; ++k) {
                    const PeerSlot peer = peer_at_distance<N>(params, k, params.scratch_offset);
                    store_element<T>(
                        slot_byte<N>(peer.region, e * sizeof(typename T::Bits), parity, peer.slot),
                        0, value);
                }
            });
    }
    raise_step_flags<N>(params, kSetStep, flag);
}

// Sums step `step` of this block's share (its flags were awaited): each vector's fp32 sums to
// store_lanes(v, sums), the tail's rounded sums into `output` (indexed like the message).
template <typename T, int N, typename StoreLanes>
__device__ __forceinline__ void sum_step(const LaunchParams& params, const SimpleShare& share,
                                         u64 parity, u64 step, unsigned char* output,
                                         StoreLanes store_lanes_op) {
    const u64 first = share.begin + step * share.step_vectors;
#pragma unroll 1
    for (unsigned int u = 0; u < kSimpleStepVectors; ++u) {
        const u64 v = first + u * blockDim.x + threadIdx.x;
        if (v < share.end) {
            store_lanes_op(v, sum_received_lanes<T, N>(params, parity, v, v * 16));
        }
    }
    if (share.tail_block && step + 1 == share.steps) {
        for_each_owned(
            share.tail, Workers{threadIdx.x, blockDim.x}, [](u64) {},
            [&](u64 e) {
                store_element<T>(output, e,
                                 sum_received_element<T, N>(params, parity, e,
                                                            e * sizeof(typename T::Bits)));
            });
    }
}

// Moves this block's share of the message to every peer in steps and hands each vector's
// rank-ordered fp32 sums to store_lanes(v, sums), the tail's rounded sums into `output`
// (indexed like the message), each element by the thread that read it, after reading it. A
// peer that times out ends it (abort recorded, flags.timed_out set).
template <typename T, int N, typename StoreLanes>
__device__ __forceinline__ void push_sum_steps(const LaunchParams& params, BlockFlags& flags,
                                               const SimpleShare& share, unsigned char* output,
                                               StoreLanes store_lanes_op) {
    const u64 parity = flags.epoch & 1;
    // Steps fit the low 24 bits: a bucket holds at most 4 GiB, 2^28 vectors, and a step at
    // least 32 threads x 4 vectors, so a block never has more than 2^21 steps.
    const u64 flag_base = flags.epoch << 24;
    // Step s is sent, then step s - 1 summed, so the local sum of one step overlaps the
    // transfer of the next.
#pragma unroll 1
    for (u64 step = 0; step <= share.steps; ++step) {
        if (step < share.steps) {
            send_step<T, N>(params, share, parity, step, flag_base | (step + 1));
        }
        if (step == 0) {
            check_line_shapes<N>(params, flags);
        }
        if (step > 0) {
            if (!wait_step_flags<N>(params, flags, kSetStep, flag_base | step)) {
                break;
            }
            sum_step<T, N>(params, share, parity, step - 1, output, store_lanes_op);
        }
    }
}

// push_sum_steps with every sum rounded into `output`.
template <typename T, int N>
__device__ __forceinline__ void push_sum_steps(const LaunchParams& params, BlockFlags& flags,
                                               const SimpleShare& share, unsigned char* output) {
    push_sum_steps<T, N>(params, flags, share, output, [&](u64 v, const VectorSum<T>& sums) {
        store_vector(output, v, sums.result());
    });
}

}  // namespace prepare
