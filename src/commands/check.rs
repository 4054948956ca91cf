//! `prepare check`: brings the runtime up on every GPU (one process each, like torchrun),
//! compares NCCL's all-reduce with the reference sum and, given a package, qualifies every
//! candidate in CUDA graphs and requires the reference's exact bytes from every custom one on
//! every rank.

use std::path::PathBuf;

use prepare::check::{check_rank, SoakCollective};
use prepare::package::Outcome;
use prepare::qualify::QualifyOptions;

use super::ranks::{self, RankArgs, Role};
use super::Failure;

/// Flags of `prepare check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    ranks: RankArgs,
    /// A package (from `prepare export`) whose candidates are checked for exactness.
    #[arg(long, value_name = "DIR")]
    package: Option<PathBuf>,
    /// Times every candidate runs at each size, each time on fresh random data.
    #[arg(long, default_value_t = 1, value_name = "N")]
    repeat: u32,
    /// Replays of the multi-size graph sequence (0 skips it).
    #[arg(long, default_value_t = 18, value_name = "N")]
    sequence_replays: u32,
    /// Collectives to repeat after the checks.
    #[arg(long, default_value_t = 0)]
    soak: u32,
    /// Which collective the soak repeats.
    #[arg(long, value_enum, default_value = "nccl")]
    soak_collective: SoakKind,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SoakKind {
    Nccl,
    Custom,
}

/// Runs `prepare check`.
pub fn run(args: &Args) -> Result<(), Failure> {
    args.ranks.timeout()?;
    match ranks::role()? {
        Role::Rank => run_rank(args),
        Role::Launcher => {
            ranks::launch_ranks("check", &args.ranks, args.ranks.gpu_list()?, Vec::new())
        }
    }
}

#[allow(clippy::print_stdout)]
fn run_rank(args: &Args) -> Result<(), Failure> {
    let package = match &args.package {
        Some(dir) => Some(prepare::package::open_package_retrying(dir).map_err(Failure::refused)?),
        None => None,
    };
    let runtime = ranks::start_rank(&args.ranks)?;
    let record = &runtime.records()[runtime.rank() as usize];
    println!(
        "rank {}/{} on GPU {} ({}, {}), {:?}",
        runtime.rank(),
        runtime.world(),
        runtime.device().ordinal(),
        record.gpu_name,
        record.gpu_uuid,
        runtime.topology()
    );
    if let Ok(nccl) = prepare::gpu::nccl::library() {
        let (major, minor, patch) = nccl.version;
        println!(
            "NCCL {major}.{minor}.{patch} from {} ({})",
            prepare::files::escape_control(&nccl.path.display().to_string()),
            nccl.found
        );
    }
    let soak_collective = match args.soak_collective {
        SoakKind::Nccl => SoakCollective::Nccl,
        SoakKind::Custom => SoakCollective::Custom,
    };
    let options = QualifyOptions {
        sizes: prepare::qualify::Sizes::Edges,
        repeat: args.repeat.max(1),
        sequence_replays: args.sequence_replays,
        data: prepare::qualify::Data::Fresh,
    };
    let report = check_rank(
        &runtime,
        package.as_ref(),
        options,
        args.soak,
        soak_collective,
        &|line| println!("{line}"),
    )
    .map_err(Failure::runtime)?;
    for candidate in &report.candidates {
        let result = match &candidate.outcome {
            Outcome::Qualified { exact: true } => "exact".to_owned(),
            Outcome::Qualified { exact: false } => {
                "differs from the reference sum (NCCL's own order)".to_owned()
            }
            Outcome::Dropped(reason) => format!("dropped: {reason}"),
        };
        println!(
            "bucket {:>2} {:<20} {result}",
            candidate.bucket, candidate.profile
        );
    }
    println!("check passed");
    Ok(())
}
