//! Streams: this crate's own non-blocking ones and a caller's, borrowed; copies and fills
//! queued on them, and waiting for them, with or without a bound.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use super::device::{bind, Device};
use super::error::{check, CallContext, DriverError};
use super::memory::{DeviceCopy, DeviceMemory, HostWords};

impl Device {
    /// A new non-blocking stream.
    pub fn new_stream(&self) -> Result<Stream, DriverError> {
        let stream = self
            .context
            .new_stream()
            .during("cuStreamCreate", Some(self.ordinal))?;
        Ok(Stream {
            ordinal: self.ordinal,
            context: self.context.clone(),
            raw: stream.cu_stream(),
            owned: Some(stream),
        })
    }

    /// A caller's stream on this GPU (`0` is the legacy default stream), checked to belong to
    /// this GPU's primary context. The returned [`Stream`] does not own it: work goes on it,
    /// but it cannot be captured through [`Stream::capture`] (the caller captures it).
    ///
    /// # Safety
    ///
    /// `raw` must be a live `CUstream` (or `cudaStream_t`, the same handle) or 0, and stay
    /// alive while the returned value is used.
    #[allow(unsafe_code)]
    pub unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream, DriverError> {
        self.bind()?;
        let stream = raw as sys::CUstream;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller promises `stream` is live or null; the context pointer is a live
        // local written by the call.
        let result = unsafe { sys::cuStreamGetCtx(stream, &raw mut context) };
        check(result, "cuStreamGetCtx", Some(self.ordinal))?;
        if context != self.context.cu_ctx() {
            return Err(DriverError::ForeignStream {
                device: self.ordinal,
            });
        }
        Ok(Stream {
            ordinal: self.ordinal,
            context: self.context.clone(),
            raw: stream,
            owned: None,
        })
    }
}

/// A stream on one GPU: a non-blocking one of this crate's, or a caller's, borrowed.
#[derive(Debug)]
pub struct Stream {
    pub(super) ordinal: usize,
    pub(super) context: Arc<CudaContext>,
    pub(super) raw: sys::CUstream,
    // The stream this value owns; `None` for a caller's, which the caller keeps alive.
    pub(super) owned: Option<Arc<CudaStream>>,
}

// SAFETY: a CUstream may be used from any thread once its context is current, which every
// method makes so first (`bind`); the owned stream, if any, is itself Send and Sync.
#[allow(unsafe_code)]
unsafe impl Send for Stream {}

// SAFETY: as above; the driver serialises work queued on one stream from several threads.
#[allow(unsafe_code)]
unsafe impl Sync for Stream {}

impl Stream {
    /// The GPU it runs on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(super) fn bind(&self) -> Result<(), DriverError> {
        bind(&self.context, self.ordinal)
    }

    pub(super) fn checked_range(
        memory: &(impl DeviceMemory + ?Sized),
        operation: &'static str,
        range: &Range<usize>,
    ) -> Result<u64, DriverError> {
        if range.start > range.end || range.end > memory.len_bytes() {
            return Err(DriverError::OutOfBounds {
                operation,
                start: range.start,
                end: range.end,
                bytes: memory.len_bytes(),
                device: memory.ordinal(),
            });
        }
        Ok(memory.address() + range.start as u64)
    }

    /// A copy between `bytes` at byte `offset` of `memory` and host memory, waited for: checks
    /// the range, makes the context current, queues `copy` (the driver's `function`) with the
    /// range's device address, and synchronises the stream.
    fn host_copy(
        &self,
        memory: &impl DeviceMemory,
        operation: &'static str,
        offset: usize,
        bytes: usize,
        function: &'static str,
        copy: impl FnOnce(u64) -> sys::CUresult,
    ) -> Result<(), DriverError> {
        let range = offset..offset.saturating_add(bytes);
        let address = Self::checked_range(memory, operation, &range)?;
        self.bind()?;
        check(copy(address), function, Some(self.ordinal))?;
        self.synchronize()
    }

    /// Copies `data` into `memory` at byte `offset` and waits for the copy.
    pub fn write<T: DeviceCopy>(
        &self,
        memory: &impl DeviceMemory,
        offset: usize,
        data: &[T],
    ) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(data);
        self.host_copy(
            memory,
            "write",
            offset,
            bytes,
            "cuMemcpyHtoDAsync",
            |address| {
                // SAFETY: the destination range lies inside the allocation (host_copy checked it);
                // the source is `bytes` readable bytes borrowed until host_copy has synchronised
                // the stream, so the copy never reads it after this function returns.
                unsafe { sys::cuMemcpyHtoDAsync_v2(address, data.as_ptr().cast(), bytes, self.raw) }
            },
        )
    }

    /// Queues a copy of the 64-bit word at byte `offset` of `memory` into word `index` of
    /// `words`, without waiting for it.
    pub fn copy_word_to_host(
        &self,
        memory: &impl DeviceMemory,
        offset: usize,
        words: &HostWords,
        index: usize,
    ) -> Result<(), DriverError> {
        assert!(index < words.count, "word {index} of {}", words.count);
        let range = offset..offset.saturating_add(8);
        let address = Self::checked_range(memory, "read", &range)?;
        self.bind()?;
        // SAFETY: the source range lies inside the allocation (checked above); the destination
        // is one word of pinned host memory that outlives the copy (its drop waits for the
        // context's work).
        let result = unsafe {
            sys::cuMemcpyDtoHAsync_v2(words.words().add(index).cast(), address, 8, self.raw)
        };
        check(result, "cuMemcpyDtoHAsync", Some(self.ordinal))
    }

    /// Whether the stream is being captured into a graph (work queued now is recorded, not
    /// run, and waiting on the stream is not allowed).
    pub fn is_capturing(&self) -> Result<bool, DriverError> {
        self.bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is alive and its context current; the status is a live local.
        let result = unsafe { sys::cuStreamIsCapturing(self.raw, &raw mut status) };
        check(result, "cuStreamIsCapturing", Some(self.ordinal))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Copies from `memory` at byte `offset` into `out` and waits for the copy.
    pub fn read<T: DeviceCopy>(
        &self,
        memory: &impl DeviceMemory,
        offset: usize,
        out: &mut [T],
    ) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(out);
        self.host_copy(
            memory,
            "read",
            offset,
            bytes,
            "cuMemcpyDtoHAsync",
            |address| {
                // SAFETY: the source range lies inside the allocation (host_copy checked it); `out`
                // is `bytes` writable bytes, exclusively borrowed until host_copy has synchronised
                // the stream, and every bit pattern is a valid T (DeviceCopy).
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), address, bytes, self.raw)
                }
            },
        )
    }

    /// Copies `bytes` from `source` at byte `source_offset` to `destination` at
    /// `destination_offset`, device to device, on this stream (queued, not waited for; it can
    /// be captured). Either side may be another GPU's memory mapped here (a peer's buffer): the
    /// copy engine of this stream's GPU moves the bytes.
    pub fn copy_device(
        &self,
        destination: &dyn DeviceMemory,
        destination_offset: usize,
        source: &dyn DeviceMemory,
        source_offset: usize,
        bytes: usize,
    ) -> Result<(), DriverError> {
        let target = destination_offset..destination_offset.saturating_add(bytes);
        let from = source_offset..source_offset.saturating_add(bytes);
        let to_address = Self::checked_range(destination, "copy", &target)?;
        let from_address = Self::checked_range(source, "copy", &from)?;
        self.bind()?;
        // SAFETY: both ranges lie inside live device allocations or mappings (checked above),
        // which outlive the queued copy (their drops wait for the device); no host memory is
        // involved.
        let result =
            unsafe { sys::cuMemcpyDtoDAsync_v2(to_address, from_address, bytes, self.raw) };
        check(result, "cuMemcpyDtoDAsync", Some(self.ordinal))
    }

    /// Fills a byte range with `value` (queued, not waited for).
    pub fn fill_u8(
        &self,
        memory: &impl DeviceMemory,
        range: Range<usize>,
        value: u8,
    ) -> Result<(), DriverError> {
        let address = Self::checked_range(memory, "fill", &range)?;
        self.bind()?;
        // SAFETY: the range lies inside the allocation (checked above); no host memory is
        // involved, and the allocation outlives queued work (its drop waits for the device).
        let result = unsafe { sys::cuMemsetD8Async(address, value, range.len(), self.raw) };
        check(result, "cuMemsetD8Async", Some(self.ordinal))
    }

    /// Fills a byte range, 2-byte aligned, with a 16-bit pattern (queued, not waited for).
    pub fn fill_u16(
        &self,
        memory: &impl DeviceMemory,
        range: Range<usize>,
        value: u16,
    ) -> Result<(), DriverError> {
        let address = Self::checked_range(memory, "fill", &range)?;
        if address % 2 != 0 || range.len() % 2 != 0 {
            return Err(DriverError::Misaligned {
                operation: "fill_u16",
                width: 2,
                start: range.start,
                end: range.end,
                device: memory.ordinal(),
            });
        }
        self.bind()?;
        // SAFETY: the range lies inside the allocation and is 2-byte aligned (checked above);
        // no host memory is involved.
        let result = unsafe { sys::cuMemsetD16Async(address, value, range.len() / 2, self.raw) };
        check(result, "cuMemsetD16Async", Some(self.ordinal))
    }

    /// Waits for the stream's work, without a bound.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: the stream is alive (owned, or kept alive by the caller that borrowed it) and
        // belongs to the current context.
        let result = unsafe { sys::cuStreamSynchronize(self.raw) };
        check(result, "cuStreamSynchronize", Some(self.ordinal))
    }

    /// Waits for the stream's work for at most `limit`; a kernel still running then is a
    /// [`DriverError::Timeout`] (the work is left running: a context cannot cancel it).
    pub fn synchronize_within(&self, limit: Duration) -> Result<(), DriverError> {
        self.bind()?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: the stream is alive (held by self) and belongs to the current context.
            match unsafe { sys::cuStreamQuery(self.raw) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                error => check(error, "cuStreamQuery", Some(self.ordinal))?,
            }
            let waited = start.elapsed();
            if waited >= limit {
                return Err(DriverError::Timeout {
                    device: self.ordinal,
                    waited,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Makes the stream's context current on this thread (NCCL binds communicators to the
    /// current device).
    pub fn bind_current(&self) -> Result<(), DriverError> {
        self.bind()
    }

    /// Makes the stream's context current on this thread and returns the raw stream, for the
    /// NCCL layer, which enqueues on it.
    pub(in crate::gpu) fn bound_raw(&self) -> Result<sys::CUstream, DriverError> {
        self.bind()?;
        Ok(self.raw)
    }
}
