//! Every kernel at every world size on one real GPU (tests/gpu/one_gpu.rs: all ranks as
//! streams of one context): every shipped ladder that targets sm_90 at its own world size, and
//! the GB202 ladders' profiles (the phased RSAG and the phased full all-reduce among them)
//! retargeted to sm_90; every custom candidate exact on every rank at each bucket's edges,
//! tails and a middle size, eagerly with one rank late and in graphs replayed with one branch
//! per rank; the multi-size graph sequence with device memory unchanged; a rank that never
//! launches; the planted mutations caught at 2, 4 and 8 ranks; batch invariance
//! (tests/gpu/one_gpu/invariance.rs); and the reduce-scatter and all-gather kernels at 2, 4 and 8
//! ranks (tests/gpu/one_gpu/rows.rs), which also runs the shipped reduce-scatter and all-gather
//! ladders' candidates at their buckets' geometry. NCCL candidates are out: NCCL refuses two ranks on one
//! device. Each test prints a table for the GPU run's log.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use prepare::compile::SourceOverrides;
use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{validate_ladder_bytes, Arch, Collective, Ladder};

use super::mutations::cut_ladder;
use super::one_gpu::{bucket_sizes, compile, dtype_name, gpu_lock, Outcome, World};
use super::support::{h200_ladder, ladder, require_gpus, WORLDS};
use crate::support::mutations::{overrides, Mutation};

/// The deadline of the runs with a rank that never launches.
const MISSING_DEADLINE: Duration = Duration::from_millis(200);
/// Replays of each candidate's two graphs.
const GRAPH_REPLAYS: usize = 3;
/// Replays of the multi-size sequence, as `prepare check` replays it.
const SEQUENCE_REPLAYS: usize = 18;
/// Passes over the race ladders' candidates, each at every size with a rank late in turn.
const RACE_PASSES: usize = 20;

/// What one ladder came to.
#[derive(Default)]
struct Report {
    name: String,
    world: usize,
    dtype: &'static str,
    candidates: usize,
    exact: usize,
    reduced: BTreeSet<String>,
    /// Candidates not run, with why.
    not_run: Vec<String>,
    missing_rank: String,
    sequence: String,
    failures: Vec<String>,
    not_co_scheduled: Vec<String>,
    seconds: f64,
}

impl Report {
    fn row(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} own geometry, {} reduced | {} | {} | {:.1} s |",
            self.name,
            self.world,
            self.dtype,
            self.candidates,
            self.exact,
            self.candidates - self.reduced.len(),
            self.reduced.len(),
            self.sequence,
            self.missing_rank,
            self.seconds
        )
    }
}

const HEADER: &str = "| ladder | world | dtype | candidates run | exact (eager and graphs) | \
                      geometry | multi-size sequence | rank never launching | time |\n\
                      | --- | --- | --- | --- | --- | --- | --- | --- | --- |";

/// Every check of one ladder, reported.
fn run_ladder(
    device: &prepare::gpu::driver::Device,
    name: &str,
    ladder: Ladder,
    seed: u64,
) -> Report {
    let started = Instant::now();
    let mut report = Report {
        name: name.to_owned(),
        world: ladder.world_size as usize,
        dtype: dtype_name(ladder.dtype),
        ..Report::default()
    };
    let kernels = match compile(
        &kernels_for_ladder(&ladder),
        ladder.world_size,
        &SourceOverrides::new(),
        "embedded",
    ) {
        Ok(kernels) => kernels,
        Err(error) => {
            report
                .failures
                .push(format!("does not compile for sm_90: {error}"));
            return report;
        }
    };
    eprintln!(
        "== {name}: {} kernels compiled in {:.1} s",
        kernels.len(),
        started.elapsed().as_secs_f64()
    );
    let mut world = World::new(device, ladder, &kernels, seed);
    eprintln!(
        "== {name}: {} custom candidates ready in {:.1} s",
        world.cases.len(),
        started.elapsed().as_secs_f64()
    );
    for (bucket, profile, why) in &world.impossible {
        report
            .not_run
            .push(format!("bucket {bucket} {profile}: {why}"));
    }
    let mut first_of_profile = Vec::new();
    let mut first_of_bucket = Vec::new();
    for index in 0..world.cases.len() {
        let (bucket, profile) = (
            world.cases[index].bucket,
            world.cases[index].profile.clone(),
        );
        if !world.cases[index].is_own_geometry() {
            report.reduced.insert(format!(
                "bucket {bucket} {profile} {} to {}",
                world.cases[index].own.blocks(),
                world.cases[index].geometry.blocks()
            ));
        }
        if !first_of_profile
            .iter()
            .any(|(_, known): &(usize, String)| *known == profile)
        {
            first_of_profile.push((index, profile.clone()));
        }
        if !first_of_bucket.iter().any(|(_, known)| *known == bucket) {
            first_of_bucket.push((index, bucket));
        }
        report.candidates += 1;
        let sizes = bucket_sizes(&world.ladder, bucket);
        let largest = *sizes.last().expect("a bucket has sizes");
        let mut outcomes: Vec<(String, Outcome)> = sizes
            .iter()
            .map(|&size| (format!("{size} elements"), world.run_eager(index, size)))
            .collect();
        outcomes.push((
            format!("graphs of {largest} elements"),
            world.run_graphs(index, largest, GRAPH_REPLAYS),
        ));
        let mut exact = true;
        for (what, outcome) in outcomes {
            let line = format!("bucket {bucket} {profile} at {what}: {outcome}");
            if !outcome.passed() {
                eprintln!("{name}: {line}");
            }
            match outcome {
                Outcome::Pass => {}
                Outcome::NotCoScheduled { .. } => {
                    exact = false;
                    report.not_co_scheduled.push(line);
                }
                _ => {
                    exact = false;
                    report.failures.push(line);
                }
            }
        }
        report.exact += usize::from(exact);
    }
    // The sequence: every bucket's first candidate at its middle size, small to large and back.
    let mut sequence: Vec<(usize, usize)> = first_of_bucket
        .iter()
        .map(|&(index, bucket)| {
            let sizes = bucket_sizes(&world.ladder, bucket);
            (index, sizes[sizes.len() / 2])
        })
        .collect();
    let back: Vec<(usize, usize)> = sequence.iter().rev().skip(1).copied().collect();
    sequence.extend(back);
    let budget = world.output_bytes() / world.ladder.dtype.size_bytes() as usize;
    // Small buckets first, as many as the output holds.
    let mut total = 0;
    sequence.retain(|&(_, elements)| {
        total += elements + 1024;
        total <= budget
    });
    report.sequence = match world.run_sequence(&sequence, SEQUENCE_REPLAYS) {
        Outcome::Pass => format!("{} steps x {SEQUENCE_REPLAYS} exact", sequence.len()),
        outcome => {
            eprintln!("{name}: sequence: {outcome}");
            report.failures.push(format!("sequence: {outcome}"));
            "FAILED".to_owned()
        }
    };
    let mut named = 0;
    for (index, profile) in &first_of_profile {
        let bucket = world.cases[*index].bucket;
        let smallest = bucket_sizes(&world.ladder, bucket)[0];
        match world.run_missing_rank(*index, smallest, MISSING_DEADLINE) {
            Outcome::Pass => named += 1,
            outcome => {
                let line = format!("rank never launching, {profile}: {outcome}");
                eprintln!("{name}: {line}");
                report.failures.push(line);
            }
        }
    }
    report.missing_rank = format!("{named} of {} profiles", first_of_profile.len());
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// A ladder checked by another harness than the all-reduce's, as a row of the table: a
/// reduce-scatter or all-gather ladder's custom candidates at every bucket's geometry and sizes
/// (tests/gpu/one_gpu/rows.rs), or an all-reduce + add + RMSNorm ladder's fused candidates
/// (tests/gpu/one_gpu/fused.rs); its rows count (bucket, candidate) pairs.
fn run_other_ladder(
    device: &prepare::gpu::driver::Device,
    name: &str,
    ladder: &Ladder,
    seed: u64,
) -> Report {
    let started = Instant::now();
    let checked = if ladder.collective == Collective::AllReduceAddRmsNorm {
        super::one_gpu::fused::check_epilogue_ladder(device, ladder, seed)
    } else {
        super::one_gpu::rows::check_row_ladder(device, ladder, seed)
    };
    Report {
        name: name.to_owned(),
        world: ladder.world_size as usize,
        dtype: dtype_name(ladder.dtype),
        candidates: checked.candidates,
        exact: checked.exact,
        sequence: "-".to_owned(),
        missing_rank: "-".to_owned(),
        failures: checked.failures,
        reduced: checked.reduced.into_iter().collect(),
        seconds: started.elapsed().as_secs_f64(),
        ..Report::default()
    }
}

/// The variable that restricts the ladder tests to the ladders whose names contain one of its
/// comma-separated words (all when unset), to take the checks in several commands.
const LADDERS_VARIABLE: &str = "PREPARE_ONE_GPU_LADDERS";

fn selected(name: &str) -> bool {
    std::env::var(LADDERS_VARIABLE).map_or(true, |words| {
        words
            .split(',')
            .any(|word| !word.is_empty() && name.contains(word))
    })
}

/// Runs `ladders` and asserts every check passed, printing the table and every failure.
fn run_and_report(title: &str, ladders: Vec<(String, Result<Ladder, String>)>) {
    let ladders: Vec<_> = ladders
        .into_iter()
        .filter(|(name, _)| selected(name))
        .collect();
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mut table = format!("{title}\n{HEADER}\n");
    let mut problems = String::new();
    for (seed, (name, ladder)) in ladders.into_iter().enumerate() {
        let report = match ladder {
            Ok(ladder) if ladder.collective != Collective::AllReduce => {
                run_other_ladder(&device, &name, &ladder, 1000 * seed as u64 + 1)
            }
            Ok(ladder) => run_ladder(&device, &name, ladder, 1000 * seed as u64 + 1),
            Err(why) => Report {
                name: name.clone(),
                failures: vec![why],
                ..Report::default()
            },
        };
        let _ = writeln!(table, "{}", report.row());
        for line in report.not_run.iter().map(|line| format!("not run: {line}")) {
            let _ = writeln!(problems, "{name}: {line}");
        }
        for line in report.not_co_scheduled.iter().chain(&report.failures) {
            let _ = writeln!(problems, "{name}: {line}");
        }
        eprintln!("{}", report.row());
        for reduced in &report.reduced {
            eprintln!("{name}: reduced: {reduced}");
        }
    }
    eprintln!("\n{table}\n{problems}");
    let failed: Vec<&str> = problems
        .lines()
        .filter(|line| !line.contains("copy-engine kernels are not run here"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} problem(s):\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The shipped ladders' files, sorted.
fn shipped_ladders() -> Vec<(String, Vec<u8>)> {
    let dir = ladder("");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "json")
        })
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn parsed(bytes: &[u8]) -> Result<Ladder, String> {
    validate_ladder_bytes(bytes).map_err(|report| format!("not a valid ladder: {report}"))
}

/// The shipped ladders that target sm_90 whose collective `collectives` names, parsed.
fn shipped_sm90(collectives: &[Collective]) -> Vec<(String, Result<Ladder, String>)> {
    shipped_ladders()
        .into_iter()
        .filter_map(|(name, bytes)| {
            let ladder = parsed(&bytes).unwrap_or_else(|why| panic!("{name}: {why}"));
            (ladder.targets.contains(&Arch::Sm90) && collectives.contains(&ladder.collective))
                .then_some((name, Ok(ladder)))
        })
        .collect()
}

/// The shipped sm_90 all-reduce ladders (one test, the row collectives' another and the
/// all-reduce + RMSNorm ladders' a third, so each fits one run of ten minutes on one H200).
#[test]
#[ignore = "needs GPUs"]
fn every_shipped_sm90_all_reduce_ladder_is_exact_at_its_world_on_one_gpu() {
    run_and_report(
        "shipped sm_90 all-reduce ladders, every rank on one GPU",
        shipped_sm90(&[Collective::AllReduce]),
    );
}

/// The shipped sm_90 reduce-scatter and all-gather ladders.
#[test]
#[ignore = "needs GPUs"]
fn every_shipped_sm90_row_ladder_is_exact_at_its_world_on_one_gpu() {
    run_and_report(
        "shipped sm_90 reduce-scatter and all-gather ladders, every rank on one GPU",
        shipped_sm90(&[Collective::ReduceScatter, Collective::AllGather]),
    );
}

/// The shipped sm_90 all-reduce + residual add + RMSNorm ladders' fused candidates (their
/// separate candidates are an all-reduce kernel and the epilogue's, each checked on its own).
#[test]
#[ignore = "needs GPUs"]
fn every_shipped_sm90_epilogue_ladder_s_fused_candidates_are_exact_at_their_buckets_on_one_gpu() {
    run_and_report(
        "shipped sm_90 all-reduce + add + RMSNorm ladders' fused candidates, every rank on one GPU",
        shipped_sm90(&[Collective::AllReduceAddRmsNorm]),
    );
}

/// The GB202 ladders' own profiles and buckets with `targets` set to sm_90: test-only ladders
/// that `prepare export` rightly refuses to users (no GB202 is at hand), run here because the
/// kernels' code is the same on every architecture.
#[test]
#[ignore = "needs GPUs"]
fn gb202_ladders_retargeted_to_sm90_are_exact_on_one_gpu() {
    let ladders = shipped_ladders()
        .into_iter()
        .filter_map(|(name, bytes)| {
            // The GB10 catalogs are NCCL only: nothing of theirs runs on one GPU.
            if !name.starts_with("gb202_") {
                return None;
            }
            let mut value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let targets = value["targets"].as_array().unwrap();
            if targets.iter().any(|target| target == "sm_90") {
                return None;
            }
            value["targets"] = serde_json::json!(["sm_90"]);
            let retargeted = format!("{} on sm_90", name.trim_end_matches(".json"));
            Some((retargeted, parsed(&serde_json::to_vec(&value).unwrap())))
        })
        .collect();
    run_and_report(
        "GB202 ladders retargeted to sm_90, every rank on one GPU",
        ladders,
    );
}

/// How one mutation fared at one world.
struct MutationReport {
    caught: Vec<String>,
    missed: Vec<String>,
    other: Vec<String>,
}

/// Every candidate of `ladder` compiled with `mutation` planted, at the sizes of `sizes`,
/// `passes` times: which touched candidates it caught (a wrong sum, an overrun or a changed
/// input), which untouched ones stayed exact.
fn run_mutation(
    device: &prepare::gpu::driver::Device,
    mutation: Mutation,
    ladder: Ladder,
    passes: usize,
    sizes: impl Fn(&Ladder, usize) -> Vec<usize>,
) -> MutationReport {
    let touched = mutation.kernels();
    let key = mutation.name();
    let kernels = compile(
        &kernels_for_ladder(&ladder),
        ladder.world_size,
        &overrides(mutation),
        key,
    )
    .unwrap_or_else(|error| panic!("{mutation}: {error}"));
    let mut world = World::new(device, ladder, &kernels, 7);
    let mut report = MutationReport {
        caught: Vec::new(),
        missed: Vec::new(),
        other: Vec::new(),
    };
    for index in 0..world.cases.len() {
        let case = &world.cases[index];
        let (bucket, profile) = (case.bucket, case.profile.clone());
        let is_touched = touched.contains(&case.kernel_name);
        let passes = if is_touched { passes } else { 1 };
        let mut caught = false;
        'passes: for _ in 0..passes {
            for size in sizes(&world.ladder, bucket) {
                match world.run_eager(index, size) {
                    Outcome::Pass => {}
                    Outcome::Mismatch { .. }
                    | Outcome::Overrun { .. }
                    | Outcome::InputChanged { .. }
                        if is_touched =>
                    {
                        caught = true;
                        break 'passes;
                    }
                    outcome => {
                        report
                            .other
                            .push(format!("bucket {bucket} {profile} at {size}: {outcome}"));
                        break 'passes;
                    }
                }
            }
        }
        let name = format!("bucket {bucket} {profile}");
        match (is_touched, caught) {
            (true, true) => report.caught.push(name),
            (true, false) => report.missed.push(name),
            (false, _) => {}
        }
    }
    report
}

/// The tail sizes of a bucket: a message whose last vector is partial, at both ends.
fn tail_sizes(ladder: &Ladder, bucket: usize) -> Vec<usize> {
    let sizes = bucket_sizes(ladder, bucket);
    let mut tails = vec![
        sizes[1.min(sizes.len() - 1)],
        sizes[sizes.len().saturating_sub(2)],
    ];
    tails.dedup();
    tails
}

fn shipped_h200(world: usize) -> Ladder {
    parsed(&std::fs::read(ladder(&h200_ladder(world))).unwrap()).unwrap()
}

/// Each planted mutation the two-GPU suite catches, caught at 2, 4 and 8 ranks on one GPU:
/// the deterministic ones in every candidate whose kernel they change, with every other
/// candidate exact; the two races (`NoStartBarrier`, `NoLineWait`) in some pass over the
/// buckets that have their kernel's profile, a rank late in turn. As in the two-GPU suite, the
/// missing `simple` step wait is run and reported but not required (its race window is small
/// with the ranks started together; the host emulation catches it), and the missing
/// copy-engine start barrier is not run (no copy-engine kernel runs here).
#[test]
#[ignore = "needs GPUs"]
fn planted_mutations_are_caught_at_every_world_on_one_gpu() {
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mut table = String::from(
        "| mutation | world | caught | missed | other failures |\n| --- | --- | --- | --- | --- |\n",
    );
    let mut problems = Vec::new();
    for world in WORLDS {
        for mutation in [
            Mutation::SkipPeer,
            Mutation::Truncate,
            Mutation::DropTail,
            Mutation::DoubleCount,
        ] {
            let report = run_mutation(&device, mutation, shipped_h200(world), 1, tail_sizes);
            record(&mut table, &mut problems, mutation, world, &report, true);
        }
        for (mutation, profile, required) in [
            (Mutation::NoStartBarrier, "one_shot_pull", true),
            (Mutation::NoLineWait, "one_shot_ll", true),
            (Mutation::NoStepWait, "one_shot_simple", false),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let cut = race_ladder(dir.path(), world, profile);
            let report = run_mutation(&device, mutation, cut, RACE_PASSES, bucket_sizes);
            record(
                &mut table,
                &mut problems,
                mutation,
                world,
                &report,
                required,
            );
        }
    }
    eprintln!("\nplanted mutations, every rank on one GPU\n{table}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The world's H200 ladder cut to the buckets where `profile` is a candidate (taken from the
/// TP2 ladder where the world's lacks it), as the two-GPU race tests cut it.
fn race_ladder(dir: &Path, world: usize, profile: &str) -> Ladder {
    parsed(&std::fs::read(cut_ladder(dir, world, profile)).unwrap()).unwrap()
}

fn record(
    table: &mut String,
    problems: &mut Vec<String>,
    mutation: Mutation,
    world: usize,
    report: &MutationReport,
    required: bool,
) {
    let _ = writeln!(
        table,
        "| {mutation} | {world} | {} | {} | {} |",
        report.caught.len(),
        if report.missed.is_empty() {
            "0".to_owned()
        } else {
            format!("{}: {}", report.missed.len(), report.missed.join(", "))
        },
        report.other.len()
    );
    for line in &report.other {
        problems.push(format!("{mutation} at {world} ranks: {line}"));
    }
    if required {
        if report.caught.is_empty() {
            problems.push(format!("{mutation} at {world} ranks: caught nowhere"));
        }
        if mutation.is_deterministic() && !report.missed.is_empty() {
            problems.push(format!(
                "{mutation} at {world} ranks: missed in {}",
                report.missed.join(", ")
            ));
        }
    }
}

/// The reduce-scatter and all-gather kernels at 2, 4 and 8 ranks, in every type, at rows 0, 1,
/// world - 1, world + 1, 2047 and 2048 of widths 1, 7 and 4096, out of place and in place,
/// eagerly with a rank late and in graphs (tests/gpu/one_gpu/rows.rs): every rank's output the
/// reference, nothing written past it, its input kept.
#[test]
#[ignore = "needs GPUs"]
fn row_collectives_are_exact_at_every_world_on_one_gpu() {
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    match super::one_gpu::rows::check_every_row_kernel(&device) {
        Ok(table) => eprintln!("\nreduce-scatter and all-gather, every rank on one GPU\n{table}"),
        Err(report) => panic!("{report}"),
    }
}

/// The all-gather of the reduce-scatter is the all-reduce (tests/gpu/one_gpu/identity.rs):
/// every reduce-scatter kernel then every all-gather kernel on its output, back to back on every
/// rank, at 2, 4 and 8 ranks, in every type, at the row kernels' shapes, in place and not,
/// eagerly with a rank late and in a graph of both: every rank's output the reference
/// all-reduce's bytes.
#[test]
#[ignore = "needs GPUs"]
fn the_all_gather_of_the_reduce_scatter_is_the_all_reduce_on_one_gpu() {
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    match super::one_gpu::identity::check_the_identity(&device) {
        Ok(table) => eprintln!("\nthe all-gather of the reduce-scatter, on one GPU\n{table}"),
        Err(report) => panic!("{report}"),
    }
}

/// Ranks that disagree on rows or width (tests/gpu/one_gpu/shapes.rs): every kernel that checks
/// the shape (the reduce-scatter, all-gather, fused and all-reduce kernels but the copy
/// engine's) at 2, 4 and 8 ranks stops on every rank with the shape-mismatch abort naming a peer
/// of another shape, well before the deadline, writing nothing (a double-buffered kernel
/// nothing but its output, a fused one's residual, and its region).
#[test]
#[ignore = "needs GPUs"]
fn ranks_that_disagree_on_the_shape_abort_on_one_gpu() {
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    if let Err(report) = super::one_gpu::shapes::check_disagreeing_shapes(&device) {
        panic!("{report}");
    }
}

/// Batch invariance: rows in messages on both sides of every bucket boundary of every shipped
/// sm_90 ladder, and in pieces above it, the same bytes in every message and candidate.
#[test]
#[ignore = "needs GPUs"]
fn rows_are_the_same_bytes_in_every_message_and_candidate_on_one_gpu() {
    super::one_gpu::invariance::check_every_shipped_sm90_ladder();
}

/// A sum order that changes with the message size is caught in exactly its candidates.
#[test]
#[ignore = "needs GPUs"]
fn a_sum_order_that_depends_on_the_message_size_is_caught_on_one_gpu() {
    super::one_gpu::invariance::check_a_size_dependent_sum_order_is_caught();
}
