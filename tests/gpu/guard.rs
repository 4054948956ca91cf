//! Guards GPU runs: with `PREPARE_REQUIRE_GPU=1` a run that finds no GPU, or fewer than the
//! world it chose with `PREPARE_TEST_WORLD`, fails here, so the ignored GPU tests can never pass
//! by skipping. Not ignored: it always asks the driver.

use prepare::gpu::driver::{visible_devices, DriverError};

use super::support::{chosen_world, gpu_required, parse_world, verdict};

#[test]
fn a_run_that_requires_gpus_finds_one() {
    let probe = visible_devices();
    let needed = chosen_world().unwrap_or(1);
    eprintln!("driver probe: {probe:?}; {needed} GPU(s) needed");
    if let Err(message) = verdict(gpu_required(), needed, &probe) {
        panic!("{message}");
    }
}

#[test]
fn the_test_world_is_2_4_or_8() {
    assert_eq!(parse_world(None), Ok(2));
    for world in ["2", "4", "8"] {
        assert_eq!(parse_world(Some(world)), Ok(world.parse().unwrap()));
    }
    insta::assert_snapshot!(
        ["3", "16", "0", "four", ""]
            .map(|value| parse_world(Some(value)).unwrap_err())
            .join("\n"),
        @r#"
        PREPARE_TEST_WORLD must be 2, 4 or 8, not "3"
        PREPARE_TEST_WORLD must be 2, 4 or 8, not "16"
        PREPARE_TEST_WORLD must be 2, 4 or 8, not "0"
        PREPARE_TEST_WORLD must be 2, 4 or 8, not "four"
        PREPARE_TEST_WORLD must be 2, 4 or 8, not ""
        "#
    );
}

#[test]
fn the_verdict_fails_only_required_runs_without_enough_gpus() {
    let missing = || Err(DriverError::LibraryMissing);
    assert_eq!(verdict(false, 1, &Ok(2)), Ok(true));
    assert_eq!(verdict(true, 2, &Ok(2)), Ok(true));
    assert_eq!(verdict(false, 2, &Ok(1)), Ok(false));
    assert_eq!(verdict(false, 1, &missing()), Ok(false));
    insta::assert_snapshot!(
        [
            verdict(true, 2, &Ok(1)).unwrap_err(),
            verdict(true, 1, &Ok(0)).unwrap_err(),
            verdict(true, 1, &missing()).unwrap_err(),
        ]
        .join("\n"),
        @r"
        PREPARE_REQUIRE_GPU=1 but the driver sees 1 GPU(s), 2 needed
        PREPARE_REQUIRE_GPU=1 but the driver sees 0 GPU(s), 1 needed
        PREPARE_REQUIRE_GPU=1 but no usable driver: the CUDA driver library (libcuda.so.1) could not be loaded: no NVIDIA driver is installed here, or it is not on the loader path
        "
    );
}
