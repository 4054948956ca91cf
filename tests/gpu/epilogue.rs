//! The handle's all-reduce + residual add + RMSNorm at two ranks: every candidate of the
//! separate-candidates package forced in turn, each shape with and without a residual and with
//! `normed` apart or over `x`, in a graph of the caller's, against `reference_epilogue` on every
//! rank (normed and the residual); a message above the ladder through NCCL then add_rms_norm;
//! then every refusal, with nothing enqueued.

use std::time::Duration;

use prepare::ladder::Dtype;
use prepare::reference::random_rank_inputs;

use super::support::{export_file, launch_on_two_gpus, require_gpus};

/// The package's path, in the environment of each rank's process.
const EPILOGUE_PACKAGE: &str = "PREPARE_TEST_EPILOGUE_PACKAGE";

/// One rank: serves the package and checks every candidate and shape, then the refusals.
fn serve_epilogue(package: &str) {
    use prepare::collective::EpilogueMessage;
    use prepare::gpu::driver::CallerMemory;
    use prepare::ladder::Collective;
    use prepare::reference::{reference_epilogue, EpilogueInputs};
    use prepare::serve::{Options, Server};
    use prepare::shape::Shape;

    let package = prepare::package::open_package_retrying(package.as_ref()).unwrap();
    let options = Options {
        timeout: Duration::from_secs(30),
        cache_dir: None,
        ..Options::default()
    };
    let mut handle = Server::from_env(options)
        .unwrap()
        .start(std::slice::from_ref(&package))
        .unwrap();
    let (rank, world) = (handle.rank(), handle.world());
    let device = handle.runtime().device().clone();
    let mut stream = device.new_stream().unwrap();
    let dtype = Dtype::Bf16;
    let size = 2_u64;
    let eps = 1e-5_f32;
    // (rows, hidden): inside the buckets, and one above the ladder (NCCL, then add_rms_norm).
    let shapes = [
        (1, 8),
        (3, 16),
        (2, 4096),
        (4, 7168),
        (1, 16384),
        (64, 8192),
        (80, 8192),
    ];
    let x_buffer = device.allocate(4 << 20).unwrap();
    let residual_buffer = device.allocate(4 << 20).unwrap();
    let weight_buffer = device.allocate(64 << 10).unwrap();
    let normed_buffer = device.allocate(4 << 20).unwrap();
    let ladder = package.ladder().clone();
    let mut checked = 0_u64;
    let mut forced = Vec::new();
    for (bucket, entry) in ladder.buckets.iter().enumerate() {
        for profile in &entry.candidates {
            forced.push((Some(bucket), profile.clone()));
        }
    }
    forced.push((None, "nccl".to_owned()));
    for (bucket, profile) in forced {
        if let Some(bucket) = bucket {
            handle
                .force(Collective::AllReduceAddRmsNorm, dtype, bucket, &profile)
                .unwrap();
        }
        for (rows, hidden) in shapes {
            let shape = Shape::new(rows, hidden).unwrap();
            let bytes = shape.elements() * size;
            if ladder.bucket_for(bytes) != bucket {
                continue;
            }
            for (with_residual, over_x) in [(true, false), (false, false), (true, true)] {
                checked += 1;
                let seed = rows * 131 + hidden + checked;
                let x = random_rank_inputs(dtype, seed, world as usize, shape.elements() as usize);
                let residual =
                    random_rank_inputs(dtype, seed + 1, 1, shape.elements() as usize).remove(0);
                let weight = random_rank_inputs(dtype, seed + 2, 1, hidden as usize).remove(0);
                let views: Vec<&[u8]> = x.iter().map(Vec::as_slice).collect();
                let inputs = EpilogueInputs {
                    residual: with_residual.then_some(&residual[..]),
                    weight: &weight,
                    eps,
                };
                let expected = reference_epilogue(dtype, shape, &views, &inputs).unwrap();
                let x_memory = CallerMemory::prefix(&x_buffer, bytes);
                let message = EpilogueMessage {
                    x: x_memory,
                    residual: with_residual.then(|| CallerMemory::prefix(&residual_buffer, bytes)),
                    weight: CallerMemory::prefix(&weight_buffer, hidden * size),
                    normed: if over_x {
                        x_memory
                    } else {
                        CallerMemory::prefix(&normed_buffer, bytes)
                    },
                    shape,
                    eps,
                };
                let graph = stream
                    .capture(|stream| {
                        handle
                            .all_reduce_add_rms_norm_on(stream, &message, dtype)
                            .map_err(anyhow::Error::from)
                    })
                    .unwrap();
                stream.write(&x_buffer, 0, &x[rank as usize]).unwrap();
                stream.write(&residual_buffer, 0, &residual).unwrap();
                stream.write(&weight_buffer, 0, &weight).unwrap();
                graph.launch().unwrap();
                stream.synchronize_within(Duration::from_secs(60)).unwrap();
                handle.check().unwrap();
                let what = format!(
                    "rank {rank}: {profile} in {bucket:?}, {rows} x {hidden}, residual \
                     {with_residual}, over x {over_x}"
                );
                let mut got = vec![0_u8; bytes as usize];
                stream.read(&message.normed, 0, &mut got).unwrap();
                let mine = &expected[rank as usize];
                assert!(
                    got == mine.normed,
                    "{what}: normed differs from the reference"
                );
                if with_residual {
                    stream.read(&residual_buffer, 0, &mut got).unwrap();
                    assert!(got == mine.residual_out, "{what}: the residual differs");
                }
                if !over_x {
                    stream.read(&x_buffer, 0, &mut got).unwrap();
                    assert!(got == x[rank as usize], "{what}: x changed");
                }
            }
        }
    }
    // Refusals, each before anything is enqueued.
    let shape = Shape::new(4, 16).unwrap();
    let good = EpilogueMessage {
        x: CallerMemory::prefix(&x_buffer, 128),
        residual: Some(CallerMemory::prefix(&residual_buffer, 128)),
        weight: CallerMemory::prefix(&weight_buffer, 32),
        normed: CallerMemory::prefix(&normed_buffer, 128),
        shape,
        eps,
    };
    let twelve = Shape::new(4, 12).unwrap();
    let refusals = [
        (
            EpilogueMessage {
                shape: twelve,
                x: CallerMemory::prefix(&x_buffer, 96),
                residual: Some(CallerMemory::prefix(&residual_buffer, 96)),
                weight: CallerMemory::prefix(&weight_buffer, 24),
                normed: CallerMemory::prefix(&normed_buffer, 96),
                ..good
            },
            "not a multiple of 8",
        ),
        (
            EpilogueMessage {
                weight: CallerMemory::prefix(&weight_buffer, 30),
                ..good
            },
            "the weight holds 30 bytes",
        ),
        (
            EpilogueMessage {
                residual: Some(CallerMemory::prefix(&residual_buffer, 64)),
                ..good
            },
            "the residual holds 64 bytes",
        ),
        (
            EpilogueMessage {
                eps: f32::NAN,
                ..good
            },
            "eps is NaN",
        ),
        (EpilogueMessage { eps: -1.0, ..good }, "eps is -1"),
        (
            EpilogueMessage {
                normed: CallerMemory::prefix(&residual_buffer, 128),
                ..good
            },
            "normed overlaps the residual",
        ),
    ];
    for (message, said) in refusals {
        let refused = handle
            .all_reduce_add_rms_norm_on(&stream, &message, dtype)
            .unwrap_err();
        assert!(refused.to_string().contains(said), "{said}: {refused}");
    }
    eprintln!("rank {rank}: {checked} served epilogues exact");
}

#[test]
#[ignore = "needs GPUs"]
fn the_handle_runs_the_epilogue_through_every_candidate_and_nccl_above_the_ladder_at_two_ranks() {
    if let Some(package) = std::env::var_os(EPILOGUE_PACKAGE) {
        serve_epilogue(&package.to_string_lossy());
        return;
    }
    require_gpus!(2);
    let fixture = crate::support::repository::root()
        .join("tests/fixtures/ladders/valid/epilogue_package.json");
    let (_package_dir, package) = export_file(&fixture);
    let (launched, lines) = launch_on_two_gpus(
        std::env::current_exe().unwrap(),
        crate::support::process::rerun(&crate::test_name!(
            the_handle_runs_the_epilogue_through_every_candidate_and_nccl_above_the_ladder_at_two_ranks
        ))
        .get_args()
        .map(Into::into)
        .collect(),
        vec![(EPILOGUE_PACKAGE.into(), package.into_os_string())],
    );
    launched.unwrap_or_else(|error| panic!("{error}: {lines:#?}"));
    for rank in 0..2 {
        assert!(
            lines.iter().any(
                |line| line.starts_with(&format!("[rank {rank}] rank {rank}: "))
                    && line.ends_with(" served epilogues exact")
            ),
            "{lines:#?}"
        );
    }
}

/// `prepare check` of an all-reduce + RMSNorm package at two ranks whose largest bucket holds
/// a fused and a separate custom candidate: above the ladder, a message of two pieces of whole
/// rows and three rows more through each, `normed` apart from `x` and over it, equals
/// `reference_epilogue` on every rank (`normed` and the overwritten residual), `x` kept.
#[test]
#[ignore = "needs GPUs"]
fn the_epilogue_above_the_ladder_is_exact_in_pieces_of_whole_rows_on_every_rank() {
    use super::support::{check_on_two_gpus, printed, written_ladder};
    require_gpus!(2);
    let fixture = crate::support::repository::root()
        .join("tests/fixtures/ladders/valid/epilogue_package.json");
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    value["profiles"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"id": "fused_two_shot", "algorithm": "rsag"}));
    let last = value["buckets"].as_array_mut().unwrap().last_mut().unwrap();
    last["candidates"]
        .as_array_mut()
        .unwrap()
        .insert(0, serde_json::json!("fused_two_shot"));
    let (_ladder_dir, written) = written_ladder(
        "epilogue_pieces.json",
        serde_json::to_vec_pretty(&value).unwrap(),
    );
    let (_package_dir, package) = export_file(&written);
    let output = check_on_two_gpus(&package, 60, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", printed(&output));
    assert!(output.status.success(), "prepare check failed");
    for rank in 0..2 {
        for profile in ["fused_two_shot", "rsag_push"] {
            let prefix = format!("[rank {rank}] {profile} in pieces, ");
            let suffix = " all_reduce_add_rms_norm, normed apart and over x: equals the \
                          epilogue's reference";
            assert!(
                stdout
                    .lines()
                    .any(|line| line.starts_with(&prefix) && line.ends_with(suffix)),
                "rank {rank}, {profile}: {stdout}"
            );
        }
    }
}
