//! Batch invariance on one GPU, every rank a stream of it: for each shipped sm_90 ladder, rows
//! of one matrix of random data (NaNs, infinities, signed zeros and subnormals among them) are
//! all-reduced inside messages of 1 row, 3 rows, the fewest rows past each bucket boundary and
//! the most within it, and a message above the ladder cut into pieces as the serving code cuts
//! it (`Collectives::enqueue_chunked`: the largest bucket's message, then the rest, which a
//! smaller bucket's candidate sums); each message by every custom candidate of its bucket (of
//! the piece's bucket, in pieces). Every message must be the reference on every rank, and one
//! row that every message holds (at its start, middle or end; in pieces, cut by the piece edge)
//! must be the same bytes in all of them. A planted sum order that changes with the message
//! size must be caught in exactly the candidates whose kernel it changes. The tests that run
//! these checks are in tests/gpu/ranks_on_one_gpu.rs, with the other one-GPU tests.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Instant;

use prepare::compile::SourceOverrides;
use prepare::gpu::driver::{Device, DeviceBuffer, DeviceMemory, Geometry};
use prepare::kernels::kernels_for_ladder;
use prepare::ladder::{validate_ladder_bytes, Arch, Collective, Ladder};
use prepare::reference::{random_rank_inputs, reference_sum};

use super::checks::{hex, RESULT_WORDS};
use super::{compile, dtype_name, gpu_lock, Case, World, DEADLINE, GUARD_BYTES, POISON, WAIT};
use crate::gpu::support::{h200_ladder, ladder, require_gpus};
use crate::support::mutations::{overrides, Mutation};
use crate::support::one_gpu::{judge_abort, Verdict};

/// Elements a row: a whole number of 16-byte vectors in no type, so rows start anywhere in a
/// vector and the kernels' vector, slice and block edges fall inside rows.
const ROW: usize = 333;

/// The matrix every message's rows come from, on the device: each rank's rows, their reference
/// sum, and each rank's output, large enough for the message in pieces.
struct Rows {
    inputs: Vec<DeviceBuffer>,
    reference: DeviceBuffer,
    /// The reference's bytes of the row every message holds.
    probe_reference: Vec<u8>,
    outputs: Vec<DeviceBuffer>,
}

/// One launch of a message: `count` elements from element `first` of it.
struct Part<'c> {
    case: &'c Case,
    first: usize,
    count: usize,
}

/// Rows `rows` from row `row`, all-reduced by its parts in stream order.
struct Message<'c> {
    what: String,
    row: usize,
    rows: usize,
    parts: Vec<Part<'c>>,
}

impl Message<'_> {
    /// The part that wrote element `element` of the message.
    fn part_at(&self, element: usize) -> &Part<'_> {
        self.parts
            .iter()
            .find(|part| element < part.first + part.count)
            .unwrap_or_else(|| self.parts.last().expect("a message has parts"))
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|part| format!("bucket {} {}", part.case.bucket, part.case.profile))
            .collect();
        format!(
            "{} ({} rows from row {}) by {}",
            self.what,
            self.rows,
            self.row,
            parts.join(" then ")
        )
    }
}

/// A message that did not give the reference, or gave the probe row other bytes than before:
/// the kernel of the part at fault and what was seen.
struct Failure {
    kernel: String,
    line: String,
}

impl World<'_> {
    fn rows(&self, seed: u64, rows: usize, probe: usize) -> Rows {
        let dtype = self.ladder.dtype;
        let element = self.element_bytes();
        let inputs = random_rank_inputs(dtype, seed, self.size, rows * ROW);
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let reference = reference_sum(dtype, &views);
        let stream = &self.ranks[0].stream;
        let upload = |bytes: &[u8]| {
            let buffer = self.device.allocate(bytes.len()).unwrap();
            stream.write(&buffer, 0, bytes).unwrap();
            buffer
        };
        let row_bytes = ROW * element;
        Rows {
            inputs: inputs.iter().map(|input| upload(input)).collect(),
            probe_reference: reference[probe * row_bytes..][..row_bytes].to_vec(),
            reference: upload(&reference),
            outputs: (0..self.size)
                .map(|_| self.device.allocate(rows * row_bytes).unwrap())
                .collect(),
        }
    }

    /// Elements of `found` that differ from `expected` (`elements` each), the first of them,
    /// and bytes of the `guard` after `found` that are not poison, on rank `rank`'s stream.
    fn differences(
        &self,
        rank: usize,
        found: u64,
        expected: u64,
        elements: usize,
        guard: usize,
    ) -> [u64; RESULT_WORDS] {
        let memory = &self.ranks[rank];
        let stream = &memory.stream;
        stream
            .fill_u8(&memory.result, 0..RESULT_WORDS * 8, 0)
            .unwrap();
        stream.fill_u8(&memory.result, 8..16, 0xFF).unwrap();
        let words = [
            found,
            expected,
            elements as u64,
            self.element_bytes() as u64,
            guard as u64,
            memory.result.address(),
        ];
        let params: Vec<u8> = words.iter().flat_map(|word| word.to_ne_bytes()).collect();
        stream
            .launch(&self.compare, Geometry::new(264, 256).unwrap(), &params)
            .unwrap();
        let mut result = [0_u64; RESULT_WORDS];
        stream.read(&memory.result, 0, &mut result).unwrap();
        result
    }

    /// `message` on every rank, each on its own stream: the output poisoned, then per part the
    /// part's rows copied into the rank's buffer and the kernel summing them into the part's
    /// place of the output. Returns each rank's bytes of row `probe` when every rank's output
    /// is the reference and its guard poison; otherwise what went wrong.
    fn run_rows(
        &self,
        rows: &Rows,
        message: &Message<'_>,
        probe: usize,
    ) -> Result<Vec<Vec<u8>>, Failure> {
        let element = self.element_bytes();
        let row_bytes = ROW * element;
        let start = message.row * row_bytes;
        let bytes = message.rows * row_bytes;
        let fail = |part: &Part<'_>, line: String| Failure {
            kernel: part.case.kernel_name.clone(),
            line: format!("{}: {line}", message.describe()),
        };
        let before = self.arrivals();
        for (rank, memory) in self.ranks.iter().enumerate() {
            let stream = &memory.stream;
            let output = &rows.outputs[rank];
            let guard = (bytes + GUARD_BYTES).min(output.len_bytes());
            stream.fill_u8(output, 0..guard, POISON).unwrap();
            for part in &message.parts {
                let offset = start + part.first * element;
                stream
                    .copy_device(
                        &memory.buffer,
                        0,
                        &rows.inputs[rank],
                        offset,
                        part.count * element,
                    )
                    .unwrap();
                let mut params = self.params(part.case, rank, part.count, 0, DEADLINE);
                params.output = output.address() + (part.first * element) as u64;
                stream
                    .launch_loaded(&part.case.kernel, part.case.geometry, &params.to_bytes())
                    .unwrap();
            }
        }
        for (rank, memory) in self.ranks.iter().enumerate() {
            if let Err(error) = memory.stream.synchronize_within(WAIT) {
                return Err(fail(&message.parts[0], format!("rank {rank}: {error}")));
            }
        }
        let aborts = self.aborts();
        if let Some((rank, abort)) = aborts
            .iter()
            .enumerate()
            .find_map(|(rank, abort)| abort.as_ref().map(|abort| (rank, abort.to_string())))
        {
            let recording = message
                .parts
                .iter()
                .map(|part| part.case.recording)
                .max()
                .unwrap_or(0);
            let everyone = vec![true; self.size];
            let deadline = DEADLINE.as_nanos() as u64;
            let verdict = judge_abort(&before, &self.arrivals(), recording, &everyone, deadline);
            self.reset();
            let line = match verdict {
                Verdict::KernelAborted => format!("rank {rank} aborted: {abort}"),
                Verdict::NotCoScheduled { never, late } => format!(
                    "not co-scheduled: {} block(s) never began, {} began late",
                    never.len(),
                    late.len()
                ),
            };
            return Err(fail(&message.parts[0], line));
        }
        let mut probes = Vec::new();
        for (rank, output) in rows.outputs.iter().enumerate() {
            let guard = GUARD_BYTES.min(output.len_bytes() - bytes);
            let [wrong, first, overrun] = self.differences(
                rank,
                output.address(),
                rows.reference.address() + start as u64,
                message.rows * ROW,
                guard,
            );
            if wrong > 0 {
                let first = first as usize;
                let mut found = vec![0_u8; element];
                let mut expected = vec![0_u8; element];
                let stream = &self.ranks[rank].stream;
                stream.read(output, first * element, &mut found).unwrap();
                stream
                    .read(&rows.reference, start + first * element, &mut expected)
                    .unwrap();
                let line = format!(
                    "rank {rank}: row {} element {} is {}, the reference {} ({wrong} elements \
                     differ)",
                    message.row + first / ROW,
                    first % ROW,
                    hex(&found),
                    hex(&expected)
                );
                return Err(fail(message.part_at(first), line));
            }
            if overrun > 0 {
                let line = format!("rank {rank}: {overrun} bytes past the message were written");
                return Err(fail(message.parts.last().expect("parts"), line));
            }
            let mut row = vec![0_u8; row_bytes];
            let at = (probe - message.row) * row_bytes;
            self.ranks[rank].stream.read(output, at, &mut row).unwrap();
            probes.push(row);
        }
        Ok(probes)
    }
}

/// What one ladder came to.
struct Report {
    row: String,
    runs: usize,
    /// The kernels of the candidates run.
    kernels: BTreeSet<String>,
    failures: Vec<Failure>,
}

/// Every custom candidate of `ladder` on rows inside messages on both sides of every bucket
/// boundary and in pieces above the ladder, with its kernels compiled from `sources` (`key`
/// names them for the compile cache).
fn run_ladder(
    device: &Device,
    name: &str,
    ladder: Ladder,
    sources: &SourceOverrides,
    key: &str,
    seed: u64,
) -> Report {
    let started = Instant::now();
    let world = ladder.world_size as usize;
    let dtype = dtype_name(ladder.dtype);
    let kernels = compile(
        &kernels_for_ladder(&ladder),
        ladder.world_size,
        sources,
        key,
    )
    .unwrap_or_else(|error| panic!("{name}: {error}"));
    let world_on_gpu = World::new(device, ladder, &kernels, seed);
    let this = &world_on_gpu;
    let ladder = &this.ladder;
    let element = ladder.dtype.size_bytes() as usize;
    let row_bytes = ROW * element;
    let capacity = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes) as usize;
    // The message above the ladder: the largest bucket's message and then at least two rows.
    let above = capacity / row_bytes + 3;
    let probe = above;
    let rows = this.rows(seed + 100, 2 * above + 1, probe);
    let cases_of = |bucket: usize| -> Vec<&Case> {
        this.cases
            .iter()
            .filter(|case| case.bucket == bucket)
            .collect()
    };
    // Message sizes in rows: 1, 3, and around every boundary, each in its bucket.
    let mut sizes = vec![1, 3];
    for bucket in &ladder.buckets {
        let within = bucket.max_bytes as usize / row_bytes;
        sizes.extend([within, within + 1]);
    }
    sizes.retain(|&size| size >= 1 && size * row_bytes <= capacity);
    sizes.sort_unstable();
    sizes.dedup();
    let mut messages = Vec::new();
    for (index, &size) in sizes.iter().enumerate() {
        let bucket = ladder
            .bucket_for((size * row_bytes) as u64)
            .expect("a size within the ladder has a bucket");
        // The probe row at the message's start, middle or end in turn.
        let at = [0, (size - 1) / 2, size - 1][index % 3];
        for case in cases_of(bucket) {
            messages.push(Message {
                what: format!("{size} rows"),
                row: probe - at,
                rows: size,
                parts: vec![Part {
                    case,
                    first: 0,
                    count: size * ROW,
                }],
            });
        }
    }
    // In pieces: the largest bucket's message, cut inside the probe row, then the rest.
    let piece = capacity / element;
    let rest = above * ROW - piece;
    let rest_cases = cases_of(
        ladder
            .bucket_for((rest * element) as u64)
            .expect("a bucket"),
    );
    for (index, case) in cases_of(ladder.buckets.len() - 1).into_iter().enumerate() {
        let Some(&other) = rest_cases.get(index % rest_cases.len().max(1)) else {
            break;
        };
        messages.push(Message {
            what: "above the ladder, in pieces".to_owned(),
            row: probe - piece / ROW,
            rows: above,
            parts: vec![
                Part {
                    case,
                    first: 0,
                    count: piece,
                },
                Part {
                    case: other,
                    first: piece,
                    count: rest,
                },
            ],
        });
    }
    let mut report = Report {
        row: String::new(),
        runs: messages.len(),
        kernels: this
            .cases
            .iter()
            .map(|case| case.kernel_name.clone())
            .collect(),
        failures: Vec::new(),
    };
    // Every message so far gave the probe row the reference's bytes, so a message that gives it
    // other bytes differs from all of them.
    let known = &rows.probe_reference;
    for message in &messages {
        let probes = match this.run_rows(&rows, message, probe) {
            Ok(probes) => probes,
            Err(failure) => {
                eprintln!("{name}: {}", failure.line);
                report.failures.push(failure);
                continue;
            }
        };
        for (rank, bytes) in probes.iter().enumerate() {
            let Some(at) = bytes.iter().zip(known).position(|(a, b)| a != b) else {
                continue;
            };
            let line = format!(
                "{}: rank {rank}'s row {probe} differs from the reference and every earlier \
                 message's from byte {at}",
                message.describe()
            );
            eprintln!("{name}: {line}");
            let element_at = (probe - message.row) * ROW + at / element;
            report.failures.push(Failure {
                kernel: message.part_at(element_at).case.kernel_name.clone(),
                line,
            });
            break;
        }
    }
    report.row = format!(
        "| {name} | {world} | {dtype} | {} | {} | {} | {} | {:.1} s |",
        sizes.len() + 1,
        report.runs,
        report.runs - report.failures.len(),
        if report.failures.is_empty() {
            "none".to_owned()
        } else {
            report.failures.len().to_string()
        },
        started.elapsed().as_secs_f64()
    );
    report
}

const HEADER: &str = "| ladder | world | dtype | message sizes | runs | rows the same | \
                      failures | time |\n| --- | --- | --- | --- | --- | --- | --- | --- |";

/// The shipped all-reduce ladders that target sm_90, by file name, sorted.
fn shipped_sm90_ladders() -> Vec<(String, Ladder)> {
    let dir = ladder("");
    let mut ladders: Vec<(String, Ladder)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "json")
        })
        .filter_map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let ladder = validate_ladder_bytes(&std::fs::read(&path).unwrap())
                .unwrap_or_else(|report| panic!("{name}: {report}"));
            // The row collectives' harness has no probe row; their kernels' order is the
            // rank order of the reference at every shape (tests/gpu/one_gpu/rows.rs).
            (ladder.targets.contains(&Arch::Sm90) && ladder.collective == Collective::AllReduce)
                .then_some((name, ladder))
        })
        .collect();
    ladders.sort_by(|a, b| a.0.cmp(&b.0));
    ladders
}

/// Every shipped sm_90 ladder (2, 4 and 8 ranks; bf16, fp16 and fp32): every custom candidate's
/// messages exact and the probe row the same bytes in all of them. Panics naming every problem.
pub fn check_every_shipped_sm90_ladder() {
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mut table = format!("batch invariance, every rank on one GPU\n{HEADER}\n");
    let mut problems = Vec::new();
    for (seed, (name, ladder)) in shipped_sm90_ladders().into_iter().enumerate() {
        let report = run_ladder(
            &device,
            &name,
            ladder,
            &SourceOverrides::new(),
            "embedded",
            1000 * seed as u64 + 7,
        );
        eprintln!("{}", report.row);
        let _ = writeln!(table, "{}", report.row);
        problems.extend(
            report
                .failures
                .into_iter()
                .map(|failure| format!("{name}: {}", failure.line)),
        );
    }
    eprintln!("\n{table}");
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The one-shot pull summing the ranks in reverse order above 2048 elements
/// (`Mutation::SizeDependentOrder`) at 4 and 8 ranks: the rows differ between small and large
/// messages in its candidates, and every other candidate stays the same. Panics otherwise.
pub fn check_a_size_dependent_sum_order_is_caught() {
    let mutation = Mutation::SizeDependentOrder;
    let _gpu = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mut problems = Vec::new();
    for world in [4, 8] {
        let name = h200_ladder(world);
        let ladder = validate_ladder_bytes(&std::fs::read(ladder(&name)).unwrap())
            .unwrap_or_else(|report| panic!("{name}: {report}"));
        let report = run_ladder(
            &device,
            &name,
            ladder,
            &overrides(mutation),
            mutation.name(),
            11,
        );
        eprintln!("{mutation}: {}", report.row);
        let caught: BTreeSet<String> = report
            .failures
            .iter()
            .map(|failure| failure.kernel.clone())
            .collect();
        let touched: BTreeSet<String> = report
            .kernels
            .iter()
            .filter(|kernel| mutation.kernels().contains(kernel))
            .cloned()
            .collect();
        if touched.is_empty() || caught != touched {
            problems.push(format!(
                "{name}: the kernels with differing rows are {caught:?}, those it touches {touched:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{mutation}:\n{}", problems.join("\n"));
}
