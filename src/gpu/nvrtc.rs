//! NVRTC, loaded at run time: finding the library where pip wheels, CUDA toolkits and the
//! dynamic loader keep it, and compiling one program into a cubin with its log.
//!
//! cudarc's NVRTC layer looks the library up by file name only and panics when none loads,
//! while the pip wheel's `libnvrtc.so.13` has to be opened by absolute path with its
//! `libnvrtc-builtins` preloaded (glibc then resolves the builtins' soname to the loaded copy).
//! So this module opens the library itself and binds the few entry points it needs.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

use super::search::{self, library_api};

/// What to tell someone without NVRTC.
const HOW_TO_GET: &str = "install it with `pip install nvidia-cuda-nvrtc==13.0.*` (into the \
     active virtual environment), install a CUDA 13 toolkit, or set PREPARE_NVRTC to the library \
     or the directory holding it";

/// The environment variable naming the library or its directory.
pub const OVERRIDE_VARIABLE: &str = "PREPARE_NVRTC";

/// Library file names, preferred first.
const LIBRARY_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Where wheels put the library inside site-packages (CUDA 13, then CUDA 12 layout).
const WHEEL_DIRECTORIES: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"];

/// `NVRTC_ERROR_COMPILATION` in nvrtc.h.
const ERROR_COMPILATION: c_int = 6;

/// Why NVRTC could not be loaded or could not compile.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// No library in any searched place.
    #[error("NVRTC (libnvrtc.so.13) was not found; {HOW_TO_GET}. Searched: {}", .searched.join("; "))]
    NotFound {
        /// The places searched, in order.
        searched: Vec<String>,
    },
    /// `PREPARE_NVRTC` is set but does not lead to a library.
    #[error("{OVERRIDE_VARIABLE} names {}, which {problem}; point it at libnvrtc.so.13 or the directory holding it", .path.display())]
    BadOverride {
        /// The value of the variable.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The library exists but the loader refused it.
    #[error("cannot load NVRTC from {}: {message}; {HOW_TO_GET}", .path.display())]
    Open {
        /// The file or name that was opened.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library lacks an entry point this module needs.
    #[error("NVRTC at {} has no {symbol} ({message}): it is too old; {HOW_TO_GET}", .path.display())]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
    /// An NVRTC call returned an error.
    #[error("{function} failed: {message} (NVRTC error {code})")]
    Call {
        /// The NVRTC function.
        function: &'static str,
        /// Its `nvrtcResult`.
        code: i32,
        /// NVRTC's description of the code.
        message: String,
    },
    /// The program did not compile; the log says why.
    #[error("NVRTC could not compile {program}:\n{log}")]
    Compilation {
        /// The program's name.
        program: String,
        /// NVRTC's log.
        log: String,
    },
    /// The compiled program has no cubin (it was compiled for a virtual architecture).
    #[error("NVRTC produced no cubin for {program}; compile for a real architecture (sm_XX)")]
    NoCubin {
        /// The program's name.
        program: String,
    },
    /// A text handed to NVRTC has a NUL byte.
    #[error("the {what} handed to NVRTC contains a NUL byte")]
    Nul {
        /// Which text.
        what: String,
    },
}

/// Where to look for NVRTC. [`NvrtcSearch::from_env`] fills it from the environment; tests
/// build it by hand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvrtcSearch {
    /// The library file or a directory holding it (`PREPARE_NVRTC`); when set, nothing else is
    /// searched, so a wrong value is an error rather than a silent fallback.
    pub explicit: Option<PathBuf>,
    /// Python environment prefixes whose `lib*/python3*/{site,dist}-packages` may hold the
    /// wheel: `VIRTUAL_ENV`, `CONDA_PREFIX`, the parent of each `PATH` directory with a
    /// `python3`, the `sys.prefix` that `python3` reports (pyenv and other shims), `~/.local`,
    /// `/usr/local`, `/usr`.
    pub python_prefixes: Vec<PathBuf>,
    /// CUDA toolkit roots whose `lib64` may hold the library: `CUDA_HOME`, `CUDA_PATH`,
    /// `/usr/local/cuda`.
    pub toolkit_roots: Vec<PathBuf>,
    /// Whether to try the dynamic loader's own search (`LD_LIBRARY_PATH`, `ld.so.cache`) last.
    pub loader_path: bool,
}

impl NvrtcSearch {
    /// The usual places, from this process's environment.
    pub fn from_env() -> NvrtcSearch {
        let variable = |name: &str| std::env::var_os(name);
        let mut toolkit_roots: Vec<PathBuf> = Vec::new();
        toolkit_roots.extend(search::variable_path(&variable, "CUDA_HOME"));
        toolkit_roots.extend(search::variable_path(&variable, "CUDA_PATH"));
        toolkit_roots.push(PathBuf::from("/usr/local/cuda"));
        NvrtcSearch {
            explicit: search::variable_path(&variable, OVERRIDE_VARIABLE),
            python_prefixes: search::python_prefixes_from_env(),
            toolkit_roots: search::deduplicated(toolkit_roots),
            loader_path: true,
        }
    }

    /// The library to open: the first existing candidate, or the loader's search by name.
    fn locate(&self) -> Result<Location, NvrtcError> {
        if let Some(path) = &self.explicit {
            return locate_explicit(path);
        }
        let mut searched = Vec::new();
        for prefix in &self.python_prefixes {
            searched.push(search::describe_wheel_directories(
                prefix,
                &WHEEL_DIRECTORIES,
            ));
            for directory in search::wheel_directories(prefix, &WHEEL_DIRECTORIES) {
                if let Some(file) = library_in(&directory) {
                    return Ok(Location::File(file));
                }
            }
        }
        for root in &self.toolkit_roots {
            let directory = root.join("lib64");
            searched.push(directory.display().to_string());
            if let Some(file) = library_in(&directory) {
                return Ok(Location::File(file));
            }
        }
        if self.loader_path {
            searched.push("the loader path (LD_LIBRARY_PATH, ld.so.cache)".to_owned());
            for name in LIBRARY_NAMES {
                // SAFETY: loading NVRTC runs only its initialisers, which have no preconditions.
                if let Ok(library) = unsafe { Library::new(name) } {
                    drop(library);
                    return Ok(Location::Name(name));
                }
            }
        }
        Err(NvrtcError::NotFound { searched })
    }
}

/// A library found by path, or by name through the loader's own search.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    File(PathBuf),
    Name(&'static str),
}

impl Location {
    fn path(&self) -> PathBuf {
        match self {
            Location::File(path) => path.clone(),
            Location::Name(name) => PathBuf::from(name),
        }
    }
}

fn locate_explicit(path: &Path) -> Result<Location, NvrtcError> {
    let problem = |problem: &str| NvrtcError::BadOverride {
        path: path.to_path_buf(),
        problem: problem.to_owned(),
    };
    if path.is_file() {
        Ok(Location::File(path.to_path_buf()))
    } else if path.is_dir() {
        library_in(path)
            .map(Location::File)
            .ok_or_else(|| problem("is a directory without libnvrtc.so.13, .so.12 or .so"))
    } else {
        Err(problem("does not exist"))
    }
}

fn library_in(directory: &Path) -> Option<PathBuf> {
    search::first_file_in(directory, &LIBRARY_NAMES)
}

/// The `libnvrtc-builtins` that belongs beside `library` (same version; the wheel's `.alt.`
/// variants are for another C++ runtime and are skipped).
fn builtins_beside(library: &Path) -> Option<PathBuf> {
    let version = library
        .file_name()?
        .to_string_lossy()
        .strip_prefix("libnvrtc.so")?
        .to_owned();
    let mut directories = vec![library.parent()?.to_path_buf()];
    if let Some(real) = std::fs::canonicalize(library)
        .ok()
        .and_then(|real| real.parent().map(Path::to_path_buf))
    {
        directories.push(real);
    }
    let wanted = format!("libnvrtc-builtins.so{version}");
    directories.iter().find_map(|directory| {
        search::entries_starting_with(directory, &wanted)
            .into_iter()
            .filter(|path| !path.to_string_lossy().contains(".alt."))
            .max()
    })
}

type ProgramHandle = *mut c_void;

library_api! {
    /// The NVRTC entry points used here, with the prototypes of nvrtc.h.
    struct Api from Library {
        version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int = "nvrtcVersion",
        get_error_string: unsafe extern "C" fn(c_int) -> *const c_char = "nvrtcGetErrorString",
        get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> c_int
            = "nvrtcGetNumSupportedArchs",
        get_supported_archs: unsafe extern "C" fn(*mut c_int) -> c_int = "nvrtcGetSupportedArchs",
        create_program: unsafe extern "C" fn(
            *mut ProgramHandle,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int = "nvrtcCreateProgram",
        destroy_program: unsafe extern "C" fn(*mut ProgramHandle) -> c_int = "nvrtcDestroyProgram",
        compile_program: unsafe extern "C" fn(ProgramHandle, c_int, *const *const c_char) -> c_int
            = "nvrtcCompileProgram",
        get_program_log_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> c_int
            = "nvrtcGetProgramLogSize",
        get_program_log: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> c_int
            = "nvrtcGetProgramLog",
        get_cubin_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> c_int
            = "nvrtcGetCUBINSize",
        get_cubin: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> c_int = "nvrtcGetCUBIN",
    }
}

impl Api {
    fn check(&self, function: &'static str, code: c_int) -> Result<(), NvrtcError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString takes any code and returns a static NUL-terminated string
        // (or null for codes it does not know).
        let text = unsafe { (self.get_error_string)(code) };
        let message = if text.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated and static, as above.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Err(NvrtcError::Call {
            function,
            code,
            message,
        })
    }
}

/// A loaded NVRTC library. Loaded libraries are kept for the life of the process.
pub struct Nvrtc {
    path: PathBuf,
    version: (u32, u32),
    api: Api,
    // The library before its builtins, so a drop would unload them in that order.
    _library: Library,
    _builtins: Option<Library>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Libraries loaded so far, by location.
static LOADED: Mutex<Vec<(Location, &'static Nvrtc)>> = Mutex::new(Vec::new());

impl Nvrtc {
    /// Loads NVRTC from the usual places ([`NvrtcSearch::from_env`]).
    pub fn load() -> Result<&'static Nvrtc, NvrtcError> {
        Nvrtc::load_from(&NvrtcSearch::from_env())
    }

    /// Loads NVRTC from the first place `search` finds it; a library loaded before is reused.
    pub fn load_from(search: &NvrtcSearch) -> Result<&'static Nvrtc, NvrtcError> {
        let location = search.locate()?;
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, nvrtc)) = loaded.iter().find(|(known, _)| *known == location) {
            return Ok(nvrtc);
        }
        let nvrtc: &'static Nvrtc = Box::leak(Box::new(Nvrtc::open(&location)?));
        loaded.push((location, nvrtc));
        Ok(nvrtc)
    }

    fn open(location: &Location) -> Result<Nvrtc, NvrtcError> {
        let path = location.path();
        let open = |path: &Path| {
            // SAFETY: loading NVRTC and its builtins runs only their initialisers, which have
            // no preconditions.
            unsafe { Library::new(path) }.map_err(|error| NvrtcError::Open {
                path: path.to_path_buf(),
                message: error.to_string(),
            })
        };
        // Preloaded by absolute path so that NVRTC's own load of the builtins by soname finds
        // this copy instead of searching the loader path, which does not include the wheel.
        let builtins = match location {
            Location::File(file) => builtins_beside(file)
                .map(|builtins| open(&builtins))
                .transpose()?,
            Location::Name(_) => None,
        };
        let library = open(&path)?;
        let missing = |symbol, message| NvrtcError::Symbol {
            path: path.clone(),
            symbol,
            message,
        };
        let api = Api::bind(&library, missing)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both pointers are to live c_ints, as nvrtcVersion requires.
        api.check("nvrtcVersion", unsafe {
            (api.version)(&raw mut major, &raw mut minor)
        })?;
        Ok(Nvrtc {
            path,
            version: (major.max(0) as u32, minor.max(0) as u32),
            api,
            _library: library,
            _builtins: builtins,
        })
    }

    /// The library file (or name, when the loader found it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// The real architectures this NVRTC compiles for, as numbers (90 for sm_90).
    pub fn supported_architectures(&self) -> Result<Vec<u32>, NvrtcError> {
        let mut count: c_int = 0;
        // SAFETY: a pointer to a live c_int, as nvrtcGetNumSupportedArchs requires.
        let code = unsafe { (self.api.get_num_supported_archs)(&raw mut count) };
        self.api.check("nvrtcGetNumSupportedArchs", code)?;
        let mut architectures: Vec<c_int> = vec![0; count.max(0) as usize];
        // SAFETY: the buffer holds the count NVRTC just reported.
        let code = unsafe { (self.api.get_supported_archs)(architectures.as_mut_ptr()) };
        self.api.check("nvrtcGetSupportedArchs", code)?;
        Ok(architectures
            .into_iter()
            .map(|architecture| architecture.max(0) as u32)
            .collect())
    }

    /// A program from `source`, named `name` in diagnostics, whose `#include "x"` lines are
    /// served from `headers` (include name, text).
    pub fn program(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
    ) -> Result<Program<'_>, NvrtcError> {
        let text = |what: &str, value: &str| {
            CString::new(value).map_err(|_| NvrtcError::Nul {
                what: what.to_owned(),
            })
        };
        let source_text = text(&format!("source of {name}"), source)?;
        let name_text = text("program name", name)?;
        let mut header_texts = Vec::with_capacity(headers.len());
        let mut header_names = Vec::with_capacity(headers.len());
        for (include, header) in headers {
            header_texts.push(text(&format!("header {include}"), header)?);
            header_names.push(text("header name", include)?);
        }
        let header_text_pointers: Vec<*const c_char> =
            header_texts.iter().map(|text| text.as_ptr()).collect();
        let header_name_pointers: Vec<*const c_char> =
            header_names.iter().map(|text| text.as_ptr()).collect();
        let mut handle: ProgramHandle = std::ptr::null_mut();
        // SAFETY: every pointer is to a NUL-terminated string alive for the call (NVRTC copies
        // them), the two arrays hold `headers.len()` entries, and `handle` is a live out-pointer.
        let code = unsafe {
            (self.api.create_program)(
                &raw mut handle,
                source_text.as_ptr(),
                name_text.as_ptr(),
                c_int::try_from(headers.len()).unwrap_or(c_int::MAX),
                header_text_pointers.as_ptr(),
                header_name_pointers.as_ptr(),
            )
        };
        self.api.check("nvrtcCreateProgram", code)?;
        Ok(Program {
            api: &self.api,
            handle,
            name: name.to_owned(),
        })
    }
}

/// One NVRTC program, destroyed on drop. Not shared between threads; NVRTC compiles distinct
/// programs on different threads concurrently.
pub struct Program<'nvrtc> {
    api: &'nvrtc Api,
    handle: ProgramHandle,
    name: String,
}

impl std::fmt::Debug for Program<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Program")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Program<'_> {
    /// Compiles with `options`; returns NVRTC's log (with `--ptxas-options=-v`, the resource
    /// usage). A compile error carries the log.
    pub fn compile(&mut self, options: &[String]) -> Result<String, NvrtcError> {
        let option_texts = options
            .iter()
            .map(|option| {
                CString::new(option.as_str()).map_err(|_| NvrtcError::Nul {
                    what: format!("option {option:?}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let pointers: Vec<*const c_char> = option_texts.iter().map(|text| text.as_ptr()).collect();
        // SAFETY: `handle` is a live program owned by `self`; the array holds `options.len()`
        // NUL-terminated strings alive for the call.
        let code = unsafe {
            (self.api.compile_program)(
                self.handle,
                c_int::try_from(pointers.len()).unwrap_or(c_int::MAX),
                pointers.as_ptr(),
            )
        };
        let log = self.log()?;
        if code == ERROR_COMPILATION {
            return Err(NvrtcError::Compilation {
                program: self.name.clone(),
                log,
            });
        }
        self.api.check("nvrtcCompileProgram", code)?;
        Ok(log)
    }

    /// The compile log.
    pub fn log(&self) -> Result<String, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: `handle` is live; `size` is a live out-pointer.
        let code = unsafe { (self.api.get_program_log_size)(self.handle, &raw mut size) };
        self.api.check("nvrtcGetProgramLogSize", code)?;
        let mut bytes = vec![0u8; size.max(1)];
        // SAFETY: the buffer has the size NVRTC reported (terminating NUL included).
        let code = unsafe { (self.api.get_program_log)(self.handle, bytes.as_mut_ptr().cast()) };
        self.api.check("nvrtcGetProgramLog", code)?;
        let end = bytes
            .iter()
            .position(|&byte| byte == 0)
            .unwrap_or(bytes.len());
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    /// The cubin of a compiled program.
    pub fn cubin(&self) -> Result<Vec<u8>, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: `handle` is live; `size` is a live out-pointer.
        let code = unsafe { (self.api.get_cubin_size)(self.handle, &raw mut size) };
        self.api.check("nvrtcGetCUBINSize", code)?;
        if size == 0 {
            return Err(NvrtcError::NoCubin {
                program: self.name.clone(),
            });
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: the buffer has the size NVRTC reported.
        let code = unsafe { (self.api.get_cubin)(self.handle, cubin.as_mut_ptr().cast()) };
        self.api.check("nvrtcGetCUBIN", code)?;
        Ok(cubin)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `handle` came from nvrtcCreateProgram and is destroyed once, here. A failure
        // leaks the program, which is all that can be done in a destructor.
        let _ = unsafe { (self.api.destroy_program)(&raw mut self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::search::directory_with;

    /// A search of the Python prefixes and CUDA toolkit roots named under `root`, not of the
    /// loader's path.
    fn search_under(root: &Path, python_prefixes: &[&str], toolkit_roots: &[&str]) -> NvrtcSearch {
        let under = |names: &[&str]| names.iter().map(|name| root.join(name)).collect();
        NvrtcSearch {
            python_prefixes: under(python_prefixes),
            toolkit_roots: under(toolkit_roots),
            ..NvrtcSearch::default()
        }
    }

    #[test]
    fn finds_the_wheel_under_a_virtual_environment_newest_python_first() {
        let (root, [_old, new]) = directory_with([
            "venv/lib/python3.10/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
            "venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
        ]);
        let search = search_under(root.path(), &["missing", "venv"], &[]);
        assert_eq!(search.locate().unwrap(), Location::File(new));
    }

    #[test]
    fn finds_the_cuda_12_wheel_and_the_toolkit() {
        let (root, [wheel, toolkit]) = directory_with([
            "local/lib/python3.11/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "cuda/lib64/libnvrtc.so.13",
        ]);
        let search = search_under(root.path(), &["local"], &["cuda"]);
        assert_eq!(search.locate().unwrap(), Location::File(wheel));
        let toolkit_only = search_under(root.path(), &[], &["cuda"]);
        assert_eq!(toolkit_only.locate().unwrap(), Location::File(toolkit));
    }

    #[test]
    fn explicit_directory_file_and_missing_path() {
        let (root, [file]) = directory_with(["lib/libnvrtc.so.13"]);
        let search = |explicit: PathBuf| NvrtcSearch {
            explicit: Some(explicit),
            loader_path: true,
            ..NvrtcSearch::default()
        };
        assert_eq!(
            search(root.path().join("lib")).locate().unwrap(),
            Location::File(file.clone())
        );
        assert_eq!(search(file.clone()).locate().unwrap(), Location::File(file));
        let missing = search(root.path().join("nowhere")).locate().unwrap_err();
        assert!(
            matches!(missing, NvrtcError::BadOverride { .. }),
            "{missing}"
        );
        let empty = search(root.path().to_path_buf()).locate().unwrap_err();
        assert!(matches!(empty, NvrtcError::BadOverride { .. }), "{empty}");
    }

    #[test]
    fn nothing_found_says_how_to_get_nvrtc_and_where_it_looked() {
        let root = tempfile::tempdir().unwrap();
        let search = search_under(root.path(), &["venv"], &["cuda"]);
        let message = search
            .locate()
            .unwrap_err()
            .to_string()
            .replace(&root.path().display().to_string(), "<root>");
        insta::assert_snapshot!(message, @"NVRTC (libnvrtc.so.13) was not found; install it with `pip install nvidia-cuda-nvrtc==13.0.*` (into the active virtual environment), install a CUDA 13 toolkit, or set PREPARE_NVRTC to the library or the directory holding it. Searched: <root>/venv/lib*/python3*/{site,dist}-packages/{nvidia/cu13/lib,nvidia/cuda_nvrtc/lib}; <root>/cuda/lib64");
    }

    #[test]
    fn builtins_of_the_same_version_and_not_the_alternative_runtime() {
        let (root, [library, ..]) = directory_with([
            "libnvrtc.so.13",
            "libnvrtc-builtins.alt.so.13.0",
            "libnvrtc-builtins.so.12.9",
            "libnvrtc-builtins.so.13.0",
        ]);
        assert_eq!(
            builtins_beside(&library),
            Some(root.path().join("libnvrtc-builtins.so.13.0"))
        );
        assert_eq!(builtins_beside(&root.path().join("libnvrtc.so.11")), None);
    }
}
