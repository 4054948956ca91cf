// prepare's unfused residual add + RMSNorm (add_rms_norm.cu, prepare_norm.cuh) on the host,
// against a mirror of prepare::reference::reference_add_rms_norm written again here, in the
// harness's own element conversions. The `norm` mode also prints the mirror's inputs and
// outputs of a set of cases, one line each, which the Rust test compares with the Rust
// reference, so the mirror cannot drift from it:
//   norm <type> <hidden> <rows> <eps bits> <x> <residual or -> <weight> <normed> <residual_out>
// each array its elements' bits in hex, comma-separated.
//
// A row's data is a function of the seed, the row's id and the column alone, so the same row
// can sit anywhere in any message: ordinary values whose squares span 2^24 (so their sums round
// at almost every step) at a scale that changes from row to row (small rows are where eps
// matters); a row of those with signed zeros and subnormals; a row of zeros; a row with a NaN,
// an infinity or huge values whose squares overflow; a row of any bits.
//
// Included by harness.cc inside its anonymous namespace, after rank_order_checks.h (Aligned).
#pragma once

// The kernel at world 2, as a package of two ranks compiles it.
template <typename T>
void norm_entry(LaunchParams params) {
    prepare::epilogue_kernel<prepare::AddRmsNorm, T, 2>(params);
}

const Kernel kAddRmsNorm = {"add_rms_norm",
                            {{&norm_entry<prepare::Bf16>, &norm_entry<prepare::Fp16>,
                              &norm_entry<prepare::Fp32>}},
                            Scratch::None,
                            false,
                            true};

u64 norm_hash(u64 seed, u64 row, u64 operand, u64 column) {
    u64 x = seed ^ (row * 0x9e3779b97f4a7c15ull) ^ (operand << 56) ^ (column << 20);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// A value of 1.m x 2^exponent with the mantissa and sign from `bits`.
unsigned norm_ordinary(u64 bits, int exponent) {
    switch (dtype) {
        case kBf16: return (bits & 0x807fu) | (unsigned(127 + exponent) << 7);
        case kFp16: return (bits & 0x83ffu) | (unsigned(15 + exponent) << 10);
        default: return (bits & 0x807fffffu) | (unsigned(127 + exponent) << 23);
    }
}

enum NormKind {
    kSpread,
    kSpreadToo,
    kSmallSpread,
    kSubnormals,
    kZeros,
    kOneSpecial,
    kHuge,
    kAnyBits,
    kOverflowTie,
};
constexpr u64 kNormKinds = 9;

// A row whose sum of squares overflows in the pinned order alone (bf16 and fp32; fp16 cannot
// overflow fp32): group 0's lanes hold squares summing to FLT_MAX exactly (2^104 times
// 255^2 4^4 + 45^2 4^3 + 17^2 4 + 7^2 + 3^2 + 1 = 2^24 - 1), groups 16 and 17 a square of
// 2^102 each. The pinned butterfly adds those two first, and FLT_MAX + 2^103 is a tie that
// rounds to infinity; an order adding each to FLT_MAX alone loses both. Element `column` of
// its x (its residual is zeros).
unsigned norm_overflow_tie(u64 column) {
    const int terms[][2] = {{255, 56}, {45, 55}, {17, 53}, {7, 52}, {3, 52}, {1, 52}};
    if (column < std::size(terms))
        return float_to_element(float(terms[column][0]) * __uint_as_float(unsigned(127 + terms[column][1]) << 23));
    return column == 128 || column == 136 ? float_to_element(__uint_as_float((127u + 51u) << 23)) : 0;
}

// Element `column` of row `row`'s operand (0: x, 1: the residual).
unsigned norm_value(u64 seed, u64 row, u64 operand, u64 column) {
    const u64 h = norm_hash(seed, row, operand, column);
    const u64 pick = norm_hash(seed, row, 2, 0);
    // fp16 holds 2^-14 to 2^15: its scales are narrower.
    const int low = dtype == kFp16 ? -8 : -12;
    const int scale = low + static_cast<int>(row / kNormKinds % 11);
    const unsigned spread = norm_ordinary(h, scale + static_cast<int>((h >> 40) % 13) - 6);
    const unsigned zero = (h >> 17) & 1 ? (dtype == kFp32 ? 0x80000000u : 0x8000u) : 0;
    switch (static_cast<NormKind>(row % kNormKinds)) {
        case kSpread:
        case kSpreadToo: return spread;
        case kSmallSpread: return norm_ordinary(h, low - 2 + static_cast<int>((h >> 40) % 5));
        case kSubnormals:
            if ((h >> 48) % 5 != 0)
                return spread;
            return (h >> 52) % 2 ? zero : zero | (static_cast<unsigned>(h >> 20) & 0x3fu);
        case kZeros: return zero;
        case kOneSpecial: {
            if (column != (pick >> 8) % 8 || operand != pick % 2)
                return spread;
            const unsigned specials[kDtypes][3] = {
                {0x7fc0u, 0x7f80u, 0xff80u}, {0x7e00u, 0x7c00u, 0xfc00u},
                {0x7fc00000u, 0x7f800000u, 0xff800000u}};
            return specials[dtype][(pick >> 16) % 3];
        }
        case kOverflowTie:
            if (dtype != kFp16)
                return operand == 0 ? norm_overflow_tie(column) : 0;
            return spread;
        case kHuge:
            // bf16 and fp32 squares overflow fp32; fp16's sums overflow fp16.
            return norm_ordinary(h, dtype == kFp16 ? 14 : 100 + static_cast<int>((h >> 40) % 27));
        default: return dtype == kFp32 ? static_cast<unsigned>(h >> 13) : static_cast<unsigned>(h >> 48);
    }
}

// The weight's element `column`: 0.5 to 2, and now and then any bits when `special`.
unsigned norm_weight(u64 seed, u64 column, bool special) {
    const u64 h = norm_hash(seed, ~0ull, 3, column);
    if (special && (h >> 56) % 32 == 0)
        return dtype == kFp32 ? static_cast<unsigned>(h) : static_cast<unsigned>(h & 0xffffu);
    return norm_ordinary(h & ~(dtype == kFp32 ? 0x80000000ull : 0x8000ull), -1 + int((h >> 40) % 2));
}

// The mirror's arithmetic, each operation rounded on its own.
float norm_add(float a, float b) {
    volatile float sum = a + b;
    return sum;
}
float norm_mul(float a, float b) {
    volatile float product = a * b;
    return product;
}

// prepare::reference::sum_of_squares.
float mirror_sum_of_squares(const float* row, u64 hidden) {
    std::vector<float> lanes(PREPARE_NORM_LANES, 0.0f);
    for (u64 i = 0; i < hidden; ++i)
        lanes[i % PREPARE_NORM_LANES] = norm_add(lanes[i % PREPARE_NORM_LANES], norm_mul(row[i], row[i]));
    for (u64 width = PREPARE_NORM_LANES; width > 1;) {
        width /= 2;
        for (u64 lane = 0; lane < width; ++lane)
            lanes[lane] = norm_add(lanes[2 * lane], lanes[2 * lane + 1]);
    }
    return lanes[0];
}

// prepare::reference::inverse_rms.
float mirror_inverse_rms(float sum_of_squares, u64 hidden, float eps) {
    volatile float mean = sum_of_squares / static_cast<float>(hidden);
    volatile float root = __builtin_sqrtf(norm_add(mean, eps));
    volatile float inv = 1.0f / root;
    return inv;
}

struct NormOutputs {
    std::vector<unsigned> normed;
    std::vector<unsigned> residual_out;
};

// prepare::reference::reference_add_rms_norm of `x` (the sum), rows x hidden.
NormOutputs mirror_add_rms_norm(u64 hidden, const std::vector<unsigned>& x,
                                const std::vector<unsigned>* residual,
                                const std::vector<unsigned>& weight, float eps) {
    NormOutputs out{std::vector<unsigned>(x.size()), x};
    if (residual != nullptr) {
        for (u64 i = 0; i < x.size(); ++i)
            out.residual_out[i] = float_to_element(
                norm_add(element_to_float(x[i]), element_to_float((*residual)[i])));
    }
    std::vector<float> row(hidden);
    for (u64 first = 0; first < x.size(); first += hidden) {
        for (u64 c = 0; c < hidden; ++c)
            row[c] = element_to_float(out.residual_out[first + c]);
        const float inv = mirror_inverse_rms(mirror_sum_of_squares(row.data(), hidden), hidden, eps);
        for (u64 c = 0; c < hidden; ++c)
            out.normed[first + c] =
                float_to_element(norm_mul(norm_mul(row[c], inv), element_to_float(weight[c])));
    }
    return out;
}

struct NormCase {
    u64 hidden;
    std::vector<u64> rows;  // the ids of the message's rows, in order
    bool residual;
    bool alias;  // normed written over x
    float eps;
    unsigned blocks, threads;
    u64 seed;
    bool special_weight;
};

struct NormInputs {
    std::vector<unsigned> x, residual, weight;
};

NormInputs norm_inputs(const NormCase& c) {
    NormInputs in;
    for (u64 row : c.rows) {
        for (u64 col = 0; col < c.hidden; ++col) {
            in.x.push_back(norm_value(c.seed, row, 0, col));
            in.residual.push_back(norm_value(c.seed, row, 1, col));
        }
    }
    for (u64 col = 0; col < c.hidden; ++col)
        in.weight.push_back(norm_weight(c.seed, col, c.special_weight));
    return in;
}

// The first index where `got` and `expected` differ, or -1.
long long first_difference(const std::vector<unsigned>& got, const std::vector<unsigned>& expected) {
    for (u64 i = 0; i < got.size(); ++i) {
        if (got[i] != expected[i])
            return static_cast<long long>(i);
    }
    return -1;
}

// One launch of `c`: the kernel's outputs, each checked against the mirror, with the guards
// after every operand, the input kept (unless normed overwrote it) and no abort.
NormOutputs run_norm(const NormCase& c) {
    const u64 elements = c.rows.size() * c.hidden;
    const u64 bytes = elements * element_bytes();
    const NormInputs in = norm_inputs(c);
    Aligned x(bytes + kGuard), residual(bytes + kGuard), weight(c.hidden * element_bytes() + kGuard),
        separate(bytes + kGuard);
    for (u64 e = 0; e < elements; ++e) {
        put_element(x.data, e, in.x[e]);
        put_element(residual.data, e, in.residual[e]);
    }
    for (u64 e = 0; e < c.hidden; ++e)
        put_element(weight.data, e, in.weight[e]);
    unsigned char* normed = c.alias ? x.data : separate.data;
    std::vector<u64> state(PREPARE_STATE_WORDS, 0);
    LaunchParams params = {};
    params.state = state.data();
    params.input = x.data;
    params.rows = c.rows.size();
    params.width = c.hidden;
    params.residual = c.residual ? residual.data : nullptr;
    params.weight = weight.data;
    params.normed = normed;
    params.eps = c.eps;
    params.world = 2;
    launch_rank({&kAddRmsNorm, c.blocks, c.threads, 1, elements}, params);
    char what[160];
    std::snprintf(what, sizeof what, "add_rms_norm %s hidden %llu rows %zu%s%s eps %g (%u x %u)",
                  kDtypeNames[dtype], c.hidden, c.rows.size(), c.residual ? " residual" : "",
                  c.alias ? " over x" : "", c.eps, c.blocks, c.threads);
    CHECK(state[0] == 0, "%s: abort word %llx", what, state[0]);
    NormOutputs got{std::vector<unsigned>(elements), std::vector<unsigned>(elements)};
    for (u64 e = 0; e < elements; ++e) {
        got.normed[e] = get_element(normed, e);
        got.residual_out[e] = get_element(c.residual ? residual.data : x.data, e);
    }
    if (c.alias && !c.residual)
        got.residual_out = in.x;  // residual_out is x itself, which normed overwrote
    const NormOutputs expected =
        mirror_add_rms_norm(c.hidden, in.x, c.residual ? &in.residual : nullptr, in.weight, c.eps);
    const long long normed_wrong = first_difference(got.normed, expected.normed);
    CHECK(normed_wrong < 0, "%s: normed element %lld is %x, the reference's %x", what, normed_wrong,
          normed_wrong < 0 ? 0 : got.normed[normed_wrong],
          normed_wrong < 0 ? 0 : expected.normed[normed_wrong]);
    const long long residual_wrong = first_difference(got.residual_out, expected.residual_out);
    CHECK(residual_wrong < 0, "%s: residual_out element %lld is %x, the reference's %x", what,
          residual_wrong, residual_wrong < 0 ? 0 : got.residual_out[residual_wrong],
          residual_wrong < 0 ? 0 : expected.residual_out[residual_wrong]);
    if (!c.alias) {
        for (u64 e = 0; e < elements; ++e) {
            CHECK(get_element(x.data, e) == in.x[e], "%s: x element %llu changed", what, e);
            if (get_element(x.data, e) != in.x[e])
                break;
        }
    }
    if (!c.residual) {
        for (u64 e = 0; e < elements; ++e) {
            CHECK(get_element(residual.data, e) == in.residual[e],
                  "%s: the residual, not given, was written at %llu", what, e);
            if (get_element(residual.data, e) != in.residual[e])
                break;
        }
    }
    const unsigned char* guards[] = {x.data + bytes, residual.data + bytes, separate.data + bytes,
                                     weight.data + c.hidden * element_bytes()};
    for (const unsigned char* guard : guards) {
        for (int g = 0; g < kGuard; ++g)
            CHECK(guard[g] == kBufferFill, "%s: wrote past an operand", what);
    }
    return got;
}

// Consecutive row ids from `first`.
std::vector<u64> norm_rows(u64 first, u64 count) {
    std::vector<u64> rows;
    for (u64 i = 0; i < count; ++i)
        rows.push_back(first + i);
    return rows;
}

const float kNormEps[] = {1e-5f, 1e-6f, 0.0f, 0.25f, 1e-40f};

// Rows of a 64-row message again alone and among other rows, by other geometries: the same
// bytes as in the large message.
void norm_batch_invariance(u64 hidden, u64 seed) {
    NormCase large{hidden, norm_rows(100, 64), true, false, 1e-5f, 4, 64, seed, false};
    const NormOutputs all = run_norm(large);
    for (u64 at : {0ull, 21ull, 63ull}) {
        const u64 id = 100 + at;
        NormCase alone = large;
        alone.rows = {id};
        alone.blocks = 1;
        alone.threads = 256;
        NormCase among = large;
        among.rows = {7, id, 9000 + at};
        among.blocks = 2;
        among.threads = 32;
        among.alias = true;
        const std::pair<const NormOutputs, u64> runs[] = {{run_norm(alone), 0}, {run_norm(among), 1}};
        for (const auto& [outputs, position] : runs) {
            for (u64 col = 0; col < hidden; ++col) {
                const u64 mine = position * hidden + col, theirs = at * hidden + col;
                CHECK(outputs.normed[mine] == all.normed[theirs] &&
                          outputs.residual_out[mine] == all.residual_out[theirs],
                      "add_rms_norm %s hidden %llu: row %llu differs at %llu in a message of %s",
                      kDtypeNames[dtype], hidden, id, col, position == 0 ? "1 row" : "3 rows");
                if (outputs.normed[mine] != all.normed[theirs])
                    break;
            }
        }
    }
}

// Every launch the epilogue cannot do is refused with its code, and writes nothing.
void norm_invalid_launches() {
    const u64 invalid = PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32);
    Aligned x(4096), residual(4096), weight(4096), normed(4096);
    struct Bad {
        const char* what;
        void (*spoil)(LaunchParams&, unsigned&);
    };
    const Bad bads[] = {
        {"hidden 12", [](LaunchParams& p, unsigned&) { p.width = 12; }},
        {"hidden 0", [](LaunchParams& p, unsigned&) { p.width = 0; }},
        {"hidden 2^24 + 8", [](LaunchParams& p, unsigned&) { p.width = PREPARE_NORM_MAX_HIDDEN + 8; }},
        {"no weight", [](LaunchParams& p, unsigned&) { p.weight = nullptr; }},
        {"no normed", [](LaunchParams& p, unsigned&) { p.normed = nullptr; }},
        {"no input", [](LaunchParams& p, unsigned&) { p.input = nullptr; }},
        {"a misaligned residual", [](LaunchParams& p, unsigned&) {
             p.residual = static_cast<unsigned char*>(p.residual) + 8; }},
        {"normed over the residual", [](LaunchParams& p, unsigned&) {
             p.normed = static_cast<unsigned char*>(p.residual) + 16; }},
        {"eps NaN", [](LaunchParams& p, unsigned&) { p.eps = __uint_as_float(0x7fc00000u); }},
        {"eps -1", [](LaunchParams& p, unsigned&) { p.eps = -1.0f; }},
        {"48 threads", [](LaunchParams&, unsigned& threads) { threads = 48; }},
        {"world 3", [](LaunchParams& p, unsigned&) { p.world = 3; }},
    };
    for (const Bad& bad : bads) {
        std::vector<u64> state(PREPARE_STATE_WORDS, 0);
        LaunchParams params = {};
        params.state = state.data();
        params.input = x.data;
        params.rows = 2;
        params.width = 64;
        params.residual = residual.data;
        params.weight = weight.data;
        params.normed = normed.data;
        params.eps = 1e-5f;
        params.world = 2;
        unsigned threads = 32;
        bad.spoil(params, threads);
        launch_rank({&kAddRmsNorm, 2, threads, 1, 128}, params);
        CHECK(state[0] == invalid, "add_rms_norm, %s: abort word %llx", bad.what, state[0]);
        for (const Aligned* memory : {&normed, &residual}) {
            for (int b = 0; b < 4096; ++b)
                CHECK(memory->data[b] == kBufferFill, "add_rms_norm, %s: wrote byte %d", bad.what, b);
        }
    }
}

void print_hex(const std::vector<unsigned>& bits) {
    for (u64 i = 0; i < bits.size(); ++i)
        std::printf("%s%x", i == 0 ? " " : ",", bits[i]);
}

// The mirror's cases for the Rust reference (see the top), each also run by the kernel.
void print_norm_table() {
    for (u64 hidden : {8ull, 24ull, 2056ull, 16384ull}) {
        for (bool residual : {true, false}) {
            NormCase c{hidden, norm_rows(hidden, hidden > 4096 ? 2 : 16), residual, false,
                       kNormEps[(hidden / 8 + residual) % 5], 2, 64, 77 + hidden, residual};
            run_norm(c);
            const NormInputs in = norm_inputs(c);
            const NormOutputs out =
                mirror_add_rms_norm(hidden, in.x, residual ? &in.residual : nullptr, in.weight, c.eps);
            std::lock_guard<std::mutex> lock(print_mutex);
            std::printf("norm %s %llu %zu %x", kDtypeNames[dtype], hidden, c.rows.size(),
                        __float_as_uint(c.eps));
            print_hex(in.x);
            if (residual)
                print_hex(in.residual);
            else
                std::printf(" -");
            print_hex(in.weight);
            print_hex(out.normed);
            print_hex(out.residual_out);
            std::printf("\n");
        }
    }
}

// The `norm` mode in the current type: every hidden size of the list and some random
// multiples of 8, messages of 0, 1 and 3 rows with a residual and without and of 64 rows with
// or without, normed over x or apart, several geometries; batch invariance; invalid launches;
// the table.
void norm_checks() {
    std::vector<u64> sizes = {8, 16, 24, 2048, 2056, 7168, 8192, 16384};
    for (int i = 0; i < 3; ++i)
        sizes.push_back(8 * (1 + random_source() % 2048));
    const unsigned geometries[][2] = {{1, 32}, {2, 64}, {3, 96}, {1, 256}, {2, 288}};
    unsigned variant = 0;
    for (u64 hidden : sizes) {
        for (u64 rows : {0ull, 1ull, 3ull, 64ull}) {
            for (bool residual : {true, false}) {
                // 64 rows, the slowest to emulate, once per size: with a residual or without.
                if (rows == 64 && residual == (hidden / 8 % 2 == 0))
                    continue;
                const unsigned* geometry = geometries[variant++ % std::size(geometries)];
                // The large messages with few threads, which the emulation runs fastest.
                const bool large = rows * hidden > 100000;
                NormCase c{hidden, norm_rows(random_source() % 1000, rows), residual,
                           variant % 3 == 0, kNormEps[variant % 5], large ? 4 : geometry[0],
                           large ? 32 : geometry[1], random_source(), variant % 4 == 0};
                run_norm(c);
            }
        }
    }
    norm_batch_invariance(2056, random_source());
    norm_invalid_launches();
    print_norm_table();
}

// The epilogue's line of the exactness mode: every kind of row at hidden 24, 2056 and 16384,
// with a residual and without, and more ordinary rows at 16384, where another order of the
// squares moves some row's `inv` by an ulp, which only a few of its 16-bit outputs show.
void norm_exactness() {
    const ExactnessEntry entry{"add_rms_norm_" + std::string(kDtypeNames[dtype])};
    for (u64 hidden : {24ull, 2056ull, 16384ull}) {
        for (bool residual : {true, false}) {
            if (entry.runs())
                run_norm({hidden, norm_rows(residual ? 0 : 9, hidden > 4096 ? 9 : 18), residual,
                          !residual, 1e-5f, 2, 64, 11 + hidden, false});
        }
    }
    std::vector<u64> spread;
    for (u64 row = 0; row < 12; ++row)
        spread.push_back(kNormKinds * row);
    if (entry.runs())
        run_norm({16384, spread, true, false, 1e-6f, 3, 32, 5, false});
    entry.report();
}

// The epilogue's line of the invariance mode. Its seeds are its own: the mode's other data
// come from random_source, whose draws this leaves as they were.
void norm_invariance() {
    const int before = failures;
    for (u64 hidden : {24ull, 7168ull})
        norm_batch_invariance(hidden, 1000 + hidden);
    std::lock_guard<std::mutex> lock(print_mutex);
    if (failures == before) {
        std::printf("add_rms_norm_%s: invariant\n", kDtypeNames[dtype]);
    } else {
        std::printf("add_rms_norm_%s: varies (%d failed checks)\n", kDtypeNames[dtype],
                    failures - before);
    }
}
