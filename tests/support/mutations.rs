//! Shared by the tests that plant bugs in the kernels to prove the exactness checks catch them:
//! the mutations, each an exact text replacement in the embedded sources, and packages built
//! from mutated sources.
//!
//! A replacement whose text is not found, or found more than once, panics naming it, so an
//! edit to the kernels cannot silently turn a mutation into a no-op: update the pattern here.

use std::path::{Path, PathBuf};

use prepare::compile::{compile_kernels_with_sources, SourceOverrides};
use prepare::gpu::nvrtc::Nvrtc;
use prepare::kernels::{all_kernels, headers, kernels_for_ladder, source};
use prepare::ladder::{validate_ladder_bytes, Arch, Dtype};
use prepare::progress::Silent;

/// A bug planted in the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutation {
    /// The sum leaves out the last rank's contribution.
    SkipPeer,
    /// fp32 to bf16 and to fp16 round by truncation instead of to nearest even.
    Truncate,
    /// The tail (the elements after the last whole 16-byte vector) is never written.
    DropTail,
    /// `all_reduce_one_shot_pull_<dtype>` skips its start barrier, so it may read a peer's input
    /// before the peer wrote it: a race that shows only sometimes.
    NoStartBarrier,
    /// Rank 0's contribution is added twice.
    DoubleCount,
    /// `all_reduce_one_shot_push_ll_<dtype>`, the fused kernel of that protocol and the
    /// reduce-scatter's and all-gather's `ll` kernels take each line as they find it, without
    /// waiting for the launch's flag: a race that shows only when a peer is late.
    NoLineWait,
    /// `all_reduce_one_shot_push_simple_<dtype>`, `all_reduce_rsag_push_simple_<dtype>` and the
    /// fused kernel of that protocol take a step without waiting for the peers' step flags: a
    /// race that shows only when a peer is late.
    NoStepWait,
    /// `all_reduce_one_shot_copy_engine_start_<dtype>` does not wait for the peers, so the copies
    /// may read a peer's input before the peer wrote it: a race that shows only when a peer is
    /// late.
    NoCopyStart,
    /// The epilogue's warp butterfly joins its 32 groups of squares from the other end (xor 16
    /// first): another tree than the pinned order's.
    SquaresOutOfOrder,
    /// The epilogue leaves eps out of the mean of squares.
    NoEps,
    /// The epilogue leaves the weight out of each row's last element.
    WeightSkipped,
    /// The fused kernels add the residual to the fp32 sum over the ranks before it is rounded
    /// to the type, not to the rounded sum: in bf16 and fp16 (fp32's sum is its own rounding).
    /// The unfused path has no such bug to plant: its sum reaches the epilogue through memory,
    /// rounded.
    ResidualBeforeRounding,
    /// `reduce_scatter_one_shot_pull_<dtype>` sums its rows in rank order rotated by one (from
    /// rank 1, rank 0 last): out of rank order at more than two ranks (two values add the same
    /// either way).
    RowOutOfOrder,
    /// `all_gather_one_shot_pull_<dtype>` never copies the rows of the peer at the greatest
    /// distance (rank - 1).
    SkipRowPeer,
    /// The row collectives and the fused two-shot take the ranks that own one row fewer (rows /
    /// world, when rows % world is not 0) to own as many as the others.
    ShortRankRows,
    /// The row collectives and the fused two-shot place the boundary between the ranks with one
    /// row more and the others one rank late, so a run past it starts a row late.
    RowBoundaryOffByOne,
    /// `all_reduce_one_shot_pull_<dtype>` sums the ranks in reverse order in messages of more
    /// than 2048 elements: a row's sum then depends on the size of the message holding it
    /// (at more than two ranks; two values add the same either way). Not in
    /// [`Mutation::ALL`]: the host emulation's exactness mode runs smaller messages only, and
    /// the batch-invariance checks, which run larger ones, are the tests meant to catch it.
    SizeDependentOrder,
    /// The shape checks (the start barrier's and the double-buffered kernels') take a peer's
    /// shape line without comparing it with this rank's, so ranks that disagree on rows or width
    /// go on to move data. Every sum stays right when the
    /// ranks agree: in [`Mutation::OF_THE_CHECKS`], caught by the host emulation's `shapes`
    /// mode, not by its exactness mode.
    ShapeCheckSkipped,
}

/// One exact text replacement in one kernel source or header.
#[derive(Debug)]
struct Patch {
    file: &'static str,
    find: &'static str,
    replace: &'static str,
}

/// The two rank loops of prepare_element.cuh, the element one and the vector one, each opening
/// with `$header` (`for (int q = 1; q < N; ++q) {` as written: from rank 1 on).
macro_rules! rank_loops {
    ($header:literal) => {
        [
            concat!(
                $header,
                "\n        acc = add_round_nearest(acc, T::to_float(source(q)));"
            ),
            concat!($header, "\n        acc.add(source(q));"),
        ]
    };
}

/// The rank loops rewritten as `loops` (from [`rank_loops!`]).
const fn rank_loop_patches(loops: [&'static str; 2]) -> [Patch; 2] {
    let [element, vector] = rank_loops!("for (int q = 1; q < N; ++q) {");
    [
        Patch {
            file: "prepare_element.cuh",
            find: element,
            replace: loops[0],
        },
        Patch {
            file: "prepare_element.cuh",
            find: vector,
            replace: loops[1],
        },
    ]
}

const SKIP_PEER: &[Patch] = &rank_loop_patches(rank_loops!("for (int q = 1; q < N - 1; ++q) {"));

/// Rounding dropped from bf16 and fp16 (fp32 has none).
const TRUNCATE: &[Patch] = &[
    Patch {
        file: "prepare_element.cuh",
        find: "return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;",
        replace: "return bits >> 16;",
    },
    Patch {
        file: "prepare_element.cuh",
        find: "return float_to_fp16_bits(value);",
        replace: "return float_to_fp16_bits(__uint_as_float(bits & 0xffffe000u));",
    },
];

const DROP_TAIL: &[Patch] = &[Patch {
    file: "prepare_layout.cuh",
    find: "e < range.tail_end; e += workers.count) {",
    replace: "e < range.tail_begin; e += workers.count) {",
}];

const NO_START_BARRIER: &[Patch] = &[Patch {
    file: "all_reduce_one_shot.cu",
    find: "struct OneShotPull : StartBarrier {\n",
    replace: concat!(
        "struct OneShotPull {\n",
        "    template <int N>\n",
        "    __device__ static bool begin(const LaunchParams& params, BlockFlags& flags) {\n",
        "        return block_begin(params, flags);\n",
        "    }\n",
    ),
}];

/// The lines are read once, not awaited.
const NO_LINE_WAIT: &[Patch] = &[Patch {
    file: "prepare_double_buffer.cuh",
    find: "        return all;\n    });",
    replace: "        return true;\n    });",
}];

const NO_STEP_WAIT: &[Patch] = &[Patch {
    file: "prepare_double_buffer.cuh",
    find: "[&] { return load_acquire_system(word) >= flag; }",
    replace: "[&] { return true; }",
}];

/// The copy-engine start barrier does nothing at all.
const NO_COPY_START: &[Patch] = &[Patch {
    file: "prepare_copy_engine.cuh",
    find: "return begin_with_barrier<N>(params, flags, Set);",
    replace: "return Set != kSetStart && begin_with_barrier<N>(params, flags, Set);",
}];

const SIZE_DEPENDENT_ORDER: &[Patch] = &[Patch {
    file: "all_reduce_one_shot.cu",
    find: "sum_whole_message<T, N>(params.buffers, params.output, params.input_elements);",
    replace: concat!(
        "unsigned char* ranks[N];\n",
        "        for (int q = 0; q < N; ++q) {\n",
        "            ranks[q] = params.buffers[params.input_elements > 2048 ? N - 1 - q : q];\n",
        "        }\n",
        "        sum_whole_message<T, N>(ranks, params.output, params.input_elements);",
    ),
}];

const SQUARES_OUT_OF_ORDER: &[Patch] = &[Patch {
    file: "prepare_norm.cuh",
    find: "for (unsigned int offset = 1; offset < kWarpThreads; offset <<= 1) {",
    replace: "for (unsigned int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {",
}];

const NO_EPS: &[Patch] = &[Patch {
    file: "prepare_norm.cuh",
    find: "sqrt_round_nearest(add_round_nearest(mean, eps))",
    replace: "sqrt_round_nearest(mean)",
}];

const WEIGHT_SKIPPED: &[Patch] = &[Patch {
    file: "prepare_norm.cuh",
    find: "bits[j] = T::round(mul_round_nearest(scaled, T::to_float(scale[j])));",
    replace: "bits[j] = T::round(e + j == hidden - 1 ? scaled : mul_round_nearest(scaled, T::to_float(scale[j])));",
}];

const RESIDUAL_BEFORE_ROUNDING: &[Patch] = &[Patch {
    file: "prepare_norm.cuh",
    find: "added.lane[i] = T::rounded(sums.lane[i]);",
    replace: "added.lane[i] = sums.lane[i];",
}];

/// The unfused epilogue, which sums no ranks: the mutations of the rank loops leave it as it is.
const EPILOGUE: &[&str] = &["add_rms_norm"];
/// Every kernel that runs the epilogue's norm (prepare_norm.cuh): the unfused one and the fused
/// all-reduce + add + RMSNorm kernels, which move whole rows, so the mutation of the tail leaves
/// them as they are.
const NORMS: &[&str] = &[
    "add_rms_norm",
    "all_reduce_add_rms_norm_one_shot_push_ll",
    "all_reduce_add_rms_norm_one_shot_push_simple",
    "all_reduce_add_rms_norm_two_shot",
];
/// The fused kernels: those that add the residual to their own sum.
const FUSED: &[&str] = &[
    "all_reduce_add_rms_norm_one_shot_push_ll",
    "all_reduce_add_rms_norm_one_shot_push_simple",
    "all_reduce_add_rms_norm_two_shot",
];
const ROW_OUT_OF_ORDER: &[Patch] = &[Patch {
    file: "reduce_scatter.cu",
    find: "reduce_scatter_pull<T, N>(params, slices(params.rank), grid_workers(), output, output);",
    replace: concat!(
        "LaunchParams rotated = params;\n",
        "        for (int q = 0; q < N; ++q) {\n",
        "            rotated.buffers[q] = params.buffers[(q + 1) % N];\n",
        "        }\n",
        "        reduce_scatter_pull<T, N>(rotated, slices(params.rank), grid_workers(), output,\n",
        "                                  output);",
    ),
}];

const SKIP_ROW_PEER: &[Patch] = &[Patch {
    file: "all_gather.cu",
    find: "for (int k = 0; k < N; ++k) {\n            const unsigned int owner",
    replace: "for (int k = 0; k < N - 1; ++k) {\n            const unsigned int owner",
}];

/// The slices' row count: ceil(rows / world) for every rank.
const SHORT_RANK_ROWS: &[Patch] = &[Patch {
    file: "prepare_phases.cuh",
    find: "owned_rows<N>(params.rows, slice)",
    replace: "(params.rows / N + (params.rows % N != 0 ? 1 : 0))",
}];

/// The first row of rank q: q * (rows / world) + min(q, rows % world + 1).
const ROW_BOUNDARY_OFF_BY_ONE: &[Patch] = &[Patch {
    file: "prepare_layout.cuh",
    find: "return q * (rows / N) + min_u64(q, rows % N);",
    replace: "return q * (rows / N) + min_u64(q, rows % N + 1);",
}];

const SHAPE_CHECK_SKIPPED: &[Patch] = &[Patch {
    file: "prepare_sync.cuh",
    find: "return a[0] != b[0] || a[1] != b[1] || a[2] != b[2] || a[3] != b[3];",
    replace: "return false;",
}];

/// Every kernel that checks the shape, by algorithm: those that begin with the start barrier
/// or the cluster kernels' start exchange (start_exchange's check) and the double-buffered ones
/// (check_line_shapes); both compare the lines with shape_lines_differ.
const SHAPE_CHECKED_KERNELS: &[&str] = &[
    "all_gather_one_shot_copy_engine",
    "all_gather_one_shot_pull",
    "all_gather_one_shot_push",
    "all_gather_one_shot_push_ll",
    "all_reduce_add_rms_norm_one_shot_push_ll",
    "all_reduce_add_rms_norm_one_shot_push_simple",
    "all_reduce_add_rms_norm_two_shot",
    "all_reduce_full_phased",
    "all_reduce_one_shot_copy_engine",
    "all_reduce_one_shot_pull",
    "all_reduce_one_shot_push",
    "all_reduce_one_shot_push_ll",
    "all_reduce_one_shot_push_simple",
    "all_reduce_rsag_pull",
    "all_reduce_rsag_phased",
    "all_reduce_rsag_push",
    "all_reduce_rsag_push_simple",
    "reduce_scatter_one_shot_pull",
    "reduce_scatter_one_shot_push",
    "reduce_scatter_one_shot_push_ll",
];

const DOUBLE_COUNT: &[Patch] = &rank_loop_patches(rank_loops!("for (int q = 0; q < N; ++q) {"));

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 16] = [
        Mutation::SkipPeer,
        Mutation::Truncate,
        Mutation::DropTail,
        Mutation::NoStartBarrier,
        Mutation::DoubleCount,
        Mutation::NoLineWait,
        Mutation::NoStepWait,
        Mutation::NoCopyStart,
        Mutation::SquaresOutOfOrder,
        Mutation::NoEps,
        Mutation::WeightSkipped,
        Mutation::ResidualBeforeRounding,
        Mutation::RowOutOfOrder,
        Mutation::SkipRowPeer,
        Mutation::ShortRankRows,
        Mutation::RowBoundaryOffByOne,
    ];

    /// The mutations of a bad-input check: every sum stays right, so each is caught by the mode
    /// that feeds its check bad input, not by the exactness mode.
    pub const OF_THE_CHECKS: [Mutation; 1] = [Mutation::ShapeCheckSkipped];

    /// Its name, as tests report it.
    pub fn name(self) -> &'static str {
        match self {
            Mutation::SkipPeer => "skip_peer",
            Mutation::Truncate => "truncate",
            Mutation::DropTail => "drop_tail",
            Mutation::NoStartBarrier => "no_start_barrier",
            Mutation::DoubleCount => "double_count",
            Mutation::NoLineWait => "no_line_wait",
            Mutation::NoStepWait => "no_step_wait",
            Mutation::NoCopyStart => "no_copy_start",
            Mutation::SquaresOutOfOrder => "squares_out_of_order",
            Mutation::NoEps => "no_eps",
            Mutation::WeightSkipped => "weight_skipped",
            Mutation::ResidualBeforeRounding => "residual_before_rounding",
            Mutation::RowOutOfOrder => "row_out_of_order",
            Mutation::SkipRowPeer => "skip_row_peer",
            Mutation::ShortRankRows => "short_rank_rows",
            Mutation::RowBoundaryOffByOne => "row_boundary_off_by_one",
            Mutation::SizeDependentOrder => "size_dependent_order",
            Mutation::ShapeCheckSkipped => "shape_check_skipped",
        }
    }

    /// Whether every run with random data shows it; a missing barrier or wait shows only when
    /// a peer happens to be late.
    pub fn is_deterministic(self) -> bool {
        !matches!(
            self,
            Mutation::NoStartBarrier
                | Mutation::NoLineWait
                | Mutation::NoStepWait
                | Mutation::NoCopyStart
        )
    }

    /// The kernels whose code it changes, by entry name, sorted: every kernel that runs the
    /// changed code for a mutation in a shared header (no algorithm named), but the all-gathers
    /// for one in the sum (they sum nothing).
    pub fn kernels(self) -> Vec<String> {
        let untouched: &[&str] = match self {
            Mutation::SkipPeer | Mutation::DoubleCount => EPILOGUE,
            Mutation::DropTail => NORMS,
            _ => &[],
        };
        let sums = matches!(
            self,
            Mutation::SkipPeer | Mutation::Truncate | Mutation::DoubleCount
        );
        let (algorithms, dtypes): (&[&str], &[Dtype]) = match self {
            Mutation::NoStartBarrier | Mutation::SizeDependentOrder => {
                (&["all_reduce_one_shot_pull"], &Dtype::ALL)
            }
            Mutation::NoLineWait => (
                &[
                    "all_gather_one_shot_push_ll",
                    "all_reduce_add_rms_norm_one_shot_push_ll",
                    "all_reduce_one_shot_push_ll",
                    "reduce_scatter_one_shot_push_ll",
                ],
                &Dtype::ALL,
            ),
            Mutation::NoStepWait => (
                &[
                    "all_reduce_add_rms_norm_one_shot_push_simple",
                    "all_reduce_one_shot_push_simple",
                    "all_reduce_rsag_push_simple",
                ],
                &Dtype::ALL,
            ),
            Mutation::NoCopyStart => (
                &[
                    "all_gather_one_shot_copy_engine",
                    "all_reduce_one_shot_copy_engine",
                ],
                &Dtype::ALL,
            ),
            Mutation::ShapeCheckSkipped => (SHAPE_CHECKED_KERNELS, &Dtype::ALL),
            Mutation::SquaresOutOfOrder | Mutation::NoEps | Mutation::WeightSkipped => {
                (NORMS, &Dtype::ALL)
            }
            Mutation::ResidualBeforeRounding => (FUSED, &[Dtype::Bf16, Dtype::Fp16]),
            Mutation::RowOutOfOrder => (&["reduce_scatter_one_shot_pull"], &Dtype::ALL),
            Mutation::SkipRowPeer => (&["all_gather_one_shot_pull"], &Dtype::ALL),
            Mutation::ShortRankRows | Mutation::RowBoundaryOffByOne => (
                &[
                    "all_gather_one_shot_copy_engine",
                    "all_gather_one_shot_pull",
                    "all_reduce_add_rms_norm_two_shot",
                    "all_gather_one_shot_push",
                    "all_gather_one_shot_push_ll",
                    "reduce_scatter_one_shot_pull",
                    "reduce_scatter_one_shot_push",
                    "reduce_scatter_one_shot_push_ll",
                ],
                &Dtype::ALL,
            ),
            Mutation::Truncate => (&[], &[Dtype::Bf16, Dtype::Fp16]),
            Mutation::SkipPeer | Mutation::DropTail | Mutation::DoubleCount => (&[], &Dtype::ALL),
        };
        let mut names: Vec<String> = dtypes
            .iter()
            .flat_map(|dtype| all_kernels(*dtype, 2))
            .map(|spec| spec.name)
            .filter(|name| !(sums && name.starts_with("all_gather_")))
            .filter(|name| {
                let of = |algorithms: &[&str]| {
                    algorithms.iter().any(|algorithm| {
                        name.strip_prefix(algorithm)
                            .is_some_and(|rest| rest.matches('_').count() == 1)
                    })
                };
                (algorithms.is_empty() || of(algorithms)) && !of(untouched)
            })
            .collect();
        names.sort();
        names
    }

    fn patches(self) -> &'static [Patch] {
        match self {
            Mutation::SkipPeer => SKIP_PEER,
            Mutation::Truncate => TRUNCATE,
            Mutation::DropTail => DROP_TAIL,
            Mutation::NoStartBarrier => NO_START_BARRIER,
            Mutation::DoubleCount => DOUBLE_COUNT,
            Mutation::NoLineWait => NO_LINE_WAIT,
            Mutation::NoStepWait => NO_STEP_WAIT,
            Mutation::NoCopyStart => NO_COPY_START,
            Mutation::SquaresOutOfOrder => SQUARES_OUT_OF_ORDER,
            Mutation::NoEps => NO_EPS,
            Mutation::WeightSkipped => WEIGHT_SKIPPED,
            Mutation::ResidualBeforeRounding => RESIDUAL_BEFORE_ROUNDING,
            Mutation::RowOutOfOrder => ROW_OUT_OF_ORDER,
            Mutation::SkipRowPeer => SKIP_ROW_PEER,
            Mutation::ShortRankRows => SHORT_RANK_ROWS,
            Mutation::RowBoundaryOffByOne => ROW_BOUNDARY_OFF_BY_ONE,
            Mutation::SizeDependentOrder => SIZE_DEPENDENT_ORDER,
            Mutation::ShapeCheckSkipped => SHAPE_CHECK_SKIPPED,
        }
    }
}

impl std::fmt::Display for Mutation {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// The embedded text of a kernel source or header.
fn embedded(file: &str) -> &'static str {
    if let Some((_, text)) = headers().iter().find(|(name, _)| *name == file) {
        return text;
    }
    all_kernels(Dtype::Bf16, 2)
        .iter()
        .find(|spec| spec.source == file)
        .map_or_else(
            || panic!("`{file}` is not a kernel source or header"),
            source,
        )
}

/// The files `mutation` changes, as (file name, patched text), sorted by name. Panics when a
/// pattern is not found exactly once or a patch leaves a file unchanged.
pub fn apply(mutation: Mutation) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = Vec::new();
    for patch in mutation.patches() {
        let index = files
            .iter()
            .position(|(file, _)| file == patch.file)
            .unwrap_or_else(|| {
                files.push((patch.file.to_owned(), embedded(patch.file).to_owned()));
                files.len() - 1
            });
        let text = &mut files[index].1;
        let found = text.matches(patch.find).count();
        assert!(
            found == 1,
            "mutation {mutation}: kernels/{} should contain this text exactly once but has it \
             {found} times; the kernel changed, so update tests/support/mutations.rs:\n{}",
            patch.file,
            patch.find
        );
        let patched = text.replacen(patch.find, patch.replace, 1);
        assert_ne!(
            &patched, text,
            "mutation {mutation}: a patch of kernels/{} changes nothing",
            patch.file
        );
        *text = patched;
    }
    for (file, text) in &files {
        assert_ne!(
            text,
            embedded(file),
            "mutation {mutation} leaves kernels/{file} as it was"
        );
    }
    files.sort();
    files
}

/// [`apply`] as sources to compile.
pub fn overrides(mutation: Mutation) -> SourceOverrides {
    let mut sources = SourceOverrides::new();
    for (file, text) in apply(mutation) {
        sources
            .replace(&file, text)
            .unwrap_or_else(|error| panic!("mutation {mutation}: {error}"));
    }
    sources
}

/// Writes a package of the ladder at `ladder_path` for `arch`, with its kernels compiled from
/// `sources`, into `out` (which must not exist), as `prepare export` would: the ladder is
/// validated and must target `arch`. Panics naming what failed.
pub fn package_with_sources(
    ladder_path: &Path,
    arch: Arch,
    out: &Path,
    sources: &SourceOverrides,
) -> PathBuf {
    let name = ladder_path.display();
    let bytes =
        std::fs::read(ladder_path).unwrap_or_else(|error| panic!("cannot read {name}: {error}"));
    let ladder = validate_ladder_bytes(&bytes)
        .unwrap_or_else(|report| panic!("{name} is not a valid ladder:\n{report}"));
    prepare::device::check_export_target(&ladder, arch)
        .unwrap_or_else(|error| panic!("{name}: {error}"));
    let nvrtc = Nvrtc::load().unwrap_or_else(|error| panic!("{error}"));
    let compilation =
        compile_kernels_with_sources(nvrtc, &kernels_for_ladder(&ladder), arch, sources, &Silent)
            .unwrap_or_else(|error| panic!("compiling the kernels of {name} for {arch}: {error}"));
    let text = String::from_utf8(bytes).expect("a valid ladder is UTF-8");
    prepare::package::write_package(out, &text, &ladder, &compilation, arch, false)
        .unwrap_or_else(|error| panic!("writing the package of {name}: {error}"));
    out.to_path_buf()
}

/// Writes a package of the ladder at `ladder_path` for `arch` with `mutation` planted in its
/// kernels into `out_dir`/<mutation name>, and returns that path.
pub fn mutated_package(
    mutation: Mutation,
    ladder_path: &Path,
    arch: Arch,
    out_dir: &Path,
) -> PathBuf {
    package_with_sources(
        ladder_path,
        arch,
        &out_dir.join(mutation.name()),
        &overrides(mutation),
    )
}
