//! The v-forms of the reduce-scatter and the all-gather on real GPUs: the exact
//! reduce-scatter's passes over per-rank rows summed by the rank-order sum kernel (one GPU, the
//! slots written as the grouped transfers would), and on two GPUs every forced candidate of
//! every bucket with per-rank rows equal to the shape rule's (the candidate's own path) and
//! other per-rank rows (NCCL's grouped transfers, the reduce-scatter's exact one), in place and
//! out of place, each in a graph, against the reference; then the refusals.

use std::time::Duration;

use prepare::collective::{scatter_passes, Operands, RowMessage};
use prepare::gpu::driver::{CallerMemory, DeviceMemory, Geometry, ModuleImage};
use prepare::kernels::{rank_order_sum, LaunchParams};
use prepare::ladder::{Collective, Dtype};
use prepare::reference::{random_rank_inputs, reference_sum};
use prepare::serve::{Handle, Options, Server};
use prepare::shape::RankRows;

use super::rows::rows_ladder;
use super::support::{arch_of, export_file, launch_on_two_gpus, require_gpus, written_ladder};

#[test]
#[ignore = "needs GPUs"]
fn the_exact_reduce_scatter_s_passes_over_per_rank_rows_sum_every_rank_s_rows_in_rank_order() {
    let (driver, [device]) = require_gpus!(1);
    let arch = arch_of(driver, 0);
    let stream = device.new_stream().unwrap();
    // Per-rank rows (the longest run not first, ranks owning none) and widths, in slots of
    // 64 bytes and of 1 MiB: many passes and one.
    let layouts: [(&[u64], u64); 5] = [
        (&[1, 6], 7),
        (&[0, 5, 2], 3),
        (&[3, 0, 0, 9], 33),
        (&[2, 1, 7, 0, 0, 4, 1, 5], 5),
        (&[100, 3000], 9),
    ];
    let mut checked = 0;
    for dtype in Dtype::ALL {
        for (counts, width) in layouts {
            let world = counts.len() as u32;
            let spec = rank_order_sum(dtype, world);
            let compiled = prepare::compile::compile_kernels(
                std::slice::from_ref(&spec),
                arch,
                &prepare::progress::Silent,
            )
            .unwrap();
            let module = device
                .load_module(ModuleImage::Cubin(&compiled.kernels[0].cubin))
                .unwrap();
            let kernel = module
                .load(&spec.name, false, prepare::abi::PARAMS_BYTES)
                .unwrap();
            let layout = RankRows::given(counts, world).unwrap();
            let elements = (layout.rows() * width) as usize;
            let inputs = random_rank_inputs(dtype, layout.rows() + width, world as usize, elements);
            let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let sum = reference_sum(dtype, &views);
            for slot_capacity in [64_u64, 1 << 20] {
                for rank in 0..world {
                    let message =
                        RowMessage::given(Collective::ReduceScatter, width, &layout, rank, dtype)
                            .unwrap();
                    let own = message.owned_bytes(rank);
                    let mut got = vec![0_u8; (own.end - own.start) as usize];
                    for pass in scatter_passes(&message, dtype, slot_capacity) {
                        let bytes = (pass.own.end - pass.own.start) as usize;
                        if bytes == 0 {
                            continue;
                        }
                        // Slot q holds rank q's input of this rank's part, as rank q sends it.
                        let slot = pass.slot as usize;
                        let scratch = device.allocate(slot * world as usize).unwrap();
                        for (q, input) in inputs.iter().enumerate() {
                            let part = &input[pass.own.start as usize..pass.own.end as usize];
                            stream.write(&scratch, q * slot, part).unwrap();
                        }
                        let output = device.allocate(slot.max(16)).unwrap();
                        let params = LaunchParams {
                            output: output.address(),
                            input: scratch.address(),
                            rank: world - 1,
                            world,
                            ..LaunchParams::all_reduce(pass.sum.1)
                        };
                        stream
                            .launch_loaded(
                                &kernel,
                                Geometry::new(3, 128).unwrap(),
                                &params.to_bytes(),
                            )
                            .unwrap();
                        stream.synchronize_within(Duration::from_secs(30)).unwrap();
                        let at = pass.output_offset as usize;
                        stream.read(&output, 0, &mut got[at..at + bytes]).unwrap();
                    }
                    assert!(
                        got == sum[own.start as usize..own.end as usize],
                        "{} of rows {counts:?} x {width}, slots of {slot_capacity}: rank {rank}'s \
                         rows differ from the reference sum",
                        spec.name
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} ranks' per-rank rows summed in rank order, each the reference sum");
}

const V_PACKAGES: &str = "PREPARE_TEST_ROWS_V_PACKAGES";

/// Per-rank rows at two ranks, with their width: the rule's (even and uneven), a rank owning
/// none either way, the longer run last, and one above the ladder's largest bucket.
const LAYOUTS: [([u64; 2], u64); 8] = [
    ([2, 1], 7),
    ([4, 4], 4096),
    ([1, 6], 7),
    ([0, 5], 3),
    ([5, 0], 4),
    ([3, 5], 1),
    ([1000, 3000], 5),
    ([3, 70_000], 64),
];

/// A rank's expected output of `collective` in fp32, `own` the bytes of its rows and `inputs`
/// the whole message on every rank (the all-gather's inputs are rank 0's rows at each owner's
/// place): the reference sum's bytes of this rank's rows, or the whole message.
fn expected(collective: Collective, inputs: &[Vec<u8>], own: std::ops::Range<u64>) -> Vec<u8> {
    match collective {
        Collective::ReduceScatter => {
            let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            reference_sum(Dtype::Fp32, &views)[own.start as usize..own.end as usize].to_vec()
        }
        _ => inputs[0].clone(),
    }
}

fn enqueue(
    handle: &Handle,
    collective: Collective,
    stream: &prepare::gpu::driver::Stream,
    operands: Operands,
    counts: &[u64],
    width: u64,
) -> Result<(), prepare::serve::ServeError> {
    match collective {
        Collective::ReduceScatter => {
            handle.reduce_scatter_v_on(stream, operands, counts, width, Dtype::Fp32)
        }
        _ => handle.all_gather_v_on(stream, operands, counts, width, Dtype::Fp32),
    }
}

/// One rank of the two.
fn serve_rows_v(packages: &str) {
    let packages: Vec<_> = packages
        .lines()
        .map(|path| prepare::package::open_package_retrying(path.as_ref()).unwrap())
        .collect();
    let options = Options {
        timeout: Duration::from_secs(30),
        cache_dir: None,
        ..Options::default()
    };
    let mut handle = Server::from_env(options).unwrap().start(&packages).unwrap();
    let (rank, world) = (handle.rank(), handle.world());
    let device = handle.runtime().device().clone();
    let mut stream = device.new_stream().unwrap();
    let size = 4_u64;
    let first = device.allocate(64 << 20).unwrap();
    let second = device.allocate(64 << 20).unwrap();
    let mut checked = 0;
    for package in &packages {
        let ladder = package.ladder().clone();
        let collective = ladder.collective;
        for (bucket_index, bucket) in ladder.buckets.iter().enumerate() {
            for profile in &bucket.candidates {
                handle
                    .force(collective, Dtype::Fp32, bucket_index, profile)
                    .unwrap();
                for (counts, width) in LAYOUTS {
                    let layout = RankRows::given(&counts, world).unwrap();
                    let bytes = layout.rows() * width * size;
                    let own_rows = layout.owned_rows(rank).unwrap();
                    let own = own_rows.start * width * size..own_rows.end * width * size;
                    let own_len = own.end - own.start;
                    let seed = layout.rows() * 131 + width + checked;
                    let inputs = random_rank_inputs(
                        Dtype::Fp32,
                        seed,
                        world as usize,
                        (layout.rows() * width) as usize,
                    );
                    let mine = match collective {
                        Collective::ReduceScatter => inputs[rank as usize].clone(),
                        _ => inputs[0][own.start as usize..own.end as usize].to_vec(),
                    };
                    let want = expected(collective, &inputs, own.clone());
                    for in_place in [false, true] {
                        let (input, output) = match (collective, in_place) {
                            (Collective::ReduceScatter, false) => (
                                CallerMemory::prefix(&first, bytes),
                                CallerMemory::prefix(
                                    &CallerMemory::whole(&second).offset(4),
                                    own_len,
                                ),
                            ),
                            (Collective::ReduceScatter, true) => {
                                let input = CallerMemory::prefix(&first, bytes);
                                (
                                    input,
                                    CallerMemory::prefix(&input.offset(own.start), own_len),
                                )
                            }
                            (_, false) => (
                                CallerMemory::prefix(
                                    &CallerMemory::whole(&first).offset(4),
                                    own_len,
                                ),
                                CallerMemory::prefix(&second, bytes),
                            ),
                            (_, true) => {
                                let output = CallerMemory::prefix(&second, bytes);
                                (
                                    CallerMemory::prefix(&output.offset(own.start), own_len),
                                    output,
                                )
                            }
                        };
                        let operands = Operands { input, output };
                        let graph = stream
                            .capture(|stream| {
                                enqueue(&handle, collective, stream, operands, &counts, width)
                                    .map_err(anyhow::Error::from)
                            })
                            .unwrap();
                        if output.len_bytes() > 0 && !in_place {
                            stream
                                .fill_u16(&output, 0..output.len_bytes(), 0x7FA5)
                                .unwrap();
                        }
                        if !mine.is_empty() {
                            stream.write(&input, 0, &mine).unwrap();
                        }
                        graph.launch().unwrap();
                        stream.synchronize_within(Duration::from_secs(60)).unwrap();
                        handle.check().unwrap();
                        let what = format!(
                            "rank {rank}: {collective}_v {profile} in bucket {bucket_index}, \
                             rows {counts:?} of width {width}, in place {in_place}"
                        );
                        let mut got = vec![0_u8; output.len_bytes()];
                        if !got.is_empty() {
                            stream.read(&output, 0, &mut got).unwrap();
                        }
                        assert!(got == want, "{what}: the output differs from the reference");
                        if !in_place && !mine.is_empty() {
                            let mut after = vec![0_u8; input.len_bytes()];
                            stream.read(&input, 0, &mut after).unwrap();
                            assert!(after == mine, "{what}: the input changed");
                        }
                        checked += 1;
                    }
                }
            }
        }
        // Refusals, before anything is enqueued: a list not one count per rank, an output
        // not of this rank's count.
        let whole = CallerMemory::prefix(&first, 64 * size);
        let operands = Operands {
            input: whole,
            output: whole,
        };
        let refused = enqueue(&handle, collective, &stream, operands, &[1, 2, 3], 1).unwrap_err();
        assert!(
            refused.to_string().contains("rows_per_rank has 3 counts"),
            "{refused}"
        );
        let refused = enqueue(&handle, collective, &stream, operands, &[3, 61], 1).unwrap_err();
        assert!(refused.to_string().contains("holds"), "{refused}");
        stream.synchronize_within(Duration::from_secs(60)).unwrap();
        handle.check().unwrap();
    }
    eprintln!("rank {rank}: {checked} served v-form reduce-scatters and all-gathers exact");
}

#[test]
#[ignore = "needs GPUs"]
fn the_handle_s_v_forms_take_any_per_rank_rows_at_two_ranks() {
    if let Some(packages) = std::env::var_os(V_PACKAGES) {
        serve_rows_v(&packages.to_string_lossy());
        return;
    }
    require_gpus!(2);
    let mut keep = Vec::new();
    let mut paths = Vec::new();
    for collective in ["reduce_scatter", "all_gather"] {
        let value = rows_ladder(collective, 2, true);
        let (ladder_dir, written) = written_ladder(
            &format!("{collective}.json"),
            serde_json::to_vec_pretty(&value).unwrap(),
        );
        let (package_dir, package) = export_file(&written);
        paths.push(package.to_string_lossy().into_owned());
        keep.push((ladder_dir, package_dir));
    }
    let (launched, lines) = launch_on_two_gpus(
        std::env::current_exe().unwrap(),
        crate::support::process::rerun(&crate::test_name!(
            the_handle_s_v_forms_take_any_per_rank_rows_at_two_ranks
        ))
        .get_args()
        .map(Into::into)
        .collect(),
        vec![(V_PACKAGES.into(), paths.join("\n").into())],
    );
    launched.unwrap_or_else(|error| panic!("{error}: {lines:#?}"));
    for rank in 0..2 {
        assert!(
            lines.iter().any(
                |line| line.starts_with(&format!("[rank {rank}] rank {rank}: "))
                    && line.ends_with(" served v-form reduce-scatters and all-gathers exact")
            ),
            "{lines:#?}"
        );
    }
}
