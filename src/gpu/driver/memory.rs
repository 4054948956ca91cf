//! Device memory: the caller's, checked to lie in one allocation; this crate's own from
//! `cuMemAlloc` (never the stream-ordered pool, which CUDA IPC refuses); pinned host words the
//! device copies into; and IPC, which shares an allocation with another process.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::device::Device;
use super::error::{check, DriverError};

impl Device {
    /// A caller's device memory, checked to lie inside one allocation of this GPU: `bytes`
    /// from `address`.
    ///
    /// # Safety
    ///
    /// The memory must stay allocated while work queued on it runs, as with any CUDA call.
    #[allow(unsafe_code)]
    pub unsafe fn caller_memory(
        &self,
        address: u64,
        bytes: usize,
    ) -> Result<CallerMemory, DriverError> {
        self.bind()?;
        let outside = |reason: &'static str| DriverError::NotDeviceMemory {
            address,
            bytes,
            device: self.ordinal,
            reason,
        };
        if address == 0 {
            return Err(outside("it is a null pointer"));
        }
        let mut start: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut ordinal: i32 = -1;
        let mut memory_type: u32 = 0;
        let mut attributes = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        ];
        let mut data: [*mut c_void; 4] = [
            (&raw mut start).cast(),
            (&raw mut size).cast(),
            (&raw mut ordinal).cast(),
            (&raw mut memory_type).cast(),
        ];
        // SAFETY: each data pointer is a live local of the type its attribute writes
        // (CUdeviceptr, size_t, int, CUmemorytype as unsigned int), and both arrays hold
        // exactly `attributes.len()` entries.
        let result = unsafe {
            sys::cuPointerGetAttributes(
                attributes.len() as u32,
                attributes.as_mut_ptr(),
                data.as_mut_ptr(),
                address,
            )
        };
        if result != sys::CUresult::CUDA_SUCCESS {
            return Err(outside("the driver does not know the address"));
        }
        if memory_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || start == 0 {
            return Err(outside("it is not device memory"));
        }
        if usize::try_from(ordinal).ok() != Some(self.ordinal) {
            return Err(DriverError::WrongDevice {
                what: format!("memory at {address:#x}"),
                found: usize::try_from(ordinal).unwrap_or(usize::MAX),
                expected: self.ordinal,
            });
        }
        let end = address.checked_add(bytes as u64);
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(outside("it runs past the end of its allocation"));
        }
        Ok(CallerMemory {
            address,
            bytes,
            ordinal: self.ordinal,
        })
    }

    /// `bytes` of device memory from `cuMemAlloc` (shareable by CUDA IPC), uninitialised.
    pub fn allocate(&self, bytes: usize) -> Result<DeviceBuffer, DriverError> {
        self.bind()?;
        let mut address = 0;
        // SAFETY: the context is current; writes one CUdeviceptr to a live local. Zero bytes is
        // refused by the driver with an error, not undefined behaviour.
        let result = unsafe { sys::cuMemAlloc_v2(&raw mut address, bytes) };
        check(result, "cuMemAlloc", Some(self.ordinal))?;
        Ok(DeviceBuffer {
            address,
            bytes,
            device: self.clone(),
        })
    }

    /// Maps another process's buffer, shared by [`DeviceBuffer::ipc_handle`], into this GPU's
    /// context (peer access is enabled lazily for it).
    pub fn open_ipc(&self, handle: &IpcHandle) -> Result<PeerBuffer, DriverError> {
        self.bind()?;
        let mut address = 0;
        let raw = sys::CUipcMemHandle {
            reserved: handle.0.map(|byte| std::ffi::c_char::from_ne_bytes([byte])),
        };
        // SAFETY: the context is current; the handle is passed by value; writes one pointer.
        let result = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &raw mut address,
                raw,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        };
        check(result, "cuIpcOpenMemHandle", Some(self.ordinal))?;
        let mut base = 0;
        let mut bytes = 0usize;
        // SAFETY: `address` is a live mapping made above; writes two locals.
        let result =
            unsafe { sys::cuMemGetAddressRange_v2(&raw mut base, &raw mut bytes, address) };
        let range = check(result, "cuMemGetAddressRange", Some(self.ordinal));
        let mapping = PeerBuffer {
            address,
            bytes,
            device: self.clone(),
        };
        range?;
        debug_assert_eq!(
            base, address,
            "an IPC mapping starts at its allocation's base"
        );
        Ok(mapping)
    }
}

/// Plain element types that may be copied between host and device memory byte for byte:
/// every bit pattern is a valid value.
pub trait DeviceCopy: Copy + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! device_copy {
    ($($type:ty),*) => {
        $(impl sealed::Sealed for $type {} impl DeviceCopy for $type {})*
    };
}

device_copy!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

/// Device memory that copies and fills can address: a local allocation or an IPC mapping.
pub trait DeviceMemory {
    /// The device address of the first byte.
    fn address(&self) -> u64;
    /// Size in bytes.
    fn len_bytes(&self) -> usize;
    /// The GPU whose context owns the allocation or mapping.
    fn ordinal(&self) -> usize;
}

/// A range of a caller's device memory, checked by [`Device::caller_memory`]; the caller owns
/// and frees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerMemory {
    address: u64,
    bytes: usize,
    ordinal: usize,
}

impl CallerMemory {
    /// All of a buffer or mapping this crate holds (no check is needed: it is known memory).
    pub fn whole(memory: &(impl DeviceMemory + ?Sized)) -> CallerMemory {
        CallerMemory {
            address: memory.address(),
            bytes: memory.len_bytes(),
            ordinal: memory.ordinal(),
        }
    }

    /// Memory another library allocated for this crate (NCCL's `ncclMemAlloc`): `bytes` at
    /// `address` on GPU `ordinal`, which the library's allocation guarantees.
    pub(crate) fn allocated_by_library(address: u64, bytes: usize, ordinal: usize) -> CallerMemory {
        CallerMemory {
            address,
            bytes,
            ordinal,
        }
    }

    /// The part from `offset` bytes on (empty past the end).
    #[must_use]
    pub fn offset(self, offset: u64) -> CallerMemory {
        let offset = offset.min(self.bytes as u64);
        CallerMemory {
            address: self.address + offset,
            bytes: self.bytes - offset as usize,
            ordinal: self.ordinal,
        }
    }

    /// The first `bytes` of a buffer or mapping this crate holds (at most all of it).
    pub fn prefix(memory: &(impl DeviceMemory + ?Sized), bytes: u64) -> CallerMemory {
        CallerMemory {
            address: memory.address(),
            bytes: (bytes as usize).min(memory.len_bytes()),
            ordinal: memory.ordinal(),
        }
    }
}

impl DeviceMemory for CallerMemory {
    fn address(&self) -> u64 {
        self.address
    }

    fn len_bytes(&self) -> usize {
        self.bytes
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }
}

/// Device memory from `cuMemAlloc`, freed on drop (after the device's work finishes).
#[derive(Debug)]
pub struct DeviceBuffer {
    address: sys::CUdeviceptr,
    bytes: usize,
    device: Device,
}

impl DeviceBuffer {
    /// A handle another process can open with [`Device::open_ipc`].
    pub fn ipc_handle(&self) -> Result<IpcHandle, DriverError> {
        self.device.bind()?;
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `address` is the base of a live cuMemAlloc allocation in the current
        // context; writes one 64-byte handle to a local.
        let result = unsafe { sys::cuIpcGetMemHandle(&raw mut raw, self.address) };
        check(result, "cuIpcGetMemHandle", Some(self.device.ordinal))?;
        Ok(IpcHandle(raw.reserved.map(|char| char.to_ne_bytes()[0])))
    }
}

/// Implements [`DeviceMemory`] for this layer's own memory: an address, a size and the GPU
/// whose context holds it.
macro_rules! held_memory {
    ($($type:ty),*) => {
        $(impl DeviceMemory for $type {
            fn address(&self) -> u64 {
                self.address
            }
            fn len_bytes(&self) -> usize {
                self.bytes
            }
            fn ordinal(&self) -> usize {
                self.device.ordinal
            }
        })*
    };
}
held_memory!(DeviceBuffer, PeerBuffer);

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.device.release_after_work(|| {
            // SAFETY: the context is current and idle; the address is this allocation's base
            // and is freed exactly once.
            let _ = unsafe { sys::cuMemFree_v2(self.address) };
        });
    }
}

/// Pinned (page-locked) host bytes: copies between them and the device run at the link's
/// speed, several times faster than from pageable memory. Zeroed when made; freed on drop.
#[derive(Debug)]
pub struct PinnedBytes {
    bytes: *mut u8,
    len: usize,
    device: Device,
}

impl Device {
    /// `len` zeroed bytes of pinned host memory.
    pub fn pinned_bytes(&self, len: usize) -> Result<PinnedBytes, DriverError> {
        self.bind()?;
        let mut bytes: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is current; the pointer is a live local written by the call.
        let result = unsafe { sys::cuMemAllocHost_v2(&raw mut bytes, len.max(1)) };
        check(result, "cuMemAllocHost", Some(self.ordinal))?;
        // SAFETY: the allocation holds at least `len` writable bytes.
        unsafe { std::ptr::write_bytes(bytes.cast::<u8>(), 0, len) };
        Ok(PinnedBytes {
            bytes: bytes.cast(),
            len,
            device: self.clone(),
        })
    }
}

impl std::ops::Deref for PinnedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes owned by this value, alive as long as it is; a copy
        // writes them only while a `&mut` borrow of them is held (Stream::read waits for it).
        unsafe { std::slice::from_raw_parts(self.bytes, self.len) }
    }
}

impl std::ops::DerefMut for PinnedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.bytes, self.len) }
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        self.device.release_after_work(|| {
            // SAFETY: the context is idle, so no copy still uses the bytes; the pointer is this
            // allocation's and is freed exactly once.
            let _ = unsafe { sys::cuMemFreeHost(self.bytes.cast()) };
        });
    }
}

/// Pinned host memory of 64-bit words the device copies into asynchronously, so the host can
/// look at a device word without waiting for any stream; freed on drop.
#[derive(Debug)]
pub struct HostWords {
    memory: PinnedBytes,
    pub(super) count: usize,
}

// SAFETY: the words are plain host memory owned by this value; reads are volatile and the
// device writes them only through copies this value's owner enqueues.
#[allow(unsafe_code)]
unsafe impl Send for HostWords {}

// SAFETY: as above: shared references only read.
#[allow(unsafe_code)]
unsafe impl Sync for HostWords {}

impl Device {
    /// `count` zeroed words of pinned host memory.
    pub fn host_words(&self, count: usize) -> Result<HostWords, DriverError> {
        let count = count.max(1);
        Ok(HostWords {
            memory: self.pinned_bytes(count * 8)?,
            count,
        })
    }
}

impl HostWords {
    /// Where the words start (page aligned, so 8-byte aligned).
    pub(super) fn words(&self) -> *mut u64 {
        self.memory.bytes.cast()
    }

    /// Word `index` as last written (by a finished copy, or zero).
    pub fn get(&self, index: usize) -> u64 {
        assert!(index < self.count, "word {index} of {}", self.count);
        // SAFETY: in bounds (asserted); the memory lives as long as self; a volatile read
        // because the device writes it behind the compiler's back.
        unsafe { std::ptr::read_volatile(self.words().add(index)) }
    }
}

/// A CUDA IPC handle: 64 opaque bytes that travel between processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; 64]);

/// Another process's buffer mapped into this one; unmapped on drop.
#[derive(Debug)]
pub struct PeerBuffer {
    address: sys::CUdeviceptr,
    bytes: usize,
    device: Device,
}

impl Drop for PeerBuffer {
    fn drop(&mut self) {
        self.device.release_after_work(|| {
            // SAFETY: the context is current and idle, so no work uses the mapping; it was
            // opened by cuIpcOpenMemHandle and is closed exactly once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.address) };
        });
    }
}
