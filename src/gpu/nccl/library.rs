//! Finding and opening NCCL. cudarc's loader opens only `libnccl.so` by name and panics when it
//! is missing, while PyTorch's `nvidia-nccl-cu*` wheels and distributions ship `libnccl.so.2`,
//! outside the loader path. So this module finds the library itself, opens it once for the
//! process, binds the entry points the communicator code calls and turns their results into
//! errors; cudarc's `nccl::sys` gives only the types.
//!
//! The order: an NCCL already loaded in this process (inside PyTorch, so a communicator a
//! server hands over belongs to the same library), `PREPARE_NCCL`, a Python environment's wheel,
//! the loader's own search.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::nccl::sys;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use nix::libc;

use super::error::{NcclError, MIN_VERSION, OVERRIDE_VARIABLE};
use crate::gpu::search::{self, library_api};

/// Library file names, preferred first.
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where wheels put the library inside site-packages.
const WHEEL_DIRECTORIES: [&str; 2] = ["nvidia/nccl/lib", "nvidia/cu13/lib"];

/// How the library in use was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Found {
    /// It was already loaded in this process (by PyTorch or the server).
    InProcess,
    /// `PREPARE_NCCL` named it.
    Override,
    /// A Python environment's `nvidia-nccl-cu*` wheel.
    PythonEnvironment,
    /// The dynamic loader's own search (`LD_LIBRARY_PATH`, `ld.so.cache`).
    LoaderPath,
}

impl std::fmt::Display for Found {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Found::InProcess => "already loaded in this process",
            Found::Override => OVERRIDE_VARIABLE,
            Found::PythonEnvironment => "a Python environment's NCCL wheel",
            Found::LoaderPath => "the loader path",
        })
    }
}

/// The NCCL library this process uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryInfo {
    /// The file (the loader's name for it when the loader found it and cannot say more).
    pub path: PathBuf,
    /// How it was found.
    pub found: Found,
    /// Its version (major, minor, patch).
    pub version: (u32, u32, u32),
}

/// A library to open, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    path: PathBuf,
    found: Found,
}

/// What the search asks of the process, apart from files: the one part tests replace.
trait Probe {
    /// The file of an NCCL already loaded in this process (its name when the file is unknown).
    fn loaded_in_process(&self) -> Option<PathBuf>;
    /// The Python environment prefixes to search, in order.
    fn python_prefixes(&self) -> Vec<PathBuf>;
    /// Whether the dynamic loader opens `name` by its own search.
    fn loader_opens(&self, name: &str) -> bool;
}

/// The search, in order; `variable` reads the environment. Files are probed on disk.
fn locate(
    variable: &dyn Fn(&str) -> Option<OsString>,
    probe: &dyn Probe,
) -> Result<Location, NcclError> {
    let mut looked = vec![format!(
        "libraries already loaded in this process ({})",
        LIBRARY_NAMES.join(", ")
    )];
    if let Some(path) = probe.loaded_in_process() {
        return Ok(Location {
            path,
            found: Found::InProcess,
        });
    }
    if let Some(path) = search::variable_path(variable, OVERRIDE_VARIABLE) {
        return locate_explicit(&path);
    }
    looked.push(format!("{OVERRIDE_VARIABLE} (not set)"));
    for prefix in probe.python_prefixes() {
        looked.push(search::describe_wheel_directories(
            &prefix,
            &WHEEL_DIRECTORIES,
        ));
        for directory in search::wheel_directories(&prefix, &WHEEL_DIRECTORIES) {
            if let Some(path) = search::first_file_in(&directory, &LIBRARY_NAMES) {
                return Ok(Location {
                    path,
                    found: Found::PythonEnvironment,
                });
            }
        }
    }
    looked.push(format!(
        "the loader path (LD_LIBRARY_PATH, ld.so.cache) for {}",
        LIBRARY_NAMES.join(", ")
    ));
    for name in LIBRARY_NAMES {
        if probe.loader_opens(name) {
            return Ok(Location {
                path: PathBuf::from(name),
                found: Found::LoaderPath,
            });
        }
    }
    Err(NcclError::NotFound { looked })
}

/// `PREPARE_NCCL`: a file, or a directory holding one of [`LIBRARY_NAMES`]. A wrong value is an
/// error, not a reason to look elsewhere.
fn locate_explicit(path: &Path) -> Result<Location, NcclError> {
    let problem = |problem: &str| NcclError::BadOverride {
        path: path.to_path_buf(),
        problem: problem.to_owned(),
    };
    let file = if path.is_file() {
        path.to_path_buf()
    } else if path.is_dir() {
        search::first_file_in(path, &LIBRARY_NAMES)
            .ok_or_else(|| problem("is a directory without libnccl.so.2 or libnccl.so"))?
    } else {
        return Err(problem("does not exist"));
    };
    Ok(Location {
        path: file,
        found: Found::Override,
    })
}

/// Library files named in `/proc/self/maps` text whose file name starts with `libnccl.so`, in
/// the order they first appear.
fn mapped_libraries(maps: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for line in maps.lines() {
        // address perms offset device inode path; the path may hold spaces.
        let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim_start) else {
            continue;
        };
        // A file replaced on disk since it was loaded cannot be opened by its name.
        if path.ends_with(" (deleted)") {
            continue;
        }
        let path = Path::new(path);
        let is_nccl = path.is_absolute()
            && path
                .file_name()
                .is_some_and(|name| name.as_bytes().starts_with(b"libnccl.so"));
        if is_nccl && !found.iter().any(|known: &PathBuf| known == path) {
            found.push(path.to_path_buf());
        }
    }
    found
}

/// The file of the loaded object that holds `address`, as the loader knows it.
fn object_file_of(address: *const c_void) -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the address (never dereferenced) and fills the live struct.
    let found = unsafe { libc::dladdr(address, &raw mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a non-null dli_fname is the loader's NUL-terminated name of an object that stays
    // loaded (the caller holds a handle to it); it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(OsStr::from_bytes(name.to_bytes()));
    path.is_absolute().then_some(path)
}

/// The process as it is.
struct Process;

impl Probe for Process {
    fn loaded_in_process(&self) -> Option<PathBuf> {
        // glibc matches these names against loaded objects' sonames too, so this finds a
        // library PyTorch loaded by absolute path.
        for name in LIBRARY_NAMES {
            // SAFETY: with RTLD_NOLOAD dlopen loads nothing and runs no initialiser; it only
            // returns another handle to an object already loaded.
            let Ok(library) = (unsafe { Library::open(Some(name), RTLD_NOW | libc::RTLD_NOLOAD) })
            else {
                continue;
            };
            // SAFETY: the symbol's address is only looked up, never called or read.
            let address = unsafe { library.get::<*const c_void>(b"ncclGetVersion\0") }
                .ok()
                .map(|symbol| *symbol);
            let file = address.and_then(object_file_of);
            return Some(file.unwrap_or_else(|| PathBuf::from(name)));
        }
        // A copy whose soname differs (a renamed build) is still visible in the mappings.
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        mapped_libraries(&maps).into_iter().next()
    }

    fn python_prefixes(&self) -> Vec<PathBuf> {
        search::python_prefixes_from_env()
    }

    fn loader_opens(&self, name: &str) -> bool {
        // SAFETY: loading NCCL runs only its initialisers, which have no preconditions.
        unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) }.is_ok()
    }
}

library_api! {
    /// The NCCL entry points the communicator code calls, with nccl.h's prototypes. Results are
    /// plain ints, so a code newer than cudarc's `ncclResult_t` cannot be an invalid enum value.
    pub(super) struct Api from Library {
        pub get_version: unsafe extern "C" fn(*mut c_int) -> c_int = "ncclGetVersion",
        pub get_unique_id: unsafe extern "C" fn(*mut sys::ncclUniqueId) -> c_int
            = "ncclGetUniqueId",
        pub comm_init_rank_config: unsafe extern "C" fn(
            *mut sys::ncclComm_t,
            c_int,
            sys::ncclUniqueId,
            c_int,
            *mut sys::ncclConfig_t,
        ) -> c_int = "ncclCommInitRankConfig",
        pub comm_split: unsafe extern "C" fn(
            sys::ncclComm_t,
            c_int,
            c_int,
            *mut sys::ncclComm_t,
            *mut sys::ncclConfig_t,
        ) -> c_int = "ncclCommSplit",
        pub comm_abort: unsafe extern "C" fn(sys::ncclComm_t) -> c_int = "ncclCommAbort",
        pub comm_get_async_error: unsafe extern "C" fn(sys::ncclComm_t, *mut c_int) -> c_int
            = "ncclCommGetAsyncError",
        pub get_error_string: unsafe extern "C" fn(c_int) -> *const c_char = "ncclGetErrorString",
        pub get_last_error: unsafe extern "C" fn(sys::ncclComm_t) -> *const c_char
            = "ncclGetLastError",
        pub all_reduce: unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            sys::ncclDataType_t,
            sys::ncclRedOp_t,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> c_int = "ncclAllReduce",
        pub all_gather: unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            sys::ncclDataType_t,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> c_int = "ncclAllGather",
        pub reduce_scatter: unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            sys::ncclDataType_t,
            sys::ncclRedOp_t,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> c_int = "ncclReduceScatter",
        pub send: unsafe extern "C" fn(
            *const c_void,
            usize,
            sys::ncclDataType_t,
            c_int,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> c_int = "ncclSend",
        pub recv: unsafe extern "C" fn(
            *mut c_void,
            usize,
            sys::ncclDataType_t,
            c_int,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> c_int = "ncclRecv",
        pub group_start: unsafe extern "C" fn() -> c_int = "ncclGroupStart",
        pub group_end: unsafe extern "C" fn() -> c_int = "ncclGroupEnd",
    }
}

library_api! {
    /// The entry points of symmetric windows (NCCL 2.27 and later), bound apart from [`Api`]: a
    /// library without them still runs everything else.
    pub(super) struct WindowApi from Library {
        pub mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int = "ncclMemAlloc",
        pub mem_free: unsafe extern "C" fn(*mut c_void) -> c_int = "ncclMemFree",
        pub window_register: unsafe extern "C" fn(
            sys::ncclComm_t,
            *mut c_void,
            usize,
            *mut *mut c_void,
            c_int,
        ) -> c_int = "ncclCommWindowRegister",
    }
}

/// The first NCCL with symmetric windows and the kernels that use them.
pub(super) const SYMMETRIC_MIN_VERSION: (u32, u32) = (2, 27);

/// The loaded library: kept for the life of the process.
pub(super) struct Nccl {
    pub api: Api,
    /// The symmetric-window entry points, or why the library has none.
    pub windows: Result<WindowApi, String>,
    pub info: LibraryInfo,
    _library: Library,
}

/// Why NCCL of `version` has no symmetric windows, or `None` when it is new enough.
fn symmetric_refusal(version: (u32, u32, u32)) -> Option<String> {
    let (major, minor, patch) = version;
    ((major, minor) < SYMMETRIC_MIN_VERSION).then(|| {
        format!(
            "NCCL {major}.{minor}.{patch} has no symmetric windows (ncclCommWindowRegister with \
             NCCL_WIN_COLL_SYMMETRIC needs {}.{} or later)",
            SYMMETRIC_MIN_VERSION.0, SYMMETRIC_MIN_VERSION.1
        )
    })
}

/// The symmetric-window entry points of a library of `version`, or why it has none.
fn bind_windows(library: &Library, version: (u32, u32, u32)) -> Result<WindowApi, String> {
    if let Some(refusal) = symmetric_refusal(version) {
        return Err(refusal);
    }
    let (major, minor, patch) = version;
    WindowApi::bind(library, |symbol, message| {
        format!("NCCL {major}.{minor}.{patch} has no {symbol} ({message})")
    })
}

/// Splits `ncclGetVersion`'s code (major x 10000 + minor x 100 + patch since 2.9).
pub(super) fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    (code / 10_000, code / 100 % 100, code % 100)
}

fn open(location: &Location) -> Result<Nccl, NcclError> {
    let path = location.path.as_path();
    // Never a second copy of one already loaded: the communicator a server hands over must
    // belong to the library that made it.
    let flags = if location.found == Found::InProcess {
        RTLD_NOW | RTLD_LOCAL | libc::RTLD_NOLOAD
    } else {
        RTLD_NOW | RTLD_LOCAL
    };
    // SAFETY: loading NCCL runs only its initialisers, which have no preconditions.
    let library = unsafe { Library::open(Some(path), flags) }.map_err(|error| NcclError::Open {
        path: path.to_path_buf(),
        message: error.to_string(),
    })?;
    let missing = |symbol, message| NcclError::Symbol {
        path: path.to_path_buf(),
        symbol,
        message,
    };
    let api = Api::bind(&library, missing)?;
    let mut code: c_int = 0;
    // SAFETY: ncclGetVersion writes one int through a pointer to a live local.
    let result = unsafe { (api.get_version)(&raw mut code) };
    let version = decode_version(code);
    if result != 0 || (version.0, version.1) < MIN_VERSION {
        return Err(NcclError::TooOld {
            path: path.to_path_buf(),
            version: if result == 0 {
                format!("{}.{}.{}", version.0, version.1, version.2)
            } else {
                format!("unknown (ncclGetVersion returned {result})")
            },
        });
    }
    let file = object_file_of(api.get_version as *const c_void).unwrap_or_else(|| path.into());
    Ok(Nccl {
        api,
        windows: bind_windows(&library, version),
        info: LibraryInfo {
            path: file,
            found: location.found,
            version,
        },
        _library: library,
    })
}

static LOADED: OnceLock<Nccl> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

/// NCCL, found and opened on the first call that succeeds; a failure is not remembered, so a
/// library installed meanwhile is found by the next call.
pub(super) fn load() -> Result<&'static Nccl, NcclError> {
    if let Some(nccl) = LOADED.get() {
        return Ok(nccl);
    }
    let _loading = LOADING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(nccl) = LOADED.get() {
        return Ok(nccl);
    }
    let location = locate(&|name| std::env::var_os(name), &Process)?;
    let nccl = open(&location)?;
    Ok(LOADED.get_or_init(|| nccl))
}

/// The entry points of the library in use, loading it on first use.
pub(super) fn api() -> Result<&'static Api, NcclError> {
    Ok(&load()?.api)
}

/// `ncclSuccess`.
pub(super) const SUCCESS: c_int = sys::ncclResult_t::ncclSuccess as c_int;

/// `ncclInProgress`: a nonblocking call has not finished yet.
pub(super) const IN_PROGRESS: c_int = sys::ncclResult_t::ncclInProgress as c_int;

/// NCCL's description of `result`, with the communicator's last error when it has one.
pub(super) fn error_message(api: &Api, result: c_int, comm: sys::ncclComm_t) -> String {
    // SAFETY: both functions return pointers to static or communicator-owned NUL-terminated
    // strings (or null), which are copied before any other NCCL call.
    unsafe {
        let describe = |pointer: *const std::ffi::c_char| {
            if pointer.is_null() {
                String::new()
            } else {
                CStr::from_ptr(pointer).to_string_lossy().into_owned()
            }
        };
        let general = describe((api.get_error_string)(result));
        let last = describe((api.get_last_error)(comm));
        if last.is_empty() {
            general
        } else {
            format!("{general} ({last})")
        }
    }
}

/// A call's result as this module's error, naming the call and the rank; in progress is not an
/// error.
pub(super) fn check(
    api: &Api,
    call: &'static str,
    rank: u32,
    result: c_int,
    comm: sys::ncclComm_t,
) -> Result<(), NcclError> {
    match result {
        SUCCESS | IN_PROGRESS => Ok(()),
        error => Err(NcclError::Call {
            call,
            rank,
            message: error_message(api, error, comm),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_windows_need_nccl_2_27() {
        let refusal = symmetric_refusal((2, 26, 6)).expect("2.26 is refused");
        assert!(
            refusal.starts_with("NCCL 2.26.6 has no symmetric windows"),
            "{refusal}"
        );
        assert!(refusal.contains("2.27 or later"), "{refusal}");
        assert_eq!(symmetric_refusal((2, 27, 3)), None);
        assert_eq!(symmetric_refusal((2, 28, 9)), None);
        assert_eq!(symmetric_refusal((3, 0, 0)), None);
    }
    use crate::gpu::search::directory_with;

    /// A process with an optional NCCL loaded, the given Python prefixes, and a loader that
    /// opens only `loader_has`.
    struct Fake {
        loaded: Option<PathBuf>,
        prefixes: Vec<PathBuf>,
        loader_has: Vec<&'static str>,
    }

    impl Probe for Fake {
        fn loaded_in_process(&self) -> Option<PathBuf> {
            self.loaded.clone()
        }
        fn python_prefixes(&self) -> Vec<PathBuf> {
            self.prefixes.clone()
        }
        fn loader_opens(&self, name: &str) -> bool {
            self.loader_has.contains(&name)
        }
    }

    /// A process without NCCL loaded, with the Python prefixes named under `root`, and a loader
    /// that opens only `loader_has`.
    fn process_under(root: &Path, prefixes: &[&str], loader_has: Vec<&'static str>) -> Fake {
        Fake {
            loaded: None,
            prefixes: prefixes.iter().map(|name| root.join(name)).collect(),
            loader_has,
        }
    }

    fn environment(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), value.as_os_str().to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    fn location(path: impl Into<PathBuf>, found: Found) -> Location {
        Location {
            path: path.into(),
            found,
        }
    }

    #[test]
    fn a_library_already_loaded_comes_before_everything_else() {
        let (root, _) =
            directory_with(["venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"]);
        let probe = Fake {
            loaded: Some(PathBuf::from("/torch/lib/libnccl.so.2")),
            ..process_under(root.path(), &["venv"], vec!["libnccl.so.2"])
        };
        let variable = environment(&[(OVERRIDE_VARIABLE, &root.path().join("nowhere"))]);
        assert_eq!(
            locate(&variable, &probe).unwrap(),
            location("/torch/lib/libnccl.so.2", Found::InProcess)
        );
    }

    #[test]
    fn the_override_comes_before_wheels_and_a_wrong_one_is_an_error() {
        let (root, [own, wheel]) = directory_with([
            "own/libnccl.so.2",
            "venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        ]);
        let probe = process_under(root.path(), &["venv"], vec!["libnccl.so.2"]);
        let found = |value: &Path| locate(&environment(&[(OVERRIDE_VARIABLE, value)]), &probe);
        assert_eq!(
            found(&root.path().join("own")).unwrap(),
            location(own.clone(), Found::Override)
        );
        assert_eq!(found(&own).unwrap(), location(own, Found::Override));
        let missing = found(&root.path().join("nowhere")).unwrap_err();
        assert!(
            matches!(missing, NcclError::BadOverride { .. }),
            "{missing}"
        );
        let empty_directory = found(&root.path().join("venv")).unwrap_err();
        assert!(
            matches!(empty_directory, NcclError::BadOverride { .. }),
            "{empty_directory}"
        );
        // An empty value is no override.
        assert_eq!(
            found(Path::new("")).unwrap(),
            location(wheel, Found::PythonEnvironment)
        );
    }

    #[test]
    fn the_wheel_of_the_first_environment_that_has_one_then_the_loader() {
        let (root, [_old, new, third]) = directory_with([
            "second/lib/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "second/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
            "third/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
        ]);
        let first = root.path().join("first");
        std::fs::create_dir_all(first.join("lib/python3.12/site-packages/nvidia")).unwrap();
        let found = |prefixes: &[&str], loader_has| {
            locate(
                &environment(&[]),
                &process_under(root.path(), prefixes, loader_has),
            )
        };
        assert_eq!(
            found(&["first", "second", "third"], vec![]).unwrap(),
            location(new, Found::PythonEnvironment)
        );
        assert_eq!(
            found(&["first", "third"], vec!["libnccl.so.2"]).unwrap(),
            location(third, Found::PythonEnvironment)
        );
        assert_eq!(
            found(&["first"], vec!["libnccl.so", "libnccl.so.2"]).unwrap(),
            location("libnccl.so.2", Found::LoaderPath)
        );
        assert_eq!(
            found(&["first"], vec!["libnccl.so"]).unwrap(),
            location("libnccl.so", Found::LoaderPath)
        );
    }

    #[test]
    fn an_unversioned_name_in_a_wheel_directory_is_taken_too() {
        let (root, [file]) =
            directory_with(["venv/lib/python3.13/site-packages/nvidia/cu13/lib/libnccl.so"]);
        let probe = process_under(root.path(), &["venv"], vec![]);
        assert_eq!(
            locate(&environment(&[]), &probe).unwrap(),
            location(file, Found::PythonEnvironment)
        );
    }

    #[test]
    fn nothing_found_lists_every_place_looked_and_how_to_get_nccl() {
        let root = tempfile::tempdir().unwrap();
        let probe = process_under(root.path(), &["venv", "usr"], vec![]);
        let error = locate(&environment(&[]), &probe).unwrap_err();
        let NcclError::NotFound { looked } = &error else {
            panic!("{error}");
        };
        assert_eq!(looked.len(), 5, "{looked:?}");
        let message = error
            .to_string()
            .replace(&root.path().display().to_string(), "<root>");
        insta::assert_snapshot!(message, @"NCCL (libnccl.so.2) was not found; install it with `pip install nvidia-nccl-cu13` (into the active virtual environment; PyTorch's CUDA 13 builds bring it), install a system package that provides libnccl.so.2, or set PREPARE_NCCL to the library or the directory holding it. Looked in: libraries already loaded in this process (libnccl.so.2, libnccl.so); PREPARE_NCCL (not set); <root>/venv/lib*/python3*/{site,dist}-packages/{nvidia/nccl/lib,nvidia/cu13/lib}; <root>/usr/lib*/python3*/{site,dist}-packages/{nvidia/nccl/lib,nvidia/cu13/lib}; the loader path (LD_LIBRARY_PATH, ld.so.cache) for libnccl.so.2, libnccl.so");
    }

    #[test]
    fn mapped_nccl_libraries_are_read_from_the_process_maps() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 1234                       /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f0000001000-7f0000002000 r-xp 00001000 08:01 1234                       /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f0000003000-7f0000004000 r--p 00000000 08:01 99                         /opt/my libs/libnccl.so.2.28.9
7f0000005000-7f0000006000 r--p 00000000 08:01 77                         /usr/lib/libnccl-net.so
7f0000006000-7f0000007000 rw-p 00000000 00:00 0                          [heap]
7f0000007000-7f0000008000 rw-p 00000000 00:00 0
7f0000008000-7f0000009000 r--p 00000000 08:01 55                         /usr/lib/libncclx.so
7f0000009000-7f000000a000 r--p 00000000 08:01 56                         /old/libnccl.so.2 (deleted)
";
        assert_eq!(
            mapped_libraries(maps),
            [
                PathBuf::from("/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"),
                PathBuf::from("/opt/my libs/libnccl.so.2.28.9"),
            ]
        );
    }

    #[test]
    fn version_codes() {
        assert_eq!(decode_version(22_809), (2, 28, 9));
        assert_eq!(decode_version(23_001), (2, 30, 1));
        assert!((2, 27) < MIN_VERSION);
    }

    /// Whatever this machine has, asking for NCCL answers and never panics.
    #[test]
    fn loading_answers_without_panicking() {
        match load() {
            Ok(nccl) => assert!((nccl.info.version.0, nccl.info.version.1) >= MIN_VERSION),
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
}
