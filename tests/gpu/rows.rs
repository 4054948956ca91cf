//! The reduce-scatter and the all-gather on real GPUs: the rank-order sum kernel summing an
//! owned run as the last slice of a message (one GPU), the exact NCCL reduce-scatter
//! qualified exact at the test world (`PREPARE_TEST_WORLD`), and the handle's reduce-scatter
//! and all-gather at two ranks in every layout against the reference.

use std::time::Duration;

use prepare::collective::{sum_message_elements, sum_slot_bytes};
use prepare::gpu::driver::{DeviceMemory, Geometry, ModuleImage};
use prepare::kernels::{rank_order_sum, LaunchParams};
use prepare::ladder::Dtype;
use prepare::reference::{random_rank_inputs, reference_sum};

use super::support::{
    arch_of, check_on_gpus, export_file, launch_on_two_gpus, printed, require_gpus, require_world,
    written_ladder,
};

#[test]
#[ignore = "needs GPUs"]
fn the_rank_order_sum_kernel_sums_an_owned_run_given_as_the_last_slice() {
    let (driver, [device]) = require_gpus!(1);
    let arch = arch_of(driver, 0);
    let stream = device.new_stream().unwrap();
    let mut checked = 0;
    for dtype in Dtype::ALL {
        for world in [2_u32, 3, 4, 8] {
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
            let size = dtype.size_bytes() as usize;
            for run in [1_u64, 3, 7, 8, 9, 4096 * 7, 8 * 4096 + 5] {
                let inputs = random_rank_inputs(
                    dtype,
                    run * 31 + u64::from(world),
                    world as usize,
                    run as usize,
                );
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let expected = reference_sum(dtype, &views);
                let slot = sum_slot_bytes(run, dtype, world) as usize;
                let scratch = device.allocate(slot * world as usize).unwrap();
                for (q, input) in inputs.iter().enumerate() {
                    stream.write(&scratch, q * slot, input).unwrap();
                }
                let output = device.allocate(slot).unwrap();
                let params = LaunchParams {
                    output: output.address(),
                    input: scratch.address(),
                    rank: world - 1,
                    world,
                    ..LaunchParams::all_reduce(sum_message_elements(run, dtype, world))
                };
                stream
                    .launch_loaded(&kernel, Geometry::new(3, 128).unwrap(), &params.to_bytes())
                    .unwrap();
                stream.synchronize_within(Duration::from_secs(30)).unwrap();
                let mut sum = vec![0_u8; run as usize * size];
                stream.read(&output, 0, &mut sum).unwrap();
                assert!(
                    sum == expected,
                    "{} at {world} ranks: a run of {run} differs from the reference sum",
                    spec.name
                );
                checked += 1;
            }
        }
    }
    eprintln!("{checked} owned runs summed in rank order, each the reference sum");
}

/// A reduce-scatter or all-gather ladder for H200s at `world` ranks: NCCL plain and (for the
/// reduce-scatter) in rank order in every bucket, and the one-shot kernels when `custom`.
pub(super) fn rows_ladder(collective: &str, world: usize, custom: bool) -> serde_json::Value {
    let mut profiles = vec![serde_json::json!({"id": "nccl", "algorithm": "nccl"})];
    let mut candidates = vec!["nccl"];
    if collective == "reduce_scatter" {
        profiles.push(
            serde_json::json!({"id": "nccl_rank_order", "algorithm": "nccl", "order": "rank"}),
        );
        candidates.push("nccl_rank_order");
    }
    if custom {
        profiles.push(
            serde_json::json!({"id": "one_shot_pull", "algorithm": "one_shot", "transfer": "pull"}),
        );
        profiles.push(
            serde_json::json!({"id": "one_shot_push", "algorithm": "one_shot", "transfer": "push"}),
        );
        candidates.extend(["one_shot_pull", "one_shot_push"]);
    }
    let step = 16 * world as u64;
    let buckets: Vec<serde_json::Value> = [step * 1024, step * 65536]
        .into_iter()
        .map(|max_bytes| {
            serde_json::json!({"max_bytes": max_bytes, "threads": 256, "blocks": 8,
                               "candidates": candidates, "default": "nccl"})
        })
        .collect();
    serde_json::json!({
        "format_version": 1,
        "name": format!("h200_{collective}_tp{world}"),
        "collective": collective,
        "dtype": "fp32",
        "world_size": world,
        "targets": ["sm_90"],
        "profiles": profiles,
        "buckets": buckets,
    })
}

#[test]
#[ignore = "needs GPUs"]
fn the_exact_nccl_reduce_scatter_is_exact_in_every_bucket_at_the_test_world() {
    let world = require_world!();
    let value = rows_ladder("reduce_scatter", world, false);
    let (_ladder_dir, written) = written_ladder(
        "reduce_scatter.json",
        serde_json::to_vec_pretty(&value).unwrap(),
    );
    let (_package_dir, package) = export_file(&written);
    let output = check_on_gpus(world, &package, 60, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", printed(&output));
    assert!(output.status.success(), "prepare check failed");
    for rank in 0..world {
        let exact = stdout
            .lines()
            .filter(|line| {
                line.starts_with(&format!("[rank {rank}] bucket"))
                    && line.contains(" nccl_rank_order ")
                    && line.ends_with(" exact")
            })
            .count();
        assert_eq!(exact, 2, "rank {rank}: {stdout}");
    }
}

/// `prepare check` on a reduce-scatter and an all-gather package with custom kernels: above the
/// ladder, every custom candidate of the largest bucket in pieces (two pieces and three rows,
/// uneven over the ranks, out of place and in place) equals the reference on every rank.
#[test]
#[ignore = "needs GPUs"]
fn row_collectives_above_the_ladder_are_exact_in_pieces_on_every_rank() {
    let world = require_world!();
    for collective in ["reduce_scatter", "all_gather"] {
        let value = rows_ladder(collective, world, true);
        let (_ladder_dir, written) = written_ladder(
            &format!("{collective}.json"),
            serde_json::to_vec_pretty(&value).unwrap(),
        );
        let (_package_dir, package) = export_file(&written);
        let output = check_on_gpus(world, &package, 60, &[]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        eprintln!("{}", printed(&output));
        assert!(
            output.status.success(),
            "prepare check of {collective} failed"
        );
        for rank in 0..world {
            for profile in ["one_shot_pull", "one_shot_push"] {
                let prefix = format!("[rank {rank}] {profile} in pieces, ");
                let suffix =
                    format!(" {collective} out of place and in place: equals the reference");
                assert!(
                    stdout
                        .lines()
                        .any(|line| line.starts_with(&prefix) && line.ends_with(&suffix)),
                    "rank {rank}, {collective} {profile}: {stdout}"
                );
            }
        }
    }
}

/// Set, to the two packages' directories joined by a newline, in the rank processes of
/// [`the_handle_reduce_scatters_and_all_gathers_every_shape_and_layout_at_two_ranks`].
const ROWS_PACKAGES: &str = "PREPARE_TEST_ROWS_PACKAGES";

/// One rank: serves the reduce-scatter and the all-gather packages, forces every candidate of
/// every bucket, and runs each shape in place and out of place in a graph of its own, each
/// output against the reference and each out-of-place input kept; then the refusals, and the
/// call check refusing ranks that pass other rows.
fn serve_rows(packages: &str) {
    use prepare::collective::Operands;
    use prepare::gpu::driver::CallerMemory;
    use prepare::ladder::Collective;
    use prepare::reference::reference_outputs;
    use prepare::serve::{Options, ServeError, Server};
    use prepare::shape::Shape;

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
    let dtype = Dtype::Fp32;
    let size = 4_u64;
    let shapes = [
        (1, 7),
        (3, 7),
        (5, 1),
        (2048, 4),
        (7, 4096),
        (2, 4096),
        (4097, 7),
    ];
    let first = device.allocate(16 << 20).unwrap();
    let second = device.allocate(16 << 20).unwrap();
    let mut checked = 0;
    for package in &packages {
        let ladder = package.ladder().clone();
        let collective = ladder.collective;
        for (bucket_index, bucket) in ladder.buckets.iter().enumerate() {
            for profile in &bucket.candidates {
                handle
                    .force(collective, dtype, bucket_index, profile)
                    .unwrap();
                for (rows, width) in shapes {
                    let shape = Shape::new(rows, width).unwrap();
                    let bytes = shape.elements() * size;
                    if ladder.bucket_for(bytes) != Some(bucket_index) {
                        continue;
                    }
                    let own = shape.owned_elements(world, rank).unwrap();
                    let own_bytes = own.start * size..own.end * size;
                    let seed = rows * 131 + width + checked;
                    let inputs =
                        random_rank_inputs(dtype, seed, world as usize, shape.elements() as usize);
                    let given: Vec<Vec<u8>> = (0..world)
                        .map(|q| {
                            if collective == Collective::ReduceScatter {
                                return inputs[q as usize].clone();
                            }
                            let theirs = shape.owned_elements(world, q).unwrap();
                            inputs[0][(theirs.start * size) as usize..(theirs.end * size) as usize]
                                .to_vec()
                        })
                        .collect();
                    let views: Vec<&[u8]> = given.iter().map(Vec::as_slice).collect();
                    let expected = reference_outputs(collective, dtype, shape, &views).unwrap();
                    let mine = &given[rank as usize];
                    for in_place in [false, true] {
                        let (input, output) = match (collective, in_place) {
                            (Collective::ReduceScatter, false) => (
                                CallerMemory::prefix(&first, bytes),
                                CallerMemory::prefix(
                                    &CallerMemory::whole(&second).offset(4),
                                    own_bytes.end - own_bytes.start,
                                ),
                            ),
                            (Collective::ReduceScatter, true) => {
                                let input = CallerMemory::prefix(&first, bytes);
                                (
                                    input,
                                    CallerMemory::prefix(
                                        &input.offset(own_bytes.start),
                                        own_bytes.end - own_bytes.start,
                                    ),
                                )
                            }
                            (_, false) => (
                                CallerMemory::prefix(
                                    &CallerMemory::whole(&first).offset(4),
                                    own_bytes.end - own_bytes.start,
                                ),
                                CallerMemory::prefix(&second, bytes),
                            ),
                            (_, true) => {
                                let output = CallerMemory::prefix(&second, bytes);
                                (
                                    CallerMemory::prefix(
                                        &output.offset(own_bytes.start),
                                        own_bytes.end - own_bytes.start,
                                    ),
                                    output,
                                )
                            }
                        };
                        let operands = Operands { input, output };
                        let graph = stream
                            .capture(|stream| {
                                match collective {
                                    Collective::ReduceScatter => handle
                                        .reduce_scatter_on(stream, operands, rows, width, dtype),
                                    _ => handle.all_gather_on(stream, operands, rows, width, dtype),
                                }
                                .map_err(anyhow::Error::from)
                            })
                            .unwrap();
                        if output.len_bytes() > 0 && !in_place {
                            stream
                                .fill_u16(&output, 0..output.len_bytes(), 0x7FA5)
                                .unwrap();
                        }
                        if !mine.is_empty() {
                            stream.write(&input, 0, mine).unwrap();
                        }
                        graph.launch().unwrap();
                        stream.synchronize_within(Duration::from_secs(60)).unwrap();
                        handle.check().unwrap();
                        let what = format!(
                            "rank {rank}: {collective} {profile} in bucket {bucket_index}, {rows} x {width}, in place {in_place}"
                        );
                        let mut got = vec![0_u8; output.len_bytes()];
                        if !got.is_empty() {
                            stream.read(&output, 0, &mut got).unwrap();
                        }
                        assert!(
                            got == expected[rank as usize],
                            "{what}: the output differs from the reference"
                        );
                        if !in_place && !mine.is_empty() {
                            let mut after = vec![0_u8; input.len_bytes()];
                            stream.read(&input, 0, &mut after).unwrap();
                            assert!(&after == mine, "{what}: the input changed");
                        }
                        checked += 1;
                    }
                }
            }
        }
        // Refusals, before anything is enqueued.
        let whole = CallerMemory::prefix(&first, 64 * size);
        let operands = Operands {
            input: whole,
            output: whole,
        };
        let refused = match collective {
            Collective::ReduceScatter => handle.reduce_scatter_on(&stream, operands, 8, 0, dtype),
            _ => handle.all_gather_on(&stream, operands, 8, 0, dtype),
        }
        .unwrap_err();
        assert!(refused.to_string().contains("width 0"), "{refused}");
        let refused = match collective {
            Collective::ReduceScatter => handle.reduce_scatter_on(&stream, operands, 64, 1, dtype),
            _ => handle.all_gather_on(&stream, operands, 64, 1, dtype),
        }
        .unwrap_err();
        assert!(refused.to_string().contains("holds"), "{refused}");

        // The call check: rank r passes 8 + r rows, so every rank's call is refused, naming
        // the first rank whose call differs, with nothing enqueued; then one call of 8 rows on
        // every rank goes through.
        handle.set_call_checks(true);
        let width = 4;
        let row_operands = |rows: u64| {
            let shape = Shape::new(rows, width).unwrap();
            let own = shape.owned_elements(world, rank).unwrap();
            let (whole, part) = (shape.elements() * size, (own.end - own.start) * size);
            let (input, output) = match collective {
                Collective::ReduceScatter => (whole, part),
                _ => (part, whole),
            };
            Operands {
                input: CallerMemory::prefix(&first, input),
                output: CallerMemory::prefix(&second, output),
            }
        };
        let call = |rows: u64| match collective {
            Collective::ReduceScatter => {
                handle.reduce_scatter_on(&stream, row_operands(rows), rows, width, dtype)
            }
            _ => handle.all_gather_on(&stream, row_operands(rows), rows, width, dtype),
        };
        let refused = call(8 + u64::from(rank)).unwrap_err();
        let first_other = u32::from(rank == 0);
        assert!(
            matches!(&refused, ServeError::CallsDisagree { other, .. } if *other == first_other),
            "rank {rank}: {refused}"
        );
        call(8).unwrap();
        stream.synchronize_within(Duration::from_secs(60)).unwrap();
        handle.check().unwrap();
        handle.set_call_checks(false);
    }
    eprintln!("rank {rank}: {checked} served reduce-scatters and all-gathers exact");
}

#[test]
#[ignore = "needs GPUs"]
fn the_handle_reduce_scatters_and_all_gathers_every_shape_and_layout_at_two_ranks() {
    if let Some(packages) = std::env::var_os(ROWS_PACKAGES) {
        serve_rows(&packages.to_string_lossy());
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
            the_handle_reduce_scatters_and_all_gathers_every_shape_and_layout_at_two_ranks
        ))
        .get_args()
        .map(Into::into)
        .collect(),
        vec![(ROWS_PACKAGES.into(), paths.join("\n").into())],
    );
    launched.unwrap_or_else(|error| panic!("{error}: {lines:#?}"));
    for rank in 0..2 {
        assert!(
            lines.iter().any(
                |line| line.starts_with(&format!("[rank {rank}] rank {rank}: "))
                    && line.ends_with(" served reduce-scatters and all-gathers exact")
            ),
            "{lines:#?}"
        );
    }
}
