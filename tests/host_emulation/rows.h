// The row collectives (reduce_scatter.cu, all_gather.cu with the all-gather's copy engine, and
// their ll forms in reduce_scatter_double_buffered.cu and all_gather_double_buffered.cu) on the
// host: included by
// harness.cc inside its anonymous namespace, after the helpers it uses (launch_rank, Rank, CHECK,
// input_value, the element conversions and accessors, scratch_bytes, random_source, Aligned).
//
// A message is rows x width elements; rank q owns rows [first(q), first(q) + owned(q)), rows /
// world each, one more for the first rows % world ranks (the rule of prepare::shape, written
// here apart from the kernels' so that a planted error in theirs is caught). Rank q's input
// element e of a reduce-scatter is row_value(seed, launch, q, e), and each element it owns
// must be row_reference(seed, launch, world, e); an all-gather's rank q holds its own rows'
// values row_value(seed, launch, q, e), and every rank's output must be every owner's bytes.
#pragma once

// input_value, but in every other element ranks 0 and 1 hold a value and its negation so large
// that the other ranks' values are rounded away (or to a coarser step, in fp16) unless those two
// are added first: a sum out of rank order then differs in most such elements, where with
// ordinary values alone few differences survive the rounding to bf16 or fp16.
unsigned row_value(u64 seed, unsigned launch, unsigned rank, u64 e) {
    if (e % 2 != 0 || rank > 1)
        return input_value(seed, launch, rank, e);
    // 2^40 in bf16 and fp32, 2^15 in fp16 (its largest power of two).
    const unsigned large = dtype == kBf16 ? 0x5380u : dtype == kFp16 ? 0x7800u : 0x53800000u;
    const unsigned sign = dtype == kFp32 ? 0x80000000u : 0x8000u;
    return rank == 0 ? large : large | sign;
}

// The reference of element e: the fp32 sum of every rank's row_value in rank order, rounded once.
unsigned row_reference(u64 seed, unsigned launch, unsigned world, u64 e) {
    float sum = element_to_float(row_value(seed, launch, 0, e));
    for (unsigned q = 1; q < world; ++q)
        sum += element_to_float(row_value(seed, launch, q, e));
    return float_to_element(sum);
}

template <typename Algorithm, typename T, int N>
void row_entry_at(LaunchParams params) {
    prepare::row_kernel<Algorithm, T, N>(params);
}

template <typename Algorithm, typename T>
void row_entry(LaunchParams params) {
    switch (params.world) {
        case 3: row_entry_at<Algorithm, T, 3>(params); break;
        case 4: row_entry_at<Algorithm, T, 4>(params); break;
        case 5: row_entry_at<Algorithm, T, 5>(params); break;
        case 6: row_entry_at<Algorithm, T, 6>(params); break;
        case 7: row_entry_at<Algorithm, T, 7>(params); break;
        case 8: row_entry_at<Algorithm, T, 8>(params); break;
        default: row_entry_at<Algorithm, T, 2>(params); break;
    }
}

template <typename Algorithm>
constexpr Entries row_entries() {
    return {{&row_entry<Algorithm, prepare::Bf16>, &row_entry<Algorithm, prepare::Fp16>,
             &row_entry<Algorithm, prepare::Fp32>}};
}

struct RowKernel {
    Kernel kernel;  // its name is the entry's, without the type
    bool gather;    // an all-gather (else a reduce-scatter)
};

const RowKernel kRowKernels[] = {
    {{"all_gather_one_shot_copy_engine", row_entries<prepare::AllGatherCopyEngine>(), Scratch::None,
      false, false, true,
      row_entries<prepare::AllGatherCopyEngineBarrier<prepare::kSetStart>>(),
      row_entries<prepare::AllGatherCopyEngineBarrier<prepare::kSetEnd>>()},
     true},
    {{"all_gather_one_shot_pull", row_entries<prepare::AllGatherPull>(), Scratch::None, false,
      false},
     true},
    {{"all_gather_one_shot_push", row_entries<prepare::AllGatherPush>(), Scratch::Message, false,
      true},
     true},
    {{"all_gather_one_shot_push_ll", row_entries<prepare::AllGatherPushLl>(),
      Scratch::DoubleBufferedLines, false, true},
     true},
    {{"reduce_scatter_one_shot_pull", row_entries<prepare::ReduceScatterPull>(), Scratch::None,
      false, false},
     false},
    {{"reduce_scatter_one_shot_push", row_entries<prepare::ReduceScatterPush>(),
      Scratch::PeerMessageSlots, false, true},
     false},
    {{"reduce_scatter_one_shot_push_ll", row_entries<prepare::ReduceScatterPushLl>(),
      Scratch::DoubleBufferedLines, false, true},
     false},
};

u64 host_owned_rows(u64 rows, unsigned world, unsigned q) {
    return rows / world + (q < rows % world ? 1 : 0);
}

u64 host_first_row(u64 rows, unsigned world, unsigned q) {
    u64 first = 0;
    for (unsigned p = 0; p < q; ++p)
        first += host_owned_rows(rows, world, p);
    return first;
}

// The rank whose rows hold element e.
unsigned owner_of(u64 rows, u64 width, unsigned world, u64 e) {
    unsigned q = 0;
    while ((host_first_row(rows, world, q) + host_owned_rows(rows, world, q)) * width <= e)
        ++q;
    return q;
}

struct RowLaunch {
    const RowKernel* kernel;
    u64 rows;
    u64 width;
    unsigned blocks;
    unsigned threads;
    // The reduce-scatter's output is this rank's rows of its input; the all-gather's input is
    // this rank's rows inside its output.
    bool in_place;
    // An all-gather whose input is the output of the launch before it, a reduce-scatter of the
    // same shape: its output must be the all-reduce's, row_reference of that launch.
    bool chained = false;
};

struct RowOptions {
    std::vector<bool> present;  // ranks that launch at all
    u64 timeout_ns = kHealthyTimeoutNs;
    bool expect_success = true;  // check outputs (else only report abort words)
    bool expect_untouched = false;  // check that nothing was written (an invalid launch)
    bool last_rank_late = false;  // as harness.cc's Options::last_rank_late
    // Applied to every rank's parameters before its launch (the invalid launches).
    void (*tamper)(LaunchParams&) = nullptr;
};

// Memory with a guard of `guard` bytes of kBufferFill before and after `bytes`.
struct Guarded {
    Guarded(u64 bytes, u64 guard) : bytes(bytes), guard(guard), memory(bytes + 2 * guard) {}
    unsigned char* data() const { return memory.data + guard; }
    // Bytes of the guards that are no longer kBufferFill.
    u64 overrun() const {
        u64 changed = 0;
        for (u64 b = 0; b < guard; ++b)
            changed += (memory.data[b] != kBufferFill) + (data()[bytes + b] != kBufferFill);
        return changed;
    }
    u64 bytes, guard;
    Aligned memory;
};

// One rank's copy-engine all-gather as the host enqueues it (src/collective/copy_engine.rs): the
// start barrier; every peer's rows copied from its input region (its rows from byte 0) to their
// place in `output` (the copy engine; here on the rank's own thread in stream order, so a missing
// barrier shows as a race on the peers' input regions), peers from rank + 1 on; the own-rows
// copy; the end barrier. The copies are the host's: they take the launch's rows and width and
// the output where it is, whatever `params` says.
void copy_engine_gather(const RowLaunch& launch, const LaunchParams& params, unsigned char* output) {
    const Kernel& kernel = launch.kernel->kernel;
    const Kernel start = {"start", kernel.start, Scratch::None, false, false};
    const Kernel end = {"end", kernel.end, Scratch::None, false, false};
    const u64 whole = launch.rows * launch.width;
    const unsigned world = params.world;
    // The barriers run on one block of 32 threads, as the host launches them.
    launch_rank({&start, 1, 32, 1, whole}, params);
    for (unsigned k = 1; k < world; ++k) {
        const unsigned q = (params.rank + k) % world;
        const u64 bytes = host_owned_rows(launch.rows, world, q) * launch.width * element_bytes();
        if (bytes > 0) {
            std::memcpy(output + host_first_row(launch.rows, world, q) * launch.width *
                                     element_bytes(),
                        params.buffers[q], bytes);
        }
    }
    launch_rank({&kernel, launch.blocks, launch.threads, 1, whole}, params);
    launch_rank({&end, 1, 32, 1, whole}, params);
}

// What a row launch checks on one rank once it ended; `carried` is a chained launch's input
// (else null; it may hold no bytes, for a rank that owns no rows).
void check_rows(const RowLaunch& launch, const char* what, unsigned rank, unsigned world,
                u64 seed, unsigned index, const unsigned char* output, u64 output_elements,
                const unsigned char* input, u64 input_elements, u64 first,
                const std::vector<unsigned char>* carried) {
    const bool gather = launch.kernel->gather;
    u64 wrong = 0, at = 0;
    for (u64 e = 0; e < output_elements; ++e) {
        const unsigned expected =
            carried != nullptr ? row_reference(seed, index - 1, world, e)
            : gather ? row_value(seed, index, owner_of(launch.rows, launch.width, world, e), e)
                     : row_reference(seed, index, world, first + e);
        if (get_element(output, e) != expected && wrong++ == 0)
            at = e;
    }
    CHECK(wrong == 0, "%s rank %u: %llu of %llu output elements wrong, first %llu", what, rank,
          wrong, output_elements, at);
    // The input is unchanged, but for a reduce-scatter in place, whose output is its rows.
    const u64 written_from = launch.in_place && !gather ? first : input_elements;
    const u64 written_to = written_from + (launch.in_place && !gather ? output_elements : 0);
    for (u64 e = 0; e < input_elements; ++e) {
        if (e >= written_from && e < written_to)
            continue;
        const unsigned kept = get_element(input, e);
        const unsigned expected = carried != nullptr
                                      ? get_element(carried->data(), e)
                                      : row_value(seed, index, rank, gather ? first + e : e);
        CHECK(kept == expected, "%s rank %u: input element %llu changed", what, rank, e);
        if (kept != expected)
            break;
    }
}

// Every present rank runs `sequence` in stream order; returns each rank's abort word.
std::vector<u64> run_rows(std::vector<Rank>& ranks, const std::vector<RowLaunch>& sequence,
                          const RowOptions& options, u64 seed) {
    const unsigned world = static_cast<unsigned>(ranks.size());
    const u64 size = element_bytes();
    u64 max_elements = 0, shared = 0, row_guard = 64;
    std::vector<u64> own_bytes(std::size(kRowKernels), 0);
    for (const RowLaunch& launch : sequence) {
        const u64 elements = launch.rows * launch.width;
        max_elements = std::max(max_elements, elements);
        const Scratch scratch = launch.kernel->kernel.scratch;
        u64& needed =
            double_buffered(scratch) ? own_bytes[launch.kernel - kRowKernels] : shared;
        needed = std::max(needed, scratch_bytes(scratch, world, elements));
        // Wide enough that a whole row written past a buffer lands in its guard.
        row_guard = std::max(row_guard, round_up(launch.width * size + 64, 16));
    }
    // The input region holds the message and a row's guard; then the scratch, exactly, as the
    // host lays it out: the barrier kernels' shared region, then one region of each
    // double-buffered kernel, zeroed before its first launch.
    const u64 scratch_offset = round_up(max_elements * size, 16) + row_guard;
    std::vector<u64> offsets(std::size(kRowKernels), scratch_offset);
    u64 buffer_bytes = scratch_offset + shared;
    for (std::size_t k = 0; k < std::size(kRowKernels); ++k) {
        if (own_bytes[k] > 0)
            offsets[k] = buffer_bytes;
        buffer_bytes += own_bytes[k];
    }
    std::vector<std::unique_ptr<Aligned>> buffers(world);
    for (auto& buffer : buffers) {
        buffer.reset(new Aligned(buffer_bytes + kBufferGuard));
        std::memset(buffer->data + scratch_offset + shared, 0,
                    buffer_bytes - scratch_offset - shared);
    }
    const emu_stall::Run counts(options.present, options.last_rank_late);
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        if (!options.present[rank])
            continue;
        streams.emplace_back([&, rank] {
            // The last launch's output, a chained launch's input.
            std::vector<unsigned char> carried;
            for (unsigned index = 0; index < sequence.size(); ++index) {
                const RowLaunch& launch = sequence[index];
                const bool chained = launch.chained && index > 0;
                const bool gather = launch.kernel->gather;
                const bool local = launch.kernel->kernel.local_input;
                const emu_stall::StreamLaunch begun(counts, rank, rank == world - 1);
                const u64 whole = launch.rows * launch.width;
                const u64 first = host_first_row(launch.rows, world, rank) * launch.width;
                const u64 own = host_owned_rows(launch.rows, world, rank) * launch.width;
                unsigned char* region = buffers[rank]->data;
                // The message's memory: the whole one, and where this rank's rows are. `values`
                // is the caller's input; a kernel whose peers read it reads the input region.
                Guarded whole_memory(whole * size, row_guard);
                Guarded own_memory(own * size, row_guard);
                unsigned char* values;
                unsigned char* output;
                const u64 input_elements = gather ? own : whole;
                if (gather) {
                    output = whole_memory.data();
                    values = launch.in_place ? output + first * size : own_memory.data();
                } else {
                    values = local ? whole_memory.data() : region;
                    output = launch.in_place ? values + first * size : own_memory.data();
                }
                // Every kernel's input region past the message is a row's guard; a kernel that
                // reads only locally must not read the region at all: it holds poison.
                std::memset(region, local ? 0x5A : kBufferFill, scratch_offset);
                CHECK(!chained || carried.size() == input_elements * size,
                      "launch %u: a chained launch's input is not its predecessor's output",
                      index);
                for (u64 e = 0; e < input_elements; ++e)
                    put_element(values, e,
                                chained ? get_element(carried.data(), e)
                                        : row_value(seed, index, rank, gather ? first + e : e));
                if (!local && gather)
                    std::memcpy(region, values, own * size);
                unsigned char* input = local ? values : region;
                LaunchParams params;
                std::memset(&params, 0, sizeof params);
                for (unsigned q = 0; q < world; ++q) {
                    params.buffers[q] = buffers[q]->data;
                    params.signals[q] = ranks[q].signals.data();
                }
                params.state = ranks[rank].state.data();
                params.output = output;
                params.input = input;
                params.input_elements = input_elements;
                params.output_elements = gather ? whole : own;
                params.rows = launch.rows;
                params.width = launch.width;
                params.scratch_offset = offsets[launch.kernel - kRowKernels];
                params.timeout_ns = options.timeout_ns;
                params.rank = rank;
                params.world = world;
                if (options.tamper != nullptr)
                    options.tamper(params);
                const Kernel& kernel = launch.kernel->kernel;
                if (kernel.copy_engine) {
                    copy_engine_gather(launch, params, output);
                } else {
                    launch_rank({&kernel, launch.blocks, launch.threads, 1, whole}, params);
                }
                char what[160];
                std::snprintf(what, sizeof what,
                              "%s_%s world %u, %llu x %llu%s, %u x %u threads, launch %u",
                              kernel.name, kDtypeNames[dtype], world, launch.rows, launch.width,
                              launch.in_place ? " in place" : "", launch.blocks, launch.threads,
                              index);
                CHECK(whole_memory.overrun() == 0 && own_memory.overrun() == 0,
                      "%s rank %u: wrote past its memory", what, rank);
                if (!local) {
                    const u64 used = (gather ? own : whole) * size;
                    u64 changed = 0;
                    for (u64 b = used; b < used + row_guard; ++b)
                        changed += region[b] != kBufferFill;
                    CHECK(changed == 0, "%s rank %u: wrote past its input", what, rank);
                }
                if (options.expect_untouched) {
                    // A copy engine's host copies run whatever its kernels refuse (as after an
                    // abort): only its own rows are the kernels' to leave.
                    const bool copies = kernel.copy_engine;
                    const unsigned char* written =
                        gather ? output + (copies ? first * size : 0) : own_memory.data();
                    const u64 bytes = gather ? (copies ? own : whole) * size
                                             : launch.in_place ? 0 : own * size;
                    u64 changed = 0;
                    for (u64 b = 0; b < bytes; ++b)
                        changed += written[b] != kBufferFill;
                    CHECK(changed == 0, "%s rank %u: wrote %llu bytes of its output", what, rank,
                          changed);
                }
                if (!options.expect_success)
                    continue;
                const u64 abort = ranks[rank].state[0];
                CHECK(abort == 0, "%s rank %u: aborted %llx", what, rank, abort);
                if (abort != 0)
                    return;
                check_rows(launch, what, rank, world, seed, index, output, params.output_elements,
                           input, input_elements, first, chained ? &carried : nullptr);
                carried.assign(output, output + params.output_elements * size);
            }
        });
    }
    for (std::thread& stream : streams)
        stream.join();
    std::vector<u64> aborts(world);
    for (unsigned rank = 0; rank < world; ++rank) {
        aborts[rank] = ranks[rank].state[0];
        u64 changed = 0;
        for (u64 g = 0; g < kBufferGuard; ++g)
            changed += buffers[rank]->data[buffer_bytes + g] != kBufferFill;
        CHECK(changed == 0, "rank %u: wrote %llu bytes past the scratch region", rank, changed);
    }
    return aborts;
}

// The shapes every row kernel is checked at: rows 0, 1, world - 1, world + 1, 2047 and 2048 of
// widths 1, 7 and 4096, those of more than `cap` elements or of `floor` or fewer (but for rows
// 0, when `floor` is 0) left out.
std::vector<std::pair<u64, u64>> row_shapes(unsigned world, u64 cap, u64 floor = 0) {
    std::vector<std::pair<u64, u64>> shapes;
    for (u64 rows : {u64(0), u64(1), u64(world) - 1, u64(world) + 1, u64(2047), u64(2048)}) {
        for (u64 width : {1, 7, 4096}) {
            const u64 elements = rows * width;
            if (elements <= cap && (elements > floor || (floor == 0 && elements == 0)))
                shapes.push_back({rows, width});
        }
    }
    return shapes;
}

// Every row kernel at every world of `worlds` and every shape, out of place and in place, in
// one stream of launches per kernel and world (the epochs run on from shape to shape).
void row_collectives(const std::vector<unsigned>& worlds, u64 cap, u64 floor = 0) {
    for (unsigned world : worlds) {
        for (const RowKernel& kernel : kRowKernels) {
            std::vector<RowLaunch> sequence;
            unsigned variant = 0;
            for (const auto& [rows, width] : row_shapes(world, cap, floor)) {
                for (bool in_place : {false, true}) {
                    ++variant;
                    sequence.push_back({&kernel, rows, width, 1 + variant % 3,
                                        variant % 4 == 0 ? 64u : 32u, in_place});
                }
            }
            std::vector<Rank> ranks(world);
            RowOptions options;
            options.present.assign(world, true);
            run_rows(ranks, sequence, options, random_source());
        }
    }
}

// Rank 2 of 3 never launches: its peers give up naming it, then return at once.
void row_timeouts() {
    const u64 timeout = PREPARE_ABORT_FLAG | (PREPARE_ABORT_PEER_TIMEOUT << 32);
    for (const RowKernel& kernel : kRowKernels) {
        std::vector<Rank> ranks(3);
        const RowLaunch launch = {&kernel, 5, 7, 2, 32, false};
        RowOptions options;
        options.present = {true, true, false};
        options.timeout_ns = 200'000'000;
        options.expect_success = false;
        std::vector<u64> aborts = run_rows(ranks, {launch}, options, random_source());
        CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2), "%s: abort words %llx %llx",
              kernel.kernel.name, aborts[0], aborts[1]);
        options.present = {true, true, true};
        const auto start = std::chrono::steady_clock::now();
        aborts = run_rows(ranks, {launch, launch, launch}, options, random_source());
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2),
              "%s: the abort word changed", kernel.kernel.name);
        CHECK(aborts[2] == (timeout | 0) || aborts[2] == (timeout | 1),
              "%s: rank 2's abort word %llx", kernel.kernel.name, aborts[2]);
        CHECK(seconds < 1.0, "%s: three launches after an abort took %.2f s", kernel.kernel.name,
              seconds);
    }
}

// The side that holds the whole message, and this rank's side, of a launch's parameters.
bool tampered_gather = false;

u64& whole_count(LaunchParams& params) {
    return tampered_gather ? params.output_elements : params.input_elements;
}

u64& own_count(LaunchParams& params) {
    return tampered_gather ? params.input_elements : params.output_elements;
}

// Every rank launches the same broken launch: each refuses it, writing nothing.
void row_invalid_launches() {
    const u64 invalid = PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32);
    struct Invalid {
        const char* what;
        u64 rows, width;
        void (*tamper)(LaunchParams&);
    };
    // Rows of width 8 start a vector in every type: this rank's side must be 16-byte aligned.
    const Invalid cases[] = {
        {"width 0", 4, 0, nullptr},
        {"a whole message one element longer", 5, 7,
         [](LaunchParams& params) { ++whole_count(params); }},
        {"this rank's rows one element longer", 5, 7,
         [](LaunchParams& params) { ++own_count(params); }},
        {"rows x width past 64 bits", 3, 7,
         [](LaunchParams& params) {
             params.rows = 1ull << 40;
             params.width = 1ull << 30;
         }},
        {"this rank's rows off their 16-byte boundary", 6, 8,
         [](LaunchParams& params) {
             if (tampered_gather) {
                 params.input += 2;
             } else {
                 params.output = static_cast<unsigned char*>(params.output) + 2;
             }
         }},
        {"the whole message off its 16-byte boundary", 6, 8,
         [](LaunchParams& params) {
             if (tampered_gather) {
                 params.output = static_cast<unsigned char*>(params.output) + 4;
             } else {
                 params.input += 4;
             }
         }},
    };
    for (const RowKernel& kernel : kRowKernels) {
        tampered_gather = kernel.gather;
        for (const Invalid& broken : cases) {
            std::vector<Rank> ranks(3);
            RowOptions options;
            options.present.assign(3, true);
            options.expect_success = false;
            options.expect_untouched = true;
            options.tamper = broken.tamper;
            const RowLaunch launch = {&kernel, broken.rows, broken.width, 1, 32, false};
            const std::vector<u64> aborts = run_rows(ranks, {launch}, options, random_source());
            for (unsigned rank = 0; rank < 3; ++rank) {
                CHECK(aborts[rank] == (invalid | rank), "%s, %s, rank %u: abort word %llx",
                      kernel.kernel.name, broken.what, rank, aborts[rank]);
            }
        }
    }
    tampered_gather = false;
}

// The identity: the all-gather of a reduce-scatter is the all-reduce. Every all-gather kernel,
// each in one stream of launches per world, after a reduce-scatter kernel at every shape, its
// input the reduce-scatter's output (the reduce-scatters taken in turn from shape to shape, so
// every pair runs), both in place or both not, each rank going on to the all-gather as soon as
// its reduce-scatter ends; every rank's output must be row_reference of the reduce-scatter's
// inputs, the all-reduce's sum.
void row_identity(const std::vector<unsigned>& worlds, u64 cap, u64 floor = 0) {
    std::vector<const RowKernel*> scatters, gathers;
    for (const RowKernel& kernel : kRowKernels)
        (kernel.gather ? gathers : scatters).push_back(&kernel);
    for (unsigned world : worlds) {
        for (std::size_t g = 0; g < gathers.size(); ++g) {
            std::vector<RowLaunch> sequence;
            unsigned variant = 0;
            for (const auto& [rows, width] : row_shapes(world, cap, floor)) {
                ++variant;
                const RowKernel* scatter = scatters[(variant + g) % scatters.size()];
                const bool in_place = (variant / scatters.size() + g) % 2 == 1;
                const unsigned blocks = 1 + variant % 3;
                const unsigned threads = variant % 4 == 0 ? 64u : 32u;
                sequence.push_back({scatter, rows, width, blocks, threads, in_place});
                sequence.push_back({gathers[g], rows, width, blocks, threads, in_place, true});
            }
            std::vector<Rank> ranks(world);
            RowOptions options;
            options.present.assign(world, true);
            run_rows(ranks, sequence, options, random_source());
        }
    }
}

// The shapes above the quick and full modes' cap, 2047 and 2048 rows of 4096: every row kernel
// and the identity at every world of `worlds`, in every type.
void rows_large_mode(const std::vector<unsigned>& worlds) {
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        row_collectives(worlds, 2048 * 4096, 40'000);
        row_identity(worlds, 2048 * 4096, 40'000);
    }
}

// The quick mode's row checks (worlds 2, 3 and 8), or the full mode's (every world 2..8, the
// shapes above the cap too).
void rows_mode(bool full) {
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        const std::vector<unsigned> worlds =
            full ? std::vector<unsigned>{2, 3, 4, 5, 6, 7, 8} : std::vector<unsigned>{2, 3, 8};
        row_collectives(worlds, 40'000);
        row_identity(worlds, 40'000);
    }
    if (full)
        rows_large_mode({2, 3, 4, 5, 6, 7, 8});
    dtype = kBf16;
    row_timeouts();
    row_invalid_launches();
}

// The exactness mode's lines for the row kernels, in the current type: a few shapes at worlds
// 2 and 3 (a rank without rows, short ranks, rows the world divides, odd and whole-vector
// widths, in place and not), then one launch whose last rank starts late.
void rows_exactness() {
    for (const RowKernel& kernel : kRowKernels) {
        const ExactnessEntry entry{entry_name(kernel.kernel.name)};
        for (unsigned world : {2u, 3u}) {
            std::vector<RowLaunch> sequence;
            for (const auto& [rows, width] : std::vector<std::pair<u64, u64>>{
                     {1, 7}, {u64(world) + 1, 1}, {u64(world) + 1, 7}, {2 * u64(world), 7},
                     {9, 8}, {3, 4096}}) {
                for (bool in_place : {false, true})
                    sequence.push_back({&kernel, rows, width, 2, 32, in_place});
            }
            std::vector<Rank> ranks(world);
            RowOptions options;
            options.present.assign(world, true);
            const u64 seed = random_source();
            if (entry.runs())
                run_rows(ranks, sequence, options, seed);
        }
        std::vector<Rank> ranks(3);
        RowOptions late;
        late.present.assign(3, true);
        late.last_rank_late = true;
        const u64 seed = random_source();
        if (entry.runs())
            run_rows(ranks, {{&kernel, 4, 7, 1, 32, false}}, late, seed);
        entry.report();
    }
}
