// The fused one-shot all-reduce + residual add + RMSNorm (all_reduce_add_rms_norm_one_shot.cu)
// on the host: every rank at once, against the harness's reference, the rank-ordered sum of
// every rank's x rounded once and then norm.h's mirror of the epilogue (itself held to the Rust
// reference by the `norm` mode's test). Row r's data is a function of the seed, r, the rank and
// the column alone (norm.h's kinds of rows: ordinary values at scales that change from row to
// row, signed zeros and subnormals, a row of zeros, NaN and infinities, huge values, any bits),
// so a row can sit anywhere in any message; the residual and the weight are the same on every
// rank. Checked on every rank: normed, residual_out (written into the residual), x kept unless
// normed is x, the residual untouched without one, no byte past any operand, the registered
// input region never read, the scratch regions not overrun; the unfused path (the all-reduce
// kernel of the same protocol into normed, then add_rms_norm) gives the same bits.
//
// Included by harness.cc inside its anonymous namespace, after norm.h and rows.h (Guarded).
#pragma once

// A kernel shape's entries at the launch's world, for the worlds a build instantiates.
template <typename Shape, typename T>
void shape_at_world(LaunchParams params) {
    switch (params.world) {
        case 3: Shape::template run<T, 3>(params); break;
        case 4: Shape::template run<T, 4>(params); break;
        case 5: Shape::template run<T, 5>(params); break;
        case 6: Shape::template run<T, 6>(params); break;
        case 7: Shape::template run<T, 7>(params); break;
        case 8: Shape::template run<T, 8>(params); break;
        default: Shape::template run<T, 2>(params); break;
    }
}

template <typename Shape>
constexpr Entries shape_entries() {
    return {{&shape_at_world<Shape, prepare::Bf16>, &shape_at_world<Shape, prepare::Fp16>,
             &shape_at_world<Shape, prepare::Fp32>}};
}

template <int N>
bool world_is_built() {
    if constexpr (N > HARNESS_MAX_WORLD) {
        std::printf("FAIL: world %d; built for worlds up to %d\n", N, HARNESS_MAX_WORLD);
        std::fflush(stdout);
        std::_Exit(2);
    }
    return true;
}

template <typename Algorithm>
struct FusedShape {
    template <typename T, int N>
    static void run(LaunchParams params) {
        if constexpr (N <= HARNESS_MAX_WORLD)
            prepare::fused_kernel<Algorithm, T, N>(params);
        else
            world_is_built<N>();
    }
};

// The unfused epilogue kernel at the launch's world, as a package of that world compiles it.
struct UnfusedNormShape {
    template <typename T, int N>
    static void run(LaunchParams params) {
        if constexpr (N <= HARNESS_MAX_WORLD)
            prepare::epilogue_kernel<prepare::AddRmsNorm, T, N>(params);
        else
            world_is_built<N>();
    }
};

const Kernel kUnfusedNorm = {"add_rms_norm", shape_entries<UnfusedNormShape>(), Scratch::None,
                             false, true};

struct FusedKernel {
    Kernel kernel;         // its name is the entry's, without the type
    const char* unfused;   // the all-reduce kernel of the same protocol, in kKernels
};

const FusedKernel kFusedKernels[] = {
    {{"all_reduce_add_rms_norm_one_shot_push_ll", shape_entries<FusedShape<prepare::FusedPushLl>>(),
      Scratch::DoubleBufferedLines, false, true},
     "one_shot_push_ll"},
    {{"all_reduce_add_rms_norm_one_shot_push_simple",
      shape_entries<FusedShape<prepare::FusedPushSimple>>(), Scratch::DoubleBufferedMessageSlots,
      false, true},
     "one_shot_push_simple"},
};

const Kernel& all_reduce_kernel(const char* name) {
    for (const Kernel& kernel : kKernels) {
        if (std::string(kernel.name) == name)
            return kernel;
    }
    std::printf("FAIL: no kernel %s\n", name);
    std::exit(2);
}

// Rank `rank`'s x at column `column` of row `row`. A row whose squares overflow in the pinned
// order alone (norm.h) is rank 0's, every other rank's +0, so that its sum is that row.
unsigned fused_x(u64 seed, u64 row, unsigned rank, u64 column) {
    if (row % kNormKinds == kOverflowTie && dtype != kFp16 && rank != 0)
        return 0;
    return norm_value(seed ^ (u64(rank + 1) << 44), row, 0, column);
}

struct FusedLaunch {
    const FusedKernel* kernel;
    std::vector<u64> rows;  // the ids of the message's rows, in order
    u64 hidden;
    bool residual;
    bool alias;    // normed written over x
    bool unfused;  // the all-reduce kernel of the same protocol, then add_rms_norm
    unsigned blocks, threads;
    float eps;
};

struct FusedOptions {
    std::vector<bool> present;  // ranks that launch at all
    u64 timeout_ns = kHealthyTimeoutNs;
    bool expect_success = true;     // check outputs (else only report abort words)
    bool expect_untouched = false;  // normed and the residual as they were (an invalid launch)
    bool last_rank_late = false;  // as harness.cc's Options::last_rank_late
    void (*tamper)(LaunchParams&) = nullptr;  // applied to every rank's fused launch
};

// The reference of a launch: the rank-ordered sums rounded once, then the mirror's epilogue.
NormOutputs fused_reference(const FusedLaunch& launch, unsigned world, u64 seed) {
    std::vector<unsigned> sums, residual, weight;
    for (u64 row : launch.rows) {
        for (u64 c = 0; c < launch.hidden; ++c) {
            float acc = element_to_float(fused_x(seed, row, 0, c));
            for (unsigned q = 1; q < world; ++q)
                acc = norm_add(acc, element_to_float(fused_x(seed, row, q, c)));
            sums.push_back(float_to_element(acc));
            residual.push_back(norm_value(seed, row, 1, c));
        }
    }
    for (u64 c = 0; c < launch.hidden; ++c)
        weight.push_back(norm_weight(seed, c, true));
    return mirror_add_rms_norm(launch.hidden, sums, launch.residual ? &residual : nullptr, weight,
                               launch.eps);
}

struct FusedRun {
    std::vector<u64> aborts;
    // outputs[launch][rank]: normed, and residual_out when a residual was given.
    std::vector<std::vector<NormOutputs>> outputs;
};

// Every present rank runs `sequence` in stream order.
FusedRun run_fused(std::vector<Rank>& ranks, const std::vector<FusedLaunch>& sequence,
                   const FusedOptions& options, u64 seed) {
    const unsigned world = static_cast<unsigned>(ranks.size());
    const u64 size = element_bytes();
    u64 max_elements = 0;
    for (const FusedLaunch& launch : sequence)
        max_elements = std::max(max_elements, launch.rows.size() * launch.hidden);
    // The input region (poisoned: every kernel here reads x locally), then a zeroed region per
    // double-buffered kernel: each fused kernel's and its all-reduce's.
    const u64 input_region = round_up(max_elements * size, 16);
    std::vector<const Kernel*> regions;
    for (const FusedKernel& kernel : kFusedKernels) {
        regions.push_back(&kernel.kernel);
        regions.push_back(&all_reduce_kernel(kernel.unfused));
    }
    std::vector<u64> offsets;
    u64 buffer_bytes = input_region;
    for (const Kernel* kernel : regions) {
        offsets.push_back(buffer_bytes);
        buffer_bytes += round_up(scratch_bytes(kernel->scratch, world, max_elements), 16);
    }
    const auto offset_of = [&](const Kernel* kernel) {
        return offsets[std::find(regions.begin(), regions.end(), kernel) - regions.begin()];
    };
    std::vector<std::unique_ptr<Aligned>> buffers(world);
    for (auto& buffer : buffers) {
        buffer.reset(new Aligned(buffer_bytes + kBufferGuard));
        std::memset(buffer->data, 0x5A, input_region);
        std::memset(buffer->data + input_region, 0, buffer_bytes - input_region);
    }
    std::vector<NormOutputs> expected(sequence.size());
    if (options.expect_success) {
        for (u64 i = 0; i < sequence.size(); ++i)
            expected[i] = fused_reference(sequence[i], world, seed);
    }
    FusedRun result{std::vector<u64>(world),
                    std::vector<std::vector<NormOutputs>>(sequence.size(),
                                                          std::vector<NormOutputs>(world))};
    // When each rank's launches began and ended, in seconds from the run's start: printed when
    // a run that must succeed aborted, to tell a late peer from a lost line.
    const auto run_start = std::chrono::steady_clock::now();
    const auto seconds = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    };
    std::vector<std::vector<std::pair<double, double>>> spans(
        sequence.size(), std::vector<std::pair<double, double>>(world, {-1.0, -1.0}));
    const emu_stall::Run counts(options.present, options.last_rank_late);
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        if (!options.present[rank])
            continue;
        streams.emplace_back([&, rank] {
            for (unsigned index = 0; index < sequence.size(); ++index) {
                const FusedLaunch& launch = sequence[index];
                spans[index][rank].first = seconds();
                const emu_stall::StreamLaunch begun(counts, rank, rank == world - 1);
                const u64 elements = launch.rows.size() * launch.hidden;
                const u64 bytes = elements * size;
                Guarded x(bytes, 64), residual(bytes, 64), separate(bytes, 64),
                    weight(launch.hidden * size, 64);
                std::vector<unsigned> x_in, residual_in;
                for (u64 row : launch.rows) {
                    for (u64 c = 0; c < launch.hidden; ++c) {
                        x_in.push_back(fused_x(seed, row, rank, c));
                        residual_in.push_back(norm_value(seed, row, 1, c));
                    }
                }
                for (u64 e = 0; e < elements; ++e) {
                    put_element(x.data(), e, x_in[e]);
                    put_element(residual.data(), e, residual_in[e]);
                }
                for (u64 c = 0; c < launch.hidden; ++c)
                    put_element(weight.data(), c, norm_weight(seed, c, true));
                unsigned char* normed = launch.alias ? x.data() : separate.data();
                LaunchParams params;
                std::memset(&params, 0, sizeof params);
                for (unsigned q = 0; q < world; ++q) {
                    params.buffers[q] = buffers[q]->data;
                    params.signals[q] = ranks[q].signals.data();
                }
                params.state = ranks[rank].state.data();
                params.input = x.data();
                params.input_elements = elements;
                params.output = normed;
                params.output_elements = elements;
                params.rows = launch.rows.size();
                params.width = launch.hidden;
                params.residual = launch.residual ? residual.data() : nullptr;
                params.weight = weight.data();
                params.normed = normed;
                params.eps = launch.eps;
                params.timeout_ns = options.timeout_ns;
                params.rank = rank;
                params.world = world;
                const Kernel& kernel = launch.kernel->kernel;
                if (launch.unfused) {
                    const Kernel& sum = all_reduce_kernel(launch.kernel->unfused);
                    LaunchParams all_reduce = params;
                    all_reduce.rows = 1;
                    all_reduce.width = elements;
                    all_reduce.residual = nullptr;
                    all_reduce.weight = nullptr;
                    all_reduce.normed = nullptr;
                    all_reduce.eps = 0;
                    all_reduce.scratch_offset = offset_of(&sum);
                    launch_rank({&sum, launch.blocks, launch.threads, 1, elements}, all_reduce);
                    LaunchParams norm = params;
                    norm.input = normed;
                    launch_rank({&kUnfusedNorm, launch.blocks, launch.threads, 1, elements}, norm);
                } else {
                    params.scratch_offset = offset_of(&kernel);
                    if (options.tamper != nullptr)
                        options.tamper(params);
                    launch_rank({&kernel, launch.blocks, launch.threads, 1, elements}, params);
                }
                spans[index][rank].second = seconds();
                char what[200];
                std::snprintf(what, sizeof what,
                              "%s_%s%s world %u, %zu x %llu%s%s, eps %g, %u x %u threads, "
                              "launch %u rank %u",
                              kernel.name, kDtypeNames[dtype], launch.unfused ? " (unfused)" : "",
                              world, launch.rows.size(), launch.hidden,
                              launch.residual ? ", residual" : "", launch.alias ? ", over x" : "",
                              launch.eps, launch.blocks, launch.threads, index, rank);
                CHECK(x.overrun() + residual.overrun() + separate.overrun() + weight.overrun() == 0,
                      "%s: wrote past an operand", what);
                u64 poisoned = 0;
                for (u64 b = 0; b < input_region; ++b)
                    poisoned += buffers[rank]->data[b] != 0x5A;
                CHECK(poisoned == 0, "%s: wrote the registered input region", what);
                std::vector<unsigned> got_normed(elements), got_residual(elements);
                for (u64 e = 0; e < elements; ++e) {
                    got_normed[e] = get_element(normed, e);
                    got_residual[e] = get_element(residual.data(), e);
                }
                if (!launch.residual || options.expect_untouched) {
                    CHECK(got_residual == residual_in, "%s: the residual was written", what);
                }
                if (options.expect_untouched && !launch.alias) {
                    u64 changed = 0;
                    for (u64 b = 0; b < bytes; ++b)
                        changed += separate.data()[b] != kBufferFill;
                    CHECK(changed == 0, "%s: wrote %llu bytes of normed", what, changed);
                }
                if (!launch.alias) {
                    std::vector<unsigned> kept(elements);
                    for (u64 e = 0; e < elements; ++e)
                        kept[e] = get_element(x.data(), e);
                    CHECK(kept == x_in, "%s: x changed", what);
                }
                if (!options.expect_success)
                    continue;
                const u64 abort = ranks[rank].state[0];
                CHECK(abort == 0, "%s: aborted %llx", what, abort);
                if (abort != 0)
                    return;
                const long long wrong = first_difference(got_normed, expected[index].normed);
                CHECK(wrong < 0, "%s: normed element %lld is %x, the reference's %x", what, wrong,
                      wrong < 0 ? 0 : got_normed[wrong],
                      wrong < 0 ? 0 : expected[index].normed[wrong]);
                if (launch.residual) {
                    const long long off =
                        first_difference(got_residual, expected[index].residual_out);
                    CHECK(off < 0, "%s: residual_out element %lld is %x, the reference's %x",
                          what, off, off < 0 ? 0 : got_residual[off],
                          off < 0 ? 0 : expected[index].residual_out[off]);
                }
                result.outputs[index][rank] = {got_normed,
                                               launch.residual ? got_residual
                                                               : std::vector<unsigned>()};
            }
        });
    }
    for (std::thread& stream : streams)
        stream.join();
    for (unsigned rank = 0; rank < world; ++rank) {
        result.aborts[rank] = ranks[rank].state[0];
        u64 changed = 0;
        for (u64 g = 0; g < kBufferGuard; ++g)
            changed += buffers[rank]->data[buffer_bytes + g] != kBufferFill;
        CHECK(changed == 0, "rank %u: wrote %llu bytes past the scratch regions", rank, changed);
    }
    const bool aborted = std::any_of(result.aborts.begin(), result.aborts.end(),
                                     [](u64 abort) { return abort != 0; });
    if (aborted && options.expect_success) {
        for (unsigned index = 0; index < sequence.size(); ++index) {
            for (unsigned rank = 0; rank < world; ++rank) {
                std::printf("  launch %u rank %u: began at %.3f s, ended at %.3f s\n", index, rank,
                            spans[index][rank].first, spans[index][rank].second);
            }
        }
    }
    return result;
}

// Launches i and i + 1 of `sequence` (a fused launch and its unfused twin) gave the same bits
// on every rank.
void check_twins(const FusedRun& run, const std::vector<FusedLaunch>& sequence) {
    for (u64 i = 0; i + 1 < sequence.size(); ++i) {
        if (sequence[i].unfused || !sequence[i + 1].unfused)
            continue;
        for (u64 rank = 0; rank < run.outputs[i].size(); ++rank) {
            CHECK(run.outputs[i][rank].normed == run.outputs[i + 1][rank].normed &&
                      run.outputs[i][rank].residual_out == run.outputs[i + 1][rank].residual_out,
                  "%s_%s launch %llu rank %llu: fused and unfused differ",
                  sequence[i].kernel->kernel.name, kDtypeNames[dtype], i, rank);
        }
    }
}

// Consecutive row ids from `first`.
std::vector<u64> fused_rows(u64 first, u64 count) {
    std::vector<u64> rows;
    for (u64 i = 0; i < count; ++i)
        rows.push_back(first + i);
    return rows;
}

// Every fused kernel at each world of `worlds`: rows 0, 1, world + 1, 64 and 65 of hidden 8, 7168
// and 16384 (those of more than `cap` elements left out), with a residual and without, normed
// over x or apart, several grids (more blocks than rows too) and eps; each launch followed by
// its unfused twin, whose bits must be the same. One stream of launches per kernel and world, so
// the launch count runs on through both kernels' regions.
void fused_collectives(const std::vector<unsigned>& worlds, u64 cap) {
    const unsigned geometries[][2] = {{1, 32}, {3, 64}, {4, 96}, {2, 32}};
    for (unsigned world : worlds) {
        for (const FusedKernel& kernel : kFusedKernels) {
            std::vector<FusedLaunch> sequence;
            unsigned variant = 0;
            for (u64 hidden : {8ull, 7168ull, 16384ull}) {
                for (u64 rows : {u64(0), u64(1), u64(world) + 1, u64(64), u64(65)}) {
                    if (rows * hidden > cap)
                        continue;
                    ++variant;
                    const unsigned* geometry = geometries[variant % std::size(geometries)];
                    FusedLaunch launch{&kernel, fused_rows(random_source() % 1000, rows), hidden,
                                       variant % 3 != 0, variant % 2 == 0, false, geometry[0],
                                       geometry[1], kNormEps[variant % 5]};
                    sequence.push_back(launch);
                    launch.unfused = true;
                    sequence.push_back(launch);
                }
            }
            std::vector<Rank> ranks(world);
            FusedOptions options;
            options.present.assign(world, true);
            check_twins(run_fused(ranks, sequence, options, random_source()), sequence);
        }
    }
}

// Rows of a 65-row message again alone and among other rows, by another kernel and grid: the
// same bytes as in the large message. Returns the rows that differed.
int fused_batch_invariance(unsigned world, u64 hidden, u64 seed) {
    const int before = failures;
    std::vector<FusedLaunch> sequence;
    const FusedKernel& ll = kFusedKernels[0];
    const FusedKernel& simple = kFusedKernels[1];
    sequence.push_back({&ll, fused_rows(100, 65), hidden, true, false, false, 4, 32, 1e-5f});
    for (u64 at : {0ull, 33ull, 64ull}) {
        const u64 id = 100 + at;
        sequence.push_back({&simple, {id}, hidden, true, true, false, 3, 64, 1e-5f});
        sequence.push_back({&ll, {7, id, 9000 + at}, hidden, true, false, false, 1, 96, 1e-5f});
    }
    std::vector<Rank> ranks(world);
    FusedOptions options;
    options.present.assign(world, true);
    const FusedRun run = run_fused(ranks, sequence, options, seed);
    for (u64 i = 1; i < sequence.size(); ++i) {
        const u64 at = sequence[i].rows.size() == 1 ? sequence[i].rows[0] : sequence[i].rows[1];
        const u64 position = sequence[i].rows.size() == 1 ? 0 : 1;
        for (unsigned rank = 0; rank < world; ++rank) {
            const NormOutputs& all = run.outputs[0][rank];
            const NormOutputs& mine = run.outputs[i][rank];
            if (all.normed.empty() || mine.normed.empty())
                continue;  // a failed launch, reported already
            bool same = true;
            for (u64 c = 0; c < hidden; ++c) {
                const u64 ours = position * hidden + c, theirs = (at - 100) * hidden + c;
                same = same && mine.normed[ours] == all.normed[theirs] &&
                       mine.residual_out[ours] == all.residual_out[theirs];
            }
            CHECK(same, "fused %s world %u hidden %llu: row %llu differs in a message of %zu rows",
                  kDtypeNames[dtype], world, hidden, at, sequence[i].rows.size());
        }
    }
    return failures - before;
}

// Rank 2 of 3 never launches: its peers give up naming it, then return at once.
void fused_timeouts() {
    const u64 timeout = PREPARE_ABORT_FLAG | (PREPARE_ABORT_PEER_TIMEOUT << 32);
    for (const FusedKernel& kernel : kFusedKernels) {
        for (u64 rows : {0ull, 5ull}) {
            std::vector<Rank> ranks(3);
            const FusedLaunch launch = {&kernel, fused_rows(0, rows), 16, true, false, false, 2, 32,
                                        1e-5f};
            FusedOptions options;
            options.present = {true, true, false};
            options.timeout_ns = 200'000'000;
            options.expect_success = false;
            FusedRun run = run_fused(ranks, {launch}, options, random_source());
            CHECK(run.aborts[0] == (timeout | 2) && run.aborts[1] == (timeout | 2),
                  "%s rows %llu: abort words %llx %llx", kernel.kernel.name, rows, run.aborts[0],
                  run.aborts[1]);
            options.present = {true, true, true};
            const auto start = std::chrono::steady_clock::now();
            run = run_fused(ranks, {launch, launch, launch}, options, random_source());
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            CHECK(run.aborts[0] == (timeout | 2) && run.aborts[1] == (timeout | 2),
                  "%s: the abort word changed", kernel.kernel.name);
            CHECK(run.aborts[2] == (timeout | 0) || run.aborts[2] == (timeout | 1),
                  "%s: rank 2's abort word %llx", kernel.kernel.name, run.aborts[2]);
            CHECK(seconds < 1.0, "%s: three launches after an abort took %.2f s",
                  kernel.kernel.name, seconds);
        }
    }
}

// Every rank launches the same broken launch: each refuses it, writing nothing.
void fused_invalid_launches() {
    const u64 invalid = PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32);
    struct Invalid {
        const char* what;
        u64 hidden;
        unsigned threads;
        void (*tamper)(LaunchParams&);
    };
    const Invalid cases[] = {
        {"hidden 12", 12, 32, nullptr},
        {"48 threads", 16, 48, nullptr},
        {"no weight", 16, 32, [](LaunchParams& p) { p.weight = nullptr; }},
        {"eps NaN", 16, 32, [](LaunchParams& p) { p.eps = __uint_as_float(0x7fc00000u); }},
        {"eps -1", 16, 32, [](LaunchParams& p) { p.eps = -1.0f; }},
        {"normed over the residual", 16, 32,
         [](LaunchParams& p) { p.normed = p.output = static_cast<unsigned char*>(p.residual) + 16; }},
        {"output not normed", 16, 32,
         [](LaunchParams& p) { p.output = const_cast<unsigned char*>(p.input); }},
        {"input one element longer", 16, 32, [](LaunchParams& p) { ++p.input_elements; }},
        {"output one element shorter", 16, 32, [](LaunchParams& p) { --p.output_elements; }},
        {"rows x hidden past 64 bits", 16, 32,
         [](LaunchParams& p) { p.rows = 1ull << 62; }},
        {"a misaligned residual", 16, 32,
         [](LaunchParams& p) { p.residual = static_cast<unsigned char*>(p.residual) + 8; }},
    };
    for (const FusedKernel& kernel : kFusedKernels) {
        for (const Invalid& broken : cases) {
            std::vector<Rank> ranks(3);
            FusedOptions options;
            options.present.assign(3, true);
            options.expect_success = false;
            options.expect_untouched = true;
            options.tamper = broken.tamper;
            const FusedLaunch launch = {&kernel, fused_rows(0, 3), broken.hidden, true, false,
                                        false, 2, broken.threads, 1e-5f};
            const FusedRun run = run_fused(ranks, {launch}, options, random_source());
            for (unsigned rank = 0; rank < 3; ++rank) {
                CHECK(run.aborts[rank] == (invalid | rank), "%s, %s, rank %u: abort word %llx",
                      kernel.kernel.name, broken.what, rank, run.aborts[rank]);
            }
        }
    }
}

// The quick mode's fused checks (worlds 2 and 3 in bf16, 2 in fp16 and fp32, up to 20,000
// elements; batch invariance in bf16), or the full mode's (every world 2..8 in every type, up to
// 140,000 elements: 65 rows of 2048, 8 of 16384; batch invariance in every type).
void fused_mode(bool full) {
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        const std::vector<unsigned> worlds =
            full ? std::vector<unsigned>{2, 3, 4, 5, 6, 7, 8}
                 : dtype == kBf16 ? std::vector<unsigned>{2, 3} : std::vector<unsigned>{2};
        fused_collectives(worlds, full ? 140'000 : 20'000);
        if (full || dtype == kBf16)
            fused_batch_invariance(3, 24, random_source());
    }
    dtype = kBf16;
    fused_timeouts();
    fused_invalid_launches();
}

// The exactness mode's lines for the fused kernels, in the current type: at worlds 2 and 3
// every kind of row at hidden 8 (with a residual, over x) and at 2056 (without), an empty
// message, more blocks than rows; ordinary rows of 16384, where another order of the squares
// moves some row's inverse by an ulp; then one launch whose last rank starts late.
void fused_exactness() {
    for (const FusedKernel& kernel : kFusedKernels) {
        const ExactnessEntry entry{entry_name(kernel.kernel.name)};
        for (unsigned world : {2u, 3u}) {
            const std::vector<FusedLaunch> sequence = {
                {&kernel, fused_rows(0, 18), 8, true, true, false, 4, 32, 1e-5f},
                {&kernel, fused_rows(36, 9), 2056, false, false, false, 2, 64, 1e-5f},
                {&kernel, {}, 8, true, false, false, 2, 32, 1e-5f},
                {&kernel, fused_rows(7, 2), 24, true, false, false, 3, 32, 0.0f},
            };
            std::vector<Rank> ranks(world);
            FusedOptions options;
            options.present.assign(world, true);
            const u64 seed = random_source();
            if (entry.runs())
                run_fused(ranks, sequence, options, seed);
        }
        std::vector<u64> spread;
        for (u64 row = 0; row < 6; ++row)
            spread.push_back(kNormKinds * row);
        std::vector<Rank> ranks(2);
        FusedOptions late;
        late.present.assign(2, true);
        if (entry.runs())
            run_fused(ranks, {{&kernel, spread, 16384, true, false, false, 3, 32, 1e-6f}}, late, 5);
        late.last_rank_late = true;
        const u64 seed = random_source();
        if (entry.runs())
            run_fused(ranks, {{&kernel, fused_rows(3, 3), 24, true, false, false, 2, 32, 1e-5f}},
                      late, seed);
        entry.report();
    }
}

// The fused kernels' lines of the invariance mode (both kernels share each message).
void fused_invariance() {
    const int differ = fused_batch_invariance(3, 24, 2000) + fused_batch_invariance(2, 2056, 2001);
    std::lock_guard<std::mutex> lock(print_mutex);
    for (const FusedKernel& kernel : kFusedKernels) {
        if (differ == 0) {
            std::printf("%s_%s: invariant\n", kernel.kernel.name, kDtypeNames[dtype]);
        } else {
            std::printf("%s_%s: varies (%d failed checks)\n", kernel.kernel.name,
                        kDtypeNames[dtype], differ);
        }
    }
}
