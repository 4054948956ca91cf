//! Starting a rank from a launcher's variables leaves the process environment as it was: the
//! host's own later NCCL set-up (PyTorch's) reads the same variables. Without a driver the
//! start fails at the driver; with GPUs, rank 0 waits alone for its peer past a 1 s timeout;
//! either way every variable is what it was before, byte for byte.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::sync::Mutex;
use std::time::Duration;

use prepare::serve::{Options, Server};
use prepare_c::{
    prepare_open_env, prepare_options_init, PrepareHandle, PrepareOptions, PrepareStatus,
};

use crate::c_program::write_nccl_only;

/// The tests here change the launcher's variables of this process, one test at a time.
static ENVIRONMENT: Mutex<()> = Mutex::new(());

fn snapshot() -> BTreeMap<OsString, OsString> {
    std::env::vars_os().collect()
}

/// Runs `start` as rank 0 of 2 (MASTER_ADDR, MASTER_PORT set; NCCL_COMM_ID and
/// NCCL_RUNTIME_CONNECT as `preset` says) and checks that it failed and changed nothing.
fn leaves_the_environment_as_it_was(preset: &[(&str, &str)], start: impl Fn() -> String) {
    let _one = ENVIRONMENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let port = prepare::launch::free_port_pair().unwrap();
    let launcher = [
        ("RANK", "0".to_owned()),
        ("WORLD_SIZE", "2".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", port.to_string()),
    ];
    for (name, value) in &launcher {
        std::env::set_var(name, value);
    }
    for name in ["LOCAL_RANK", "PREPARE_GPUS", "PREPARE_PORT"] {
        std::env::remove_var(name);
    }
    for name in ["NCCL_COMM_ID", "NCCL_RUNTIME_CONNECT"] {
        match preset.iter().find(|(preset, _)| *preset == name) {
            Some((_, value)) => std::env::set_var(name, value),
            None => std::env::remove_var(name),
        }
    }
    let before = snapshot();
    let failure = start();
    let after = snapshot();
    for (name, _) in &launcher {
        std::env::remove_var(name);
    }
    for (name, _) in preset {
        std::env::remove_var(name);
    }
    let changed: Vec<_> = before
        .keys()
        .chain(after.keys())
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| (name, before.get(name), after.get(name)))
        .collect();
    assert!(
        changed.is_empty(),
        "the failed start ({failure}) changed the environment: {changed:?}"
    );
}

/// `prepare_open_env` with the package at `package`, which must fail; returns its message.
fn open_env(package: &std::path::Path) -> String {
    let path = CString::new(package.to_str().unwrap()).unwrap();
    let packages = [path.as_ptr()];
    let mut options = std::mem::MaybeUninit::<PrepareOptions>::uninit();
    // SAFETY: a writable options struct.
    let initialised = unsafe { prepare_options_init(options.as_mut_ptr()) };
    assert_eq!(initialised, PrepareStatus::Ok);
    // SAFETY: prepare_options_init filled it.
    let mut options = unsafe { options.assume_init() };
    options.packages = packages.as_ptr();
    options.package_count = 1;
    options.cache_dir = c"".as_ptr();
    options.timeout_seconds = 1.0;
    let mut handle: *mut PrepareHandle = std::ptr::null_mut();
    // SAFETY: the options' pointers live across the call; `handle` is writable.
    let status = unsafe { prepare_open_env(&raw const options, &raw mut handle) };
    // SAFETY: a NUL-terminated string the library keeps until the next failed call here.
    let message = unsafe { std::ffi::CStr::from_ptr(prepare_c::prepare_last_error()) }
        .to_string_lossy()
        .into_owned();
    assert!(
        matches!(
            status,
            PrepareStatus::RuntimeFailure | PrepareStatus::PeerTimeout
        ),
        "status {status:?}: {message}"
    );
    assert!(handle.is_null());
    message
}

#[test]
fn a_failed_prepare_open_env_leaves_the_environment_as_it_was() {
    let scratch = tempfile::tempdir().unwrap();
    let package = scratch.path().join("nccl_only");
    write_nccl_only(&package);
    leaves_the_environment_as_it_was(&[], || open_env(&package));
    leaves_the_environment_as_it_was(
        &[
            ("NCCL_COMM_ID", "127.0.0.1:1"),
            ("NCCL_RUNTIME_CONNECT", "1"),
        ],
        || open_env(&package),
    );
}

#[test]
fn a_failed_rust_server_start_leaves_the_environment_as_it_was() {
    let scratch = tempfile::tempdir().unwrap();
    let package_dir = scratch.path().join("nccl_only");
    write_nccl_only(&package_dir);
    let package = prepare::package::open_package_retrying(&package_dir).unwrap();
    let options = || Options {
        timeout: Duration::from_secs(1),
        cache_dir: None,
        ..Options::default()
    };
    leaves_the_environment_as_it_was(&[], || {
        let server = Server::from_env(options()).unwrap();
        server.runtime().unwrap_err().to_string()
    });
    leaves_the_environment_as_it_was(&[("NCCL_RUNTIME_CONNECT", "1")], || {
        let server = Server::from_env(options()).unwrap();
        server
            .start(std::slice::from_ref(&package))
            .unwrap_err()
            .to_string()
    });
}
