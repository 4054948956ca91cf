//! `prepare show`: a package's header, buckets, kernels, peer memory and qualification, and a
//! choice made for it, as tables that fit 100 columns (`--wide`: one line per bucket, nothing
//! wrapped), or as one JSON document.

mod choice;
mod text;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use prepare::ladder::Collective;
use prepare::package::{self, BucketRecord, CandidateRecord, Manifest, Outcome, Package};
use prepare::show::Description;
use prepare::tune::choice::{Choice, ChoiceError};

use super::Failure;
use text::{glued, human_bytes, message_range, paragraph, plain, Align, Table, WIDTH};

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
    /// One line per bucket with every candidate and its tags, and no line wrapped: lines may
    /// run past 100 columns.
    #[arg(long, conflicts_with = "json")]
    wide: bool,
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
        let width = (!args.wide).then_some(WIDTH);
        let mut text = render(&package, width);
        if let (Some(path), Some(choice)) = (&args.choice, &choice) {
            choice::render_choice(&mut text, path, choice, width);
        }
        plain(&text)
    };
    // Names, versions and a choice's text come from files: escaped for the terminal, in JSON's
    // own syntax inside JSON.
    let output = if args.json {
        prepare::files::escape_control_json(&output)
    } else {
        prepare::files::escape_control(&output)
    };
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
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

/// The tables `prepare show` prints for a package, fitted to `width` when one is given.
fn render(package: &Package, width: Option<usize>) -> String {
    let manifest = package.manifest();
    let mut out = String::new();
    render_header(&mut out, package, width);
    match width {
        Some(_) => render_bucket_groups(&mut out, manifest, width),
        None => render_bucket_lines(&mut out, manifest),
    }
    render_kernels(&mut out, manifest, width);
    let memory = manifest.peer_memory;
    let ladder = package.ladder();
    // NCCL maps every peer's symmetric window, so they count as peer memory.
    let windows = ladder.symmetric_windows_bytes();
    let total = memory.total_bytes().saturating_add(windows);
    let _ = write!(
        out,
        "\nPeer memory per GPU: {} ({total} bytes): buffer {}, signal flags {}",
        human_bytes(total),
        human_bytes(memory.buffer_bytes),
        human_bytes(memory.signal_bytes)
    );
    if windows > 0 {
        let _ = write!(out, ",\n  NCCL symmetric windows {}", human_bytes(windows));
    }
    out.push('\n');
    if let Some(slot) = prepare::kernels::copy_engine_slot_bytes(ladder) {
        let bytes = slot * u64::from(ladder.world_size.saturating_sub(1));
        let _ = writeln!(
            out,
            "Copy-engine scratch per GPU: {} ({bytes} bytes), private, not peer-mapped",
            human_bytes(bytes)
        );
    }
    render_qualification(&mut out, manifest, width);
    out
}

fn render_header(out: &mut String, package: &Package, width: Option<usize>) {
    let manifest = package.manifest();
    let ladder = &manifest.ladder;
    let mut table = Table::new(&[Align::Left, Align::Left]);
    table.row(["Package", &package.dir().display().to_string()]);
    table.row([
        "Identity",
        &format!(
            "{} {}",
            package.identity(),
            glued(&format!("(sha256 of {})", package::MANIFEST_FILE))
        ),
    ]);
    table.row([
        "Ladder",
        &format!(
            "{}: {}, {}, {} ranks",
            ladder.name,
            ladder.collective.name(),
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
    table.render(out, width);
}

/// Each bucket on a line with its geometry and default; under each run of buckets with the
/// same geometry and candidates, the candidates once, a tag every ordinary kernel of the run
/// shares said once before them.
fn render_bucket_groups(out: &mut String, manifest: &Manifest, width: Option<usize>) {
    let mut table = bucket_table(out, "default");
    let buckets = &manifest.buckets;
    let mut previous_max = 0;
    let mut first = 0;
    while first < buckets.len() {
        let shape = |bucket: &BucketRecord| {
            (
                bucket.threads,
                bucket.blocks,
                bucket.cluster_size,
                bucket.candidates.clone(),
            )
        };
        let run = buckets[first..]
            .iter()
            .take_while(|bucket| shape(bucket) == shape(&buckets[first]))
            .count();
        for bucket in &buckets[first..first + run] {
            let [index, messages, bytes, geometry, cluster] = bucket_cells(previous_max, bucket);
            table.row([
                &index,
                &messages,
                &bytes,
                &geometry,
                &cluster,
                &bucket.default,
            ]);
            previous_max = bucket.max_bytes;
        }
        let last = &buckets[first + run - 1];
        let of = if run == 1 {
            String::new()
        } else {
            format!(" of {}-{}", buckets[first].index, last.index)
        };
        table.note(
            1,
            format!(
                "candidates{of}{}",
                candidate_list(manifest.ladder.collective, last)
            ),
        );
        first += run;
    }
    table.render(out, width);
    footnotes(
        out,
        manifest,
        "default: the candidate used when nothing is timed.",
        width,
    );
}

/// Every bucket on one line with every candidate and its tags, `*` on the default.
fn render_bucket_lines(out: &mut String, manifest: &Manifest) {
    let mut table = bucket_table(out, "candidates");
    let mut previous_max = 0;
    for bucket in &manifest.buckets {
        let candidates = bucket
            .candidates
            .iter()
            .map(|candidate| {
                let is_default = candidate.profile == bucket.default;
                describe_candidate(
                    manifest.ladder.collective,
                    candidate,
                    is_default,
                    bucket,
                    true,
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let [index, messages, bytes, geometry, cluster] = bucket_cells(previous_max, bucket);
        table.row([&index, &messages, &bytes, &geometry, &cluster, &candidates]);
        previous_max = bucket.max_bytes;
    }
    table.render(out, None);
    footnotes(
        out,
        manifest,
        "* the bucket's default, used when nothing is timed.",
        None,
    );
}

/// The buckets' title, and their table with its heads, `last` the last column's.
fn bucket_table(out: &mut String, last: &str) -> Table {
    let _ = writeln!(out, "\nBuckets");
    let mut table = Table::indexed(6);
    table.row([
        "#",
        "messages",
        "bytes",
        "threads x blocks",
        "cluster",
        last,
    ]);
    table
}

/// A bucket's index, messages, bytes, geometry and cluster size.
fn bucket_cells(previous_max: u64, bucket: &BucketRecord) -> [String; 5] {
    [
        bucket.index.to_string(),
        message_range(previous_max, bucket.max_bytes),
        format!("{}-{}", bucket.min_bytes, bucket.max_bytes),
        format!("{} x {}", bucket.threads, bucket.blocks),
        bucket
            .cluster_size
            .map_or_else(|| "-".to_string(), |size| size.to_string()),
    ]
}

/// `: a, b [cluster kernel], nccl`, or, when every ordinary kernel is cluster-scheduled, `
/// (ordinary kernels under [cluster scheduling]): a, ...` with the tag said once.
fn candidate_list(collective: Collective, bucket: &BucketRecord) -> String {
    let candidates = &bucket.candidates;
    let ordinary =
        |candidate: &CandidateRecord| candidate.kernel.is_some() && !candidate.cluster_kernel;
    let shared = candidates
        .iter()
        .any(|candidate| candidate.cluster_scheduling)
        && candidates
            .iter()
            .all(|candidate| candidate.cluster_scheduling == ordinary(candidate));
    let names: Vec<String> = candidates
        .iter()
        .map(|candidate| {
            glued(&describe_candidate(
                collective, candidate, false, bucket, !shared,
            ))
        })
        .collect();
    let tag = if shared {
        format!(
            " (ordinary kernels under {})",
            glued("[cluster scheduling]")
        )
    } else {
        String::new()
    };
    format!("{tag}: {}", names.join(", "))
}

/// The footnotes under the buckets: the default's mark, the tags used, and where NCCL takes
/// over.
fn footnotes(out: &mut String, manifest: &Manifest, default: &str, width: Option<usize>) {
    let candidates = || {
        manifest
            .buckets
            .iter()
            .flat_map(|bucket| &bucket.candidates)
    };
    let mut notes = vec![default.to_owned()];
    if candidates().any(|candidate| candidate.cluster_kernel) {
        notes.push(
            "[cluster kernel] uses cluster barriers and distributed shared memory; one cluster \
             works, the others return at once."
                .to_owned(),
        );
    }
    if candidates().any(|candidate| candidate.cluster_scheduling) {
        notes.push(
            "[cluster scheduling] an ordinary kernel launched with the bucket's cluster \
             dimensions: it uses no cluster instructions, but its blocks are scheduled in \
             clusters of the bucket's size."
                .to_owned(),
        );
    }
    if manifest.ladder.collective == Collective::AllReduceAddRmsNorm {
        if candidates().any(|candidate| candidate.epilogue_kernel.is_none()) {
            notes.push("[fused] one kernel sums, adds the residual and normalises.".to_owned());
        }
        if candidates().any(|candidate| candidate.epilogue_kernel.is_some()) {
            notes.push(
                "[+ add_rms_norm] the all-reduce (the profile's kernel, or NCCL's) writes the sum \
                 into normed, then add_rms_norm adds the residual and normalises."
                    .to_owned(),
            );
        }
    }
    if let Some(last) = manifest.buckets.last() {
        let then = if manifest.ladder.collective == Collective::AllReduceAddRmsNorm {
            ", then add_rms_norm"
        } else {
            ""
        };
        notes.push(format!(
            "Messages above {} ({} bytes) use NCCL{then}.",
            glued(&human_bytes(last.max_bytes)),
            last.max_bytes
        ));
    }
    for note in notes {
        paragraph(out, &note, width, 0, 2);
    }
}

/// A candidate's profile, `*` when it is the default, its kernel's tags (the scheduling one
/// only when `scheduling`) and its block count where it is not the bucket's.
fn describe_candidate(
    collective: Collective,
    candidate: &CandidateRecord,
    is_default: bool,
    bucket: &BucketRecord,
    scheduling: bool,
) -> String {
    let mut text = candidate.profile.clone();
    if is_default {
        text.push('*');
    }
    if collective == Collective::AllReduceAddRmsNorm {
        text.push_str(epilogue_tag(candidate));
    }
    if candidate.cluster_kernel {
        text.push_str(" [cluster kernel]");
    }
    if candidate.cluster_scheduling && scheduling {
        text.push_str(" [cluster scheduling]");
    }
    if let Some(blocks) = candidate.blocks.filter(|blocks| *blocks != bucket.blocks) {
        let _ = write!(text, " ({blocks} blocks)");
    }
    text
}

/// `[fused]` for a candidate of `all_reduce_add_rms_norm` that runs one kernel, `[+
/// add_rms_norm]` for one that runs an all-reduce then the epilogue kernel.
fn epilogue_tag(candidate: &CandidateRecord) -> &'static str {
    if candidate.epilogue_kernel.is_some() {
        " [+ add_rms_norm]"
    } else {
        " [fused]"
    }
}

/// Every kernel's resources, under the source file it was compiled from.
fn render_kernels(out: &mut String, manifest: &Manifest, width: Option<usize>) {
    if manifest.kernels.is_empty() {
        let _ = writeln!(out, "\nKernels: none; every candidate is NCCL.");
        return;
    }
    let _ = writeln!(out, "\nKernels ({}), by source", manifest.arch);
    let mut table = Table::new(&[
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Right,
    ]);
    table.row(["kernel", "registers", "shared", "spills", "stack", "cubin"]);
    let mut sources: Vec<&str> = manifest
        .kernels
        .iter()
        .map(|kernel| kernel.source.as_str())
        .collect();
    sources.sort_unstable();
    sources.dedup();
    for source in sources {
        table.row([source]);
        for kernel in manifest
            .kernels
            .iter()
            .filter(|kernel| kernel.source == source)
        {
            let tag = if kernel.cluster {
                " [cluster kernel]"
            } else {
                ""
            };
            table.row([
                &format!("  {}{tag}", kernel.name),
                &kernel.registers.to_string(),
                &human_bytes(u64::from(kernel.shared_bytes)),
                &format!(
                    "{} / {}",
                    human_bytes(u64::from(kernel.spill_store_bytes)),
                    human_bytes(u64::from(kernel.spill_load_bytes))
                ),
                &human_bytes(u64::from(kernel.stack_bytes)),
                &human_bytes(kernel.size_bytes),
            ]);
        }
    }
    table.render(out, width);
    paragraph(
        out,
        "registers, stack and spills (stored / loaded) per thread, shared memory per block.",
        width,
        0,
        2,
    );
}

fn render_qualification(out: &mut String, manifest: &Manifest, width: Option<usize>) {
    let Some(qualification) = &manifest.qualification else {
        let _ = writeln!(out);
        paragraph(
            out,
            "Qualification: none (exported without GPUs; `prepare export --gpus` qualifies every \
             candidate).",
            width,
            0,
            2,
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
    gpus.render(out, width);
    let _ = writeln!(out);
    let mut table = Table::indexed(3);
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
    table.render(out, width);
}
