//! Communicators: a nonblocking one for the bounded bootstrap, blocking ones split from it for
//! the collectives (a nonblocking communicator's collectives are slower), the collectives
//! themselves, and the watchdog that aborts a communicator when a deadline passes.

mod point_to_point;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::environment::Scoped;
use super::error::NcclError;
use super::library::{api, check, error_message, Api, IN_PROGRESS, SUCCESS};
use super::{CommConfig, NcclDataType, UniqueId};
use crate::gpu::driver::{DeviceMemory, Stream};
pub use point_to_point::Transfer;

/// How often a nonblocking operation is polled.
const POLL_INTERVAL: Duration = Duration::from_micros(200);

/// The raw handle, shared with the watchdog.
#[derive(Debug)]
struct Handle {
    raw: sys::ncclComm_t,
    aborted: AtomicBool,
    kept: Mutex<Kept>,
}

/// What a communicator keeps until its abort has returned (memory registered with it), and
/// whether it has.
#[derive(Default)]
struct Kept {
    released: bool,
    values: Vec<Box<dyn Send>>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Kept")
            .field("released", &self.released)
            .field("values", &self.values.len())
            .finish()
    }
}

// SAFETY: NCCL documents ncclCommAbort as callable from another thread to stop a communicator
// whose operations hang; every other use goes through the owning `Communicator`.
unsafe impl Send for Handle {}

// SAFETY: as above; the flag is atomic.
unsafe impl Sync for Handle {}

/// How long an abort is waited for before the caller goes on (see [`Handle::abort`]).
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// The raw communicator, moved to the thread that aborts it.
struct RawComm(sys::ncclComm_t);

// SAFETY: only ncclCommAbort uses it on that thread, which NCCL allows from any thread.
unsafe impl Send for RawComm {}

impl Handle {
    fn new(raw: sys::ncclComm_t) -> Arc<Handle> {
        Arc::new(Handle {
            raw,
            aborted: AtomicBool::new(false),
            kept: Mutex::new(Kept::default()),
        })
    }

    /// Aborts the communicator, at most once. NCCL raises its kernels' abort flag at once, so
    /// work on a stream that waits for a missing peer ends; but ncclCommAbort then returns only
    /// when every CUDA graph that captured an operation of the communicator is destroyed. The
    /// caller may hold such graphs (the timing's, a server's), so the abort runs on a thread of
    /// its own and the caller waits for it only [`ABORT_WAIT`]: it goes on, drops its graphs,
    /// and the abort completes. What the communicator keeps is dropped once it has.
    fn abort(self: &Arc<Self>) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        // A communicator exists only once NCCL is loaded, and it stays loaded.
        let Ok(api) = api() else {
            return;
        };
        let raw = RawComm(self.raw);
        let handle = Arc::clone(self);
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = thread::Builder::new()
            .name("nccl-abort".to_owned())
            .spawn(move || {
                let raw = raw;
                // SAFETY: the communicator is live (never destroyed, aborted only here, once:
                // the swap above) and nothing else frees it.
                unsafe {
                    (api.comm_abort)(raw.0);
                }
                handle.release_kept();
                let _ = done.send(());
            });
        if spawned.is_ok() {
            let _ = finished.recv_timeout(ABORT_WAIT);
        } else {
            // No thread to spare: abort here, which may wait for the graphs.
            // SAFETY: as above.
            unsafe {
                (api.comm_abort)(self.raw);
            }
            self.release_kept();
        }
    }

    /// Keeps `value` until the abort has returned; drops it now if it already has.
    fn keep(&self, value: Box<dyn Send>) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.released {
            drop(kept);
            drop(value);
        } else {
            kept.values.push(value);
        }
    }

    /// Drops what was kept, after the abort returned.
    fn release_kept(&self) {
        let values = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.released = true;
            std::mem::take(&mut kept.values)
        };
        drop(values);
    }
}

/// An NCCL communicator of one rank.
#[derive(Debug)]
pub struct Communicator {
    handle: Arc<Handle>,
    rank: u32,
    world: u32,
    nonblocking: bool,
    // A communicator adopted from its creator (a server) is never aborted on drop.
    owned: bool,
}

/// What NCCL reads only from the process environment while a communicator initialises
/// (`ncclConfig_t` has no field for it): each is set where unset, for as long as NCCL reads it,
/// and removed after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitEnvironment {
    /// Set during the `ncclCommInitRankConfig` call only: `NCCL_COMM_ID` on rank 0, which
    /// makes NCCL serve the rendezvous at the id's address (it looks at the variable then).
    pub during_call: Vec<(String, String)>,
    /// Set from that call until the communicator is ready: `NCCL_RUNTIME_CONNECT`, which the
    /// initialisation reads in NCCL's background thread once every rank has joined.
    pub until_ready: Vec<(String, String)>,
}

impl Communicator {
    /// Joins a communicator of `world` ranks as `rank` (the CUDA device must be current on this
    /// thread), nonblocking, polled until `deadline` and aborted past it.
    pub fn init(
        id: &UniqueId,
        rank: u32,
        world: u32,
        deadline: Instant,
    ) -> Result<Communicator, NcclError> {
        Communicator::init_in(id, rank, world, &InitEnvironment::default(), deadline)
    }

    /// Like [`Communicator::init`], with the settings NCCL reads only from the process
    /// environment set (where unset) for as long as NCCL reads them, and removed after, also
    /// when the initialisation fails.
    pub fn init_in(
        id: &UniqueId,
        rank: u32,
        world: u32,
        environment: &InitEnvironment,
        deadline: Instant,
    ) -> Result<Communicator, NcclError> {
        let config = CommConfig {
            nonblocking: true,
            ..CommConfig::default()
        };
        let until_ready = Scoped::set_where_unset(&environment.until_ready);
        let during_call = Scoped::set_where_unset(&environment.during_call);
        let started = Communicator::start_init(id, rank, world, config);
        drop(during_call);
        let communicator = started?;
        communicator.wait_ready("communicator initialisation", deadline)?;
        drop(until_ready);
        Ok(communicator)
    }

    /// Joins a communicator with `config`. A nonblocking one is polled until `deadline` and
    /// aborted past it; a blocking one (as a server makes its own) returns only when every
    /// rank has joined, so `deadline` cannot bound it.
    pub fn init_with(
        id: &UniqueId,
        rank: u32,
        world: u32,
        config: CommConfig,
        deadline: Instant,
    ) -> Result<Communicator, NcclError> {
        let communicator = Communicator::start_init(id, rank, world, config)?;
        communicator.wait_ready("communicator initialisation", deadline)?;
        Ok(communicator)
    }

    /// Calls `ncclCommInitRankConfig`; a nonblocking communicator is still initialising when
    /// it returns.
    fn start_init(
        id: &UniqueId,
        rank: u32,
        world: u32,
        config: CommConfig,
    ) -> Result<Communicator, NcclError> {
        let api = api()?;
        let nonblocking = config.nonblocking;
        let mut config = config.raw();
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: raw and config are valid for the call; the id is passed by value.
        let result = unsafe {
            (api.comm_init_rank_config)(
                &raw mut raw,
                world as i32,
                id.0,
                rank as i32,
                &raw mut config,
            )
        };
        let communicator = Communicator {
            handle: Handle::new(raw),
            rank,
            world,
            nonblocking,
            owned: true,
        };
        if raw.is_null() {
            check(api, "ncclCommInitRankConfig", rank, result, raw)?;
            return Err(NcclError::Call {
                call: "ncclCommInitRankConfig",
                rank,
                message: "no communicator was returned".to_owned(),
            });
        }
        if let Err(error) = check(api, "ncclCommInitRankConfig", rank, result, raw) {
            communicator.handle.abort();
            return Err(error);
        }
        Ok(communicator)
    }

    /// Polls a nonblocking communicator until its pending operation ends or `deadline` passes
    /// (then it is aborted).
    fn wait_ready(&self, step: &'static str, deadline: Instant) -> Result<(), NcclError> {
        let api = api()?;
        let started = Instant::now();
        loop {
            let mut state: c_int = SUCCESS;
            // SAFETY: the handle is live; the call writes one result.
            let result = unsafe { (api.comm_get_async_error)(self.handle.raw, &raw mut state) };
            check(
                api,
                "ncclCommGetAsyncError",
                self.rank,
                result,
                self.handle.raw,
            )?;
            match state {
                SUCCESS => return Ok(()),
                IN_PROGRESS => {}
                error => {
                    let message = error_message(api, error, self.handle.raw);
                    self.handle.abort();
                    return Err(NcclError::Call {
                        call: step,
                        rank: self.rank,
                        message,
                    });
                }
            }
            if Instant::now() >= deadline {
                self.handle.abort();
                return Err(NcclError::Timeout {
                    step,
                    rank: self.rank,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Splits this communicator with every rank in the same group and the same rank order.
    /// The child is blocking unless `config` says otherwise. A nonblocking parent splits in
    /// NCCL's background and is polled; a blocking one (a server's, adopted) splits on a helper
    /// thread. Past `deadline` this communicator is aborted, which ends the split.
    pub fn split(&self, config: CommConfig, deadline: Instant) -> Result<Communicator, NcclError> {
        self.ensure_live()?;
        let api = api()?;
        let rank = self.rank;
        // NCCL writes the child into this slot when the split completes, possibly after the
        // call returns or after the caller gave up: it is never freed (eight bytes a split).
        let slot: &'static AtomicPtr<sys::ncclComm> =
            Box::leak(Box::new(AtomicPtr::new(std::ptr::null_mut())));
        let split = move |parent: sys::ncclComm_t| {
            let mut raw_config = config.raw();
            // SAFETY: the parent is live (its handle is held by the caller); the slot lives for
            // ever; the config is read during the call.
            unsafe { (api.comm_split)(parent, 0, rank as i32, slot.as_ptr(), &raw mut raw_config) }
        };
        if self.nonblocking {
            let result = split(self.handle.raw);
            check(api, "ncclCommSplit", rank, result, self.handle.raw)?;
            self.wait_ready("communicator split", deadline)?;
        } else {
            let parent = Arc::clone(&self.handle);
            let (sender, receiver) = std::sync::mpsc::channel();
            thread::spawn(move || {
                // The receiver may have given up; then the parent was aborted.
                let _ = sender.send(split(parent.raw));
            });
            let timeout = deadline.saturating_duration_since(Instant::now());
            let Ok(result) = receiver.recv_timeout(timeout) else {
                self.handle.abort();
                return Err(NcclError::Timeout {
                    step: "communicator split",
                    rank,
                    seconds: timeout.as_secs_f64(),
                });
            };
            check(api, "ncclCommSplit", rank, result, self.handle.raw)?;
        }
        let child = slot.load(Ordering::Acquire);
        if child.is_null() {
            return Err(NcclError::Call {
                call: "ncclCommSplit",
                rank,
                message: "the split completed without a communicator".to_owned(),
            });
        }
        let child = Communicator {
            handle: Handle::new(child),
            rank,
            world: self.world,
            nonblocking: config.nonblocking,
            owned: true,
        };
        if config.nonblocking {
            child.wait_ready("communicator split", deadline)?;
        }
        Ok(child)
    }

    /// Adopts a communicator its creator (a serving process) already has, to split the
    /// prepare communicators from. Dropping the result leaves it alone; a split that passes its
    /// deadline still aborts it, as it would any parent whose peers are gone.
    ///
    /// # Safety
    /// `raw` must be a live `ncclComm_t` of this process for `rank` of `world` ranks that stays
    /// alive, and is used by no other thread during prepare's calls, for as long as the result
    /// and every communicator split from it exist. `nonblocking` must match its config.
    pub unsafe fn adopt(
        raw: *mut std::ffi::c_void,
        rank: u32,
        world: u32,
        nonblocking: bool,
    ) -> Communicator {
        Communicator {
            handle: Handle::new(raw.cast()),
            rank,
            world,
            nonblocking,
            owned: false,
        }
    }

    /// The raw `ncclComm_t`, for handing to code that adopts it.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.handle.raw.cast()
    }

    fn ensure_live(&self) -> Result<(), NcclError> {
        if self.handle.aborted.load(Ordering::SeqCst) {
            Err(NcclError::Aborted { rank: self.rank })
        } else {
            Ok(())
        }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Aborts the communicator: pending and later operations fail.
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// Keeps `value` (memory registered with this communicator) until the communicator's abort
    /// has returned, so it outlives NCCL's use of it; a communicator never aborted (one adopted
    /// from a server) drops it with itself.
    pub(super) fn keep_until_aborted(&self, value: impl Send + 'static) {
        self.handle.keep(Box::new(value));
    }

    /// Whether the communicator was aborted.
    pub fn is_aborted(&self) -> bool {
        self.handle.aborted.load(Ordering::SeqCst)
    }

    /// A watchdog that aborts this communicator unless disarmed before `deadline`.
    pub fn watchdog(&self, deadline: Instant) -> Watchdog {
        Watchdog::arm(Arc::clone(&self.handle), deadline)
    }

    /// `count` x `size` bytes, or an error when that overflows.
    fn message_bytes(
        &self,
        call: &'static str,
        count: usize,
        size: usize,
    ) -> Result<usize, NcclError> {
        count.checked_mul(size).ok_or_else(|| NcclError::Buffers {
            call,
            rank: self.rank,
            message: format!("{count} elements of {size} bytes overflow the address space"),
        })
    }

    /// Enqueues `call` on `stream` once every buffer is on the stream's GPU and holds the bytes
    /// paired with it: `enqueue` makes the call with the library and the raw stream.
    fn enqueue(
        &self,
        call: &'static str,
        stream: &Stream,
        buffers: &[(&dyn DeviceMemory, usize)],
        enqueue: impl FnOnce(&Api, sys::cudaStream_t) -> c_int,
    ) -> Result<(), NcclError> {
        let api = api()?;
        self.ensure_live()?;
        for (memory, needed) in buffers {
            if memory.ordinal() != stream.ordinal() {
                return Err(NcclError::Buffers {
                    call,
                    rank: self.rank,
                    message: format!(
                        "a buffer of GPU {} used on a stream of GPU {}",
                        memory.ordinal(),
                        stream.ordinal()
                    ),
                });
            }
            if memory.len_bytes() < *needed {
                return Err(NcclError::Buffers {
                    call,
                    rank: self.rank,
                    message: format!(
                        "a buffer of {} bytes where {needed} are needed",
                        memory.len_bytes()
                    ),
                });
            }
        }
        let result = enqueue(api, stream.bound_raw()?.cast());
        check(api, call, self.rank, result, self.handle.raw)
    }

    /// Enqueues a sum all-reduce of `count` elements of `dtype` from `send` into `recv` (they may
    /// be the same buffer) on `stream`. The buffers free themselves only after their device's
    /// work is done, so they outlive the operation.
    pub fn all_reduce(
        &self,
        stream: &Stream,
        send: &dyn DeviceMemory,
        recv: &dyn DeviceMemory,
        count: usize,
        dtype: NcclDataType,
    ) -> Result<(), NcclError> {
        let bytes = self.message_bytes("ncclAllReduce", count, dtype.size_bytes())?;
        let buffers = [(send, bytes), (recv, bytes)];
        self.enqueue("ncclAllReduce", stream, &buffers, |api, raw_stream| {
            // SAFETY: both buffers hold `count` elements of `dtype` on the stream's device
            // (checked by `enqueue`) and are freed only after that device's work completes; the
            // stream is live and its context current.
            unsafe {
                (api.all_reduce)(
                    send.address() as *const c_void,
                    recv.address() as *mut c_void,
                    count,
                    dtype.raw(),
                    sys::ncclRedOp_t::ncclSum,
                    self.handle.raw,
                    raw_stream,
                )
            }
        })
    }

    /// Enqueues a sum all-reduce of `count` bf16 elements (see [`Communicator::all_reduce`]).
    pub fn all_reduce_bf16(
        &self,
        stream: &Stream,
        send: &dyn DeviceMemory,
        recv: &dyn DeviceMemory,
        count: usize,
    ) -> Result<(), NcclError> {
        self.all_reduce(stream, send, recv, count, NcclDataType::Bf16)
    }

    /// Enqueues a sum reduce-scatter on `stream`: `send` holds world x `count` elements of
    /// `dtype`, and rank r's `recv` gets the sum of every rank's r-th run of `count`. In place
    /// when `recv` is this rank's run of `send`. The buffers free themselves only after their
    /// device's work is done, so they outlive the operation.
    pub fn reduce_scatter(
        &self,
        stream: &Stream,
        send: &dyn DeviceMemory,
        recv: &dyn DeviceMemory,
        count: usize,
        dtype: NcclDataType,
    ) -> Result<(), NcclError> {
        let bytes = self.message_bytes("ncclReduceScatter", count, dtype.size_bytes())?;
        let total = self.message_bytes("ncclReduceScatter", bytes, self.world as usize)?;
        let buffers = [(send, total), (recv, bytes)];
        self.enqueue("ncclReduceScatter", stream, &buffers, |api, raw_stream| {
            // SAFETY: `send` holds world x `count` and `recv` `count` elements of `dtype` on the
            // stream's device (checked by `enqueue`), freed only after that device's work
            // completes; the stream is live and its context current.
            unsafe {
                (api.reduce_scatter)(
                    send.address() as *const c_void,
                    recv.address() as *mut c_void,
                    count,
                    dtype.raw(),
                    sys::ncclRedOp_t::ncclSum,
                    self.handle.raw,
                    raw_stream,
                )
            }
        })
    }

    /// Enqueues an all-gather of `bytes` bytes per rank from `send` into `recv` (world x
    /// `bytes`, in rank order) on `stream`.
    pub fn all_gather(
        &self,
        stream: &Stream,
        send: &dyn DeviceMemory,
        recv: &dyn DeviceMemory,
        bytes: usize,
    ) -> Result<(), NcclError> {
        let total = self.message_bytes("ncclAllGather", bytes, self.world as usize)?;
        let buffers = [(send, bytes), (recv, total)];
        self.enqueue("ncclAllGather", stream, &buffers, |api, raw_stream| {
            // SAFETY: `send` holds `bytes` and `recv` world x `bytes` bytes on the stream's
            // device (checked by `enqueue`), freed only after that device's work completes; the
            // stream is live and its context current.
            unsafe {
                (api.all_gather)(
                    send.address() as *const c_void,
                    recv.address() as *mut c_void,
                    bytes,
                    sys::ncclDataType_t::ncclUint8,
                    self.handle.raw,
                    raw_stream,
                )
            }
        })
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Abort, not destroy: ncclCommDestroy finalizes with the peers first, which blocks for
        // ever on a peer that is stopped; abort frees this rank's resources without them.
        if self.owned {
            self.handle.abort();
        }
    }
}

/// Aborts a communicator when a deadline passes, unless disarmed first. Dropping it disarms it.
pub struct Watchdog {
    state: Arc<(Mutex<bool>, Condvar)>,
    fired: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Watchdog")
            .field("fired", &self.fired())
            .finish_non_exhaustive()
    }
}

impl Watchdog {
    fn arm(handle: Arc<Handle>, deadline: Instant) -> Watchdog {
        let state = Arc::new((Mutex::new(false), Condvar::new()));
        let fired = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = Arc::clone(&state);
            let fired = Arc::clone(&fired);
            thread::spawn(move || {
                let (disarmed, wake) = &*state;
                let mut disarmed = disarmed.lock().unwrap_or_else(PoisonError::into_inner);
                while !*disarmed {
                    let now = Instant::now();
                    if now >= deadline {
                        fired.store(true, Ordering::SeqCst);
                        handle.abort();
                        return;
                    }
                    disarmed = wake
                        .wait_timeout(disarmed, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            })
        };
        Watchdog {
            state,
            fired,
            thread: Some(thread),
        }
    }

    /// Whether the deadline passed and the communicator was aborted.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Stops the watchdog; returns whether it had fired.
    pub fn disarm(mut self) -> bool {
        self.stop();
        self.fired()
    }

    fn stop(&mut self) {
        let (disarmed, wake) = &*self.state;
        *disarmed.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::Handle;

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn what_a_communicator_keeps_lives_until_its_abort_returned() {
        let drops = Arc::new(AtomicUsize::new(0));
        // Never aborted here, so the raw handle is never used.
        let handle = Handle::new(std::ptr::null_mut());
        handle.keep(Box::new(Counted(Arc::clone(&drops))));
        handle.keep(Box::new(Counted(Arc::clone(&drops))));
        assert_eq!(
            drops.load(Ordering::SeqCst),
            0,
            "kept until the abort returns"
        );
        handle.release_kept();
        assert_eq!(drops.load(Ordering::SeqCst), 2, "dropped once it has");
        // Kept after the abort returned: nothing holds it back any more.
        handle.keep(Box::new(Counted(Arc::clone(&drops))));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_communicator_never_aborted_drops_what_it_keeps_with_itself() {
        let drops = Arc::new(AtomicUsize::new(0));
        let handle = Handle::new(std::ptr::null_mut());
        handle.keep(Box::new(Counted(Arc::clone(&drops))));
        drop(handle);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
