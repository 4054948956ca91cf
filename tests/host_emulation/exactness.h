// exactness.h: the exactness mode's entries and its all-reduce lines (harness.cc's `exactness`
// mode; the other collectives' lines are their headers'). Included by harness.cc alone, after
// the all-reduce kernels and `run`.
#pragma once

// The exactness mode's choice of entries: those named after the mode (every entry when none
// is), and with `--stop-at-first-wrong`, an entry's cases end at its first that fails (its
// verdict is then already inexact). Skipped cases still draw their seeds, so every case that
// runs has the data of a run of every entry and case.
std::set<std::string> chosen_entries;
bool stop_at_first_wrong = false;
std::set<std::string> reported_entries;

// One kernel entry (its name with its type) of the exactness mode: whether its next case runs,
// and its line.
struct ExactnessEntry {
    std::string name;
    int before = failures;

    bool chosen() const { return chosen_entries.empty() || chosen_entries.count(name) != 0; }

    bool runs() const { return chosen() && !(stop_at_first_wrong && failures != before); }

    // `<entry>: exact` or `<entry>: inexact (N failed checks)`, for a chosen entry.
    void report() const {
        if (!chosen())
            return;
        std::lock_guard<std::mutex> lock(print_mutex);
        reported_entries.insert(name);
        if (failures == before) {
            std::printf("%s: exact\n", name.c_str());
        } else {
            std::printf("%s: inexact (%d failed checks)\n", name.c_str(), failures - before);
        }
    }
};

std::string entry_name(const char* kernel) {
    return std::string(kernel) + "_" + kDtypeNames[dtype];
}

// A kernel that reads a peer's input without waiting for the peer to start reads stale bytes
// when that peer is late. The race is caught in every run: the late rank begins its launch only
// when the on-time rank has stalled (stalls.h), after it has read whatever it did not wait for,
// while the peer's input still holds the buffer's fill bytes. The late rank's threads also
// store their first data only when the on-time rank has stalled again: a double-buffered
// kernel's shape check lets the on-time rank go on as soon as the late rank's shape lines
// arrive, so one that then reads a step's data without waiting for the step's flags reads it
// before the late rank writes it, not in a race it may win.
void exactness() {
    stop_after_printed_failures = false;
    for (const Kernel& kernel : kKernels) {
        const ExactnessEntry entry{"all_reduce_" + entry_name(kernel.name)};
        for (unsigned world : {2u, 3u}) {
            std::vector<Rank> ranks(world);
            for (u64 elements : {per_vector() * world + per_vector() - 1, 100ull, 1001ull}) {
                Options options;
                options.present.assign(world, true);
                const u64 seed = random_source();
                if (entry.runs())
                    run(ranks, {geometry(kernel, 0, elements)}, options, seed);
            }
        }
        std::vector<Rank> ranks(2);
        Options late;
        late.present.assign(2, true);
        late.last_rank_late = true;
        const u64 seed = random_source();
        if (entry.runs())
            run(ranks, {geometry(kernel, 0, 203)}, late, seed);
        entry.report();
    }
}
