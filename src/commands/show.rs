//! `prepare show`: a package's header, buckets, kernels, peer memory and qualification, and a
//! choice made for it, as tables, or as one JSON document.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use prepare::package::{self, CandidateRecord, Manifest, Outcome, Package};
use prepare::show::Description;
use prepare::tune::choice::{BucketChoice, Choice, ChoiceError, Tuning};
use prepare::tune::{CandidateOutcome, DecisionReason, Policy, SizeFigures};

use super::Failure;

/// Flags of `prepare show`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The package directory.
    #[arg(value_name = "DIR")]
    package: PathBuf,
    /// Print one JSON document (its schema: `schemas/show.schema.json`) instead of tables.
    #[arg(long)]
    json: bool,
    /// A choice made for this package (`choice.rank<r>.json`) to show after it.
    #[arg(long, value_name = "FILE")]
    choice: Option<PathBuf>,
}

/// Runs `prepare show`.
pub fn run(args: &Args) -> Result<(), Failure> {
    let package = package::open_package(&args.package).map_err(Failure::refused)?;
    let choice = args
        .choice
        .as_deref()
        .map(|path| read_choice(path, &package))
        .transpose()?;
    let output = if args.json {
        let mut text = serde_json::to_string_pretty(&Description::new(&package, choice.as_ref()))
            .expect("a package description always serializes");
        text.push('\n');
        text
    } else {
        let mut text = render(&package);
        if let (Some(path), Some(choice)) = (&args.choice, &choice) {
            render_choice(&mut text, path, choice);
        }
        text
    };
    // Names, versions and a choice's text come from files: escaped for the terminal.
    std::io::stdout()
        .lock()
        .write_all(prepare::files::escape_control(&output).as_bytes())
        .context("cannot write to standard output")
        .map_err(Failure::runtime)
}

/// Reads a choice and checks that it was made for `package`.
fn read_choice(path: &Path, package: &Package) -> Result<Choice, Failure> {
    let choice = Choice::read(path).map_err(|error| match error {
        ChoiceError::Io { path, source } => Failure::refused(
            anyhow::Error::new(source)
                .context(format!("cannot read the choice {}", path.display())),
        ),
        other => Failure::refused(other),
    })?;
    choice
        .check_package(path, package.id())
        .map_err(Failure::refused)?;
    Ok(choice)
}

/// The tables `prepare show` prints for a package.
fn render(package: &Package) -> String {
    let manifest = package.manifest();
    let mut out = String::new();
    render_header(&mut out, package);
    render_buckets(&mut out, manifest);
    render_kernels(&mut out, manifest);
    let memory = manifest.peer_memory;
    let _ = writeln!(
        out,
        "\nPeer memory per GPU: {} ({} bytes): buffer {}, signal flags {}",
        human_bytes(memory.total_bytes()),
        memory.total_bytes(),
        human_bytes(memory.buffer_bytes),
        human_bytes(memory.signal_bytes)
    );
    let ladder = package.ladder();
    if let Some(slot) = prepare::kernels::copy_engine_slot_bytes(ladder) {
        let bytes = slot * u64::from(ladder.world_size.saturating_sub(1));
        let _ = writeln!(
            out,
            "Copy-engine scratch per GPU: {} ({bytes} bytes), private, not peer-mapped",
            human_bytes(bytes)
        );
    }
    render_qualification(&mut out, manifest);
    out
}

fn render_header(out: &mut String, package: &Package) {
    let manifest = package.manifest();
    let ladder = &manifest.ladder;
    let mut table = Table::new(&[Align::Left, Align::Left]);
    table.row(["Package", &package.dir().display().to_string()]);
    table.row([
        "Identity",
        &format!(
            "{} (sha256 of {})",
            package.identity(),
            package::MANIFEST_FILE
        ),
    ]);
    table.row([
        "Ladder",
        &format!(
            "{}: {}, {}, {} ranks",
            ladder.name,
            collective_name(ladder.collective),
            ladder.dtype.name(),
            ladder.world_size
        ),
    ]);
    table.row(["Architecture", manifest.arch.name()]);
    table.row([
        "Written by",
        &format!(
            "prepare {} (package format {})",
            manifest.tool_version, manifest.format_version
        ),
    ]);
    table.row(["NVRTC", &manifest.compiler.nvrtc_version]);
    table.row(["Options", &manifest.compiler.options.join(" ")]);
    table.render(out);
}

fn render_buckets(out: &mut String, manifest: &Manifest) {
    let _ = writeln!(out, "\nBuckets");
    let mut table = Table::new(&[
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
    ]);
    table.row([
        "#",
        "messages",
        "bytes",
        "threads x blocks",
        "cluster",
        "candidates",
    ]);
    let mut previous_max = 0;
    let mut seen_cluster_kernel = false;
    let mut seen_cluster_scheduling = false;
    for bucket in &manifest.buckets {
        let candidates = bucket
            .candidates
            .iter()
            .map(|candidate| {
                seen_cluster_kernel |= candidate.cluster_kernel;
                seen_cluster_scheduling |= candidate.cluster_scheduling;
                describe_candidate(
                    candidate,
                    candidate.profile == bucket.default,
                    bucket.blocks,
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        table.row([
            &bucket.index.to_string(),
            &message_range(previous_max, bucket.max_bytes),
            &format!("{}-{}", bucket.min_bytes, bucket.max_bytes),
            &format!("{} x {}", bucket.threads, bucket.blocks),
            &bucket
                .cluster_size
                .map_or_else(|| "-".to_string(), |size| size.to_string()),
            &candidates,
        ]);
        previous_max = bucket.max_bytes;
    }
    table.render(out);
    let _ = writeln!(out, "* the bucket's default, used when nothing is timed.");
    if seen_cluster_kernel {
        let _ = writeln!(
            out,
            "[cluster kernel] uses cluster barriers and distributed shared memory; one cluster works, the others return at once."
        );
    }
    if seen_cluster_scheduling {
        let _ = writeln!(
            out,
            "[cluster scheduling] an ordinary kernel launched with the bucket's cluster dimensions: it uses no cluster instructions, but its blocks are scheduled in clusters of the bucket's size."
        );
    }
    if let Some(last) = manifest.buckets.last() {
        let _ = writeln!(
            out,
            "Messages above {} ({} bytes) use NCCL.",
            human_bytes(last.max_bytes),
            last.max_bytes
        );
    }
}

fn describe_candidate(candidate: &CandidateRecord, is_default: bool, bucket_blocks: u32) -> String {
    let mut text = candidate.profile.clone();
    if is_default {
        text.push('*');
    }
    if candidate.cluster_kernel {
        text.push_str(" [cluster kernel]");
    }
    if candidate.cluster_scheduling {
        text.push_str(" [cluster scheduling]");
    }
    if let Some(blocks) = candidate.blocks.filter(|blocks| *blocks != bucket_blocks) {
        let _ = write!(text, " ({blocks} blocks)");
    }
    text
}

fn render_kernels(out: &mut String, manifest: &Manifest) {
    if manifest.kernels.is_empty() {
        let _ = writeln!(out, "\nKernels: none; every candidate is NCCL.");
        return;
    }
    let _ = writeln!(out, "\nKernels ({})", manifest.arch);
    let mut table = Table::new(&[
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Left,
    ]);
    table.row([
        "kernel",
        "registers",
        "shared",
        "spills (store/load)",
        "stack",
        "cubin",
        "source",
    ]);
    for kernel in &manifest.kernels {
        let name = if kernel.cluster {
            format!("{} [cluster kernel]", kernel.name)
        } else {
            kernel.name.clone()
        };
        table.row([
            &name,
            &kernel.registers.to_string(),
            &human_bytes(u64::from(kernel.shared_bytes)),
            &format!(
                "{} / {}",
                human_bytes(u64::from(kernel.spill_store_bytes)),
                human_bytes(u64::from(kernel.spill_load_bytes))
            ),
            &human_bytes(u64::from(kernel.stack_bytes)),
            &human_bytes(kernel.size_bytes),
            &kernel.source,
        ]);
    }
    table.render(out);
}

fn render_qualification(out: &mut String, manifest: &Manifest) {
    let Some(qualification) = &manifest.qualification else {
        let _ = writeln!(
            out,
            "\nQualification: none (exported without GPUs; `prepare export --gpus` qualifies every candidate)."
        );
        return;
    };
    let _ = writeln!(
        out,
        "\nQualification: driver {}, NCCL {}, {} GPUs",
        qualification.driver_version,
        qualification.nccl_version,
        qualification.gpus.len()
    );
    let mut gpus = Table::new(&[Align::Left, Align::Left, Align::Left]);
    for (rank, gpu) in qualification.gpus.iter().enumerate() {
        gpus.row([&format!("rank {rank}"), &gpu.name, &gpu.uuid]);
    }
    gpus.render(out);
    let _ = writeln!(out);
    let mut table = Table::new(&[Align::Right, Align::Left, Align::Left]);
    table.row(["#", "candidate", "result"]);
    for bucket in &qualification.buckets {
        for (slot, candidate) in bucket.candidates.iter().enumerate() {
            let index = if slot == 0 {
                bucket.index.to_string()
            } else {
                String::new()
            };
            let is_nccl = manifest
                .buckets
                .get(bucket.index)
                .and_then(|record| record.candidates.get(slot))
                .is_some_and(|record| record.kernel.is_none());
            let result = match &candidate.outcome {
                Outcome::Qualified { exact: true } if is_nccl => "qualified, bit-exact".to_string(),
                Outcome::Qualified { exact: true } => "qualified".to_string(),
                Outcome::Qualified { exact: false } => {
                    "qualified, not bit-exact (NCCL sums in its own order)".to_string()
                }
                Outcome::Dropped(reason) => format!("dropped: {reason}"),
            };
            table.row([&index, &candidate.profile, &result]);
        }
    }
    table.render(out);
}

fn render_choice(out: &mut String, path: &Path, choice: &Choice) {
    let _ = writeln!(out, "\nChoice");
    let mut header = Table::new(&[Align::Left, Align::Left]);
    header.row(["File", &path.display().to_string()]);
    header.row([
        "Ladder",
        &format!("{}, {} ranks", choice.ladder, choice.world_size),
    ]);
    header.row([
        "Tuning",
        match choice.tuning {
            Tuning::Runtime => "runtime: each bucket's candidates timed on the GPUs it was made on",
            Tuning::Static => "static: each bucket's default, nothing timed",
        },
    ]);
    header.row(["Policy", &describe_policy(&choice.policy)]);
    header.row(["Topology", &choice.topology]);
    header.row([
        "Fingerprint",
        &format!("{} (its cache key)", choice.fingerprint),
    ]);
    header.row([
        "Made by",
        &format!(
            "prepare {} (choice format {})",
            choice.tool_version, choice.format_version
        ),
    ]);
    header.render(out);

    let _ = writeln!(out);
    let mut decisions = Table::new(&[
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
        Align::Left,
    ]);
    decisions.row(["#", "messages", "winner", "baseline", "bit-exact", "reason"]);
    let mut previous_max = 0;
    for bucket in &choice.buckets {
        let decision = &bucket.decision;
        decisions.row([
            &decision.index.to_string(),
            &message_range(previous_max, bucket.max_bytes),
            &decision.winner,
            &decision.baseline,
            yes_no(decision.bit_exact),
            &describe_reason(bucket, choice),
        ]);
        previous_max = bucket.max_bytes;
    }
    decisions.render(out);

    if choice.tuning == Tuning::Static {
        let _ = writeln!(
            out,
            "\nTimings: none (static tuning uses each bucket's default and times nothing)."
        );
        return;
    }
    let _ = writeln!(
        out,
        "\nTimings (microseconds per operation at the bucket's smallest and largest message; per round the slowest rank counts)"
    );
    let mut table = Table::new(&[
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
    ]);
    table.row([
        "#",
        "candidate",
        "median per size",
        "slowdown",
        "vs baseline",
        "rounds",
        "exact",
        "excluded",
    ]);
    for bucket in &choice.buckets {
        let decision = &bucket.decision;
        let baseline_slowdown = decision
            .candidates
            .iter()
            .find(|candidate| candidate.profile == decision.baseline)
            .and_then(|candidate| match candidate.outcome {
                CandidateOutcome::Timed { slowdown, .. } => Some(slowdown),
                CandidateOutcome::Excluded { .. } => None,
            });
        for (slot, candidate) in decision.candidates.iter().enumerate() {
            let index = if slot == 0 {
                decision.index.to_string()
            } else {
                String::new()
            };
            let mut name = candidate.profile.clone();
            match (
                candidate.profile == decision.winner,
                candidate.profile == decision.baseline,
            ) {
                (true, true) => name.push_str(" [winner, baseline]"),
                (true, false) => name.push_str(" [winner]"),
                (false, true) => name.push_str(" [baseline]"),
                (false, false) => {}
            }
            match &candidate.outcome {
                CandidateOutcome::Timed { slowdown, sizes } => table.row([
                    &index,
                    &name,
                    &sizes
                        .iter()
                        .map(|figures| {
                            format!(
                                "{:.2} us @ {}",
                                figures.median_us,
                                exact_size(figures.bytes)
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    &format!("{slowdown:.3}x"),
                    &baseline_slowdown.map_or_else(
                        || "-".to_string(),
                        |base| format!("{:.3}x", slowdown / base),
                    ),
                    &rounds_text(sizes),
                    yes_no(candidate.exact),
                    "",
                ]),
                CandidateOutcome::Excluded { reason } => {
                    table.row([&index, &name, "-", "-", "-", "-", "-", reason]);
                }
            }
        }
    }
    table.render(out);
    let _ = writeln!(
        out,
        "slowdown: the largest, over the sizes, of the candidate's median over the best median at that size; vs baseline: its slowdown over the baseline's, the ratio the margin applies to."
    );
    let _ = writeln!(
        out,
        "The baseline is the bucket's default if it was timed, else its first timed candidate; each size's fastest and slowest round are in the choice file."
    );
}

/// Rounds with a valid sample from every rank: one number when every size had as many.
fn rounds_text(sizes: &[SizeFigures]) -> String {
    let mut rounds: Vec<usize> = sizes.iter().map(|figures| figures.rounds).collect();
    if rounds.windows(2).all(|pair| pair[0] == pair[1]) {
        rounds.truncate(1);
    }
    rounds
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_policy(policy: &Policy) -> String {
    format!(
        "margin {}%, significance p < {} (Mann-Whitney U over rounds), exact-only {}",
        trimmed(policy.margin * 100.0, 2),
        trimmed(policy.significance, 6),
        if policy.exact_only { "on" } else { "off" }
    )
}

/// Why a bucket's winner won, in words.
fn describe_reason(bucket: &BucketChoice, choice: &Choice) -> String {
    let decision = &bucket.decision;
    let baseline = &decision.baseline;
    if choice.tuning == Tuning::Static {
        return "the bucket's default (static tuning)".to_string();
    }
    match &decision.reason {
        DecisionReason::BaselineFastest => {
            let timed = decision
                .candidates
                .iter()
                .filter(|candidate| matches!(candidate.outcome, CandidateOutcome::Timed { .. }))
                .count();
            if timed == 1 {
                "the only candidate timed".to_string()
            } else {
                "baseline fastest".to_string()
            }
        }
        DecisionReason::WithinMargin { fastest, ratio } => format!(
            "within the {}% margin of {baseline} (fastest {fastest}, {ratio:.3}x)",
            trimmed(choice.policy.margin * 100.0, 2)
        ),
        DecisionReason::NotSignificant {
            fastest,
            ratio,
            tested_bytes,
            p_value,
        } => format!(
            "not significantly faster than {baseline} (fastest {fastest}, {ratio:.3}x, {} at {})",
            p_text(*p_value),
            exact_size(*tested_bytes)
        ),
        DecisionReason::Faster {
            ratio,
            tested_bytes,
            p_value,
        } => format!(
            "faster than {baseline} by {:.1}% ({} at {})",
            (1.0 - ratio) * 100.0,
            p_text(*p_value),
            exact_size(*tested_bytes)
        ),
    }
}

/// A p-value as `p=0.04`, or `p<0.0001` below what four decimals show.
fn p_text(p_value: f64) -> String {
    if p_value < 1e-4 {
        "p<0.0001".to_string()
    } else {
        format!("p={}", trimmed(p_value, 4))
    }
}

/// A number to at most `decimals` decimals, without trailing zeros.
fn trimmed(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

/// A bucket's messages: `(16 KiB, 96 KiB]`, from the previous bucket's largest.
fn message_range(previous_max: u64, max_bytes: u64) -> String {
    let low = if previous_max == 0 {
        "0".to_string()
    } else {
        human_bytes(previous_max)
    };
    format!("({low}, {}]", human_bytes(max_bytes))
}

fn collective_name(collective: prepare::ladder::Collective) -> &'static str {
    match collective {
        prepare::ladder::Collective::AllReduce => "all_reduce",
    }
}

/// Bytes in binary units: exact values as integers (`16 KiB`), others to one decimal.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale = 1_u64;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        scale *= 1024;
        unit += 1;
    }
    if bytes % scale == 0 {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

/// A message size exactly: a round size and the bytes above it (`2 B`, `16 KiB`, `256 KiB+2`,
/// `1.5 MiB+2`, `1408 KiB`). The round part is in the largest unit that gives it to two
/// decimals.
fn exact_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    let rest = bytes % 1024;
    let round = bytes - rest;
    let Some((unit, scale)) = UNITS
        .iter()
        .find(|(_, scale)| round >= *scale && (u128::from(round) * 100) % u128::from(*scale) == 0)
    else {
        return format!("{bytes} B");
    };
    let text = format!("{} {unit}", trimmed(round as f64 / *scale as f64, 2));
    if rest == 0 {
        text
    } else {
        format!("{text}+{rest}")
    }
}

#[derive(Debug, Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// A plain text table: two spaces between columns, the last column not padded.
#[derive(Debug)]
struct Table {
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(align: &[Align]) -> Table {
        Table {
            align: align.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row<const N: usize>(&mut self, cells: [&str; N]) {
        debug_assert_eq!(N, self.align.len());
        self.rows
            .push(cells.iter().map(|cell| (*cell).to_string()).collect());
    }

    fn render(&self, out: &mut String) {
        let widths: Vec<usize> = (0..self.align.len())
            .map(|column| {
                self.rows
                    .iter()
                    .map(|row| row[column].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                let last = column + 1 == row.len();
                if column > 0 {
                    line.push_str("  ");
                }
                match (self.align[column], last) {
                    (Align::Left, true) => line.push_str(cell),
                    (Align::Left, false) => {
                        let _ = write!(line, "{cell:<width$}", width = widths[column]);
                    }
                    (Align::Right, _) => {
                        let _ = write!(line, "{cell:>width$}", width = widths[column]);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{describe_reason, exact_size, human_bytes, p_text, rounds_text, trimmed};
    use prepare::tune::choice::{BucketChoice, Choice, Tuning, CHOICE_FORMAT_VERSION};
    use prepare::tune::{
        BucketDecision, CandidateOutcome, CandidateResult, DecisionReason, Policy, SizeFigures,
    };

    fn choice(reason: DecisionReason, timed: usize, tuning: Tuning) -> Choice {
        let candidate = |profile: &str, outcome| CandidateResult {
            profile: profile.to_owned(),
            exact: true,
            outcome,
        };
        let timed_outcome = CandidateOutcome::Timed {
            slowdown: 1.0,
            sizes: vec![
                SizeFigures {
                    bytes: 2,
                    median_us: 8.0,
                    min_us: 7.5,
                    max_us: 9.0,
                    rounds: 30,
                },
                SizeFigures {
                    bytes: 16_384,
                    median_us: 10.0,
                    min_us: 9.0,
                    max_us: 11.0,
                    rounds: 30,
                },
            ],
        };
        let excluded = CandidateOutcome::Excluded {
            reason: "capture failed: out of memory".to_owned(),
        };
        Choice {
            format_version: CHOICE_FORMAT_VERSION,
            tool_version: prepare::TOOL_VERSION.to_owned(),
            package: "ab".repeat(32),
            ladder: "ladder".to_owned(),
            world_size: 2,
            fingerprint: "cd".repeat(32),
            topology: "peer_kernels".to_owned(),
            tuning,
            policy: Policy {
                margin: 0.025,
                ..Policy::default()
            },
            buckets: vec![BucketChoice {
                min_bytes: 2,
                max_bytes: 16_384,
                decision: BucketDecision {
                    index: 0,
                    winner: "nccl".to_owned(),
                    baseline: "nccl".to_owned(),
                    reason,
                    bit_exact: true,
                    candidates: vec![
                        candidate("nccl", timed_outcome.clone()),
                        candidate(
                            "one_shot_pull",
                            if timed > 1 { timed_outcome } else { excluded },
                        ),
                    ],
                },
            }],
        }
    }

    fn reason_words(reason: DecisionReason, timed: usize, tuning: Tuning) -> String {
        let choice = choice(reason, timed, tuning);
        describe_reason(&choice.buckets[0], &choice)
    }

    #[test]
    fn every_reason_reads_as_words() {
        let cases = [
            (DecisionReason::BaselineFastest, 2, "baseline fastest"),
            (
                DecisionReason::BaselineFastest,
                1,
                "the only candidate timed",
            ),
            (
                DecisionReason::WithinMargin {
                    fastest: "one_shot_pull".to_owned(),
                    ratio: 0.985,
                },
                2,
                "within the 2.5% margin of nccl (fastest one_shot_pull, 0.985x)",
            ),
            (
                DecisionReason::NotSignificant {
                    fastest: "one_shot_pull".to_owned(),
                    ratio: 0.95,
                    tested_bytes: 2,
                    p_value: 0.04,
                },
                2,
                "not significantly faster than nccl (fastest one_shot_pull, 0.950x, p=0.04 at 2 B)",
            ),
            (
                DecisionReason::Faster {
                    ratio: 0.818,
                    tested_bytes: 16_384,
                    p_value: 0.0001,
                },
                2,
                "faster than nccl by 18.2% (p=0.0001 at 16 KiB)",
            ),
        ];
        for (reason, timed, expected) in cases {
            assert_eq!(reason_words(reason, timed, Tuning::Runtime), expected);
        }
        assert_eq!(
            reason_words(DecisionReason::BaselineFastest, 2, Tuning::Static),
            "the bucket's default (static tuning)"
        );
    }

    #[test]
    fn p_values_and_percentages_drop_trailing_zeros() {
        assert_eq!(p_text(0.04), "p=0.04");
        assert_eq!(p_text(0.012_345), "p=0.0123");
        assert_eq!(p_text(1.0), "p=1");
        assert_eq!(p_text(0.000_099), "p<0.0001");
        assert_eq!(p_text(1e-12), "p<0.0001");
        assert_eq!(trimmed(0.03 * 100.0, 2), "3");
        assert_eq!(trimmed(2.5, 2), "2.5");
        assert_eq!(trimmed(0.01, 6), "0.01");
        assert_eq!(trimmed(10.0, 0), "10");
    }

    #[test]
    fn exact_sizes_name_every_byte() {
        let cases = [
            (2, "2 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (16_384, "16 KiB"),
            (16_386, "16 KiB+2"),
            (262_146, "256 KiB+2"),
            (393_216, "384 KiB"),
            (1_048_578, "1 MiB+2"),
            (1_310_720, "1.25 MiB"),
            (1_441_792, "1408 KiB"),
            (1_572_866, "1.5 MiB+2"),
            (2_098_175, "2 MiB+1023"),
            (64 << 20, "64 MiB"),
            ((4 << 30) + 2, "4 GiB+2"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(exact_size(bytes), expected, "{bytes} bytes");
        }
    }

    #[test]
    fn rounds_are_one_number_when_every_size_had_as_many() {
        let figures = |rounds| SizeFigures {
            bytes: 2,
            median_us: 1.0,
            min_us: 1.0,
            max_us: 1.0,
            rounds,
        };
        assert_eq!(rounds_text(&[figures(25), figures(25)]), "25");
        assert_eq!(rounds_text(&[figures(25), figures(24)]), "25, 24");
        assert_eq!(rounds_text(&[figures(7)]), "7");
    }

    #[test]
    fn human_bytes_is_exact_where_it_can_be() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (16_384, "16 KiB"),
            (16_386, "16.0 KiB"),
            (98_304, "96 KiB"),
            (1_572_864, "1.5 MiB"),
            (64 << 20, "64 MiB"),
            (3 << 40, "3 TiB"),
            (5 << 50, "5120 TiB"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(human_bytes(bytes), expected, "{bytes} bytes");
        }
    }
}
