//! `prepare bench`: every candidate of a package, NCCL among them, timed against each other on
//! the same GPUs in one run, at sizes across the ladder, with the tuned choice marked; then a
//! decode emulation (two all-reduces per layer, 61 layers, hidden 7168, in one graph per batch
//! size) with the tuned choice against NCCL alone. Tables like nccl-tests', and with `--out`
//! the figures as JSON and SVG plots.
//!
//! Candidates are first qualified (captured in graphs, exact on fresh random data); then
//! `prepare::bench::Bench` measures, and this command prints each row as it comes.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use prepare::bench::{
    default_sizes, epilogue, largest_choice_gap, text, Bench, BenchReport, DecodeRow, DecodeShape,
    ServingRow, SizeRow,
};
use prepare::collective::Collectives;
use prepare::ladder::Collective;
use prepare::qualify::{qualify, QualifyOptions};
use prepare::select::SelectOptions;
use prepare::timing::TimingOptions;
use prepare::tune::choice::Choice;

use super::exactness::ExactnessArgs;
use super::ranks::{self, PackageRankArgs, Role};
use super::Failure;

/// Flags of `prepare bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: PackageRankArgs,
    /// Message sizes (`8K,256K,4M,64M`, or bytes); by default every bucket's smallest and
    /// largest message, the powers of two between, and twice and four times the largest bucket
    /// (above the ladder: NCCL on the whole message against the pieces).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, value_name = "LIST", conflicts_with = "tokens")]
    sizes: Option<Vec<u64>>,
    /// Sizes as tokens x `--hidden` (`all_reduce` and `all_reduce_add_rms_norm`); the fused
    /// all-reduce + RMSNorm is timed at rows x hidden, by default 1, 2, 4, ... while the
    /// message fits the ladder.
    #[arg(long, value_delimiter = ',', value_parser = parse_tokens, value_name = "LIST")]
    tokens: Option<Vec<u64>>,
    /// Elements per row of `--tokens` and of the fused all-reduce + RMSNorm's sizes: a multiple
    /// of 8 from 8 to 16777216.
    #[arg(long, default_value_t = prepare::bench::epilogue::DEFAULT_HIDDEN, value_name = "N", value_parser = parse_hidden)]
    hidden: u64,
    /// An all-reduce package's bench.json from this machine: beside each size of a package of
    /// `all_reduce_add_rms_norm`, its tuned choice at the same bytes and the fused call's time
    /// over it.
    #[arg(long, value_name = "FILE")]
    all_reduce_bench: Option<PathBuf>,
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
    // The policy of the tuned choice selected here (not of a `--choice` given).
    #[command(flatten)]
    exactness: ExactnessArgs,
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
        .ok_or_else(|| {
            format!(
                "`{}` is not a batch size from 0 to 65536",
                prepare::files::quoted(text)
            )
        })
}

/// A token count: 1 to 65536 rows.
fn parse_tokens(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|tokens| (1..=65_536).contains(tokens))
        .ok_or_else(|| {
            format!(
                "`{}` is not a token count from 1 to 65536",
                prepare::files::quoted(text)
            )
        })
}

/// A hidden size the norm takes: a multiple of 8 up to 2^24.
fn parse_hidden(text: &str) -> Result<u64, String> {
    use prepare::collective::{HIDDEN_MULTIPLE, MAX_HIDDEN};
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&hidden| hidden > 0 && hidden % HIDDEN_MULTIPLE == 0 && hidden <= MAX_HIDDEN)
        .ok_or_else(|| {
            format!(
                "`{}` is not a hidden size: a multiple of {HIDDEN_MULTIPLE} from \
                 {HIDDEN_MULTIPLE} to {MAX_HIDDEN}",
                prepare::files::quoted(text)
            )
        })
}

/// Microseconds per sample: from 1 to a second.
fn parse_sample_us(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|us| us.is_finite() && (1.0..=1e6).contains(us))
        .ok_or_else(|| {
            format!(
                "{} is not a number of microseconds from 1 to 1000000",
                prepare::files::quoted(text)
            )
        })
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
        .ok_or_else(|| {
            format!(
                "`{}` is not a size such as 4096, 256K or 64M",
                prepare::files::quoted(text)
            )
        })
}

/// Runs `prepare bench`.
pub fn run(args: &Args) -> Result<(), Failure> {
    args.target.ranks.timeout()?;
    ranks::check_writable("--out", args.out.as_deref())?;
    let role = ranks::role()?;
    args.exactness.note(matches!(role, Role::Launcher));
    match role {
        Role::Rank => run_rank(args),
        Role::Launcher => args.target.launch("bench"),
    }
}

#[allow(clippy::print_stdout)]
fn run_rank(args: &Args) -> Result<(), Failure> {
    let package = args.target.open_package()?;
    let ladder = package.ladder();
    let given_choice = match &args.choice {
        Some(path) => {
            let choice = Choice::read(path).map_err(Failure::refused)?;
            choice
                .check_package(path, package.id())
                .map_err(Failure::refused)?;
            Some(choice)
        }
        None => None,
    };
    let plan = Plan::of(args, ladder)?;
    let all_reduce_bench = args
        .all_reduce_bench
        .as_deref()
        .map(read_all_reduce_bench)
        .transpose()?;
    let runtime = args.target.start_rank(&package)?;
    let leader = runtime.rank() == 0;
    // Lines name the paths given: escaped for the terminal.
    let log = |line: String| {
        if leader {
            println!("{}", prepare::files::escape_control(&line));
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
            data: prepare::qualify::Data::Fresh,
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
            allow_inexact: args.exactness.allow_inexact,
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
    let mut bench = Bench::new(
        &runtime,
        &collectives,
        ladder,
        &report.outcomes,
        &choice,
        TimingOptions {
            rounds: args.rounds,
            sample_us: args.sample_us,
            ..TimingOptions::default()
        },
    )
    .map_err(Failure::bench)?;
    log(text::heading(
        ladder.collective,
        ladder.dtype,
        runtime.world(),
        &ladder.name,
    ));
    let gpus: Vec<String> = runtime
        .records()
        .iter()
        .map(|record| record.gpu_name.clone())
        .collect();
    let (rows, serving, shape, decode, epilogue) = match &plan {
        Plan::Sizes(sizes) => {
            let rows = time_sizes(&mut bench, ladder.collective, sizes, &log)?;
            let serving = time_serving(&mut bench, sizes, &log)?;
            let shape = DecodeShape::default();
            let decode = emulate_decode(&mut bench, ladder, &shape, &args.batches, &log)?;
            (rows, serving, shape, decode, Vec::new())
        }
        Plan::Epilogue { tokens, hidden } => {
            if let Some((path, report)) = &all_reduce_bench {
                epilogue::check_against(report, runtime.world(), &gpus)
                    .with_context(|| format!("{} cannot stand beside this run", path.display()))
                    .map_err(Failure::refused)?;
            }
            let shape = DecodeShape {
                hidden: *hidden as usize,
                ..DecodeShape::default()
            };
            let measured = super::bench_epilogue::run(
                &mut bench,
                ladder,
                tokens,
                &shape,
                &args.batches,
                all_reduce_bench.as_ref().map(|(_, report)| report),
                &log,
            )?;
            (
                measured.sizes,
                measured.serving,
                shape,
                measured.decode,
                measured.summary,
            )
        }
    };

    if let (true, Some(dir)) = (leader, &args.out) {
        let report = BenchReport {
            ladder: ladder.name.clone(),
            collective: ladder.collective,
            package: package.identity().to_owned(),
            world_size: runtime.world(),
            gpus,
            nccl_version: prepare::runtime::nccl_version().map_err(Failure::runtime)?,
            driver_version: prepare::runtime::driver_version(),
            rounds: args.rounds,
            sizes: rows,
            decode_shape: (!decode.is_empty()).then_some(shape),
            decode,
            serving,
            epilogue,
        };
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot make {}", dir.display()))
            .map_err(Failure::runtime)?;
        let mut bytes = serde_json::to_vec_pretty(&report).expect("a report serializes");
        bytes.push(b'\n');
        let json = dir.join("bench.json");
        prepare::files::write_atomically(&json, &bytes)
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

/// What a run times: message sizes, or for the fused all-reduce + RMSNorm tokens x hidden.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    Sizes(Vec<u64>),
    Epilogue { tokens: Vec<u64>, hidden: u64 },
}

impl Plan {
    /// The sizes `args` ask of a package of `ladder`; flags that do not apply to its
    /// collective are refused by name.
    fn of(args: &Args, ladder: &prepare::ladder::Ladder) -> Result<Plan, Failure> {
        let collective = ladder.collective;
        let element_bytes = ladder.dtype.size_bytes();
        if args.all_reduce_bench.is_some() && collective != Collective::AllReduceAddRmsNorm {
            return Err(Failure::usage(anyhow::anyhow!(
                "--all-reduce-bench goes with a package of all_reduce_add_rms_norm; this one is \
                 of {collective}"
            )));
        }
        match (collective, &args.sizes, &args.tokens) {
            (Collective::AllReduceAddRmsNorm, Some(_), _) => Err(Failure::usage(anyhow::anyhow!(
                "a package of all_reduce_add_rms_norm is timed at --tokens x --hidden; --sizes \
                 does not apply"
            ))),
            (Collective::AllReduceAddRmsNorm, None, tokens) => Ok(Plan::Epilogue {
                tokens: tokens.clone().unwrap_or_else(|| {
                    epilogue::default_tokens(ladder, args.hidden, element_bytes)
                }),
                hidden: args.hidden,
            }),
            (Collective::AllReduce, None, Some(tokens)) => Ok(Plan::Sizes(
                tokens
                    .iter()
                    .map(|&tokens| tokens * args.hidden * element_bytes)
                    .collect(),
            )),
            (_, None, Some(_)) => Err(Failure::usage(anyhow::anyhow!(
                "--tokens goes with a package of all_reduce or all_reduce_add_rms_norm; this \
                 one is of {collective}: give --sizes"
            ))),
            (_, sizes, _) => Ok(Plan::Sizes(
                sizes.clone().unwrap_or_else(|| default_sizes(ladder)),
            )),
        }
    }
}

/// The most bytes an all-reduce package's bench.json may hold.
const BENCH_REPORT: prepare::files::Limit = prepare::files::Limit::new(64 << 20, "a bench report");

/// An all-reduce package's bench.json, read whole before anything runs.
fn read_all_reduce_bench(path: &std::path::Path) -> Result<(PathBuf, BenchReport), Failure> {
    let bytes = prepare::files::read_limited(path, BENCH_REPORT)
        .with_context(|| format!("cannot read --all-reduce-bench {}", path.display()))
        .map_err(Failure::refused)?;
    let report: BenchReport = serde_json::from_slice(&bytes)
        .with_context(|| format!("--all-reduce-bench {} is not a bench.json", path.display()))
        .map_err(Failure::refused)?;
    if report.collective != Collective::AllReduce {
        return Err(Failure::refused(anyhow::anyhow!(
            "--all-reduce-bench {} is a bench of {}, not of all_reduce",
            path.display(),
            report.collective
        )));
    }
    Ok((path.to_path_buf(), report))
}

/// Every candidate against the others at each size, a line each.
fn time_sizes(
    bench: &mut Bench,
    collective: Collective,
    sizes: &[u64],
    log: &dyn Fn(String),
) -> Result<Vec<SizeRow>, Failure> {
    let mut rows = Vec::new();
    log(text::size_columns(collective));
    for &bytes in sizes {
        let Some(timed) = bench.time_size(bytes).map_err(Failure::bench)? else {
            log(text::above_ladder_line(collective, bytes));
            continue;
        };
        for row in timed {
            log(text::size_line(collective, &row));
            rows.push(row);
        }
    }
    log("* the tuned choice at that size; vs_nccl: NCCL's median over the candidate's".to_owned());
    if let Some(gap) = largest_choice_gap(&rows) {
        log(format!(
            "the tuned choice is at most {:.1}% behind the fastest contender at any size: at \
             {} bytes, {} {:.2} us against {} {:.2} us",
            100.0 * gap.behind(),
            gap.bytes,
            gap.chosen.0,
            gap.chosen.1,
            gap.best.0,
            gap.best.1
        ));
    }
    Ok(rows)
}

/// The chosen candidate on the registered buffer and on a server's own memory, in one
/// interleaved group per size, so the copies the handle adds show; a line each.
fn time_serving(
    bench: &mut Bench,
    sizes: &[u64],
    log: &dyn Fn(String),
) -> Result<Vec<ServingRow>, Failure> {
    let buffers = bench.serving_buffers(sizes).map_err(Failure::bench)?;
    let mut serving = Vec::new();
    log(text::serving_heading());
    for &bytes in sizes {
        let Some(row) = bench
            .time_serving(bytes, &buffers)
            .map_err(Failure::bench)?
        else {
            continue;
        };
        log(text::serving_line(&row));
        serving.push(row);
    }
    log("extra: any tensor minus zero copy".to_owned());
    Ok(serving)
}

/// The decode emulation at each batch (`0` skips it), a line each.
fn emulate_decode(
    bench: &mut Bench,
    ladder: &prepare::ladder::Ladder,
    shape: &DecodeShape,
    batches: &[usize],
    log: &dyn Fn(String),
) -> Result<Vec<DecodeRow>, Failure> {
    let mut decode = Vec::new();
    let batches: Vec<usize> = batches.iter().copied().filter(|&batch| batch > 0).collect();
    if batches.is_empty() {
        return Ok(decode);
    }
    log(text::decode_heading(ladder.collective, ladder.dtype, shape));
    log(format!(
        "{:>6} {:>9}  {:<22} {:>11} {:>11} {:>8}",
        "batch", "elements", "tuned", "tuned_us", "nccl_us", "speedup"
    ));
    for batch in batches {
        let elements = batch * shape.hidden;
        if ladder
            .bucket_for(elements as u64 * ladder.dtype.size_bytes())
            .is_none()
        {
            log(format!("{batch:>6}: above the last bucket; skipped"));
            continue;
        }
        let Some(row) = bench.time_decode(batch, shape).map_err(Failure::bench)? else {
            continue;
        };
        log(format!(
            "{batch:>6} {elements:>9}  {:<22} {:>11.1} {:>11.1} {:>7.2}x",
            row.tuned_profile, row.tuned_us, row.nccl_us, row.speedup
        ));
        decode.push(row);
    }
    Ok(decode)
}
