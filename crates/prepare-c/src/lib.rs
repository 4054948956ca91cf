//! The C ABI of `prepare`'s serving handle ([`prepare::serve::Handle`]): what a C or C++
//! server, and the Python package, call. An opaque [`PrepareHandle`]; every call returns a
//! [`PrepareStatus`] and leaves a message for [`prepare_last_error`] when it fails; no panic
//! crosses the boundary (each body runs under `catch_unwind` and a caught panic is
//! [`PrepareStatus::Internal`]). Nothing here needs a GPU to load: the driver and NCCL are
//! opened on first use, and their absence is an error status, never a crash.
//!
//! `include/prepare.h` is generated from this file by cbindgen; a test fails when it is stale.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Duration;

use prepare::gpu::abort::{Abort, AbortReason};
use prepare::gpu::driver::DeviceMemory as _;
use prepare::gpu::nccl::Communicator;
use prepare::ladder::Dtype;
use prepare::launch::RankEnvironment;
use prepare::package::{open_package_retrying, Package};
use prepare::runtime::RuntimeError;
use prepare::runtime::{RankSetup, Rendezvous};
use prepare::select::SelectError;
use prepare::select::SelectOptions;
use prepare::serve::{environment_defaults, gpu_for_rank, Handle, ServeError};
use prepare::tune::choice::Tuning;

/// Bytes in an NCCL unique id ([`prepare_unique_id`], [`prepare_open_unique_id`]).
pub const PREPARE_UNIQUE_ID_BYTES: usize = 128;

/// What every call returns; 0 is success. The message of a failure is [`prepare_last_error`].
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareStatus {
    /// Success.
    Ok = 0,
    /// An argument is invalid: null, out of range, not of this GPU, a dtype no package holds,
    /// a missing torchrun variable.
    InvalidArgument = 1,
    /// A package or its ladder was refused: unreadable, tampered, invalid, for another GPU or
    /// world size. The message names the file.
    PackageRefused = 2,
    /// A peer did not take part before the deadline (bootstrap, agreement, or a kernel's wait;
    /// the message names the peer where it is known). The handle cannot be used again.
    PeerTimeout = 3,
    /// The driver, NCCL or a kernel failed (including: no driver or no NCCL on this machine).
    RuntimeFailure = 4,
    /// A bug in this library (a panic was caught at the boundary).
    Internal = 5,
}

/// Element types; a handle serves those its packages hold (one package per dtype).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareDtype {
    /// bfloat16.
    Bf16 = 0,
    /// IEEE half precision.
    Fp16 = 1,
    /// IEEE single precision.
    Fp32 = 2,
}

/// How start-up chooses each bucket's kernel.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareTuning {
    /// Use the cache, or check and time the candidates on this machine.
    Runtime = 0,
    /// Each bucket's default; nothing is timed.
    Static = 1,
}

/// How a handle starts. Fill it with [`prepare_options_init`], then set the packages.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PrepareOptions {
    /// Package directories, one per dtype served (UTF-8 or raw bytes, NUL-terminated).
    pub packages: *const *const c_char,
    /// Entries in `packages`; at least 1.
    pub package_count: usize,
    /// The choice cache: NULL for the default (`$XDG_CACHE_HOME/prepare`, else
    /// `~/.cache/prepare`), "" for no cache.
    pub cache_dir: *const c_char,
    /// Bounds the bootstrap, every agreement and every kernel's wait for a peer; above 0.
    pub timeout_seconds: f64,
    /// A [`PrepareTuning`] value.
    pub tuning: i32,
    /// Non-zero: time again even when the cache holds a choice.
    pub retune: i32,
}

/// A rank's serving handle (opaque). Use it from one thread at a time; every rank must call
/// the all-reduces in the same order.
#[derive(Debug)]
pub struct PrepareHandle {
    handle: Handle,
}

/// A failure on its way to the caller: a status and its message.
#[derive(Debug)]
struct Failure {
    status: PrepareStatus,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: PrepareStatus::InvalidArgument,
            message: message.into(),
        }
    }
}

impl From<ServeError> for Failure {
    fn from(error: ServeError) -> Failure {
        Failure {
            status: status(&error),
            message: chain(&error),
        }
    }
}

/// The status a serving error is returned as.
fn status(error: &ServeError) -> PrepareStatus {
    match error {
        ServeError::NoPackage { .. }
        | ServeError::DtypeNotServed { .. }
        | ServeError::BadArgument { .. }
        | ServeError::CannotForce { .. }
        | ServeError::MessageTooLarge { .. } => PrepareStatus::InvalidArgument,
        ServeError::DuplicateDtype { .. } | ServeError::WorldSize { .. } => {
            PrepareStatus::PackageRefused
        }
        ServeError::PeerTimeout { .. } => PrepareStatus::PeerTimeout,
        ServeError::Runtime(error) | ServeError::Select(SelectError::Runtime(error)) => {
            runtime_status(error)
        }
        ServeError::Select(_) | ServeError::Aborted { .. } => PrepareStatus::RuntimeFailure,
    }
}

fn runtime_status(error: &RuntimeError) -> PrepareStatus {
    match error {
        RuntimeError::Timeout { .. }
        | RuntimeError::Aborted {
            abort:
                Abort {
                    reason: AbortReason::PeerTimeout,
                    ..
                },
            ..
        } => PrepareStatus::PeerTimeout,
        RuntimeError::WrongArchitecture { .. } => PrepareStatus::PackageRefused,
        _ => PrepareStatus::RuntimeFailure,
    }
}

/// An error and its sources, joined with ": ".
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a panic without a message"
    }
}

/// Runs a call's body: its failure or a caught panic becomes a status and the last error.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> PrepareStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => PrepareStatus::Ok,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.status
        }
        Err(payload) => {
            set_last_error(&format!(
                "internal error in prepare (please report it): {}",
                panic_message(payload.as_ref())
            ));
            PrepareStatus::Internal
        }
    }
}

/// The one place C dtype codes become the library's dtypes.
fn dtype(code: i32) -> Result<Dtype, Failure> {
    const DTYPES: [(i32, Dtype); 3] = [
        (PrepareDtype::Bf16 as i32, Dtype::Bf16),
        (PrepareDtype::Fp16 as i32, Dtype::Fp16),
        (PrepareDtype::Fp32 as i32, Dtype::Fp32),
    ];
    DTYPES
        .iter()
        .find(|(known, _)| *known == code)
        .map(|(_, dtype)| *dtype)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "dtype {code} is not a PrepareDtype (0 bf16, 1 fp16, 2 fp32)"
            ))
        })
}

/// A non-null pointer's target, or InvalidArgument naming the argument.
///
/// # Safety
/// `pointer` is null or points to a live `T` for `'a`.
unsafe fn reference<'a, T>(pointer: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises a null or live pointer; null is refused by `as_ref`.
    unsafe { pointer.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// A C string's bytes, or InvalidArgument naming the argument.
///
/// # Safety
/// `text` is null or a NUL-terminated string live for `'a`.
unsafe fn c_str<'a>(text: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null (checked above) and NUL-terminated by the caller's promise.
    Ok(unsafe { CStr::from_ptr(text) })
}

/// Writes `value` through `out`, or InvalidArgument naming it when null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn write<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null (checked above) and writable by the caller's promise.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` with its NUL into `buffer` when it fits; always reports the size needed.
///
/// # Safety
/// `buffer` is null or valid for `capacity` bytes; `needed` is null or writable.
unsafe fn copy_out(
    text: &str,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> Result<(), Failure> {
    let size = text.len() + 1;
    if !needed.is_null() {
        // SAFETY: not null, and writable by the caller's promise.
        unsafe { needed.write(size) };
    }
    if buffer.is_null() {
        if needed.is_null() {
            return Err(Failure::invalid("buffer and needed are both NULL"));
        }
        return Ok(());
    }
    if capacity < size {
        return Err(Failure::invalid(format!(
            "the buffer holds {capacity} bytes, {size} are needed (with the NUL)"
        )));
    }
    // SAFETY: `buffer` holds at least `size` bytes (checked above) and does not overlap the
    // Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), text.len());
        buffer.add(text.len()).write(0);
    }
    Ok(())
}

/// What the options say, checked.
struct Start {
    packages: Vec<Package>,
    select: SelectOptions,
    timeout: Duration,
}

/// Reads and checks the options (InvalidArgument), then opens every package (PackageRefused).
///
/// # Safety
/// `options` is null or a live [`PrepareOptions`] whose pointers are null or valid as its
/// fields' documentation says.
unsafe fn start(options: *const PrepareOptions) -> Result<Start, Failure> {
    // SAFETY: the caller's promise.
    let options = unsafe { reference(options, "options") }?;
    if options.packages.is_null() || options.package_count == 0 {
        return Err(Failure::invalid(
            "options.packages is empty: give one package directory per dtype served",
        ));
    }
    if !(options.timeout_seconds.is_finite() && options.timeout_seconds > 0.0) {
        return Err(Failure::invalid(format!(
            "options.timeout_seconds is {}; it must be above 0",
            options.timeout_seconds
        )));
    }
    let timeout = Duration::try_from_secs_f64(options.timeout_seconds).map_err(|_| {
        Failure::invalid(format!(
            "options.timeout_seconds {} is too large",
            options.timeout_seconds
        ))
    })?;
    let tuning = match options.tuning {
        0 => Tuning::Runtime,
        1 => Tuning::Static,
        other => {
            return Err(Failure::invalid(format!(
                "options.tuning is {other}; it must be 0 (runtime) or 1 (static)"
            )))
        }
    };
    let mut select = SelectOptions {
        tuning,
        retune: options.retune != 0,
        ..SelectOptions::default()
    };
    if !options.cache_dir.is_null() {
        // SAFETY: not null, and NUL-terminated by the caller's promise.
        let dir = unsafe { c_str(options.cache_dir, "options.cache_dir") }?;
        select.cache_dir =
            (!dir.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(dir.to_bytes())));
    }
    // SAFETY: the caller promises `packages` holds `package_count` pointers.
    let paths = unsafe { std::slice::from_raw_parts(options.packages, options.package_count) };
    let mut packages = Vec::with_capacity(paths.len());
    for (index, &path) in paths.iter().enumerate() {
        // SAFETY: each entry is null or NUL-terminated by the caller's promise.
        let path = unsafe { c_str(path, &format!("options.packages[{index}]")) }?;
        let dir = PathBuf::from(OsStr::from_bytes(path.to_bytes()));
        let package = open_package_retrying(&dir).map_err(|error| {
            // Package errors name their file; the directory is added where one does not.
            let mut message = chain(&error);
            let named = dir.display().to_string();
            if !message.contains(&named) {
                message = format!("package {named}: {message}");
            }
            Failure {
                status: PrepareStatus::PackageRefused,
                message,
            }
        })?;
        packages.push(package);
    }
    Ok(Start {
        packages,
        select,
        timeout,
    })
}

fn check_world(rank: u32, world: u32) -> Result<(), Failure> {
    if world < 2 || rank >= world {
        return Err(Failure::invalid(format!(
            "rank {rank} of {world} ranks: a handle needs 2 or more ranks and a rank below the \
             world size"
        )));
    }
    Ok(())
}

fn gpu(device: i32) -> Result<usize, Failure> {
    usize::try_from(device)
        .map_err(|_| Failure::invalid(format!("device {device} is not a GPU ordinal")))
}

fn host() -> String {
    prepare::agree::host_identity(|name| std::env::var(name).ok())
}

/// Hands a new handle to the caller.
///
/// # Safety
/// `out` is null or writable.
unsafe fn hand_out(handle: Handle, out: *mut *mut PrepareHandle) -> Result<(), Failure> {
    let boxed = Box::into_raw(Box::new(PrepareHandle { handle }));
    // SAFETY: the caller's promise; on failure the box is taken back below.
    if let Err(failure) = unsafe { write(out, boxed, "out") } {
        // SAFETY: `boxed` came from Box::into_raw above and was handed to no one.
        drop(unsafe { Box::from_raw(boxed) });
        return Err(failure);
    }
    Ok(())
}

/// The handle behind a caller's pointer.
///
/// # Safety
/// `handle` is null or a live handle from one of the `prepare_open_*` calls.
unsafe fn handle<'a>(handle: *const PrepareHandle) -> Result<&'a Handle, Failure> {
    // SAFETY: the caller's promise.
    Ok(&unsafe { reference(handle, "handle") }?.handle)
}

/// The library's version, a static NUL-terminated string ("0.1.0").
#[no_mangle]
pub extern "C" fn prepare_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the most recent failed call on this thread ("" before any): valid until the
/// next failed call on this thread. Calls that succeed leave it as it was.
#[no_mangle]
pub extern "C" fn prepare_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Fills `options` with the defaults: no package, the default cache, a 60 s timeout,
/// runtime tuning, no retune.
///
/// # Safety
/// `options` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_options_init(options: *mut PrepareOptions) -> PrepareStatus {
    guard(|| {
        let defaults = PrepareOptions {
            packages: std::ptr::null(),
            package_count: 0,
            cache_dir: std::ptr::null(),
            timeout_seconds: 60.0,
            tuning: PrepareTuning::Runtime as i32,
            retune: 0,
        };
        // SAFETY: the caller's promise.
        unsafe { write(options, defaults, "options") }
    })
}

/// Makes an NCCL unique id into `out` (128 bytes), for [`prepare_open_unique_id`]: call it on
/// one rank and send the bytes to every rank. Needs NCCL (not a GPU).
///
/// # Safety
/// `out` is null or writable for 128 bytes.
#[no_mangle]
pub unsafe extern "C" fn prepare_unique_id(out: *mut u8) -> PrepareStatus {
    guard(|| {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let id = prepare::serve::unique_id()?;
        // SAFETY: `out` is not null and holds 128 bytes by the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), out, PREPARE_UNIQUE_ID_BYTES) };
        Ok(())
    })
}

/// Where a rank runs: its place in the world and its GPU.
#[derive(Debug, Clone, Copy)]
struct Place {
    rank: u32,
    world: u32,
    gpu: usize,
}

/// Starts the handle of one rank, splitting from `parent` when given (its rendezvous is then
/// unused), and writes it to `out`.
///
/// # Safety
/// `out` is null or writable.
unsafe fn open(
    start: &Start,
    place: Place,
    rendezvous: Rendezvous,
    parent: Option<Communicator>,
    out: *mut *mut PrepareHandle,
) -> Result<(), Failure> {
    let setup = RankSetup {
        rank: place.rank,
        world: place.world,
        gpu: place.gpu,
        timeout: start.timeout,
        rendezvous,
        host: host(),
    };
    let reporter = &prepare::progress::Silent;
    let handle = match parent {
        None => Handle::start(&setup, &start.packages, &start.select, reporter)?,
        Some(parent) => {
            Handle::start_from_parent(&setup, parent, &start.packages, &start.select, reporter)?
        }
    };
    // SAFETY: the caller's promise.
    unsafe { hand_out(handle, out) }
}

/// Starts a handle from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT; the GPU is LOCAL_RANK, or entry LOCAL_RANK of PREPARE_GPUS). The ranks meet
/// at MASTER_ADDR and PREPARE_PORT (default MASTER_PORT + 1). Collective: every rank calls it.
///
/// # Safety
/// `options` as documented on [`PrepareOptions`]; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_open_env(
    options: *const PrepareOptions,
    out: *mut *mut PrepareHandle,
) -> PrepareStatus {
    guard(|| {
        let lookup = |name: &str| std::env::var(name).ok();
        let environment = RankEnvironment::from_lookup(lookup)
            .map_err(|error| Failure::invalid(chain(&error)))?;
        let gpu = gpu_for_rank(&environment, std::env::var("PREPARE_GPUS").ok().as_deref())
            .map_err(|error| Failure::invalid(chain(&error)))?;
        check_world(environment.rank, environment.world_size)?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
        for (name, value) in environment_defaults(lookup) {
            std::env::set_var(name, value);
        }
        let place = Place {
            rank: environment.rank,
            world: environment.world_size,
            gpu,
        };
        // SAFETY: the caller's promise.
        unsafe { open(&start, place, Rendezvous::CommId, None, out) }
    })
}

/// Starts a handle from an NCCL unique id that one rank made ([`prepare_unique_id`]) and sent
/// to every rank: this process is `rank` of `world` and drives GPU `device`. Collective.
///
/// # Safety
/// `options` as documented on [`PrepareOptions`]; `unique_id` is null or 128 readable bytes;
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_open_unique_id(
    options: *const PrepareOptions,
    unique_id: *const u8,
    rank: u32,
    world: u32,
    device: i32,
    out: *mut *mut PrepareHandle,
) -> PrepareStatus {
    guard(|| {
        if unique_id.is_null() {
            return Err(Failure::invalid("unique_id is NULL"));
        }
        let mut id = Box::new([0_u8; PREPARE_UNIQUE_ID_BYTES]);
        // SAFETY: not null, and 128 readable bytes by the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(unique_id, id.as_mut_ptr(), id.len()) };
        check_world(rank, world)?;
        let gpu = gpu(device)?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
        let place = Place { rank, world, gpu };
        // SAFETY: the caller's promise.
        unsafe { open(&start, place, Rendezvous::UniqueId(id), None, out) }
    })
}

/// Starts a handle by splitting the caller's own NCCL communicator (`ncclComm_t`) of `rank`
/// of `world` ranks on GPU `device`. The communicator must come from the same NCCL library
/// prepare loads (the one already loaded in the process is tried first), stay alive for as
/// long as the handle does, and not be used by another thread during this call. Non-zero
/// `nonblocking` says it was made with `config.blocking = 0`. Collective.
///
/// # Safety
/// As above; `options` as documented on [`PrepareOptions`]; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_open_comm(
    options: *const PrepareOptions,
    nccl_comm: *mut c_void,
    rank: u32,
    world: u32,
    device: i32,
    nonblocking: i32,
    out: *mut *mut PrepareHandle,
) -> PrepareStatus {
    guard(|| {
        if nccl_comm.is_null() {
            return Err(Failure::invalid("nccl_comm is NULL"));
        }
        check_world(rank, world)?;
        let gpu = gpu(device)?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
        // SAFETY: the caller promises a live communicator of this process for this rank and
        // world, kept alive and unused by other threads, as Communicator::adopt requires.
        let parent = unsafe { Communicator::adopt(nccl_comm, rank, world, nonblocking != 0) };
        let place = Place { rank, world, gpu };
        // SAFETY: the caller's promise.
        unsafe { open(&start, place, Rendezvous::CommId, Some(parent), out) }
    })
}

/// Enqueues the all-reduce (sum) of `count` elements of `dtype` from device memory `input`
/// into `output` (the same pointer for in place) on `stream` (a `cudaStream_t`; NULL for the
/// legacy default stream), with the agreed kernel for that size, or NCCL above the package's
/// largest bucket. It only enqueues, so it can be captured in the caller's CUDA graph. Input
/// in the zero-copy region ([`prepare_zero_copy_region`]) is reduced without any copy.
/// Every rank must make the same calls in the same order. A kernel that gave up waiting for a
/// peer makes the next call fail with [`PrepareStatus::PeerTimeout`].
///
/// # Safety
/// `handle` is a live handle; `input` and `output` are device memory of this rank's GPU of
/// `count` elements that stay allocated until the work has run (or while a graph holding it
/// is replayed); `stream` is a live stream of this GPU or NULL.
#[no_mangle]
pub unsafe extern "C" fn prepare_all_reduce(
    handle: *const PrepareHandle,
    input: *const c_void,
    output: *mut c_void,
    count: usize,
    dtype: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let handle = unsafe { self::handle(handle) }?;
        let dtype = self::dtype(dtype)?;
        if count > 0 && input.is_null() {
            return Err(Failure::invalid("input is NULL"));
        }
        if count > 0 && output.is_null() {
            return Err(Failure::invalid("output is NULL"));
        }
        // SAFETY: the caller promises a live stream (or NULL) and memory that outlives the
        // work; Handle::all_reduce checks both are of this GPU and large enough.
        unsafe { handle.all_reduce(input as u64, output as u64, count, dtype, stream as u64) }?;
        Ok(())
    })
}

/// Writes where a message of `bytes` of `dtype` goes ("one_shot_push (bucket 2)", or NCCL
/// above the ladder) into `buffer` as a NUL-terminated string. `*needed` (when not NULL)
/// receives the size needed, NUL included; a NULL `buffer` only asks for the size.
///
/// # Safety
/// `handle` is a live handle; `buffer` is null or writable for `capacity` bytes; `needed` is
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_route(
    handle: *const PrepareHandle,
    dtype: i32,
    bytes: u64,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let handle = unsafe { self::handle(handle) }?;
        let route = handle.route(self::dtype(dtype)?, bytes)?.to_string();
        // SAFETY: the caller's promise.
        unsafe { copy_out(&route, buffer, capacity, needed) }
    })
}

/// Writes the agreed choice for `dtype` (the choice file's JSON: per bucket its winner, every
/// candidate's figures or why it was excluded) into `buffer`, as [`prepare_route`] does.
///
/// # Safety
/// As [`prepare_route`].
#[no_mangle]
pub unsafe extern "C" fn prepare_choice_json(
    handle: *const PrepareHandle,
    dtype: i32,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let handle = unsafe { self::handle(handle) }?;
        let choice = handle.choice(self::dtype(dtype)?)?;
        let json = String::from_utf8(choice.to_bytes())
            .map_err(|_| Failure::invalid("the choice is not UTF-8"))?;
        // SAFETY: the caller's promise.
        unsafe { copy_out(&json, buffer, capacity, needed) }
    })
}

/// Sets `*served` to 1 when a package of the handle holds `dtype`, else 0.
///
/// # Safety
/// `handle` is a live handle; `served` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_serves(
    handle: *const PrepareHandle,
    dtype: i32,
    served: *mut i32,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let handle = unsafe { self::handle(handle) }?;
        let dtype = self::dtype(dtype)?;
        let served_now = handle.dtypes().any(|held| held == dtype);
        // SAFETY: the caller's promise.
        unsafe { write(served, i32::from(served_now), "served") }
    })
}

/// The zero-copy region of the `dtype` package: this rank's peer-visible memory. A message
/// whose input starts at `*address` is all-reduced without any copy; the region holds one
/// message at a time, of at most `*bytes`. `*address` is NULL and `*bytes` 0 when only NCCL
/// runs (then any memory is as good). The region lives as long as the handle.
///
/// # Safety
/// `handle` is a live handle; `address` and `bytes` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_zero_copy_region(
    handle: *const PrepareHandle,
    dtype: i32,
    address: *mut *mut c_void,
    bytes: *mut usize,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let handle = unsafe { self::handle(handle) }?;
        let region = handle.zero_copy_region(self::dtype(dtype)?)?;
        let (start, length) =
            region.map_or((0, 0), |region| (region.address(), region.len_bytes()));
        if address.is_null() || bytes.is_null() {
            return Err(Failure::invalid("address or bytes is NULL"));
        }
        // SAFETY: both checked not null above; writable by the caller's promise.
        unsafe {
            address.write(start as *mut c_void);
            bytes.write(length);
        }
        Ok(())
    })
}

/// Routes bucket `bucket` of the `dtype` package to candidate `profile` instead of its agreed
/// winner: the override tests and comparisons use to run one candidate. Every rank must force
/// the same before the all-reduces it affects. A candidate dropped on this machine cannot be
/// forced (InvalidArgument, with the reason).
///
/// # Safety
/// `handle` is a live handle used by no other thread; `profile` is null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn prepare_force(
    handle: *mut PrepareHandle,
    dtype: i32,
    bucket: usize,
    profile: *const c_char,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller promises a live handle no other thread uses.
        let handle =
            unsafe { handle.as_mut() }.ok_or_else(|| Failure::invalid("handle is NULL"))?;
        // SAFETY: the caller's promise.
        let profile = unsafe { c_str(profile, "profile") }?
            .to_str()
            .map_err(|_| Failure::invalid("profile is not UTF-8"))?;
        handle.handle.force(self::dtype(dtype)?, bucket, profile)?;
        Ok(())
    })
}

/// Reads every package's abort word now: [`PrepareStatus::PeerTimeout`], naming the peer,
/// when a kernel gave up waiting for one (the handle is then unusable; every rank must start
/// a new one). Waits only for a small copy, not for the caller's streams.
///
/// # Safety
/// `handle` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn prepare_check(handle: *const PrepareHandle) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        unsafe { self::handle(handle) }?.check()?;
        Ok(())
    })
}

/// Destroys a handle: its kernels, peer memory and communicators (not a communicator the
/// caller handed over). NULL is accepted and does nothing. Work it enqueued must have run,
/// and graphs that captured it must not be replayed again.
///
/// # Safety
/// `handle` is null or a live handle, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn prepare_close(handle: *mut PrepareHandle) -> PrepareStatus {
    guard(|| {
        if !handle.is_null() {
            // SAFETY: a live handle from Box::into_raw (hand_out), given back once.
            drop(unsafe { Box::from_raw(handle) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: prepare_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(prepare_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, PrepareStatus::Internal);
        assert!(last_error().contains("boom"), "{}", last_error());
    }

    #[test]
    fn dtypes_map_in_one_place() {
        assert_eq!(dtype(0).unwrap(), Dtype::Bf16);
        assert_eq!(dtype(1).unwrap(), Dtype::Fp16);
        assert_eq!(dtype(2).unwrap(), Dtype::Fp32);
        let failure = dtype(7).unwrap_err();
        assert_eq!(failure.status, PrepareStatus::InvalidArgument);
        assert!(failure.message.contains("dtype 7"));
    }

    #[test]
    fn copy_out_reports_the_size_and_refuses_a_short_buffer() {
        let mut needed = 0;
        // SAFETY: a null buffer and a live `needed`.
        let asked = unsafe { copy_out("abc", std::ptr::null_mut(), 0, &raw mut needed) };
        assert!(asked.is_ok());
        assert_eq!(needed, 4);
        let mut short = [0 as c_char; 3];
        // SAFETY: a live buffer of 3 bytes.
        let failure = unsafe { copy_out("abc", short.as_mut_ptr(), short.len(), &raw mut needed) }
            .unwrap_err();
        assert!(
            failure.message.contains("4 are needed"),
            "{}",
            failure.message
        );
        let mut room = [1 as c_char; 4];
        // SAFETY: a live buffer of 4 bytes.
        unsafe { copy_out("abc", room.as_mut_ptr(), room.len(), std::ptr::null_mut()) }.unwrap();
        // SAFETY: copy_out wrote a NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(room.as_ptr()) }.to_bytes(), b"abc");
    }
}
