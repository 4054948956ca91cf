//! `prepare bench`: every candidate of a package, NCCL among them, timed against each other on
//! the same GPUs in one run, at sizes across the ladder; a table like nccl-tests' and, with
//! `--json`, the figures for machines.
//!
//! Method: candidates are first qualified (captured in graphs, exact on fresh random data);
//! then per size every qualified candidate of the bucket covering it is captured in a graph of
//! enough back-to-back operations (about `--sample-us` per replay), and timed in interleaved
//! rounds with a barrier before every sample; per round the slowest rank counts, and a
//! candidate's figure is the median over rounds (`prepare::timing`, `prepare::tune`).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{anyhow, Context as _};
use prepare::collective::Collectives;
use prepare::package::Outcome;
use prepare::qualify::{qualify, QualifyOptions};
use prepare::timing::{Timer, TimingOptions};
use prepare::tune::{decide_bucket, BucketSamples, CandidateOutcome, CandidateSamples, Policy};
use serde::Serialize;

use super::ranks::{self, RankArgs, Role};
use super::Failure;

/// Flags of `prepare bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The package (from `prepare export`) whose candidates are timed.
    #[arg(long, value_name = "DIR")]
    package: PathBuf,
    #[command(flatten)]
    ranks: RankArgs,
    /// Message sizes (`8K,256K,4M,64M`, or bytes); by default every power of two from the
    /// first bucket's smallest message to the last bucket's largest.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, value_name = "LIST")]
    sizes: Option<Vec<u64>>,
    /// Interleaved rounds per size.
    #[arg(long, default_value_t = 25, value_name = "N")]
    rounds: u32,
    /// Each sample replays enough operations to take about this many microseconds.
    #[arg(long, default_value_t = 150.0, value_name = "US")]
    sample_us: f64,
    /// Rank 0 writes the figures here as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// A size with an optional K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, scale) = match text.char_indices().last() {
        Some((at, 'K' | 'k')) => (&text[..at], 1 << 10),
        Some((at, 'M' | 'm')) => (&text[..at], 1 << 20),
        Some((at, 'G' | 'g')) => (&text[..at], 1 << 30),
        _ => (text, 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|value| value.checked_mul(scale))
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("`{text}` is not a size such as 4096, 256K or 64M"))
}

/// One contender at one size.
#[derive(Debug, Serialize)]
struct Row {
    bytes: u64,
    bucket: usize,
    profile: String,
    /// Median microseconds per all-reduce (slowest rank per round).
    median_us: Option<f64>,
    min_us: Option<f64>,
    max_us: Option<f64>,
    rounds: usize,
    /// Operations per timed replay.
    ops_per_sample: u32,
    /// Bus bandwidth at the median, GB/s: bytes x 2(n-1)/n / time.
    bus_gbps: Option<f64>,
    /// NCCL's median over this one's (above 1: faster than NCCL).
    speedup_vs_nccl: Option<f64>,
    /// Why it was not timed.
    excluded: Option<String>,
    /// Whether the decision picks it at this size.
    chosen: bool,
}

/// Runs `prepare bench`.
pub fn run(args: &Args) -> Result<(), Failure> {
    args.ranks.timeout()?;
    if args.rounds < 3 {
        return Err(Failure::refused(anyhow!("--rounds must be at least 3")));
    }
    match ranks::role()? {
        Role::Rank(environment) => run_rank(args, &environment),
        Role::Launcher => {
            // Refuse a bad package before starting any rank.
            prepare::package::open_package(&args.package).map_err(Failure::refused)?;
            ranks::launch_ranks("bench", &args.ranks, args.ranks.gpu_list()?, Vec::new())
        }
    }
}

fn default_sizes(ladder: &prepare::ladder::Ladder) -> Vec<u64> {
    let first = ladder.bucket_min_bytes(0).next_power_of_two();
    let last = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    std::iter::successors(Some(first.max(2)), |size| size.checked_mul(2))
        .take_while(|&size| size <= last)
        .collect()
}

#[allow(clippy::print_stdout, clippy::too_many_lines)]
fn run_rank(args: &Args, environment: &prepare::launch::RankEnvironment) -> Result<(), Failure> {
    let package = prepare::package::open_package(&args.package).map_err(Failure::refused)?;
    let ladder = package.ladder();
    let sizes = args.sizes.clone().unwrap_or_else(|| default_sizes(ladder));
    let runtime = ranks::start_rank(&args.ranks, environment)?;
    ranks::check_architecture(&runtime, &package)?;
    let leader = runtime.rank() == 0;
    let log = |line: String| {
        if leader {
            println!("{line}");
        }
    };
    let mut collectives = Collectives::new(&runtime, &package).map_err(Failure::runtime)?;
    let report = qualify(
        &runtime,
        &mut collectives,
        ladder,
        QualifyOptions {
            sizes: prepare::qualify::Sizes::Edges,
            repeat: 1,
            sequence_replays: 0,
        },
        &log,
    )
    .map_err(Failure::runtime)?;
    let mut timer = Timer::new(&runtime).map_err(Failure::runtime)?;
    let options = TimingOptions {
        rounds: args.rounds,
        sample_us: args.sample_us,
        ..TimingOptions::default()
    };
    let world = runtime.world();
    let factor = 2.0 * f64::from(world - 1) / f64::from(world);
    let mut rows = Vec::new();
    log(format!(
        "{:>10} {:>6}  {:<22} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "bytes", "bucket", "candidate", "median_us", "min_us", "max_us", "busbw", "vs_nccl"
    ));
    for &bytes in &sizes {
        let Some(bucket) = ladder.bucket_for(bytes) else {
            log(format!("{bytes:>10}: above the last bucket; skipped"));
            continue;
        };
        let elements = bytes.div_ceil(ladder.dtype.size_bytes()) as usize;
        let live: Vec<(usize, usize)> = collectives
            .bucket_entries(bucket)
            .filter(|(_, entry)| entry.dropped.is_none())
            .map(|(id, _)| (id, elements))
            .collect();
        let group = timer
            .time(&runtime, &collectives, &live, options)
            .map_err(Failure::runtime)?;
        let mut timed = group.samples.into_iter().zip(group.ops);
        let mut ops_of = Vec::new();
        let candidates: Vec<CandidateSamples> = collectives
            .bucket_entries(bucket)
            .map(|(id, entry)| {
                let (samples, dropped) = if entry.dropped.is_none() {
                    let (samples, ops) = timed.next().expect("one group per live entry");
                    ops_of.push((entry.profile.clone(), ops));
                    (samples, None)
                } else {
                    (Vec::new(), entry.dropped.as_ref().map(ToString::to_string))
                };
                CandidateSamples {
                    profile: entry.profile.clone(),
                    dropped,
                    exact: !matches!(report.outcomes[id], Outcome::Qualified { exact: false }),
                    samples,
                }
            })
            .collect();
        let default = ladder.buckets[bucket].default.clone();
        let decision = decide_bucket(
            &BucketSamples {
                index: bucket,
                default,
                candidates,
            },
            world as usize,
            &Policy::default(),
        )
        .map_err(Failure::runtime)?;
        let nccl_median = decision.candidates.iter().find_map(|candidate| {
            match (&candidate.outcome, candidate.profile == "nccl") {
                (CandidateOutcome::Timed { median_us, .. }, true) => Some(*median_us),
                _ => None,
            }
        });
        for candidate in &decision.candidates {
            let row = match &candidate.outcome {
                CandidateOutcome::Timed {
                    median_us,
                    min_us,
                    max_us,
                    rounds,
                } => Row {
                    bytes,
                    bucket,
                    profile: candidate.profile.clone(),
                    median_us: Some(*median_us),
                    min_us: Some(*min_us),
                    max_us: Some(*max_us),
                    rounds: *rounds,
                    ops_per_sample: ops_of
                        .iter()
                        .find(|(profile, _)| *profile == candidate.profile)
                        .map_or(0, |(_, ops)| *ops),
                    bus_gbps: Some(bytes as f64 * factor / (median_us * 1e3)),
                    speedup_vs_nccl: nccl_median.map(|nccl| nccl / median_us),
                    excluded: None,
                    chosen: candidate.profile == decision.winner,
                },
                CandidateOutcome::Excluded { reason } => Row {
                    bytes,
                    bucket,
                    profile: candidate.profile.clone(),
                    median_us: None,
                    min_us: None,
                    max_us: None,
                    rounds: 0,
                    ops_per_sample: 0,
                    bus_gbps: None,
                    speedup_vs_nccl: None,
                    excluded: Some(reason.clone()),
                    chosen: false,
                },
            };
            let marker = if row.chosen { "*" } else { " " };
            log(match (row.median_us, &row.excluded) {
                (Some(median), _) => format!(
                    "{bytes:>10} {bucket:>6} {marker}{:<22} {median:>9.2} {:>9.2} {:>9.2} {:>8.1} {:>7.2}x",
                    row.profile,
                    row.min_us.unwrap_or(f64::NAN),
                    row.max_us.unwrap_or(f64::NAN),
                    row.bus_gbps.unwrap_or(f64::NAN),
                    row.speedup_vs_nccl.unwrap_or(f64::NAN),
                ),
                (None, reason) => format!(
                    "{bytes:>10} {bucket:>6}  {:<22} excluded: {}",
                    row.profile,
                    reason.as_deref().unwrap_or("")
                ),
            });
            rows.push(row);
        }
    }
    log("* the candidate the decision picks at that size (3% margin, p < 0.01)".to_owned());
    if let (true, Some(path)) = (leader, &args.json) {
        let mut bytes = serde_json::to_vec_pretty(&rows).expect("rows serialize");
        bytes.push(b'\n');
        prepare::cache::write_atomically(path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))
            .map_err(Failure::runtime)?;
    }
    std::io::stdout()
        .flush()
        .context("cannot write to standard output")
        .map_err(Failure::runtime)
}
