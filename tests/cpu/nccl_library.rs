//! How the tool finds NCCL, against stand-in libraries built here with the C compiler: the
//! entry points it binds, with canned answers, in a file whose soname is `libnccl.so.2`. Guards
//! that a library already loaded in the process (as PyTorch loads its wheel's, by absolute path)
//! is the one used, ahead of `PREPARE_NCCL`, and that a bad or too old library is a typed error.
//! One test, in a process of its own: NCCL is loaded once per process, so the steps depend on
//! their order, and the test sets `PREPARE_NCCL`.

use std::path::{Path, PathBuf};
use std::process::Command;

use prepare::gpu::nccl::{self, Found, NcclError, UniqueId};

use crate::support::process::in_own_process;
use crate::test_name;

/// A stand-in for NCCL reporting `version` (nccl.h's code), with the entry points the tool
/// binds; creating a communicator fails with `ncclInvalidArgument`.
fn stand_in_source(version: u32) -> String {
    format!(
        r#"
#include <stddef.h>
#include <string.h>
typedef struct {{ char internal[128]; }} ncclUniqueId;
int ncclGetVersion(int* version) {{ *version = {version}; return 0; }}
int ncclGetUniqueId(ncclUniqueId* id) {{ memset(id->internal, 7, 128); return 0; }}
int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, void* config) {{
    *comm = NULL; return 4; }}
int ncclCommSplit(void* comm, int color, int key, void** out, void* config) {{ return 5; }}
int ncclCommAbort(void* comm) {{ return 0; }}
int ncclCommGetAsyncError(void* comm, int* state) {{ *state = 0; return 0; }}
const char* ncclGetErrorString(int result) {{
    return result == 4 ? "stand-in: invalid argument" : "stand-in: other"; }}
const char* ncclGetLastError(void* comm) {{ return "no real NCCL here"; }}
int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {{ return 5; }}
int ncclAllGather(const void* s, void* r, size_t n, int t, void* c, void* st) {{ return 5; }}
int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, void* c, void* st) {{ return 5; }}
int ncclSend(const void* s, size_t n, int t, int peer, void* c, void* st) {{ return 5; }}
int ncclRecv(void* r, size_t n, int t, int peer, void* c, void* st) {{ return 5; }}
int ncclGroupStart(void) {{ return 0; }}
int ncclGroupEnd(void) {{ return 0; }}
"#
    )
}

/// Builds a stand-in as `directory/file_name` with the C compiler, which the test needs: without
/// one it fails rather than passing with nothing checked (Cargo links through `cc` anyway).
fn build_stand_in(directory: &Path, file_name: &str, version: u32) -> PathBuf {
    std::fs::create_dir_all(directory).unwrap();
    let source = directory.join(format!("{file_name}.c"));
    std::fs::write(&source, stand_in_source(version)).unwrap();
    let library = directory.join(file_name);
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .unwrap_or_else(|error| {
            panic!("this test needs a C compiler; running `{compiler}` failed: {error} (install cc or set CC)")
        });
    assert!(
        status.success(),
        "{compiler} failed on {}",
        source.display()
    );
    library
}

#[test]
// Preloading a library, as PyTorch does, is the unsafe step under test.
#[allow(unsafe_code)]
fn an_nccl_already_loaded_is_used_before_prepare_nccl_and_bad_libraries_are_typed_errors() {
    if !in_own_process(&test_name!(
        an_nccl_already_loaded_is_used_before_prepare_nccl_and_bad_libraries_are_typed_errors
    )) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let old = build_stand_in(&root.path().join("old"), "libnccl.so.2", 22_704);
    let torch = build_stand_in(&root.path().join("torch/lib"), "bundled_nccl.so", 29_901);

    // A library older than 2.28 is refused by name and version.
    std::env::set_var(nccl::OVERRIDE_VARIABLE, old.parent().unwrap());
    let error = nccl::version().unwrap_err();
    assert!(matches!(error, NcclError::TooOld { .. }), "{error}");
    assert!(error.to_string().contains("2.27.4"), "{error}");
    assert!(!nccl::is_available());

    // A wrong PREPARE_NCCL is an error, not a silent fallback.
    std::env::set_var(nccl::OVERRIDE_VARIABLE, root.path().join("nowhere"));
    let error = nccl::library().unwrap_err();
    assert!(matches!(error, NcclError::BadOverride { .. }), "{error}");
    assert_eq!(nccl::library_path(), None);

    // Loaded as PyTorch loads its wheel's: by absolute path, under a file name that is not
    // libnccl's, so only its soname can find it. PREPARE_NCCL still points nowhere.
    // SAFETY: the stand-in's only initialisers are the C runtime's; it stays loaded for the
    // rest of the process.
    let preloaded = unsafe { libloading::Library::new(&torch) }.unwrap();
    std::mem::forget(preloaded);
    let library = nccl::library().unwrap();
    assert_eq!(library.found, Found::InProcess);
    assert_eq!(library.path, torch);
    assert_eq!(library.version, (2, 99, 1));
    assert_eq!(nccl::version().unwrap(), (2, 99, 1));
    assert_eq!(nccl::library_path(), Some(torch.clone()));
    assert!(nccl::is_available());

    // Calls go to that library, and its error strings reach the typed error.
    let id = UniqueId::new().unwrap();
    assert_eq!(id.to_bytes(), [7; 128]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let error = nccl::Communicator::init(&id, 0, 2, deadline).unwrap_err();
    match &error {
        NcclError::Call { call, message, .. } => {
            assert_eq!(*call, "ncclCommInitRankConfig");
            assert_eq!(message, "stand-in: invalid argument (no real NCCL here)");
        }
        other => panic!("{other}"),
    }

    // Once loaded, the library stays the process's, whatever the environment says later.
    std::env::set_var(nccl::OVERRIDE_VARIABLE, old);
    assert_eq!(nccl::library_path(), Some(torch));
}
