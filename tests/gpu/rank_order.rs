//! The exact NCCL all-reduce (`"order": "rank"`) on real GPUs: its sum kernel alone on one GPU
//! against the reference sum, and the whole path (grouped sends and receives, the kernel, the
//! all-gather) qualified exact at the test world (`PREPARE_TEST_WORLD`, 2 by default; NCCL needs
//! a GPU per rank), on one host and with the ranks on two "hosts".

use std::time::Duration;

use prepare::gpu::driver::{DeviceMemory, Geometry, ModuleImage};
use prepare::kernels::{rank_order_sum, slice_of, slot_bytes, LaunchParams};
use prepare::ladder::Dtype;
use prepare::reference::reference_sum;

use super::support::{
    arch_of, check_on_gpus, export_file, free_port, h200_ladder, ladder, printed, require_gpus,
    require_world, start_rank_of, written_ladder,
};

/// Any bits, NaNs, infinities, signed zeros and subnormals among them.
fn random_bytes(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

#[test]
#[ignore = "needs GPUs"]
fn the_rank_order_sum_kernel_gives_the_reference_sum_on_one_gpu() {
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
            let per = dtype.per_vector();
            for elements in [1, per * u64::from(world) + 3, 1001, 8 * per * 4096 + 5] {
                let size = dtype.size_bytes() as usize;
                let inputs: Vec<Vec<u8>> = (0..world)
                    .map(|q| random_bytes(elements * 10 + u64::from(q), elements as usize * size))
                    .collect();
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let expected = reference_sum(dtype, &views);
                let slot = slot_bytes(elements, dtype, world) as usize;
                let scratch = device.allocate(slot * world as usize).unwrap();
                let output = device.allocate(slot).unwrap();
                for rank in 0..world {
                    let slice = slice_of(rank, elements, dtype, world);
                    let first = slice.first_element(dtype) as usize * size;
                    let bytes = slice.bytes(dtype) as usize;
                    for (q, input) in inputs.iter().enumerate() {
                        stream
                            .write(&scratch, q * slot, &input[first..first + bytes])
                            .unwrap();
                    }
                    let params = LaunchParams {
                        output: output.address(),
                        input: scratch.address(),
                        rank,
                        world,
                        ..LaunchParams::all_reduce(elements)
                    };
                    stream
                        .launch_loaded(&kernel, Geometry::new(3, 128).unwrap(), &params.to_bytes())
                        .unwrap();
                    let mut sum = vec![0_u8; bytes];
                    stream.synchronize_within(Duration::from_secs(30)).unwrap();
                    stream.read(&output, 0, &mut sum).unwrap();
                    assert!(
                        sum == expected[first..first + bytes],
                        "{} at {world} ranks, {elements} elements: rank {rank}'s slice differs \
                         from the reference sum",
                        spec.name
                    );
                    checked += 1;
                }
                assert_eq!(scratch.len_bytes(), slot * world as usize);
            }
        }
    }
    eprintln!("{checked} slices summed in rank order, each the reference sum");
}

/// The TP2 ladder with the rank-order profile in every bucket, at two ranks; the shipped
/// `h200_nvlink_tp<N>` ladder (which has it) at more.
fn rank_order_package(world: usize) -> (tempfile::TempDir, tempfile::TempDir, std::path::PathBuf) {
    let file = if world == 2 {
        ladder("h200_nvlink_tp2.json")
    } else {
        ladder(&h200_ladder(world))
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    value.as_object_mut().unwrap().remove("$schema");
    if world == 2 {
        value["name"] = "h200_nvlink_tp2_rank_order".into();
        value["profiles"].as_array_mut().unwrap().push(
            serde_json::json!({"id": "nccl_rank_order", "algorithm": "nccl", "order": "rank"}),
        );
        for bucket in value["buckets"].as_array_mut().unwrap() {
            bucket["candidates"]
                .as_array_mut()
                .unwrap()
                .push("nccl_rank_order".into());
        }
    }
    let (ladder_dir, written) = written_ladder(
        "rank_order.json",
        serde_json::to_vec_pretty(&value).unwrap(),
    );
    let (package_dir, package) = export_file(&written);
    (ladder_dir, package_dir, package)
}

/// `prepare check`'s lines of rank `rank` that qualify `nccl_rank_order` exact, one a bucket.
fn exact_lines(lines: &[String], rank: Option<u32>) -> usize {
    let prefix = rank.map_or_else(String::new, |rank| format!("[rank {rank}] "));
    lines
        .iter()
        .filter(|line| {
            line.starts_with(&format!("{prefix}bucket"))
                && line.contains(" nccl_rank_order ")
                && line.ends_with(" exact")
        })
        .count()
}

#[test]
#[ignore = "needs GPUs"]
fn the_exact_nccl_path_is_exact_in_every_bucket_on_one_host_and_between_hosts() {
    let world = require_world!();
    let (_ladder_dir, _package_dir, package) = rank_order_package(world);
    let buckets = prepare::package::open_package(&package)
        .unwrap()
        .ladder()
        .buckets
        .len();
    // One host: beside the custom kernels, in graphs at three sizes and in the sequence.
    let output = check_on_gpus(world, &package, 60, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", printed(&output));
    assert!(output.status.success(), "prepare check failed");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    for rank in 0..world as u32 {
        assert_eq!(exact_lines(&lines, Some(rank)), buckets, "rank {rank}");
    }
    // Every rank on a host of its own: no peer memory, only NCCL, and the path stays exact.
    let port = free_port();
    let args = ["--timeout", "60", "--package", package.to_str().unwrap()];
    let ranks: Vec<_> = (0..world as u32)
        .map(|rank| start_rank_of(world, "check", rank, port, &format!("host-{rank}"), &args))
        .collect();
    for (rank, started) in ranks.into_iter().enumerate() {
        let (code, lines, _) = started.finish(Duration::from_secs(300));
        assert_eq!(code, Some(0), "rank {rank}: {lines:#?}");
        assert_eq!(
            exact_lines(&lines, None),
            buckets,
            "rank {rank}: {lines:#?}"
        );
        assert!(
            lines
                .iter()
                .any(|line| line.contains("dropped: no peer access")),
            "rank {rank}: {lines:#?}"
        );
    }
}
