//! The identity on one GPU: the all-gather of a reduce-scatter is the all-reduce, bit for bit.
//! Each reduce-scatter kernel of the table (pull, push, push with `ll`) is followed by each
//! all-gather kernel (pull, push, `ll`, the copy engine) on every rank of one world on one GPU
//! (rows.rs's harness): the reduce-scatter, each rank's rows of its output copied on the
//! rank's stream to where the all-gather takes them, then the all-gather, back to back as a
//! sequence-parallel layer enqueues them (no synchronization between the two, so the second
//! kernel's staging and barriers meet the first's ending on the peers). Every rank's output
//! must be the reference all-reduce's bytes, eagerly with a rank late and in one graph of both
//! collectives on every rank replayed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use prepare::gpu::driver::Device;
use prepare::kernels::KernelSpec;
use prepare::ladder::{Collective, Dtype};

use super::dtype_name;
use super::rows::{row_kernels, shapes, verdict, RowWorld, Run, BLOCKS, THREADS};
use crate::gpu::support::WORLDS;

impl RowWorld<'_> {
    /// Queues `scatter` on every rank (`late` late), each rank's output of it copied to its
    /// chained buffer at its rows, then `gather` (a chained run) on every rank.
    fn enqueue_chain(&self, scatter: &Run<'_>, gather: &Run<'_>, late: Option<usize>) {
        self.enqueue(scatter, late);
        let element = self.dtype.size_bytes() as usize;
        for rank in 0..self.size {
            let scattered = self.places(scatter, rank);
            let (from, offset) = scattered.output;
            let bytes = scattered.output_elements as usize * element;
            let at = self.places(gather, rank).first as usize * element;
            if bytes > 0 {
                self.world.members[rank]
                    .stream
                    .copy_device(self.chained(rank), at, from, offset, bytes)
                    .unwrap();
            }
        }
        self.enqueue(gather, None);
    }

    /// `scatter` then `gather` on every rank, eagerly with rank `late` late and in a graph
    /// replayed: every rank's output `sums`, its all-gather's input `scattered`.
    fn check_chain(
        &self,
        (scatter, gather): (&Run<'_>, &Run<'_>),
        late: usize,
        sums: &[Vec<u8>],
        scattered: &[Vec<u8>],
    ) -> Result<(), String> {
        self.world.eager_then_graph(
            late,
            &|late| self.enqueue_chain(scatter, gather, late),
            &|before| self.judge(gather, before, sums, scattered),
        )
    }
}

/// The reduce-scatter kernels of one type and world, and its all-gather kernels.
fn scatters_and_gathers(dtype: Dtype, world: usize) -> (Vec<KernelSpec>, Vec<KernelSpec>) {
    let (scatters, gathers): (Vec<_>, Vec<_>) = row_kernels(dtype, world)
        .into_iter()
        .partition(|(collective, _)| *collective == Collective::ReduceScatter);
    let specs = |kernels: Vec<(Collective, KernelSpec)>| {
        kernels.into_iter().map(|(_, spec)| spec).collect()
    };
    (specs(scatters), specs(gathers))
}

/// At 2, 4 and 8 ranks, in every type and at every row kernel's shape: each all-gather kernel
/// after a reduce-scatter kernel, the reduce-scatters taken in turn so that every pair runs at
/// six of the shapes, alternately in place (both collectives) and not. The table of what
/// passed, and every failure.
pub fn check_the_identity(device: &Device) -> Result<String, String> {
    let mut table = String::from(
        "| world | dtype | reduce-scatter then all-gather | runs exact | time |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    let mut failures = Vec::new();
    for world in WORLDS {
        for dtype in Dtype::ALL {
            let largest = shapes(world)
                .iter()
                .map(|shape| (shape.elements() * dtype.size_bytes()) as usize)
                .max()
                .unwrap_or(0);
            let (scatters, gathers) = scatters_and_gathers(dtype, world);
            let specs: Vec<KernelSpec> = scatters.iter().chain(&gathers).cloned().collect();
            let row_world = RowWorld::new(device, dtype, world, &specs, largest);
            let mut pairs: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            let started = Instant::now();
            for (index, shape) in shapes(world).into_iter().enumerate() {
                let data = row_world.load(shape, 5000 + index as u64);
                let (_, sums) = data.of(Collective::AllReduce, dtype, shape);
                let (_, scattered) = data.of(Collective::ReduceScatter, dtype, shape);
                for (turn, gather) in gathers.iter().enumerate() {
                    let scatter = &scatters[(index + turn) % scatters.len()];
                    let in_place = (index / scatters.len() + turn) % 2 == 1;
                    let run = |collective, spec, chained| Run {
                        collective,
                        spec,
                        shape,
                        in_place,
                        blocks: BLOCKS,
                        threads: THREADS,
                        chained,
                    };
                    let scatter_run = run(Collective::ReduceScatter, scatter, false);
                    let gather_run = run(Collective::AllGather, gather, true);
                    let pair = format!("{} then {}", scatter.name, gather.name);
                    let late = (index + turn) % world;
                    let outcome =
                        row_world.check_chain((&scatter_run, &gather_run), late, &sums, &scattered);
                    let entry = pairs.entry(pair).or_default();
                    entry.1 += 1;
                    match outcome {
                        Ok(()) => entry.0 += 1,
                        Err(why) => {
                            let line = format!(
                                "{world} ranks: {} then {}: {why}",
                                scatter_run.describe(),
                                gather_run.describe()
                            );
                            eprintln!("{line}");
                            failures.push(line);
                        }
                    }
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            let mut rows = String::new();
            for (pair, (passed, runs)) in &pairs {
                let _ = writeln!(
                    rows,
                    "| {world} | {} | {pair} | {passed} of {runs} | |",
                    dtype_name(dtype)
                );
            }
            let _ = writeln!(
                rows,
                "| {world} | {} | every pair | | {seconds:.1} s |",
                dtype_name(dtype)
            );
            // Printed as each world and type ends too, so a run cut short still says what
            // passed.
            eprint!("{rows}");
            table.push_str(&rows);
        }
    }
    verdict(table, &failures)
}
