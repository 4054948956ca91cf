//! `prepare tune`: startup selection on every GPU (one rank each, like torchrun): the cache, or
//! an exactness check and interleaved timing of every bucket's candidates; every rank agrees
//! and writes the identical choice.

use std::path::PathBuf;
use std::time::Instant;

use prepare::ladder::Dtype;
use prepare::select::SelectOptions;
use prepare::serve::Handle;
use prepare::timing::TimingOptions;
use prepare::tune::choice::Tuning;

use super::exactness::ExactnessArgs;
use super::ranks::{self, PackageRankArgs, Role};
use super::Failure;

/// Flags of `prepare tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: PackageRankArgs,
    /// `runtime` times the candidates here; `static` takes each bucket's default.
    #[arg(long, value_enum, default_value = "runtime")]
    collective_tuning: TuningKind,
    #[command(flatten)]
    exactness: ExactnessArgs,
    /// A candidate replaces the bucket's default only when faster by more than this percentage:
    /// its slowdown (its worst median over the best, at the bucket's smallest and largest
    /// message) lower than the default's by more than this.
    #[arg(long, default_value_t = 3.0, value_name = "PCT", value_parser = parse_margin)]
    margin: f64,
    /// The cache directory (default `$XDG_CACHE_HOME/prepare`, else `~/.cache/prepare`).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Time again even when the cache holds a choice for this machine.
    #[arg(long)]
    retune: bool,
    /// Every rank writes its choice here as `choice.rank<r>.json`.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Interleaved timing rounds per bucket (each round times every candidate at both sizes);
    /// 5 to 10000.
    #[arg(long, default_value_t = 25, value_name = "N", value_parser = parse_rounds)]
    rounds: u32,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TuningKind {
    Runtime,
    Static,
}

/// A percentage from 0 to below 100.
fn parse_margin(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|margin| margin.is_finite() && (0.0..100.0).contains(margin))
        .ok_or_else(|| {
            format!(
                "--margin {} is not a percentage from 0 to below 100",
                prepare::files::quoted(text)
            )
        })
}

/// Enough rounds for the significance test, and few enough that the gathered matrix stays
/// small.
fn parse_rounds(text: &str) -> Result<u32, String> {
    let rounds: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("--rounds {} is not a count", prepare::files::quoted(text)))?;
    match rounds {
        0..5 => Err(format!(
            "--rounds {rounds} is too few for a significance test; use at least 5"
        )),
        5..=10_000 => Ok(rounds),
        _ => Err(format!("--rounds {rounds} is more than 10000")),
    }
}

/// The checked options, or why they are refused.
fn options(args: &Args) -> Result<SelectOptions, Failure> {
    args.target.ranks.timeout()?;
    let defaults = SelectOptions::default();
    ranks::check_writable("--out", args.out.as_deref())?;
    let cache_flag = if args.cache_dir.is_some() {
        "--cache-dir"
    } else {
        "the cache directory (--cache-dir)"
    };
    let cache_dir = args.cache_dir.clone().or(defaults.cache_dir);
    ranks::check_writable(cache_flag, cache_dir.as_deref())?;
    Ok(SelectOptions {
        tuning: match args.collective_tuning {
            TuningKind::Runtime => Tuning::Runtime,
            TuningKind::Static => Tuning::Static,
        },
        margin: args.margin / 100.0,
        allow_inexact: args.exactness.allow_inexact,
        cache_dir,
        retune: args.retune,
        timing: TimingOptions {
            rounds: args.rounds,
            ..TimingOptions::default()
        },
        out: args.out.clone(),
    })
}

/// Runs `prepare tune`.
pub fn run(args: &Args) -> Result<(), Failure> {
    let options = options(args)?;
    let role = ranks::role()?;
    args.exactness.note(matches!(role, Role::Launcher));
    match role {
        Role::Rank => run_rank(args, &options),
        Role::Launcher => args.target.launch("tune"),
    }
}

/// Progress as lines on rank 0 (the launcher prefixes and prints them).
struct LineReporter {
    leader: bool,
    started: std::sync::Mutex<Option<(String, Instant)>>,
}

impl prepare::progress::Reporter for LineReporter {
    #[allow(clippy::print_stdout)]
    fn start(&self, phase: &str, total: u64) {
        if self.leader {
            println!("{phase}: {total} steps");
        }
        *prepare::progress::lock(&self.started) = Some((phase.to_owned(), Instant::now()));
    }

    fn advance(&self, _item: &str) {}

    #[allow(clippy::print_stdout)]
    fn finish(&self) {
        let started = prepare::progress::lock(&self.started).take();
        if let (true, Some((phase, at))) = (self.leader, started) {
            println!("{phase}: done in {:.3} s", at.elapsed().as_secs_f64());
        }
    }
    #[allow(clippy::print_stdout)]
    fn note(&self, message: &str) {
        if self.leader {
            println!("{message}");
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

#[allow(clippy::print_stdout)]
fn run_rank(args: &Args, options: &SelectOptions) -> Result<(), Failure> {
    let package = args.target.open_package()?;
    let runtime = args.target.start_rank(&package)?;
    let rank = runtime.rank();
    let reporter = LineReporter {
        leader: rank == 0,
        started: std::sync::Mutex::new(None),
    };
    let dtype: Dtype = package.ladder().dtype;
    let handle = Handle::select(runtime, std::slice::from_ref(&package), options, &reporter)
        .map_err(Failure::serving)?;
    let selection = handle
        .selection(package.ladder().collective, dtype)
        .map_err(Failure::serving)?;
    let choice = &selection.choice;
    let digest = prepare::hash::hex(&choice.digest());
    if rank == 0 {
        let times = selection.times;
        if selection.cache_hit {
            println!(
                "cache hit on every rank: nothing timed; selection work {:.1} ms (loading the \
                 kernels and peer memory {:.1} ms)",
                times.selection.as_secs_f64() * 1e3,
                times.load.as_secs_f64() * 1e3
            );
        } else {
            println!(
                "selected in {:.3} s after the communicator was up: loading {:.3} s, exactness \
                 check {:.3} s, timing {:.3} s",
                (times.load + times.selection).as_secs_f64(),
                times.load.as_secs_f64(),
                times.check.as_secs_f64(),
                times.timing.as_secs_f64()
            );
        }
        println!(
            "device memory the package keeps on rank 0: {:.1} MiB (free memory before loading \
             and after selection; the peer buffer is {:.1} MiB, the private output buffer \
             {:.1} MiB)",
            selection.load_memory_bytes as f64 / MIB,
            prepare::kernels::peer_buffer_bytes(package.ladder()) as f64 / MIB,
            prepare::collective::private_output_bytes(package.ladder()) as f64 / MIB
        );
        let mut custom = 0;
        for bucket in &choice.buckets {
            let winner = &bucket.decision.winner;
            let nccl = package
                .ladder()
                .profile(winner)
                .is_some_and(prepare::ladder::Profile::is_nccl);
            if !nccl {
                custom += 1;
            }
            println!(
                "bucket {:>2} up to {:>9} bytes: {winner}{}",
                bucket.decision.index,
                bucket.max_bytes,
                if bucket.decision.bit_exact {
                    ""
                } else {
                    " (not bit-exact)"
                }
            );
        }
        println!(
            "{custom} of {} buckets chose a custom kernel over NCCL",
            choice.buckets.len()
        );
        if let Some(entry) = &selection.cache_entry {
            println!(
                "cache entry {}",
                prepare::files::escape_control(&entry.display().to_string())
            );
        }
    }
    match &selection.choice_file {
        Some(file) => println!(
            "choice sha256 {digest} written to {}",
            prepare::files::escape_control(&file.display().to_string())
        ),
        None => println!("choice sha256 {digest} (no --out: not written)"),
    }
    Ok(())
}
