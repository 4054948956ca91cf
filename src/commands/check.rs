//! `prepare check`: brings the runtime up on every GPU (one process each, like torchrun),
//! compares NCCL's all-reduce with the reference sum and, given a package, qualifies every
//! candidate in CUDA graphs and requires the reference's exact bytes from every custom one on
//! every rank. Under the exact policy (the default) a candidate that differs from the reference
//! sum (plain NCCL beyond two ranks) is kept out, and a bucket left without a candidate fails the
//! check: serving could not run it exactly.

use std::path::PathBuf;

use prepare::check::{check_rank, CandidateCheck, SoakCollective};
use prepare::ladder::Collective;
use prepare::package::Outcome;
use prepare::qualify::QualifyOptions;

use super::exactness::ExactnessArgs;
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
    #[command(flatten)]
    exactness: ExactnessArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SoakKind {
    Nccl,
    Custom,
}

/// Runs `prepare check`.
pub fn run(args: &Args) -> Result<(), Failure> {
    args.ranks.timeout()?;
    let role = ranks::role()?;
    args.exactness.note(matches!(role, Role::Launcher));
    match role {
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
    let allow_inexact = args.exactness.allow_inexact;
    // What the package's collective is checked against (the all-reduce's without a package).
    let reference = package
        .as_ref()
        .map_or(Collective::AllReduce, |package| package.ladder().collective)
        .reference();
    for candidate in &report.candidates {
        let result = match &candidate.outcome {
            Outcome::Qualified { exact: true } => "exact".to_owned(),
            Outcome::Qualified { exact: false } if allow_inexact => {
                format!("differs from {reference} (NCCL's own order)")
            }
            Outcome::Qualified { exact: false } => {
                format!("differs from {reference} (NCCL's own order): kept out by the exact policy")
            }
            Outcome::Dropped(reason) => format!("dropped: {reason}"),
        };
        println!(
            "bucket {:>2} {:<20} {result}",
            candidate.bucket, candidate.profile
        );
    }
    if !allow_inexact {
        if let Some(problem) = without_exact_candidate(&report.candidates, reference) {
            return Err(Failure::runtime(anyhow::anyhow!(problem)));
        }
    }
    println!("check passed");
    Ok(())
}

/// Under the exact policy: the buckets none of whose candidates ran exact here, each with its
/// candidates' outcomes, or `None` when every bucket keeps one.
fn without_exact_candidate(candidates: &[CandidateCheck], reference: &str) -> Option<String> {
    let mut buckets: Vec<usize> = candidates
        .iter()
        .map(|candidate| candidate.bucket)
        .collect();
    buckets.sort_unstable();
    buckets.dedup();
    let problems: Vec<String> = buckets
        .into_iter()
        .filter_map(|bucket| {
            let of_bucket = || {
                candidates
                    .iter()
                    .filter(move |candidate| candidate.bucket == bucket)
            };
            if of_bucket().any(|candidate| candidate.outcome == Outcome::Qualified { exact: true })
            {
                return None;
            }
            let outcomes: Vec<String> = of_bucket()
                .map(|candidate| match &candidate.outcome {
                    Outcome::Qualified { .. } => {
                        format!("{} differs from {reference}", candidate.profile)
                    }
                    Outcome::Dropped(reason) => format!("{} dropped: {reason}", candidate.profile),
                })
                .collect();
            Some(format!("bucket {bucket} ({})", outcomes.join("; ")))
        })
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "no candidate equals {reference} here in {}: the exact policy keeps every \
             inexact candidate out, so serving would refuse these buckets; --allow-inexact \
             keeps them",
            problems.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prepare::device::DropReason;

    fn candidate(bucket: usize, profile: &str, outcome: Outcome) -> CandidateCheck {
        CandidateCheck {
            bucket,
            profile: profile.to_owned(),
            outcome,
        }
    }

    #[test]
    fn a_bucket_without_an_exact_candidate_is_named_with_its_outcomes() {
        let inexact = Outcome::Qualified { exact: false };
        let exact = Outcome::Qualified { exact: true };
        let no_peers = Outcome::Dropped(DropReason::NoPeerAccess {
            message: "two hosts".to_owned(),
        });
        let served = [
            candidate(0, "one_shot_push", exact.clone()),
            candidate(0, "nccl", inexact.clone()),
        ];
        let sum = Collective::AllReduce.reference();
        assert_eq!(without_exact_candidate(&served, sum), None);
        let between_hosts = [
            candidate(0, "one_shot_push", no_peers),
            candidate(0, "nccl", inexact.clone()),
            candidate(1, "rsag_pull", exact),
            candidate(1, "nccl", inexact),
        ];
        let problem = without_exact_candidate(&between_hosts, sum).unwrap();
        assert!(
            problem.starts_with(
                "no candidate equals the reference sum here in bucket 0 (one_shot_push dropped: "
            ),
            "{problem}"
        );
        assert!(
            problem.contains("; nccl differs from the reference sum): the exact policy"),
            "{problem}"
        );
        assert!(!problem.contains("bucket 1"), "{problem}");
        assert!(problem.ends_with("--allow-inexact keeps them"), "{problem}");
        // An epilogue package's candidates are judged against the reference epilogue.
        let epilogue =
            without_exact_candidate(&between_hosts, Collective::AllReduceAddRmsNorm.reference())
                .unwrap();
        assert!(
            epilogue.starts_with("no candidate equals the reference epilogue here in bucket 0")
                && epilogue.contains("; nccl differs from the reference epilogue): "),
            "{epilogue}"
        );
    }
}
