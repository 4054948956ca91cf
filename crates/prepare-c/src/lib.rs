//! The C ABI of `prepare`'s serving handle ([`prepare::serve::Handle`]): what a C or C++
//! server, and the Python package, call. An opaque [`PrepareHandle`]; every call returns a
//! [`PrepareStatus`] and leaves a message for [`prepare_last_error`] when it fails; no panic
//! crosses the boundary (each body runs under `catch_unwind` and a caught panic is
//! [`PrepareStatus::Internal`]). Nothing here needs a GPU to load: the driver and NCCL are
//! opened on first use, and their absence is an error status, never a crash.
//!
//! The C header, `prepare.h`, is generated from this file by cbindgen when the crate builds
//! (`build.rs`), into `include/` beside the library: `target/<profile>/include/prepare.h`.

mod boundary;
mod epilogue;
mod rows;

use std::ffi::{c_char, c_void, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::time::Duration;

use prepare::gpu::driver::DeviceMemory as _;
use prepare::gpu::nccl::Communicator;
use prepare::ladder::{Collective, Dtype};
use prepare::launch::RankEnvironment;
use prepare::package::{open_package_retrying, Package};
use prepare::runtime::{timeout_from_seconds, RankSetup, Rendezvous, MAX_TIMEOUT};
use prepare::select::SelectOptions;
use prepare::serve::{gpu_for_rank, rendezvous_address, Handle};
use prepare::tune::choice::Tuning;

use boundary::{
    c_str, chain, collective, copy_out, dtype, guard, last_error, reference, write, Failure,
};
pub use epilogue::prepare_all_reduce_add_rms_norm;
pub use rows::{
    prepare_all_gather, prepare_all_gather_v, prepare_owned_rows, prepare_reduce_scatter,
    prepare_reduce_scatter_v,
};

/// The ABI this library offers ([`prepare_abi_version`]): raised whenever a call, a struct or
/// an enum changes, so a binding written for another refuses the library before any call. A
/// call added leaves it: a binding written before it never calls it, and one that calls it
/// fails to link or load against a library without it, naming the call.
/// 2: [`PrepareOptions::allow_inexact`].
pub const PREPARE_ABI_VERSION: u32 = 2;

/// Bytes in an NCCL unique id ([`prepare_unique_id`], [`prepare_open_unique_id`]).
pub const PREPARE_UNIQUE_ID_BYTES: usize = 128;

/// The most packages one handle takes ([`PrepareOptions::package_count`]): one per collective
/// and dtype is what a handle serves; a larger count is refused before anything is read.
pub const PREPARE_MAX_PACKAGES: usize = 64;

/// What every call returns; 0 is success. The message of a failure is [`prepare_last_error`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareStatus {
    /// Success.
    Ok = 0,
    /// An argument is invalid: null, out of range, not of this GPU, a collective and dtype no
    /// package holds, a missing torchrun variable.
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

/// Collectives; a handle serves those its packages hold (one package per collective and
/// dtype). Every collective's packages can be exported.
#[repr(C)]
#[derive(Debug)]
pub enum PrepareCollective {
    /// Every rank ends with the element-wise sum of every rank's input.
    AllReduce = 0,
    /// Every rank ends with the sum of its own run of whole rows.
    ReduceScatter = 1,
    /// Every rank ends with every rank's rows, in rank order.
    AllGather = 2,
    /// The all-reduce, then a residual added and an RMSNorm of every row.
    AllReduceAddRmsNorm = 3,
}

/// Element types; a handle serves those its packages hold (one package per collective and
/// dtype).
#[repr(C)]
#[derive(Debug)]
pub enum PrepareDtype {
    /// bfloat16.
    Bf16 = 0,
    /// IEEE half precision.
    Fp16 = 1,
    /// IEEE single precision.
    Fp32 = 2,
}

/// How start-up chooses each bucket's kernel.
#[repr(C)]
#[derive(Debug)]
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
    /// Package directories, one per collective and dtype served (UTF-8 or raw bytes, NUL-terminated).
    pub packages: *const *const c_char,
    /// Entries in `packages`; 1 to [`PREPARE_MAX_PACKAGES`].
    pub package_count: usize,
    /// The choice cache: NULL for the default (`$XDG_CACHE_HOME/prepare`, else
    /// `~/.cache/prepare`), "" for no cache.
    pub cache_dir: *const c_char,
    /// Bounds the bootstrap, every agreement and every kernel's wait for a peer; above 0 and
    /// at most 86400 (a day).
    pub timeout_seconds: f64,
    /// A [`PrepareTuning`] value.
    pub tuning: i32,
    /// Non-zero: time again even when the cache holds a choice.
    pub retune: i32,
    /// 0 (the default): only candidates whose output equals the reference sum are timed,
    /// chosen or forced. 1: candidates that differ from it (plain NCCL beyond two ranks) are
    /// kept too, so the winner may change the output.
    pub allow_inexact: i32,
}

/// A rank's serving handle (opaque). Use it from one thread at a time; every rank must make
/// the same collectives in the same order.
#[derive(Debug)]
pub struct PrepareHandle {
    handle: Handle,
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
            "options.packages is empty: give one package directory per collective and dtype \
             served",
        ));
    }
    if options.package_count > PREPARE_MAX_PACKAGES {
        return Err(Failure::invalid(format!(
            "options.package_count is {}; a handle takes 1 to {PREPARE_MAX_PACKAGES} packages \
             (one per collective and dtype served)",
            options.package_count
        )));
    }
    // The range Runtime::start holds every face to, checked here too so that the message names
    // the field and comes before any package is opened.
    let timeout = timeout_from_seconds(options.timeout_seconds).ok_or_else(|| {
        Failure::invalid(format!(
            "options.timeout_seconds is {:?}; it must be above 0 and at most {} (a day)",
            options.timeout_seconds,
            MAX_TIMEOUT.as_secs()
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
    // Only 0 or 1: this field keeps outputs exact, so a stray value is refused, not taken.
    let allow_inexact = match options.allow_inexact {
        0 => false,
        1 => true,
        other => {
            return Err(Failure::invalid(format!(
                "options.allow_inexact is {other}; it must be 0 (exact candidates only) or 1 \
                 (keep candidates whose output differs from the reference sum)"
            )))
        }
    };
    let mut select = SelectOptions {
        tuning,
        retune: options.retune != 0,
        allow_inexact,
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

/// The handle behind a caller's pointer and the element type of a dtype code, both checked.
///
/// # Safety
/// As [`handle`].
unsafe fn handle_and_dtype<'a>(
    handle: *const PrepareHandle,
    code: i32,
) -> Result<(&'a Handle, Dtype), Failure> {
    // SAFETY: the caller's promise.
    Ok((unsafe { self::handle(handle) }?, dtype(code)?))
}

/// The handle behind a caller's pointer and the key of a package, each checked.
///
/// # Safety
/// As [`handle`].
unsafe fn handle_and_key<'a>(
    handle: *const PrepareHandle,
    collective_code: i32,
    dtype_code: i32,
) -> Result<(&'a Handle, Collective, Dtype), Failure> {
    // SAFETY: the caller's promise.
    let handle = unsafe { self::handle(handle) }?;
    Ok((handle, collective(collective_code)?, dtype(dtype_code)?))
}

/// Runs a call that answers with text: writes what `text` says of the handle's package of a
/// collective and dtype into `buffer` ([`copy_out`]).
///
/// # Safety
/// `handle` as [`handle`]; `buffer`, `capacity` and `needed` as [`copy_out`].
unsafe fn text_out(
    handle: *const PrepareHandle,
    (collective, dtype): (i32, i32),
    text: impl FnOnce(&Handle, Collective, Dtype) -> Result<String, Failure>,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let (handle, collective, dtype) = unsafe { handle_and_key(handle, collective, dtype) }?;
        let text = text(handle, collective, dtype)?;
        // SAFETY: the caller's promise.
        unsafe { copy_out(&text, buffer, capacity, needed) }
    })
}

/// The ABI version, [`PREPARE_ABI_VERSION`] of the header this library was built with: a
/// binding compares it with the one it was written for before any other call.
#[no_mangle]
pub extern "C" fn prepare_abi_version() -> u32 {
    PREPARE_ABI_VERSION
}

/// The library's version, a static NUL-terminated string ("0.2.0").
#[no_mangle]
pub extern "C" fn prepare_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the most recent failed call on this thread ("" before any): valid until the
/// next failed call on this thread. Calls that succeed leave it as it was.
#[no_mangle]
pub extern "C" fn prepare_last_error() -> *const c_char {
    last_error()
}

/// Fills `options` with the defaults: no package, the default cache, a 60 s timeout,
/// runtime tuning, no retune, exact candidates only (`allow_inexact` 0).
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
            allow_inexact: 0,
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

impl Place {
    /// `rank` of `world` ranks on GPU `device`, checked (InvalidArgument).
    fn checked(rank: u32, world: u32, device: i32) -> Result<Place, Failure> {
        check_world(rank, world)?;
        let gpu = usize::try_from(device)
            .map_err(|_| Failure::invalid(format!("device {device} is not a GPU ordinal")))?;
        Ok(Place { rank, world, gpu })
    }
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
/// at NCCL_COMM_ID when set, else at MASTER_ADDR and PREPARE_PORT (default MASTER_PORT + 1).
/// The process environment is left as it was, also when the call fails. Collective: every
/// rank calls it.
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
        let address =
            rendezvous_address(lookup).map_err(|error| Failure::invalid(chain(&error)))?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
        let place = Place {
            rank: environment.rank,
            world: environment.world_size,
            gpu,
        };
        // SAFETY: the caller's promise.
        unsafe { open(&start, place, Rendezvous::CommId(address), None, out) }
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
        let id = unique_id.cast::<[u8; PREPARE_UNIQUE_ID_BYTES]>();
        // SAFETY: null, or 128 readable bytes by the caller's promise (a byte array has no
        // alignment to meet).
        let id = Box::new(*unsafe { reference(id, "unique_id") }?);
        let place = Place::checked(rank, world, device)?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
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
        let place = Place::checked(rank, world, device)?;
        // SAFETY: the caller's promise.
        let start = unsafe { start(options) }?;
        // SAFETY: the caller promises a live communicator of this process for this rank and
        // world, kept alive and unused by other threads, as Communicator::adopt requires.
        let parent = unsafe { Communicator::adopt(nccl_comm, rank, world, nonblocking != 0) };
        // The parent is split from: no rendezvous is used.
        let unused = Rendezvous::CommId(String::new());
        // SAFETY: the caller's promise.
        unsafe { open(&start, place, unused, Some(parent), out) }
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
        let (handle, dtype) = unsafe { handle_and_dtype(handle, dtype) }?;
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

/// Writes where a message of `bytes` of `collective` in `dtype` goes ("one_shot_push (bucket 2)", or NCCL
/// above the ladder) into `buffer` as a NUL-terminated string. `*needed` (when not NULL)
/// receives the size needed, NUL included; a NULL `buffer` only asks for the size.
///
/// # Safety
/// `handle` is a live handle; `buffer` is null or writable for `capacity` bytes; `needed` is
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_route(
    handle: *const PrepareHandle,
    collective: i32,
    dtype: i32,
    bytes: u64,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> PrepareStatus {
    let route = |handle: &Handle, collective, dtype| {
        Ok(handle.route(collective, dtype, bytes)?.to_string())
    };
    // SAFETY: the caller's promise.
    unsafe { text_out(handle, (collective, dtype), route, buffer, capacity, needed) }
}

/// Writes the agreed choice for `collective` in `dtype` (the choice file's JSON: per bucket its winner, every
/// candidate's figures or why it was excluded) into `buffer`, as [`prepare_route`] does.
///
/// # Safety
/// As [`prepare_route`].
#[no_mangle]
pub unsafe extern "C" fn prepare_choice_json(
    handle: *const PrepareHandle,
    collective: i32,
    dtype: i32,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> PrepareStatus {
    let json = |handle: &Handle, collective, dtype| {
        String::from_utf8(handle.choice(collective, dtype)?.to_bytes())
            .map_err(|_| Failure::invalid("the choice is not UTF-8"))
    };
    // SAFETY: the caller's promise.
    unsafe { text_out(handle, (collective, dtype), json, buffer, capacity, needed) }
}

/// Sets `*served` to 1 when a package of the handle holds `collective` in `dtype`, else 0.
///
/// # Safety
/// `handle` is a live handle; `served` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_serves(
    handle: *const PrepareHandle,
    collective: i32,
    dtype: i32,
    served: *mut i32,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let (handle, collective, dtype) = unsafe { handle_and_key(handle, collective, dtype) }?;
        let served_now = handle.served_keys().any(|held| held == (collective, dtype));
        // SAFETY: the caller's promise.
        unsafe { write(served, i32::from(served_now), "served") }
    })
}

/// The zero-copy region of the package of `collective` in `dtype`: this rank's peer-visible memory. A message
/// whose input starts at `*address` is all-reduced without any copy; the region holds one
/// message at a time, of at most `*bytes`. `*address` is NULL and `*bytes` 0 when only NCCL
/// runs (then any memory is as good). The region lives as long as the handle.
///
/// # Safety
/// `handle` is a live handle; `address` and `bytes` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_zero_copy_region(
    handle: *const PrepareHandle,
    collective: i32,
    dtype: i32,
    address: *mut *mut c_void,
    bytes: *mut usize,
) -> PrepareStatus {
    guard(|| {
        // SAFETY: the caller's promise.
        let (handle, collective, dtype) = unsafe { handle_and_key(handle, collective, dtype) }?;
        let region = handle.zero_copy_region(collective, dtype)?;
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

/// Routes bucket `bucket` of the package of `collective` in `dtype` to candidate `profile` instead of its agreed
/// winner: the override tests and comparisons use to run one candidate. Every rank must force
/// the same before the all-reduces it affects. A candidate dropped on this machine cannot be
/// forced, nor, unless the handle was opened with `allow_inexact`, one whose output differs
/// from the reference sum (InvalidArgument, with the reason, naming the candidate and the
/// policy).
///
/// # Safety
/// `handle` is a live handle used by no other thread; `profile` is null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn prepare_force(
    handle: *mut PrepareHandle,
    collective: i32,
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
        handle.handle.force(
            self::collective(collective)?,
            self::dtype(dtype)?,
            bucket,
            profile,
        )?;
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
