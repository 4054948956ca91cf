// The fused two-shot all-reduce + residual add + RMSNorm (all_reduce_add_rms_norm_two_shot.cu)
// on the host: included by harness.cc inside its anonymous namespace, after norm.h (the rows'
// data and the mirror of the reference) and rows.h (Guarded, the owners' rows).
//
// A message is rows x hidden; its rows are norm.h's rows by id, so a row has the same inputs in
// every message. Rank q's x of a row of ordinary values (norm.h's spread kinds) is that row's
// data drawn again for q, so every rank's value counts in the sum; in a row of special values
// (signed zeros, subnormals, zeros, NaN, infinities, huge values, any bits) rank 0 holds the
// row and every other rank -0, which adds nothing, so the sum is that row itself. The residual
// and the weight are the same on every rank. The reference of every rank's outputs is the
// fp32 sum in rank order, rounded once (written here apart from the kernels'), through norm.h's
// mirror of prepare::reference::reference_add_rms_norm, which the `norm` mode holds to the Rust
// reference.
#pragma once

// An entry of `Shape` (a kernel body at a world) at the launch's world, as a package compiled
// for that world has it; a world outside 2..8 goes to the world-2 instantiation, which refuses
// it.
template <typename Shape, typename T, int N>
void two_shot_entry_at(LaunchParams params) {
    if constexpr (N > HARNESS_MAX_WORLD) {
        std::printf("FAIL: world %d; built for worlds up to %d\n", N, HARNESS_MAX_WORLD);
        std::fflush(stdout);
        std::_Exit(2);
    } else {
        Shape::template call<T, N>(params);
    }
}

template <typename Shape, typename T>
void two_shot_entry(LaunchParams params) {
    switch (params.world) {
        case 3: two_shot_entry_at<Shape, T, 3>(params); break;
        case 4: two_shot_entry_at<Shape, T, 4>(params); break;
        case 5: two_shot_entry_at<Shape, T, 5>(params); break;
        case 6: two_shot_entry_at<Shape, T, 6>(params); break;
        case 7: two_shot_entry_at<Shape, T, 7>(params); break;
        case 8: two_shot_entry_at<Shape, T, 8>(params); break;
        default: two_shot_entry_at<Shape, T, 2>(params); break;
    }
}

template <typename Shape>
constexpr Entries two_shot_entries() {
    return {{&two_shot_entry<Shape, prepare::Bf16>, &two_shot_entry<Shape, prepare::Fp16>,
             &two_shot_entry<Shape, prepare::Fp32>}};
}

struct FusedTwoShot {
    template <typename T, int N>
    static void call(LaunchParams params) {
        prepare::fused_kernel<prepare::AddRmsNormTwoShot, T, N>(params);
    }
};

const Kernel kTwoShot = {"all_reduce_add_rms_norm_two_shot", two_shot_entries<FusedTwoShot>(),
                         Scratch::TwoMessages, false, false};
// kUnfusedNorm, the unfused epilogue at any world, is fused.h's.

// The all-reduce of the unfused path: the RSAG pulled, an all-reduce kernel of another layout.
const Kernel& unfused_all_reduce() {
    for (const Kernel& kernel : kKernels) {
        if (std::string(kernel.name) == "rsag_pull")
            return kernel;
    }
    std::printf("FAIL: no rsag_pull kernel\n");
    std::exit(2);
}

unsigned negative_zero() {
    return dtype == kFp32 ? 0x80000000u : 0x8000u;
}

// Rank q's x, element `column` of row `id`.
unsigned two_shot_x(u64 seed, u64 id, unsigned q, u64 column) {
    switch (static_cast<NormKind>(id % kNormKinds)) {
        case kSpread:
        case kSpreadToo:
        case kSmallSpread: return norm_value(seed + q * 0x632be59bd9b4e019ull, id, 0, column);
        default: return q == 0 ? norm_value(seed, id, 0, column) : negative_zero();
    }
}

struct TwoShotLaunch {
    std::vector<u64> ids;  // the message's rows, in order
    u64 hidden;
    bool residual;
    bool in_place;  // normed over x, in this rank's registered input region
    bool unfused;   // then the unfused path on the same inputs, its bits compared
    unsigned blocks, threads;
    float eps;
    bool special_weight;
};

struct TwoShotOptions {
    std::vector<bool> present;  // ranks that launch at all
    // A block's deadline runs from its start through the norms of its rows before the gather
    // barrier, whose block barriers are slow to emulate on a loaded machine.
    u64 timeout_ns = kHealthyTimeoutNs;
    bool expect_success = true;    // check outputs (else only report abort words)
    bool expect_untouched = false;  // check that nothing was written (an invalid launch)
    bool last_rank_late = false;  // as harness.cc's Options::last_rank_late
    // Applied to every rank's parameters before its fused launch (the invalid launches).
    void (*tamper)(LaunchParams&) = nullptr;
};

// One launch's operands (the same on every rank but x) and every rank's expected outputs.
struct TwoShotData {
    std::vector<std::vector<unsigned>> x;  // per rank
    std::vector<unsigned> residual, weight;
    NormOutputs expected;
};

TwoShotData two_shot_data(const TwoShotLaunch& launch, unsigned world, u64 seed) {
    TwoShotData data;
    data.x.resize(world);
    std::vector<unsigned> sum;
    for (u64 id : launch.ids) {
        for (u64 column = 0; column < launch.hidden; ++column) {
            float total = element_to_float(two_shot_x(seed, id, 0, column));
            for (unsigned q = 0; q < world; ++q) {
                const unsigned value = two_shot_x(seed, id, q, column);
                data.x[q].push_back(value);
                if (q > 0)
                    total += element_to_float(value);
            }
            sum.push_back(float_to_element(total));
            data.residual.push_back(norm_value(seed, id, 1, column));
        }
    }
    for (u64 column = 0; column < launch.hidden; ++column)
        data.weight.push_back(norm_weight(seed, column, launch.special_weight));
    data.expected = mirror_add_rms_norm(launch.hidden, sum,
                                        launch.residual ? &data.residual : nullptr, data.weight,
                                        launch.eps);
    return data;
}

void put_elements(unsigned char* base, const std::vector<unsigned>& values) {
    for (u64 e = 0; e < values.size(); ++e)
        put_element(base, e, values[e]);
}

std::vector<unsigned> get_elements(const unsigned char* base, u64 elements) {
    std::vector<unsigned> values(elements);
    for (u64 e = 0; e < elements; ++e)
        values[e] = get_element(base, e);
    return values;
}

// Checks `got` against `expected` element by element, naming the first difference.
void check_elements(const char* what, const char* name, unsigned rank,
                    const std::vector<unsigned>& got, const std::vector<unsigned>& expected) {
    const long long wrong = first_difference(got, expected);
    CHECK(wrong < 0, "%s rank %u: %s element %lld is %x, expected %x", what, rank, name, wrong,
          wrong < 0 ? 0 : got[wrong], wrong < 0 ? 0 : expected[wrong]);
}

// One rank's unfused path on the launch's inputs, after its fused launch ended: x written
// again into its input region (peers finished reading it at the fused launch's gather
// barrier), the RSAG all-reduce of it into a buffer of its own, then add_rms_norm over that
// sum with a fresh copy of the residual. Its outputs must be the fused launch's bits.
void unfused_path(const TwoShotLaunch& launch, const TwoShotData& data, LaunchParams params,
                  const NormOutputs& fused, const char* what) {
    const u64 elements = launch.ids.size() * launch.hidden;
    const u64 bytes = elements * element_bytes();
    put_elements(params.buffers[params.rank], data.x[params.rank]);
    Guarded sum(bytes, 64), residual(bytes, 64);
    put_elements(residual.data(), data.residual);
    LaunchParams reduce = params;
    reduce.output = sum.data();
    reduce.input = params.buffers[params.rank];
    reduce.rows = 1;
    reduce.width = elements;
    reduce.residual = nullptr;
    reduce.weight = nullptr;
    reduce.normed = nullptr;
    reduce.eps = 0.0f;
    launch_rank({&unfused_all_reduce(), launch.blocks, launch.threads, 1, elements}, reduce);
    LaunchParams norm = params;
    norm.input = sum.data();
    norm.residual = launch.residual ? residual.data() : nullptr;
    norm.normed = sum.data();
    launch_rank({&kUnfusedNorm, launch.blocks, launch.threads, 1, elements}, norm);
    CHECK(params.state[0] == 0, "%s rank %u: the unfused path aborted %llx", what, params.rank,
          params.state[0]);
    check_elements(what, "the unfused path's normed", params.rank, get_elements(sum.data(), elements),
                   fused.normed);
    if (launch.residual) {
        check_elements(what, "the unfused path's residual_out", params.rank,
                       get_elements(residual.data(), elements), fused.residual_out);
    }
    CHECK(sum.overrun() == 0 && residual.overrun() == 0, "%s rank %u: the unfused path wrote past",
          what, params.rank);
}

// Every present rank runs `sequence` in stream order. Returns each rank's abort word, and
// fills `outputs` (when given) with every launch's outputs on every rank: [launch][rank].
std::vector<u64> run_two_shot(std::vector<Rank>& ranks, const std::vector<TwoShotLaunch>& sequence,
                              const TwoShotOptions& options, u64 seed,
                              std::vector<std::vector<NormOutputs>>* outputs = nullptr) {
    const unsigned world = static_cast<unsigned>(ranks.size());
    const u64 size = element_bytes();
    u64 max_elements = 0, max_scratch = 0, row_guard = 64;
    std::vector<TwoShotData> data;
    for (const TwoShotLaunch& launch : sequence) {
        const u64 elements = launch.ids.size() * launch.hidden;
        max_elements = std::max(max_elements, elements);
        max_scratch = std::max({max_scratch, scratch_bytes(kTwoShot.scratch, world, elements),
                                scratch_bytes(unfused_all_reduce().scratch, world, elements)});
        row_guard = std::max(row_guard, round_up(launch.hidden * size + 64, 16));
        data.push_back(two_shot_data(launch, world, seed + data.size()));
    }
    if (outputs != nullptr)
        outputs->assign(sequence.size(), std::vector<NormOutputs>(world));
    // The input region holds the message and a row's guard; then the scratch, exactly.
    const u64 scratch_offset = round_up(max_elements * size, 16) + row_guard;
    const u64 buffer_bytes = scratch_offset + max_scratch;
    std::vector<std::unique_ptr<Aligned>> buffers(world);
    for (auto& buffer : buffers)
        buffer.reset(new Aligned(buffer_bytes + kBufferGuard));
    const emu_stall::Run counts(options.present, options.last_rank_late);
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        if (!options.present[rank])
            continue;
        streams.emplace_back([&, rank] {
            for (unsigned index = 0; index < sequence.size(); ++index) {
                const TwoShotLaunch& launch = sequence[index];
                const TwoShotData& in = data[index];
                const emu_stall::StreamLaunch begun(counts, rank, rank == world - 1);
                const u64 elements = launch.ids.size() * launch.hidden;
                const u64 bytes = elements * size;
                unsigned char* region = buffers[rank]->data;
                // x in the input region (the host copies it there), a row's guard after it.
                std::memset(region, kBufferFill, scratch_offset);
                put_elements(region, in.x[rank]);
                Guarded residual(bytes, row_guard), separate(bytes, row_guard);
                Aligned weight(launch.hidden * size);
                put_elements(residual.data(), in.residual);
                put_elements(weight.data, in.weight);
                unsigned char* normed = launch.in_place ? region : separate.data();
                LaunchParams params;
                std::memset(&params, 0, sizeof params);
                for (unsigned q = 0; q < world; ++q) {
                    params.buffers[q] = buffers[q]->data;
                    params.signals[q] = ranks[q].signals.data();
                }
                params.state = ranks[rank].state.data();
                params.output = normed;
                params.input = region;
                params.input_elements = elements;
                params.output_elements = elements;
                params.rows = launch.ids.size();
                params.width = launch.hidden;
                params.residual = launch.residual ? residual.data() : nullptr;
                params.weight = weight.data;
                params.normed = normed;
                params.eps = launch.eps;
                params.scratch_offset = scratch_offset;
                params.timeout_ns = options.timeout_ns;
                params.rank = rank;
                params.world = world;
                LaunchParams fused = params;
                if (options.tamper != nullptr)
                    options.tamper(fused);
                launch_rank({&kTwoShot, launch.blocks, launch.threads, 1, elements}, fused);
                char what[200];
                std::snprintf(what, sizeof what,
                              "%s_%s world %u, %zu x %llu%s%s, %u x %u threads, launch %u",
                              kTwoShot.name, kDtypeNames[dtype], world, launch.ids.size(),
                              launch.hidden, launch.residual ? " residual" : "",
                              launch.in_place ? " over x" : "", launch.blocks, launch.threads,
                              index);
                CHECK(residual.overrun() == 0 && separate.overrun() == 0,
                      "%s rank %u: wrote past its outputs", what, rank);
                u64 changed = 0;
                for (u64 b = bytes; b < scratch_offset; ++b)
                    changed += region[b] != kBufferFill;
                CHECK(changed == 0, "%s rank %u: wrote past its input", what, rank);
                const NormOutputs got{get_elements(normed, elements),
                                      get_elements(residual.data(), elements)};
                if (options.expect_untouched) {
                    check_elements(what, "untouched residual", rank, got.residual_out,
                                   in.residual);
                    u64 written = 0;
                    for (u64 b = 0; b < bytes; ++b)
                        written += separate.data()[b] != kBufferFill;
                    CHECK(written == 0, "%s rank %u: wrote %llu bytes of normed", what, rank,
                          written);
                }
                if (!options.expect_success)
                    continue;
                const u64 abort = ranks[rank].state[0];
                CHECK(abort == 0, "%s rank %u: aborted %llx", what, rank, abort);
                if (abort != 0)
                    return;
                check_elements(what, "normed", rank, got.normed, in.expected.normed);
                // Without a residual, residual_out is the sum, which no output holds.
                check_elements(what, "residual_out", rank, got.residual_out,
                               launch.residual ? in.expected.residual_out : in.residual);
                if (!launch.in_place)
                    check_elements(what, "kept x", rank, get_elements(region, elements),
                                   in.x[rank]);
                if (outputs != nullptr)
                    (*outputs)[index][rank] = got;
                if (launch.unfused)
                    unfused_path(launch, in, params, got, what);
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

// Row ids from `first`, `count` of them.
std::vector<u64> two_shot_rows(u64 first, u64 count) {
    return norm_rows(first, count);
}

// The shapes the kernel is checked at: rows 0, 1, world - 1, world + 1 and 65 of hidden 8,
// 7168 and 16384, those of more than `cap` elements left out.
std::vector<std::pair<u64, u64>> two_shot_shapes(unsigned world, u64 cap) {
    std::vector<std::pair<u64, u64>> shapes;
    for (u64 rows : {u64(0), u64(1), u64(world) - 1, u64(world) + 1, u64(65)}) {
        for (u64 hidden : {8, 7168, 16384}) {
            const std::pair<u64, u64> shape{rows, hidden};
            if (rows * hidden <= cap &&
                std::find(shapes.begin(), shapes.end(), shape) == shapes.end())
                shapes.push_back(shape);
        }
    }
    return shapes;
}

// Every shape at every world of `worlds`, one stream of launches per world: with a residual
// and without, normed over x and apart, each combination (`full`) or one a shape by turns,
// with the unfused path compared every other launch. Rows of 65, the slowest to emulate (a
// block's barriers a row), at two ranks alone unless `full`.
void two_shot_shapes_at(const std::vector<unsigned>& worlds, bool full) {
    for (unsigned world : worlds) {
        std::vector<TwoShotLaunch> sequence;
        unsigned variant = 0;
        for (const auto& [rows, hidden] : two_shot_shapes(world, 40'000)) {
            if (!full && rows == 65 && world != 2)
                continue;
            for (unsigned combination = 0; combination < (full ? 4u : 1u); ++combination) {
                const unsigned mode = full ? combination : variant % 4;
                ++variant;
                sequence.push_back({two_shot_rows(random_source() % 1000, rows), hidden,
                                    mode % 2 == 0, mode / 2 == 1, variant % 2 == 0,
                                    1 + variant % 3, variant % 3 == 0 ? 64u : 32u,
                                    kNormEps[variant % 5], variant % 4 == 1});
            }
        }
        std::vector<Rank> ranks(world);
        TwoShotOptions options;
        options.present.assign(world, true);
        run_two_shot(ranks, sequence, options, random_source());
    }
}

// Rank 2 of 3 never launches: its peers give up naming it, then return at once.
void two_shot_timeouts() {
    const u64 timeout = PREPARE_ABORT_FLAG | (PREPARE_ABORT_PEER_TIMEOUT << 32);
    std::vector<Rank> ranks(3);
    const TwoShotLaunch launch = {two_shot_rows(0, 5), 16, true, false, false, 2, 32, 1e-5f, false};
    TwoShotOptions options;
    options.present = {true, true, false};
    options.timeout_ns = 200'000'000;
    options.expect_success = false;
    std::vector<u64> aborts = run_two_shot(ranks, {launch}, options, random_source());
    CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2),
          "%s: abort words %llx %llx", kTwoShot.name, aborts[0], aborts[1]);
    options.present = {true, true, true};
    const auto start = std::chrono::steady_clock::now();
    aborts = run_two_shot(ranks, {launch, launch, launch}, options, random_source());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2), "%s: the abort word changed",
          kTwoShot.name);
    CHECK(aborts[2] == (timeout | 0) || aborts[2] == (timeout | 1), "%s: rank 2's abort word %llx",
          kTwoShot.name, aborts[2]);
    CHECK(seconds < 1.0, "%s: three launches after an abort took %.2f s", kTwoShot.name, seconds);
}

// Every rank launches the same broken launch: each refuses it with its code, writing nothing.
void two_shot_invalid_launches() {
    const u64 invalid = PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32);
    struct Invalid {
        const char* what;
        unsigned threads;
        void (*tamper)(LaunchParams&);
    };
    const Invalid cases[] = {
        {"hidden 12", 32,
         [](LaunchParams& p) {
             p.width = 12;
             p.input_elements = p.output_elements = p.rows * 12;
         }},
        {"output not normed", 32,
         [](LaunchParams& p) { p.output = const_cast<unsigned char*>(p.input); }},
        {"the message one element longer than its rows", 32,
         [](LaunchParams& p) { ++p.input_elements; }},
        {"normed one element longer than the message", 32,
         [](LaunchParams& p) { ++p.output_elements; }},
        {"eps NaN", 32, [](LaunchParams& p) { p.eps = __uint_as_float(0x7fc00000u); }},
        {"no weight", 32, [](LaunchParams& p) { p.weight = nullptr; }},
        {"normed over the residual", 32,
         [](LaunchParams& p) {
             p.normed = p.output = static_cast<unsigned char*>(p.residual) + 16;
         }},
        {"an input region shorter than the message", 32,
         [](LaunchParams& p) { p.scratch_offset = 16; }},
        {"48 threads", 48, nullptr},
    };
    for (const Invalid& broken : cases) {
        std::vector<Rank> ranks(3);
        TwoShotOptions options;
        options.present.assign(3, true);
        options.expect_success = false;
        options.expect_untouched = true;
        options.tamper = broken.tamper;
        const TwoShotLaunch launch = {two_shot_rows(0, 4), 16, true, false, false, 1,
                                      broken.threads, 1e-5f, false};
        const std::vector<u64> aborts = run_two_shot(ranks, {launch}, options, random_source());
        for (unsigned rank = 0; rank < 3; ++rank) {
            CHECK(aborts[rank] == (invalid | rank), "%s, %s, rank %u: abort word %llx",
                  kTwoShot.name, broken.what, rank, aborts[rank]);
        }
    }
}

// The quick mode's checks (bf16 at worlds 2, 3 and 8, the other types at 2: they differ in
// their element arithmetic, which the norm mode checks at length), or the full mode's (every
// type at every world 2..8, every combination); then the timeouts and invalid launches.
void two_shot_mode(bool full) {
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        two_shot_shapes_at(full ? std::vector<unsigned>{2, 3, 4, 5, 6, 7, 8}
                           : dtype == kBf16 ? std::vector<unsigned>{2, 3, 8}
                                            : std::vector<unsigned>{2},
                           full);
    }
    dtype = kBf16;
    two_shot_timeouts();
    two_shot_invalid_launches();
}

// Prints the kernel's verdict line in the current type: `<entry>: <pass>` when no check failed
// since `before`, else `<entry>: <fail> (N failed checks)`.
void two_shot_verdict(int before, const char* pass, const char* fail) {
    std::lock_guard<std::mutex> lock(print_mutex);
    if (failures == before) {
        std::printf("%s_%s: %s\n", kTwoShot.name, kDtypeNames[dtype], pass);
    } else {
        std::printf("%s_%s: %s (%d failed checks)\n", kTwoShot.name, kDtypeNames[dtype], fail,
                    failures - before);
    }
}

// The exactness mode's line, in the current type: at worlds 2 and 3, every kind of row at
// hidden 24 and 2056 with a residual and without, short ranks and a rank without rows; 12 rows
// of small values at 16384 without eps, where another order of the squares moves some row's
// `inv` by an ulp, which only a few of its 16-bit outputs show (the seed one where the
// butterfly reversed shows in every type); then one launch whose last rank starts late.
void two_shot_exactness() {
    const ExactnessEntry entry{entry_name(kTwoShot.name)};
    for (unsigned world : {2u, 3u}) {
        std::vector<Rank> ranks(world);
        TwoShotOptions options;
        options.present.assign(world, true);
        if (entry.runs())
            run_two_shot(
                ranks,
                {{two_shot_rows(0, 18), 24, true, false, true, 2, 64, 1e-5f, false},
                 {two_shot_rows(9, world + 1), 2056, false, true, false, 3, 32, 1e-5f, false},
                 {two_shot_rows(3, 1), 24, true, true, false, 2, 32, 1e-6f, false}},
                options, 11 + world);
    }
    std::vector<u64> small;
    for (u64 row = 0; row < 12; ++row)
        small.push_back(kNormKinds * row + kSmallSpread);
    std::vector<Rank> pair(2);
    TwoShotOptions options;
    options.present.assign(2, true);
    if (entry.runs())
        run_two_shot(pair, {{small, 16384, true, false, false, 3, 32, 0.0f, false}}, options, 19);
    std::vector<Rank> ranks(3);
    TwoShotOptions late;
    late.present.assign(3, true);
    late.last_rank_late = true;
    if (entry.runs())
        run_two_shot(ranks, {{two_shot_rows(0, 4), 16, true, false, false, 1, 32, 1e-5f, false}},
                     late, 5);
    entry.report();
}

// The invariance mode's line, in the current type: rows of a large message at three ranks
// again alone and among other rows (so on other owners and blocks), by other geometries, the
// same bytes on every rank as in the large message. Its seeds are its own.
void two_shot_invariance() {
    const int before = failures;
    for (u64 hidden : {24ull, 7168ull}) {
        const u64 count = hidden > 4096 ? 5 : 65;
        std::vector<Rank> ranks(3);
        TwoShotOptions options;
        options.present.assign(3, true);
        // Every message a run of its own with one seed: a row's inputs are the same in each.
        const auto outputs_of = [&](const TwoShotLaunch& launch) {
            std::vector<std::vector<NormOutputs>> outputs;
            run_two_shot(ranks, {launch}, options, 2000 + hidden, &outputs);
            return outputs[0];
        };
        const std::vector<NormOutputs> all = outputs_of(
            {two_shot_rows(100, count), hidden, true, false, false, 2, 64, 1e-5f, false});
        for (u64 at : {u64(0), count / 3, count - 1}) {
            const TwoShotLaunch alone = {{100 + at}, hidden, true, false, false, 1, 32, 1e-5f,
                                         false};
            const TwoShotLaunch among = {{7, 100 + at, 9000 + at}, hidden, true, true, false, 3,
                                         32, 1e-5f, false};
            for (const auto& [launch, position] : {std::pair{alone, 0ull}, std::pair{among, 1ull}}) {
                const std::vector<NormOutputs> got = outputs_of(launch);
                for (unsigned rank = 0; rank < 3; ++rank) {
                    // A run that failed has no outputs; its failures are counted.
                    if (got[rank].normed.empty() || all[0].normed.empty())
                        continue;
                    for (u64 column = 0; column < hidden; ++column) {
                        const u64 mine = position * hidden + column, theirs = at * hidden + column;
                        const bool same = got[rank].normed[mine] == all[0].normed[theirs] &&
                                          got[rank].residual_out[mine] == all[0].residual_out[theirs];
                        CHECK(same, "%s_%s hidden %llu rank %u: row %llu differs at %llu in a "
                              "message of %zu rows", kTwoShot.name, kDtypeNames[dtype], hidden,
                              rank, 100 + at, column, launch.ids.size());
                        if (!same)
                            break;
                    }
                }
            }
        }
    }
    two_shot_verdict(before, "invariant", "varies");
}
