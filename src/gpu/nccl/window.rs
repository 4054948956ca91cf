//! NCCL's symmetric windows (NCCL 2.27 and later): memory from `ncclMemAlloc` that every rank of
//! a communicator registers as one window with `NCCL_WIN_COLL_SYMMETRIC`, so NCCL maps the
//! peers' copies itself and may run its symmetric-memory kernels on it.
//!
//! A window is never deregistered here: `ncclCommWindowDeregister` is collective, and a rank
//! that dropped its window while a peer was stopped would wait for ever. Aborting the
//! communicator releases its windows; registering hands the [`NcclMemory`] to the
//! communicator, which frees it once its abort has returned (which may be after the owner
//! dropped it: an abort waits for the graphs that captured the communicator).

use std::ffi::{c_int, c_void};
use std::ptr;

use cudarc::nccl::sys;

use super::error::NcclError;
use super::library::{self, check, WindowApi};
use super::Communicator;
use crate::gpu::driver::{CallerMemory, Device, DeviceMemory};

/// `NCCL_WIN_COLL_SYMMETRIC` in nccl.h: every rank registers a buffer of the same size.
const WIN_COLL_SYMMETRIC: c_int = 0x01;

/// Why this process's NCCL cannot make symmetric windows; `Ok` when it can.
pub fn symmetric_windows() -> Result<(), String> {
    window_api().map(|_| ())
}

fn window_api() -> Result<&'static WindowApi, String> {
    let nccl = library::load().map_err(|error| error.to_string())?;
    nccl.windows.as_ref().map_err(Clone::clone)
}

/// Device memory from `ncclMemAlloc` on one GPU, freed by `ncclMemFree` when dropped, once the
/// GPU's queued work is done (as [`crate::gpu::driver::DeviceBuffer`] is freed).
#[derive(Debug)]
pub struct NcclMemory {
    range: CallerMemory,
    device: Device,
}

impl NcclMemory {
    /// Allocates `bytes` on `device`, whose context must be current on this thread.
    pub fn allocate(device: &Device, bytes: usize, rank: u32) -> Result<NcclMemory, NcclError> {
        let windows = window_api().map_err(|message| NcclError::Call {
            call: "ncclMemAlloc",
            rank,
            message,
        })?;
        let mut pointer: *mut c_void = ptr::null_mut();
        // SAFETY: ncclMemAlloc writes one pointer through a pointer to a live local.
        let result = unsafe { (windows.mem_alloc)(&raw mut pointer, bytes) };
        check(
            library::api()?,
            "ncclMemAlloc",
            rank,
            result,
            ptr::null_mut(),
        )?;
        Ok(NcclMemory {
            range: CallerMemory::allocated_by_library(pointer as u64, bytes, device.ordinal()),
            device: device.clone(),
        })
    }

    /// The memory, for copies and collectives; valid while this lives.
    pub fn range(&self) -> CallerMemory {
        self.range
    }
}

impl Drop for NcclMemory {
    fn drop(&mut self) {
        // The memory exists only if the window entry points were bound.
        if let Ok(windows) = window_api() {
            self.device.release_after_work(|| {
                // SAFETY: the pointer came from ncclMemAlloc and is freed once, here, with the
                // GPU idle; memory registered as a window is dropped only once its
                // communicator's abort has returned, which released the window.
                unsafe {
                    (windows.mem_free)(self.range.address() as *mut c_void);
                }
            });
        }
    }
}

impl Communicator {
    /// Registers `memory` as this rank's part of a symmetric window of this communicator, which
    /// keeps it from then on (the caller keeps [`NcclMemory::range`] for its copies, valid while
    /// the communicator lives). Collective: every rank registers memory of the same size, and a
    /// blocking communicator returns only when all have (the caller bounds it with a
    /// [`super::Watchdog`]).
    pub fn register_symmetric_window(&self, memory: NcclMemory) -> Result<(), NcclError> {
        let rank = self.rank();
        let windows = window_api().map_err(|message| NcclError::Call {
            call: "ncclCommWindowRegister",
            rank,
            message,
        })?;
        let raw: sys::ncclComm_t = self.as_raw().cast();
        let mut window: *mut c_void = ptr::null_mut();
        // SAFETY: the communicator is live (its owner holds it), the memory came from
        // ncclMemAlloc and the communicator keeps it (below) until its abort has returned, and
        // the call writes one handle through a pointer to a live local.
        let result = unsafe {
            (windows.window_register)(
                raw,
                memory.range.address() as *mut c_void,
                memory.range.len_bytes(),
                &raw mut window,
                WIN_COLL_SYMMETRIC,
            )
        };
        // Kept whether or not the call succeeded: a failed registration may have got far enough
        // for NCCL to use the memory until the abort.
        self.keep_until_aborted(memory);
        check(library::api()?, "ncclCommWindowRegister", rank, result, raw)
    }
}
