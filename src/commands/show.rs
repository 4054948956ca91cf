//! `prepare show`: a package's header, buckets, kernels, peer memory and qualification as
//! tables, or as one JSON document.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use prepare::package::{self, CandidateRecord, Manifest, Outcome, Package};

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
}

/// Runs `prepare show`.
pub fn run(args: &Args) -> Result<(), Failure> {
    let package = package::open_package(&args.package).map_err(Failure::refused)?;
    let output = if args.json {
        let mut text = serde_json::to_string_pretty(&package.describe())
            .expect("a package description always serializes");
        text.push('\n');
        text
    } else {
        render(&package)
    };
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
        .context("cannot write to standard output")
        .map_err(Failure::runtime)
}

/// The tables `prepare show` prints.
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
            &format!(
                "({}, {}]",
                if previous_max == 0 {
                    "0".to_string()
                } else {
                    human_bytes(previous_max)
                },
                human_bytes(bucket.max_bytes)
            ),
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
    use super::human_bytes;

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
