//! `prepare bench`: every candidate of a package, NCCL among them, timed against each other on
//! the same GPUs in one run, at sizes across the ladder, with the tuned choice marked; then a
//! decode emulation (two all-reduces per layer, 61 layers, hidden 7168, in one graph per batch
//! size) with the tuned choice against NCCL alone. Tables like nccl-tests', and with `--out`
//! the figures as JSON and SVG plots.
//!
//! Method: candidates are first qualified (captured in graphs, exact on fresh random data);
//! then per size every qualified candidate of the bucket covering it is captured in a graph of
//! enough back-to-back operations (about `--sample-us` per replay), and timed in interleaved
//! rounds with a barrier before every sample; per round the slowest rank counts, and a
//! candidate's figure is the median over rounds (`prepare::timing`, `prepare::tune`).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use prepare::bench::{BenchReport, DecodeRow, DecodeShape, ServingRow, SizeRow};
use prepare::collective::{Collectives, Operands};
use prepare::package::Outcome;
use prepare::qualify::{qualify, QualifyOptions};
use prepare::select::SelectOptions;
use prepare::timing::{Timed, Timer, TimingOptions};
use prepare::tune::choice::Choice;
use prepare::tune::{
    decide_bucket, BucketSamples, CandidateOutcome, CandidateSamples, Policy, SizeFigures,
};

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
    /// Message sizes (`8K,256K,4M,64M`, or bytes); by default every bucket's smallest and
    /// largest message and the powers of two between.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, value_name = "LIST")]
    sizes: Option<Vec<u64>>,
    /// Interleaved rounds per size.
    #[arg(long, default_value_t = 25, value_name = "N", value_parser = clap::value_parser!(u32).range(3..=10_000))]
    rounds: u32,
    /// Each sample replays enough operations to take about this many microseconds.
    #[arg(long, default_value_t = 150.0, value_name = "US", value_parser = parse_sample_us)]
    sample_us: f64,
    /// The tuned choice to mark and to emulate decode with (from `prepare tune --out`); by
    /// default the cache's, or one selected now (and cached).
    #[arg(long, value_name = "FILE")]
    choice: Option<PathBuf>,
    /// The cache directory for the tuned choice (default `$XDG_CACHE_HOME/prepare`, else
    /// `~/.cache/prepare`).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Batch sizes (rows of the hidden state) of the decode emulation; `0` skips it.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64",
        value_name = "LIST",
        value_parser = parse_batch
    )]
    batches: Vec<usize>,
    /// Rank 0 writes bench.json and the SVG plots here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// A decode batch: 0 to 65536 rows, so that rows times the hidden size cannot overflow (any
/// batch past the last bucket is skipped anyway).
fn parse_batch(text: &str) -> Result<usize, String> {
    text.trim()
        .parse::<usize>()
        .ok()
        .filter(|&batch| batch <= 65_536)
        .ok_or_else(|| format!("`{text}` is not a batch size from 0 to 65536"))
}

/// Microseconds per sample: from 1 to a second.
fn parse_sample_us(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|us| us.is_finite() && (1.0..=1e6).contains(us))
        .ok_or_else(|| format!("{text} is not a number of microseconds from 1 to 1000000"))
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

/// Runs `prepare bench`.
pub fn run(args: &Args) -> Result<(), Failure> {
    args.ranks.timeout()?;
    ranks::check_writable("--out", args.out.as_deref())?;
    match ranks::role()? {
        Role::Rank => run_rank(args),
        Role::Launcher => {
            // Refuse a bad package before starting any rank.
            prepare::package::open_package_retrying(&args.package).map_err(Failure::refused)?;
            ranks::launch_ranks("bench", &args.ranks, args.ranks.gpu_list()?, Vec::new())
        }
    }
}

/// Every bucket's smallest and largest message and the powers of two between, ascending.
fn default_sizes(ladder: &prepare::ladder::Ladder) -> Vec<u64> {
    let last = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    let mut sizes: Vec<u64> = std::iter::successors(Some(2_u64), |size| size.checked_mul(2))
        .take_while(|&size| size <= last)
        .collect();
    for index in 0..ladder.buckets.len() {
        sizes.push(ladder.bucket_min_bytes(index));
        sizes.push(ladder.buckets[index].max_bytes);
    }
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The median over rounds of the slowest rank's time (`[rank][round]`); rounds where a rank
/// has no sample are left out.
fn slowest_median(samples: &[Vec<Option<f64>>]) -> f64 {
    let mut figures: Vec<f64> = (0..samples.first().map_or(0, Vec::len))
        .filter_map(|round| {
            samples
                .iter()
                .map(|rank| rank[round])
                .try_fold(0.0_f64, |slowest, value| value.map(|v| slowest.max(v)))
        })
        .collect();
    figures.sort_by(f64::total_cmp);
    figures.get(figures.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Per bucket, the profile the choice takes.
fn chosen_profiles(choice: &Choice) -> Vec<String> {
    choice
        .buckets
        .iter()
        .map(|bucket| bucket.decision.winner.clone())
        .collect()
}

/// The bucket's plain NCCL candidate: `nccl` without communicator settings if it has one, else
/// its first NCCL candidate.
fn nccl_profile(ladder: &prepare::ladder::Ladder, bucket: usize) -> Option<String> {
    let nccl: Vec<&prepare::ladder::Profile> = ladder.buckets[bucket]
        .candidates
        .iter()
        .filter_map(|id| ladder.profile(id))
        .filter(|profile| profile.is_nccl())
        .collect();
    nccl.iter()
        .find(|profile| profile.max_ctas.is_none() && profile.min_ctas.is_none())
        .or(nccl.first())
        .map(|profile| profile.id.clone())
}

#[allow(clippy::print_stdout, clippy::too_many_lines)]
fn run_rank(args: &Args) -> Result<(), Failure> {
    let package =
        prepare::package::open_package_retrying(&args.package).map_err(Failure::refused)?;
    let ladder = package.ladder();
    let given_choice = match &args.choice {
        Some(path) => {
            let choice = Choice::read(path).map_err(Failure::refused)?;
            choice
                .check_package(path, &package)
                .map_err(Failure::refused)?;
            Some(choice)
        }
        None => None,
    };
    let sizes = args.sizes.clone().unwrap_or_else(|| default_sizes(ladder));
    let runtime = ranks::start_rank(&args.ranks)?;
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
    let choice = if let Some(choice) = given_choice {
        choice
    } else {
        let options = SelectOptions {
            cache_dir: args
                .cache_dir
                .clone()
                .or_else(|| SelectOptions::default().cache_dir),
            ..SelectOptions::default()
        };
        let selection = prepare::select::select(
            &runtime,
            &mut collectives,
            &package,
            &options,
            &prepare::progress::Silent,
        )
        .map_err(Failure::runtime)?;
        log(format!(
            "tuned choice: {}",
            if selection.cache_hit {
                "from the cache"
            } else {
                "selected now and cached"
            }
        ));
        selection.choice
    };
    // Every rank must time and emulate with the same choice.
    let digest = choice.digest();
    let gathered = runtime
        .all_gather(&digest, "the choice agreement")
        .map_err(Failure::runtime)?;
    if let Some(other) = gathered.chunks(32).position(|theirs| theirs != digest) {
        return Err(Failure::refused(anyhow::anyhow!(
            "rank {other} was given another choice than rank {}; give every rank the same file",
            runtime.rank()
        )));
    }
    // A winner this run's qualification dropped is replaced by the bucket's NCCL.
    let chosen: Vec<String> = chosen_profiles(&choice)
        .into_iter()
        .enumerate()
        .map(|(bucket, profile)| {
            let live = collectives
                .find(bucket, &profile)
                .is_some_and(|id| collectives.entries()[id].dropped.is_none());
            if live {
                profile
            } else {
                nccl_profile(ladder, bucket).unwrap_or(profile)
            }
        })
        .collect();
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
                    // Timed at one size: this one.
                    (vec![samples], None)
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
        // The decision gives every candidate's figures; the winner marked is the tuned choice's.
        let decision = decide_bucket(
            &BucketSamples {
                index: bucket,
                default: ladder.buckets[bucket].default.clone(),
                sizes: vec![bytes],
                candidates,
            },
            world as usize,
            &Policy::default(),
        )
        .map_err(Failure::runtime)?;
        let nccl_name = nccl_profile(ladder, bucket);
        let nccl_median = decision.candidates.iter().find_map(|candidate| {
            match (
                &candidate.outcome,
                Some(&candidate.profile) == nccl_name.as_ref(),
            ) {
                (CandidateOutcome::Timed { sizes, .. }, true) => {
                    sizes.first().map(|figures| figures.median_us)
                }
                _ => None,
            }
        });
        for candidate in &decision.candidates {
            let is_chosen = candidate.profile == chosen[bucket];
            let row = match &candidate.outcome {
                CandidateOutcome::Timed { sizes, .. } => {
                    let SizeFigures {
                        median_us,
                        min_us,
                        max_us,
                        rounds,
                        ..
                    } = sizes.first().expect("one size was timed");
                    SizeRow {
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
                        chosen: is_chosen,
                    }
                }
                CandidateOutcome::Excluded { reason } => SizeRow {
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
                    chosen: is_chosen,
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
                    "{bytes:>10} {bucket:>6} {marker}{:<22} excluded: {}",
                    row.profile,
                    reason.as_deref().unwrap_or("")
                ),
            });
            rows.push(row);
        }
    }
    log("* the tuned choice at that size; vs_nccl: NCCL's median over the candidate's".to_owned());

    // The serving path: the chosen candidate on the registered buffer and on a server's own
    // memory, in one interleaved group per size, so the copies the handle adds show.
    let largest = sizes
        .iter()
        .filter(|&&bytes| ladder.bucket_for(bytes).is_some())
        .max()
        .copied()
        .unwrap_or(0) as usize;
    let device = runtime.device();
    let own_input = device
        .allocate(largest.max(16))
        .map_err(|error| Failure::runtime(anyhow::Error::from(error)))?;
    let own_output = device
        .allocate(largest.max(16))
        .map_err(|error| Failure::runtime(anyhow::Error::from(error)))?;
    let region = collectives.input_region();
    let mut serving = Vec::new();
    log(format!(
        "serving path of the chosen candidate (us): zero copy, zero copy in place, any tensor, \
         any tensor in place\n{:>10} {:>6}  {:<22} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "bytes", "bucket", "chosen", "zero_cp", "zc_inpl", "any", "any_inpl", "extra"
    ));
    for &bytes in &sizes {
        let Some(bucket) = ladder.bucket_for(bytes) else {
            continue;
        };
        let Some(id) = collectives.find(bucket, &chosen[bucket]) else {
            continue;
        };
        let elements = bytes.div_ceil(ladder.dtype.size_bytes()) as usize;
        let message = elements as u64 * ladder.dtype.size_bytes();
        let own = |buffer: &prepare::gpu::driver::DeviceBuffer| {
            prepare::gpu::driver::CallerMemory::prefix(buffer, message)
        };
        let mut entries = vec![
            Timed::from((id, elements)),
            Timed {
                id,
                elements,
                operands: Some(Operands {
                    input: own(&own_input),
                    output: own(&own_output),
                }),
            },
            Timed {
                id,
                elements,
                operands: Some(Operands {
                    input: own(&own_output),
                    output: own(&own_output),
                }),
            },
        ];
        if let Some(region) = region {
            entries.push(Timed {
                id,
                elements,
                operands: Some(Operands {
                    input: region,
                    output: region,
                }),
            });
        }
        let group = timer
            .time_operands(&runtime, &collectives, &entries, options)
            .map_err(Failure::runtime)?;
        let medians: Vec<f64> = group
            .samples
            .iter()
            .map(|samples| slowest_median(samples))
            .collect();
        let row = ServingRow {
            bytes,
            bucket,
            profile: chosen[bucket].clone(),
            zero_copy_us: medians[0],
            any_tensor_us: medians[1],
            any_tensor_in_place_us: medians[2],
            zero_copy_in_place_us: medians.get(3).copied(),
        };
        log(format!(
            "{bytes:>10} {bucket:>6}  {:<22} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>+9.2}",
            row.profile,
            row.zero_copy_us,
            row.zero_copy_in_place_us.unwrap_or(f64::NAN),
            row.any_tensor_us,
            row.any_tensor_in_place_us,
            row.any_tensor_us - row.zero_copy_us,
        ));
        serving.push(row);
    }
    log("extra: any tensor minus zero copy".to_owned());

    let shape = DecodeShape::default();
    let mut decode = Vec::new();
    let batches: Vec<usize> = args
        .batches
        .iter()
        .copied()
        .filter(|&batch| batch > 0)
        .collect();
    if !batches.is_empty() {
        let ops = (shape.layers * shape.all_reduces_per_layer) as u32;
        log(format!(
            "decode emulation: {} layers x {} all-reduces of batch x {} bf16 in one graph",
            shape.layers, shape.all_reduces_per_layer, shape.hidden
        ));
        log(format!(
            "{:>6} {:>9}  {:<22} {:>11} {:>11} {:>8}",
            "batch", "elements", "tuned", "tuned_us", "nccl_us", "speedup"
        ));
        for batch in batches {
            let elements = batch * shape.hidden;
            let bytes = elements as u64 * ladder.dtype.size_bytes();
            let Some(bucket) = ladder.bucket_for(bytes) else {
                log(format!("{batch:>6}: above the last bucket; skipped"));
                continue;
            };
            let Some(nccl) =
                nccl_profile(ladder, bucket).and_then(|profile| collectives.find(bucket, &profile))
            else {
                continue;
            };
            let tuned = collectives.find(bucket, &chosen[bucket]).unwrap_or(nccl);
            let mut entries = vec![(tuned, elements)];
            if tuned != nccl {
                entries.push((nccl, elements));
            }
            let group = timer
                .time_with_ops(&runtime, &collectives, &entries, ops, options)
                .map_err(Failure::runtime)?;
            let step = |samples: &Vec<Vec<Option<f64>>>| slowest_median(samples) * f64::from(ops);
            let tuned_us = step(&group.samples[0]);
            let nccl_us = group.samples.get(1).map_or(tuned_us, step);
            let row = DecodeRow {
                batch,
                elements,
                tuned_profile: chosen[bucket].clone(),
                tuned_us,
                nccl_us,
                speedup: nccl_us / tuned_us,
            };
            log(format!(
                "{batch:>6} {elements:>9}  {:<22} {tuned_us:>11.1} {nccl_us:>11.1} {:>7.2}x",
                row.tuned_profile, row.speedup
            ));
            decode.push(row);
        }
    }

    if let (true, Some(dir)) = (leader, &args.out) {
        let report = BenchReport {
            ladder: ladder.name.clone(),
            package: package.identity().to_owned(),
            world_size: world,
            gpus: runtime
                .records()
                .iter()
                .map(|record| record.gpu_name.clone())
                .collect(),
            nccl_version: prepare::runtime::nccl_version().map_err(Failure::runtime)?,
            driver_version: prepare::runtime::driver_version(),
            rounds: args.rounds,
            sizes: rows,
            decode_shape: (!decode.is_empty()).then_some(shape),
            decode,
            serving,
        };
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot make {}", dir.display()))
            .map_err(Failure::runtime)?;
        let mut bytes = serde_json::to_vec_pretty(&report).expect("a report serializes");
        bytes.push(b'\n');
        let json = dir.join("bench.json");
        prepare::cache::write_atomically(&json, &bytes)
            .with_context(|| format!("cannot write {}", json.display()))
            .map_err(Failure::runtime)?;
        log(format!("wrote {}", json.display()));
        let plots = prepare::bench::plot::write_plots(&report, dir)
            .context("cannot draw the plots")
            .map_err(Failure::runtime)?;
        for plot in plots {
            log(format!("wrote {}", plot.display()));
        }
    }
    std::io::stdout()
        .flush()
        .context("cannot write to standard output")
        .map_err(Failure::runtime)
}
