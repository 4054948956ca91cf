//! Safe wrappers over the CUDA driver API (cudarc's dynamically loaded `driver` bindings): the
//! devices and what they can do, primary contexts and streams, device memory from `cuMemAlloc`
//! (never the stream-ordered pool, which CUDA IPC refuses), modules loaded from cubins, kernel
//! launches with and without cluster dimensions, occupancy, peer access, IPC, events and graphs.
//!
//! A kernel of this layer takes one parameter by value, which a launch passes as bytes; a
//! kernel is checked when it is looked up to take exactly one parameter of the size its caller
//! names, and every launch to pass that many bytes, so a launch can never hand the driver fewer
//! bytes than the kernel reads. A cluster kernel is a [`ClusterKernel`], which
//! launches only with a [`ClusterGeometry`]: launched without cluster dimensions it would die
//! with an illegal instruction and poison the context.

use std::ffi::{c_void, CString};
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result::DriverError as CudaResult;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaStream};

/// The oldest driver this layer runs on: the bindings and the NVRTC cubins are CUDA 13.0's.
pub const MIN_DRIVER_VERSION: DriverVersion = DriverVersion {
    major: 13,
    minor: 0,
};

/// Room for `cuDeviceGetPCIBusId`'s `dddd:bb:dd.f` and its NUL.
const BUS_ID_BYTES: i32 = 32;

/// Largest portable thread-block cluster.
pub const MAX_CLUSTER_SIZE: u32 = 8;

/// Most blocks in a one-dimensional grid (`gridDimX`).
pub const MAX_GRID_BLOCKS: u32 = i32::MAX as u32;

/// Most threads in one block on every supported architecture.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// Why a driver operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// `libcuda.so` could not be loaded.
    #[error(
        "the CUDA driver library (libcuda.so.1) could not be loaded: no NVIDIA driver is \
         installed here, or it is not on the loader path"
    )]
    LibraryMissing,
    /// `cuInit` found no device.
    #[error("the CUDA driver sees no GPU (CUDA_VISIBLE_DEVICES={visible_devices})")]
    NoDevice {
        /// The variable's value, or `<unset>`.
        visible_devices: String,
    },
    /// The driver is older than the bindings and kernels need.
    #[error(
        "the NVIDIA driver supports CUDA {found}; prepare needs a driver for CUDA {required} or \
         newer (R580 or later)"
    )]
    DriverTooOld {
        /// What the driver reports.
        found: DriverVersion,
        /// What this layer needs.
        required: DriverVersion,
    },
    /// A driver call returned an error.
    #[error("{call}{} failed: {name} ({description})", on_device(*.device))]
    Call {
        /// The driver entry point (`cuMemAlloc`).
        call: &'static str,
        /// The GPU ordinal it was about, where there is one.
        device: Option<usize>,
        /// The error's name (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// The driver's description of it.
        description: String,
    },
    /// An ordinal past the visible devices.
    #[error("GPU {ordinal} does not exist: the driver sees {count} GPU(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices visible.
        count: usize,
    },
    /// A kernel whose parameters are not the one parameter its launches pass.
    #[error(
        "kernel {kernel} on GPU {device} takes {found}, but its launches pass one parameter of \
         {expected} bytes by value"
    )]
    ParameterMismatch {
        /// Entry symbol.
        kernel: String,
        /// GPU ordinal.
        device: usize,
        /// What the kernel's metadata says.
        found: String,
        /// Bytes the caller passes.
        expected: usize,
    },
    /// A kernel looked up as ordinary whose binary demands cluster dimensions.
    #[error(
        "kernel {kernel} on GPU {device} must be launched with cluster dimensions; load it as a \
         cluster kernel"
    )]
    ClusterKernelRequired {
        /// Entry symbol.
        kernel: String,
        /// GPU ordinal.
        device: usize,
    },
    /// A cluster kernel paired with a geometry that has no cluster dimensions.
    #[error(
        "kernel {kernel} uses cluster instructions and cannot launch as {geometry}: it needs \
         cluster dimensions"
    )]
    ClusterDimensionsMissing {
        /// Entry symbol.
        kernel: String,
        /// The geometry it was given.
        geometry: Geometry,
    },
    /// A launch geometry the launch contract or the hardware does not allow.
    #[error("invalid launch geometry: {reason}")]
    InvalidGeometry {
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A copy or fill outside a buffer.
    #[error(
        "{operation} of bytes {start}..{end} is outside the {bytes}-byte buffer on GPU {device}"
    )]
    OutOfBounds {
        /// `read`, `write` or `fill`.
        operation: &'static str,
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
        /// The buffer's size.
        bytes: usize,
        /// GPU ordinal.
        device: usize,
    },
    /// A fill whose range does not suit its element width.
    #[error(
        "{operation} needs a range aligned to {width} bytes, got {start}..{end} on GPU {device}"
    )]
    Misaligned {
        /// The operation.
        operation: &'static str,
        /// Element width in bytes.
        width: usize,
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
        /// GPU ordinal.
        device: usize,
    },
    /// A module image that is neither a loadable cubin nor PTX text.
    #[error("the module image for GPU {device} is not a loadable cubin: {reason}")]
    InvalidImage {
        /// GPU ordinal.
        device: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Two objects from different GPUs used together.
    #[error("{what} belongs to GPU {found}, but the stream is on GPU {expected}")]
    WrongDevice {
        /// The object.
        what: String,
        /// Its GPU.
        found: usize,
        /// The stream's GPU.
        expected: usize,
    },
    /// A stream that is not of this GPU's primary context, or one this crate does not own
    /// where it must (a caller's stream is captured by the caller).
    #[error(
        "the stream does not belong to GPU {device}'s primary context, or is a caller's stream \
         where one of this tool's own is needed"
    )]
    ForeignStream {
        /// GPU ordinal.
        device: usize,
    },
    /// An address that is not a range of device memory of this GPU.
    #[error("{bytes} bytes at {address:#x} are not usable memory of GPU {device}: {reason}")]
    NotDeviceMemory {
        /// The address.
        address: u64,
        /// Bytes from it.
        bytes: usize,
        /// GPU ordinal.
        device: usize,
        /// Why not.
        reason: &'static str,
    },
    /// A stream capture that recorded no work.
    #[error("stream capture on GPU {device} recorded no work")]
    EmptyCapture {
        /// GPU ordinal.
        device: usize,
    },
    /// A stream still busy when its wait ended.
    #[error(
        "work on GPU {device} did not finish within {waited:?}; a kernel is still running (a \
         peer that never arrived, or a kernel that does not honour its deadline)"
    )]
    Timeout {
        /// GPU ordinal.
        device: usize,
        /// How long it waited.
        waited: Duration,
    },
}

fn on_device(device: Option<usize>) -> String {
    device.map_or_else(String::new, |ordinal| format!(" on GPU {ordinal}"))
}

impl DriverError {
    fn call(call: &'static str, device: Option<usize>, error: CudaResult) -> DriverError {
        DriverError::Call {
            call,
            device,
            name: error.error_name().map_or_else(
                |_| format!("CUresult {}", error.0 as u32),
                |name| name.to_string_lossy().into_owned(),
            ),
            description: error.error_string().map_or_else(
                |_| "no description".to_owned(),
                |text| text.to_string_lossy().into_owned(),
            ),
        }
    }

    /// The CUDA error name of a failed call (`CUDA_ERROR_ILLEGAL_INSTRUCTION`), if it was one.
    pub fn cuda_error_name(&self) -> Option<&str> {
        match self {
            DriverError::Call { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// Turns a raw `CUresult` into this module's error, naming the call and the device.
fn check(
    result: sys::CUresult,
    call: &'static str,
    device: Option<usize>,
) -> Result<(), DriverError> {
    result
        .result()
        .map_err(|error| DriverError::call(call, device, error))
}

trait CallContext<T> {
    fn during(self, call: &'static str, device: Option<usize>) -> Result<T, DriverError>;
}

impl<T> CallContext<T> for Result<T, CudaResult> {
    fn during(self, call: &'static str, device: Option<usize>) -> Result<T, DriverError> {
        self.map_err(|error| DriverError::call(call, device, error))
    }
}

/// A CUDA version as the driver reports it (13.0 for 13000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl DriverVersion {
    /// Decodes `cuDriverGetVersion`'s `1000 * major + 10 * minor`.
    pub fn from_encoded(encoded: u32) -> DriverVersion {
        DriverVersion {
            major: encoded / 1000,
            minor: (encoded % 1000) / 10,
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}.{}", self.major, self.minor)
    }
}

/// Proof that the driver library is loaded and initialised: every other entry point of this
/// layer starts from one, so no call can reach cudarc's panic on a missing library.
#[derive(Debug, Clone, Copy)]
pub struct Driver {
    version: DriverVersion,
}

impl Driver {
    /// Loads and initialises the driver, refusing one older than [`MIN_DRIVER_VERSION`].
    pub fn open() -> Result<Driver, DriverError> {
        // SAFETY: only tries `dlopen` on the library's candidate names and closes it again; no
        // symbol is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(DriverError::LibraryMissing);
        }
        // SAFETY: the library is present (checked above), so cudarc's loader does not panic;
        // cuInit takes flags that must be 0.
        match unsafe { sys::cuInit(0) } {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(DriverError::NoDevice {
                    visible_devices: std::env::var("CUDA_VISIBLE_DEVICES")
                        .unwrap_or_else(|_| "<unset>".to_owned()),
                });
            }
            error => check(error, "cuInit", None)?,
        }
        let mut encoded = 0;
        // SAFETY: writes one int through a pointer to a live local.
        let result = unsafe { sys::cuDriverGetVersion(&raw mut encoded) };
        check(result, "cuDriverGetVersion", None)?;
        let version = DriverVersion::from_encoded(encoded.max(0) as u32);
        if version < MIN_DRIVER_VERSION {
            return Err(DriverError::DriverTooOld {
                found: version,
                required: MIN_DRIVER_VERSION,
            });
        }
        Ok(Driver { version })
    }

    /// The CUDA version the driver supports.
    pub fn version(self) -> DriverVersion {
        self.version
    }

    /// GPUs visible to this process.
    pub fn device_count(self) -> Result<usize, DriverError> {
        let mut count = 0;
        // SAFETY: the driver is initialised (self exists); writes one int to a live local.
        let result = unsafe { sys::cuDeviceGetCount(&raw mut count) };
        check(result, "cuDeviceGetCount", None)?;
        Ok(count.max(0) as usize)
    }

    fn handle(self, ordinal: usize) -> Result<sys::CUdevice, DriverError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(DriverError::NoSuchDevice { ordinal, count });
        }
        let index =
            i32::try_from(ordinal).map_err(|_| DriverError::NoSuchDevice { ordinal, count })?;
        let mut device = 0;
        // SAFETY: the driver is initialised and the ordinal is below the device count; writes
        // one CUdevice to a live local.
        let result = unsafe { sys::cuDeviceGet(&raw mut device, index) };
        check(result, "cuDeviceGet", Some(ordinal))?;
        Ok(device)
    }

    /// What one GPU is, without creating a context on it.
    pub fn describe(self, ordinal: usize) -> Result<DeviceInfo, DriverError> {
        use sys::CUdevice_attribute as Attribute;
        let device = self.handle(ordinal)?;
        let attribute = |attribute: sys::CUdevice_attribute, call| -> Result<i32, DriverError> {
            let mut value = 0;
            // SAFETY: `device` came from cuDeviceGet; writes one int to a live local.
            let result = unsafe { sys::cuDeviceGetAttribute(&raw mut value, attribute, device) };
            check(result, call, Some(ordinal))?;
            Ok(value)
        };
        let major = attribute(
            Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)",
        )?;
        let minor = attribute(
            Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)",
        )?;
        let sm_count = attribute(
            Attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
        )?;
        let cluster_launch = attribute(
            Attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
            "cuDeviceGetAttribute(CLUSTER_LAUNCH)",
        )?;
        let name = cudarc::driver::result::device::get_name(device)
            .during("cuDeviceGetName", Some(ordinal))?;
        let uuid = cudarc::driver::result::device::get_uuid(device)
            .during("cuDeviceGetUuid", Some(ordinal))?;
        let mut bus_id = [0 as std::ffi::c_char; BUS_ID_BYTES as usize];
        // SAFETY: the buffer is 32 bytes, the length passed; the driver writes a NUL-terminated
        // string of at most that length.
        let result = unsafe { sys::cuDeviceGetPCIBusId(bus_id.as_mut_ptr(), BUS_ID_BYTES, device) };
        check(result, "cuDeviceGetPCIBusId", Some(ordinal))?;
        let mut total_memory = 0usize;
        // SAFETY: `device` came from cuDeviceGet; writes one size_t to a live local.
        let result = unsafe { sys::cuDeviceTotalMem_v2(&raw mut total_memory, device) };
        check(result, "cuDeviceTotalMem", Some(ordinal))?;
        let compute_capability = (major.max(0) as u32, minor.max(0) as u32);
        Ok(DeviceInfo {
            ordinal,
            name,
            uuid: format_uuid(&uuid.bytes.map(|char| char.to_ne_bytes()[0])),
            pci_bus_id: c_chars_to_string(&bus_id),
            compute_capability,
            sm_count: sm_count.max(0) as u32,
            cluster_launch: cluster_launch != 0,
            total_memory_bytes: total_memory as u64,
        })
    }

    /// Whether GPU `ordinal` can map GPU `peer`'s memory.
    pub fn can_access_peer(self, ordinal: usize, peer: usize) -> Result<bool, DriverError> {
        let device = self.handle(ordinal)?;
        let peer_device = self.handle(peer)?;
        let mut can = 0;
        // SAFETY: both handles came from cuDeviceGet; writes one int to a live local.
        let result = unsafe { sys::cuDeviceCanAccessPeer(&raw mut can, device, peer_device) };
        check(result, "cuDeviceCanAccessPeer", Some(ordinal))?;
        Ok(can != 0)
    }

    /// Retains GPU `ordinal`'s primary context.
    pub fn open_device(self, ordinal: usize) -> Result<Device, DriverError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(DriverError::NoSuchDevice { ordinal, count });
        }
        let context =
            CudaContext::new(ordinal).during("cuDevicePrimaryCtxRetain", Some(ordinal))?;
        Ok(Device { ordinal, context })
    }
}

/// GPUs visible to this process: 0 when the driver is installed but sees none, an error when
/// there is no driver or it cannot be used.
pub fn visible_devices() -> Result<usize, DriverError> {
    match Driver::open() {
        Ok(driver) => driver.device_count(),
        Err(DriverError::NoDevice { .. }) => Ok(0),
        Err(error) => Err(error),
    }
}

fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&char| char.to_ne_bytes()[0])
        .take_while(|&byte| byte != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What a GPU is and can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal among the visible GPUs.
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`).
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
    pub uuid: String,
    /// PCI domain, bus, device and function (`0000:18:00.0`).
    pub pci_bus_id: String,
    /// Compute capability (9, 0).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Whether it launches thread-block clusters.
    pub cluster_launch: bool,
    /// Device memory, bytes.
    pub total_memory_bytes: u64,
}

impl DeviceInfo {
    /// The compute capability as an architecture name (`sm_90`), known to this tool or not.
    pub fn arch_name(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// One GPU with its primary context retained. Work goes through its [`Stream`]s.
#[derive(Debug, Clone)]
pub struct Device {
    ordinal: usize,
    context: Arc<CudaContext>,
}

impl Device {
    /// Ordinal among the visible GPUs.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn bind(&self) -> Result<(), DriverError> {
        self.context
            .bind_to_thread()
            .during("cuCtxSetCurrent", Some(self.ordinal))
    }

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

    /// Waits for all work on this GPU, without a bound.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.context
            .synchronize()
            .during("cuCtxSynchronize", Some(self.ordinal))
    }

    /// Free and total device memory, bytes.
    pub fn memory_info(&self) -> Result<(usize, usize), DriverError> {
        self.context
            .mem_get_info()
            .during("cuMemGetInfo", Some(self.ordinal))
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

    /// Whether this GPU can map `peer`'s memory.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool, DriverError> {
        let mut can = 0;
        // SAFETY: both CUdevice handles belong to live contexts; writes one int to a local.
        let result = unsafe {
            sys::cuDeviceCanAccessPeer(
                &raw mut can,
                self.context.cu_device(),
                peer.context.cu_device(),
            )
        };
        check(result, "cuDeviceCanAccessPeer", Some(self.ordinal))?;
        Ok(can != 0)
    }

    /// Lets kernels on this GPU read and write `peer`'s allocations (one direction; call it on
    /// both devices for both). Already enabled is success.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: this context is current and the peer context is alive (held by `peer`); the
        // flags argument must be 0.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.context.cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            error => check(error, "cuCtxEnablePeerAccess", Some(self.ordinal)),
        }
    }

    /// Loads a module (cubin or PTX) into this GPU's context.
    pub fn load_module(&self, image: ModuleImage<'_>) -> Result<Module, DriverError> {
        let text;
        let pointer: *const c_void = match image {
            ModuleImage::Cubin(bytes) => {
                check_cubin(bytes).map_err(|reason| DriverError::InvalidImage {
                    device: self.ordinal,
                    reason,
                })?;
                bytes.as_ptr().cast()
            }
            ModuleImage::Ptx(source) => {
                text = CString::new(source).map_err(|_| DriverError::InvalidImage {
                    device: self.ordinal,
                    reason: "PTX text contains a NUL byte".to_owned(),
                })?;
                text.as_ptr().cast()
            }
        };
        self.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is either a cubin whose header, section and segment tables were
        // checked to lie inside the slice (check_cubin), or NUL-terminated PTX text; both
        // outlive the call, which copies what it needs. The context is current.
        let result = unsafe { sys::cuModuleLoadData(&raw mut module, pointer) };
        check(result, "cuModuleLoadData", Some(self.ordinal))?;
        Ok(Module {
            handle: Arc::new(ModuleHandle {
                module,
                device: self.clone(),
            }),
        })
    }

    /// An event; `timing` makes it usable with [`Event::elapsed_ms`].
    pub fn new_event(&self, timing: bool) -> Result<Event, DriverError> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let event = self
            .context
            .new_event(Some(flags))
            .during("cuEventCreate", Some(self.ordinal))?;
        Ok(Event {
            ordinal: self.ordinal,
            event,
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

impl DeviceMemory for DeviceBuffer {
    fn address(&self) -> u64 {
        self.address
    }
    fn len_bytes(&self) -> usize {
        self.bytes
    }
    fn ordinal(&self) -> usize {
        self.device.ordinal
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; they only arise on a context that is already
        // broken, which the calls that broke it reported.
        if self.device.bind().is_ok() {
            // SAFETY: the context is current; waiting for its work first means no queued
            // kernel, copy or fill still uses the allocation when it is freed; the address is
            // this allocation's base and is freed exactly once.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuMemFree_v2(self.address);
            }
        }
    }
}

/// Pinned host memory of 64-bit words the device copies into asynchronously, so the host can
/// look at a device word without waiting for any stream; freed on drop.
#[derive(Debug)]
pub struct HostWords {
    words: *mut u64,
    count: usize,
    device: Device,
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
        self.bind()?;
        let mut words: *mut c_void = std::ptr::null_mut();
        let bytes = count.max(1) * 8;
        // SAFETY: the context is current; the pointer is a live local written by the call.
        let result = unsafe { sys::cuMemAllocHost_v2(&raw mut words, bytes) };
        check(result, "cuMemAllocHost", Some(self.ordinal))?;
        // SAFETY: the allocation holds `bytes` writable bytes, 8-byte aligned (page aligned).
        unsafe { std::ptr::write_bytes(words.cast::<u8>(), 0, bytes) };
        Ok(HostWords {
            words: words.cast(),
            count: count.max(1),
            device: self.clone(),
        })
    }
}

impl HostWords {
    /// Word `index` as last written (by a finished copy, or zero).
    pub fn get(&self, index: usize) -> u64 {
        assert!(index < self.count, "word {index} of {}", self.count);
        // SAFETY: in bounds (asserted); the memory lives as long as self; a volatile read
        // because the device writes it behind the compiler's back.
        unsafe { std::ptr::read_volatile(self.words.add(index)) }
    }
}

impl Drop for HostWords {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: waiting for the context's work first means no copy still writes the
            // words; the pointer is this allocation's and is freed exactly once.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuMemFreeHost(self.words.cast());
            }
        }
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

impl DeviceMemory for PeerBuffer {
    fn address(&self) -> u64 {
        self.address
    }
    fn len_bytes(&self) -> usize {
        self.bytes
    }
    fn ordinal(&self) -> usize {
        self.device.ordinal
    }
}

impl Drop for PeerBuffer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the context is current and idle after the synchronize, so no work uses
            // the mapping; it was opened by cuIpcOpenMemHandle and is closed exactly once.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuIpcCloseMemHandle(self.address);
            }
        }
    }
}

/// What a module is loaded from.
#[derive(Debug, Clone, Copy)]
pub enum ModuleImage<'a> {
    /// An ELF cubin (NVRTC's `nvrtcGetCUBIN`).
    Cubin(&'a [u8]),
    /// PTX text, compiled by the driver when loaded.
    Ptx(&'a str),
}

/// Checks that a cubin's ELF header, section table and segment table, and every section and
/// segment they name, lie inside the slice: `cuModuleLoadData` takes no length and trusts them.
/// Public for the fuzz targets.
pub fn check_cubin(image: &[u8]) -> Result<(), String> {
    const HEADER_BYTES: usize = 64;
    const SECTION_HEADER_BYTES: usize = 64;
    const PROGRAM_HEADER_BYTES: usize = 56;
    const MACHINE_CUDA: u16 = 190;
    const SECTION_NULL: u32 = 0;
    const SECTION_NOBITS: u32 = 8;

    let u16_at = |offset: usize| u16::from_le_bytes([image[offset], image[offset + 1]]);
    let u32_at =
        |offset: usize| u32::from_le_bytes(image[offset..offset + 4].try_into().expect("4 bytes"));
    let u64_at =
        |offset: usize| u64::from_le_bytes(image[offset..offset + 8].try_into().expect("8 bytes"));
    let inside = |offset: u64, length: u64| {
        offset
            .checked_add(length)
            .is_some_and(|end| end <= image.len() as u64)
    };

    if image.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes is shorter than an ELF header ({HEADER_BYTES} bytes)",
            image.len()
        ));
    }
    if image[0..4] != [0x7f, b'E', b'L', b'F'] {
        return Err("it does not start with the ELF magic (PTX goes in as text)".to_owned());
    }
    if image[4] != 2 || image[5] != 1 {
        return Err("it is not a 64-bit little-endian ELF file".to_owned());
    }
    let machine = u16_at(18);
    if machine != MACHINE_CUDA {
        return Err(format!(
            "its ELF machine is {machine}, not CUDA ({MACHINE_CUDA})"
        ));
    }
    let program_offset = u64_at(32);
    let section_offset = u64_at(40);
    let program_entry = u64::from(u16_at(54));
    let program_count = u64::from(u16_at(56));
    let section_entry = u64::from(u16_at(58));
    let section_count = u64::from(u16_at(60));

    if section_count == 0 && section_offset != 0 {
        return Err("it uses extended section numbering, which cubins never do".to_owned());
    }
    if section_count > 0 && section_entry < SECTION_HEADER_BYTES as u64 {
        return Err(format!(
            "its section headers are {section_entry} bytes, not 64"
        ));
    }
    if program_count > 0 && program_entry < PROGRAM_HEADER_BYTES as u64 {
        return Err(format!(
            "its program headers are {program_entry} bytes, not 56"
        ));
    }
    if !inside(section_offset, section_entry * section_count) {
        return Err("its section header table runs past the end of the file".to_owned());
    }
    if !inside(program_offset, program_entry * program_count) {
        return Err("its program header table runs past the end of the file".to_owned());
    }
    for index in 0..section_count {
        let header = (section_offset + index * section_entry) as usize;
        let kind = u32_at(header + 4);
        if kind == SECTION_NULL || kind == SECTION_NOBITS {
            continue;
        }
        if !inside(u64_at(header + 24), u64_at(header + 32)) {
            return Err(format!("section {index} runs past the end of the file"));
        }
    }
    for index in 0..program_count {
        let header = (program_offset + index * program_entry) as usize;
        if !inside(u64_at(header + 8), u64_at(header + 32)) {
            return Err(format!("segment {index} runs past the end of the file"));
        }
    }
    Ok(())
}

#[derive(Debug)]
struct ModuleHandle {
    module: sys::CUmodule,
    device: Device,
}

// SAFETY: a CUmodule is a driver handle, not host memory; the driver API may use it from any
// thread once its context is current, which every use here arranges through `Device::bind`.
unsafe impl Send for ModuleHandle {}
// SAFETY: as for Send: no method mutates host state behind the handle.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the context is current and idle after the synchronize, so no kernel of
            // the module still runs; every Function holds this handle, so none outlives it;
            // unloaded exactly once.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuModuleUnload(self.module);
            }
        }
    }
}

/// A module loaded into one GPU's context; unloaded when it and every kernel from it are gone.
#[derive(Debug, Clone)]
pub struct Module {
    handle: Arc<ModuleHandle>,
}

impl Module {
    fn function(&self, entry: &str, parameter_bytes: usize) -> Result<Function, DriverError> {
        let device = &self.handle.device;
        let name = CString::new(entry).map_err(|_| DriverError::InvalidImage {
            device: device.ordinal,
            reason: format!("entry name {entry:?} contains a NUL byte"),
        })?;
        device.bind()?;
        let mut function = std::ptr::null_mut();
        // SAFETY: the module is loaded in the current context and outlives the call; the name
        // is NUL-terminated; writes one handle to a live local.
        let result = unsafe {
            sys::cuModuleGetFunction(&raw mut function, self.handle.module, name.as_ptr())
        };
        check(result, "cuModuleGetFunction", Some(device.ordinal))?;
        let function = Function {
            raw: function,
            entry: entry.to_owned(),
            parameter_bytes,
            module: Arc::clone(&self.handle),
        };
        function.check_parameters()?;
        Ok(function)
    }

    /// An ordinary kernel taking one parameter of `parameter_bytes`: launched with or without
    /// cluster dimensions.
    pub fn kernel(&self, entry: &str, parameter_bytes: usize) -> Result<Kernel, DriverError> {
        let function = self.function(entry, parameter_bytes)?;
        if function.attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
            "cuFuncGetAttribute(CLUSTER_SIZE_MUST_BE_SET)",
        )? != 0
        {
            return Err(DriverError::ClusterKernelRequired {
                kernel: entry.to_owned(),
                device: function.ordinal(),
            });
        }
        Ok(Kernel { function })
    }

    /// A kernel with cluster instructions taking one parameter of `parameter_bytes`: launched
    /// only with cluster dimensions.
    pub fn cluster_kernel(
        &self,
        entry: &str,
        parameter_bytes: usize,
    ) -> Result<ClusterKernel, DriverError> {
        Ok(ClusterKernel {
            function: self.function(entry, parameter_bytes)?,
        })
    }

    /// The kernel as a [`LoadedKernel`], a cluster kernel when `cluster` says so.
    pub fn load(
        &self,
        entry: &str,
        cluster: bool,
        parameter_bytes: usize,
    ) -> Result<LoadedKernel, DriverError> {
        if cluster {
            self.cluster_kernel(entry, parameter_bytes)
                .map(LoadedKernel::Cluster)
        } else {
            self.kernel(entry, parameter_bytes)
                .map(LoadedKernel::Ordinary)
        }
    }
}

/// A kernel entry point checked to take one parameter of a known size; what [`Kernel`] and
/// [`ClusterKernel`] share.
#[derive(Debug)]
pub struct Function {
    raw: sys::CUfunction,
    entry: String,
    parameter_bytes: usize,
    module: Arc<ModuleHandle>,
}

// SAFETY: a CUfunction is a driver handle valid in any thread while its module is loaded
// (held by `module`); every use binds the module's context first.
unsafe impl Send for Function {}
// SAFETY: as for Send: methods only read through the handle.
unsafe impl Sync for Function {}

impl Function {
    /// The entry symbol.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The GPU it is loaded on.
    pub fn ordinal(&self) -> usize {
        self.module.device.ordinal
    }

    fn attribute(
        &self,
        attribute: sys::CUfunction_attribute,
        call: &'static str,
    ) -> Result<i32, DriverError> {
        let mut value = 0;
        // SAFETY: the function's module is loaded (held by self); writes one int to a local.
        let result = unsafe { sys::cuFuncGetAttribute(&raw mut value, attribute, self.raw) };
        check(result, call, Some(self.ordinal()))?;
        Ok(value)
    }

    /// Registers per thread the kernel was compiled to.
    pub fn registers(&self) -> Result<u32, DriverError> {
        self.attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
            "cuFuncGetAttribute(NUM_REGS)",
        )
        .map(|value| value.max(0) as u32)
    }

    /// Refuses an entry point whose parameters are not exactly one of `parameter_bytes`.
    fn check_parameters(&self) -> Result<(), DriverError> {
        let expected = self.parameter_bytes;
        let mismatch = |found: String| DriverError::ParameterMismatch {
            kernel: self.entry.clone(),
            device: self.ordinal(),
            found,
            expected,
        };
        let info = |index: usize| {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: the function's module is loaded (held by self); writes two locals. An
            // index past the last parameter is answered with CUDA_ERROR_INVALID_VALUE.
            let result =
                unsafe { sys::cuFuncGetParamInfo(self.raw, index, &raw mut offset, &raw mut size) };
            (result, offset, size)
        };
        let (first, offset, size) = info(0);
        match first {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                return Err(mismatch("no parameters".to_owned()));
            }
            error => check(error, "cuFuncGetParamInfo", Some(self.ordinal()))?,
        }
        let (second, _, _) = info(1);
        match second {
            sys::CUresult::CUDA_ERROR_INVALID_VALUE => {}
            sys::CUresult::CUDA_SUCCESS => {
                return Err(mismatch("more than one parameter".to_owned()));
            }
            error => check(error, "cuFuncGetParamInfo", Some(self.ordinal()))?,
        }
        if offset != 0 || size != expected {
            return Err(mismatch(format!(
                "one parameter of {size} bytes at offset {offset}"
            )));
        }
        Ok(())
    }

    /// Blocks of `threads` threads one multiprocessor holds at once.
    pub fn max_active_blocks_per_multiprocessor(&self, threads: u32) -> Result<u32, DriverError> {
        let block_size = i32::try_from(threads).map_err(|_| DriverError::InvalidGeometry {
            reason: format!(
                "{threads} threads per block; 1 to {MAX_THREADS_PER_BLOCK} are possible"
            ),
        })?;
        self.module.device.bind()?;
        let mut blocks = 0;
        // SAFETY: the function's module is loaded in the current context; writes one int.
        let result = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &raw mut blocks,
                self.raw,
                block_size,
                0,
            )
        };
        check(
            result,
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            Some(self.ordinal()),
        )?;
        Ok(blocks.max(0) as u32)
    }

    /// Clusters of this geometry the GPU holds at once.
    pub fn max_active_clusters(&self, geometry: ClusterGeometry) -> Result<u32, DriverError> {
        self.module.device.bind()?;
        let mut attribute = cluster_attribute(geometry.0.cluster_size.unwrap_or(1));
        let config = launch_config(&geometry.0, std::ptr::null_mut(), &mut attribute, true);
        let mut clusters = 0;
        // SAFETY: the function's module is loaded in the current context; `config` and the
        // attribute it points to live across the call; writes one int.
        let result = unsafe {
            sys::cuOccupancyMaxActiveClusters(&raw mut clusters, self.raw, &raw const config)
        };
        check(result, "cuOccupancyMaxActiveClusters", Some(self.ordinal()))?;
        Ok(clusters.max(0) as u32)
    }

    /// Blocks of `threads` threads the whole GPU holds at once: blocks per multiprocessor
    /// times multiprocessors.
    pub fn max_active_blocks(&self, threads: u32) -> Result<u32, DriverError> {
        let per_multiprocessor = self.max_active_blocks_per_multiprocessor(threads)?;
        let multiprocessors = self
            .module
            .device
            .context
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during(
                "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
                Some(self.ordinal()),
            )?;
        Ok(per_multiprocessor.saturating_mul(multiprocessors.max(0) as u32))
    }
}

/// An ordinary kernel: no cluster instructions, so it may launch with or without cluster
/// dimensions.
#[derive(Debug)]
pub struct Kernel {
    function: Function,
}

impl Deref for Kernel {
    type Target = Function;
    fn deref(&self) -> &Function {
        &self.function
    }
}

/// A kernel with cluster instructions: it launches only with a [`ClusterGeometry`].
#[derive(Debug)]
pub struct ClusterKernel {
    function: Function,
}

impl Deref for ClusterKernel {
    type Target = Function;
    fn deref(&self) -> &Function {
        &self.function
    }
}

/// A kernel whose kind is known at run time (from `KernelSpec::cluster`).
#[derive(Debug)]
pub enum LoadedKernel {
    /// No cluster instructions.
    Ordinary(Kernel),
    /// Cluster instructions: needs cluster dimensions.
    Cluster(ClusterKernel),
}

impl Deref for LoadedKernel {
    type Target = Function;
    fn deref(&self) -> &Function {
        match self {
            LoadedKernel::Ordinary(kernel) => kernel,
            LoadedKernel::Cluster(kernel) => kernel,
        }
    }
}

impl LoadedKernel {
    /// Whether it must launch with cluster dimensions.
    pub fn is_cluster(&self) -> bool {
        matches!(self, LoadedKernel::Cluster(_))
    }
}

/// A launch geometry: one-dimensional grid and block, optional one-dimensional clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    blocks: u32,
    threads: u32,
    cluster_size: Option<u32>,
}

/// A geometry with cluster dimensions, the only kind a [`ClusterKernel`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterGeometry(Geometry);

impl Geometry {
    /// `blocks` blocks of `threads` threads, no clusters.
    pub fn new(blocks: u32, threads: u32) -> Result<Geometry, DriverError> {
        let invalid = |reason: String| Err(DriverError::InvalidGeometry { reason });
        if blocks == 0 || blocks > MAX_GRID_BLOCKS {
            return invalid(format!(
                "{blocks} blocks; 1 to {MAX_GRID_BLOCKS} are possible"
            ));
        }
        if threads == 0 || threads > MAX_THREADS_PER_BLOCK {
            return invalid(format!(
                "{threads} threads per block; 1 to {MAX_THREADS_PER_BLOCK} are possible"
            ));
        }
        Ok(Geometry {
            blocks,
            threads,
            cluster_size: None,
        })
    }

    /// `blocks` blocks of `threads` threads in clusters of `cluster_size` blocks.
    pub fn clustered(
        blocks: u32,
        threads: u32,
        cluster_size: u32,
    ) -> Result<ClusterGeometry, DriverError> {
        let plain = Geometry::new(blocks, threads)?;
        if cluster_size == 0 || cluster_size > MAX_CLUSTER_SIZE {
            return Err(DriverError::InvalidGeometry {
                reason: format!(
                    "clusters of {cluster_size} blocks; 1 to {MAX_CLUSTER_SIZE} are portable"
                ),
            });
        }
        if blocks % cluster_size != 0 {
            return Err(DriverError::InvalidGeometry {
                reason: format!(
                    "{blocks} blocks is not a whole number of clusters of {cluster_size}"
                ),
            });
        }
        Ok(ClusterGeometry(Geometry {
            cluster_size: Some(cluster_size),
            ..plain
        }))
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// Blocks per cluster, when clustered.
    pub fn cluster_size(&self) -> Option<u32> {
        self.cluster_size
    }

    /// The same geometry as a [`ClusterGeometry`], when it has cluster dimensions.
    pub fn cluster(&self) -> Option<ClusterGeometry> {
        self.cluster_size.map(|_| ClusterGeometry(*self))
    }
}

impl From<ClusterGeometry> for Geometry {
    fn from(geometry: ClusterGeometry) -> Geometry {
        geometry.0
    }
}

impl Deref for ClusterGeometry {
    type Target = Geometry;
    fn deref(&self) -> &Geometry {
        &self.0
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} blocks x {} threads",
            self.blocks, self.threads
        )?;
        if let Some(size) = self.cluster_size {
            write!(formatter, " in clusters of {size}")?;
        }
        Ok(())
    }
}

fn cluster_attribute(cluster_size: u32) -> sys::CUlaunchAttribute {
    // SAFETY: CUlaunchAttribute is a plain C struct and union of integers for which all-zero
    // bytes are a valid value; the fields that matter are set below.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster_size,
        y: 1,
        z: 1,
    };
    attribute
}

fn launch_config(
    geometry: &Geometry,
    stream: sys::CUstream,
    attribute: &mut sys::CUlaunchAttribute,
    clustered: bool,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: geometry.blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: geometry.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: if clustered {
            std::ptr::from_mut(attribute)
        } else {
            std::ptr::null_mut()
        },
        numAttrs: u32::from(clustered),
    }
}

/// A stream on one GPU: a non-blocking one of this crate's, or a caller's, borrowed.
#[derive(Debug)]
pub struct Stream {
    ordinal: usize,
    context: Arc<CudaContext>,
    raw: sys::CUstream,
    // The stream this value owns; `None` for a caller's, which the caller keeps alive.
    owned: Option<Arc<CudaStream>>,
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

    fn bind(&self) -> Result<(), DriverError> {
        self.context
            .bind_to_thread()
            .during("cuCtxSetCurrent", Some(self.ordinal))
    }

    fn checked_range(
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

    /// Copies `data` into `memory` at byte `offset` and waits for the copy.
    pub fn write<T: DeviceCopy>(
        &self,
        memory: &impl DeviceMemory,
        offset: usize,
        data: &[T],
    ) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(data);
        let range = offset..offset.saturating_add(bytes);
        let address = Self::checked_range(memory, "write", &range)?;
        self.bind()?;
        // SAFETY: the destination range lies inside the allocation (checked above); the source
        // is `bytes` readable bytes borrowed until the stream is synchronised below, so the
        // copy never reads it after this function returns.
        let result =
            unsafe { sys::cuMemcpyHtoDAsync_v2(address, data.as_ptr().cast(), bytes, self.raw) };
        check(result, "cuMemcpyHtoDAsync", Some(self.ordinal))?;
        self.synchronize()
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
            sys::cuMemcpyDtoHAsync_v2(words.words.add(index).cast(), address, 8, self.raw)
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
        let range = offset..offset.saturating_add(bytes);
        let address = Self::checked_range(memory, "read", &range)?;
        self.bind()?;
        // SAFETY: the source range lies inside the allocation (checked above); `out` is
        // `bytes` writable bytes, exclusively borrowed until the stream is synchronised below,
        // and every bit pattern is a valid T (DeviceCopy).
        let result =
            unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), address, bytes, self.raw) };
        check(result, "cuMemcpyDtoHAsync", Some(self.ordinal))?;
        self.synchronize()
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

    fn launch_function(
        &self,
        function: &Function,
        geometry: Geometry,
        params: &[u8],
    ) -> Result<(), DriverError> {
        if params.len() != function.parameter_bytes {
            return Err(DriverError::ParameterMismatch {
                kernel: function.entry.clone(),
                device: function.ordinal(),
                found: format!("one parameter of {} bytes", function.parameter_bytes),
                expected: params.len(),
            });
        }
        if function.ordinal() != self.ordinal {
            return Err(DriverError::WrongDevice {
                what: format!("kernel {}", function.entry),
                found: function.ordinal(),
                expected: self.ordinal,
            });
        }
        self.bind()?;
        let clustered = geometry.cluster_size.is_some();
        let mut attribute = cluster_attribute(geometry.cluster_size.unwrap_or(1));
        let config = launch_config(&geometry, self.raw, &mut attribute, clustered);
        let mut arguments = [params.as_ptr().cast_mut().cast::<c_void>()];
        // SAFETY: the function was checked at lookup to take exactly one parameter of
        // `parameter_bytes`, and `params` holds that many bytes (checked above), so the driver
        // reads exactly `params`, which is borrowed for the call (the driver copies it before
        // returning). `config` and its
        // attribute live across the call; the function's module is loaded in the current
        // context, which is the stream's (same device, checked above).
        let result = unsafe {
            sys::cuLaunchKernelEx(
                &raw const config,
                function.raw,
                arguments.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(result, "cuLaunchKernelEx", Some(self.ordinal))
    }

    /// Launches an ordinary kernel, with cluster dimensions if the geometry has them.
    pub fn launch(
        &self,
        kernel: &Kernel,
        geometry: Geometry,
        params: &[u8],
    ) -> Result<(), DriverError> {
        self.launch_function(kernel, geometry, params)
    }

    /// Launches a cluster kernel; the geometry always carries cluster dimensions.
    pub fn launch_cluster(
        &self,
        kernel: &ClusterKernel,
        geometry: ClusterGeometry,
        params: &[u8],
    ) -> Result<(), DriverError> {
        self.launch_function(kernel, geometry.0, params)
    }

    /// Launches a kernel whose kind is known at run time; a cluster kernel with a geometry
    /// without cluster dimensions is refused before the driver sees it.
    pub fn launch_loaded(
        &self,
        kernel: &LoadedKernel,
        geometry: Geometry,
        params: &[u8],
    ) -> Result<(), DriverError> {
        match kernel {
            LoadedKernel::Ordinary(kernel) => self.launch(kernel, geometry, params),
            LoadedKernel::Cluster(kernel) => {
                let clustered =
                    geometry
                        .cluster()
                        .ok_or_else(|| DriverError::ClusterDimensionsMissing {
                            kernel: kernel.entry.clone(),
                            geometry,
                        })?;
                self.launch_cluster(kernel, clustered, params)
            }
        }
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

    /// Records `event` at the current end of the stream.
    pub fn record(&self, event: &Event) -> Result<(), DriverError> {
        if event.ordinal != self.ordinal {
            return Err(DriverError::WrongDevice {
                what: "event".to_owned(),
                found: event.ordinal,
                expected: self.ordinal,
            });
        }
        self.bind()?;
        // SAFETY: the event is alive (borrowed) and of this stream's device (checked above);
        // the stream is alive and belongs to the current context.
        let result = unsafe { sys::cuEventRecord(event.event.cu_event(), self.raw) };
        check(result, "cuEventRecord", Some(self.ordinal))
    }

    /// Makes later work on this stream wait for `event` (which may be on another GPU).
    pub fn wait_for(&self, event: &Event) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: the event and the stream are alive (borrowed, or kept alive by the caller
        // that lent the stream); the stream's context is current.
        let result = unsafe { sys::cuStreamWaitEvent(self.raw, event.event.cu_event(), 0) };
        check(result, "cuStreamWaitEvent", Some(self.ordinal))
    }

    /// Captures what `record` queues on the stream it is given (this one) into a graph.
    /// During capture only work that stays on the device can be queued (launches, fills,
    /// device copies, NCCL): a host copy fails the capture. The stream is borrowed exclusively
    /// so no other thread's work lands in the graph.
    pub fn capture<F, E>(&mut self, record: F) -> Result<Graph, E>
    where
        F: FnOnce(&Stream) -> Result<(), E>,
        E: From<DriverError>,
    {
        let owned = self.owned.clone().ok_or(DriverError::ForeignStream {
            device: self.ordinal,
        })?;
        owned
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("cuStreamBeginCapture", Some(self.ordinal))?;
        let recorded = record(self);
        let ended = owned
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .during("cuStreamEndCapture/cuGraphInstantiate", Some(self.ordinal));
        recorded?;
        let empty = || DriverError::EmptyCapture {
            device: self.ordinal,
        };
        let graph = ended?.ok_or_else(empty)?;
        let mut nodes = 0usize;
        // SAFETY: the graph is alive (owned by `graph`); a null node array asks only for the
        // count, written to a live local.
        let result =
            unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &raw mut nodes) };
        check(result, "cuGraphGetNodes", Some(self.ordinal))?;
        // An empty graph is valid to CUDA, but a capture that queued nothing is a caller's bug.
        if nodes == 0 {
            return Err(empty().into());
        }
        Ok(Graph {
            ordinal: self.ordinal,
            graph,
        })
    }
}

/// An instantiated graph, replayed on the stream it was captured from. Its kernels hold device
/// addresses, not buffers: keep every buffer they use alive while the graph is replayed.
pub struct Graph {
    ordinal: usize,
    graph: CudaGraph,
}

impl fmt::Debug for Graph {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Graph")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// Queues one replay.
    pub fn launch(&self) -> Result<(), DriverError> {
        self.graph
            .launch()
            .during("cuGraphLaunch", Some(self.ordinal))
    }

    /// Uploads the graph's resources so that the first replay costs no setup.
    pub fn upload(&self) -> Result<(), DriverError> {
        self.graph
            .upload()
            .during("cuGraphUpload", Some(self.ordinal))
    }
}

/// A CUDA event on one GPU.
#[derive(Debug)]
pub struct Event {
    ordinal: usize,
    event: CudaEvent,
}

impl Event {
    /// Waits until the work recorded before it is done.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.event
            .synchronize()
            .during("cuEventSynchronize", Some(self.ordinal))
    }

    /// Milliseconds from this event to `end` (both created with timing, both recorded);
    /// waits for both.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        self.event
            .elapsed_ms(&end.event)
            .during("cuEventElapsedTime", Some(self.ordinal))
    }
}

impl Stream {
    /// Makes the stream's context current on this thread (NCCL binds communicators to the
    /// current device).
    pub fn bind_current(&self) -> Result<(), DriverError> {
        self.bind()
    }

    /// Makes the stream's context current on this thread and returns the raw stream, for the
    /// NCCL layer, which enqueues on it.
    pub(super) fn bound_raw(&self) -> Result<sys::CUstream, DriverError> {
        self.bind()?;
        Ok(self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_and_order() {
        assert_eq!(
            DriverVersion::from_encoded(13000),
            DriverVersion {
                major: 13,
                minor: 0
            }
        );
        assert_eq!(DriverVersion::from_encoded(12090).to_string(), "12.9");
        assert!(DriverVersion::from_encoded(12090) < MIN_DRIVER_VERSION);
        assert!(DriverVersion::from_encoded(13010) > MIN_DRIVER_VERSION);
    }

    #[test]
    fn uuid_prints_like_nvidia_smi() {
        let bytes: [u8; 16] = std::array::from_fn(|index| (index * 17) as u8);
        assert_eq!(
            format_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn geometry_rules() {
        let plain = Geometry::new(16, 256).unwrap();
        assert_eq!(plain.cluster(), None);
        assert_eq!(plain.to_string(), "16 blocks x 256 threads");
        let clustered = Geometry::clustered(64, 512, 8).unwrap();
        assert_eq!(clustered.cluster_size(), Some(8));
        assert_eq!(
            Geometry::from(clustered).to_string(),
            "64 blocks x 512 threads in clusters of 8"
        );
        assert_eq!(Geometry::from(clustered).cluster(), Some(clustered));

        let errors = [
            Geometry::new(0, 256).unwrap_err(),
            Geometry::new(MAX_GRID_BLOCKS + 1, 256).unwrap_err(),
            Geometry::new(4, 0).unwrap_err(),
            Geometry::new(4, 2048).unwrap_err(),
            Geometry::clustered(64, 512, 16).unwrap_err(),
            Geometry::clustered(60, 512, 8).unwrap_err(),
        ];
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        insta::assert_snapshot!(messages.join("\n"), @r"
        invalid launch geometry: 0 blocks; 1 to 2147483647 are possible
        invalid launch geometry: 2147483648 blocks; 1 to 2147483647 are possible
        invalid launch geometry: 0 threads per block; 1 to 1024 are possible
        invalid launch geometry: 2048 threads per block; 1 to 1024 are possible
        invalid launch geometry: clusters of 16 blocks; 1 to 8 are portable
        invalid launch geometry: 60 blocks is not a whole number of clusters of 8
        ");
    }

    /// A minimal ELF64 cubin: header, one PROGBITS section of `payload` bytes, its section
    /// table, one segment over the payload.
    fn synthetic_cubin(payload: usize) -> Vec<u8> {
        let mut image = vec![0u8; 64];
        image[0..4].copy_from_slice(&[0x7f, b'E', b'L', b'F']);
        image[4] = 2;
        image[5] = 1;
        image[18..20].copy_from_slice(&190u16.to_le_bytes());
        let payload_offset = image.len() as u64;
        image.extend(std::iter::repeat_n(0xab, payload));
        let section_offset = image.len() as u64;
        let mut null_section = vec![0u8; 64];
        let mut section = vec![0u8; 64];
        section[4..8].copy_from_slice(&1u32.to_le_bytes());
        section[24..32].copy_from_slice(&payload_offset.to_le_bytes());
        section[32..40].copy_from_slice(&(payload as u64).to_le_bytes());
        image.append(&mut null_section);
        image.append(&mut section);
        let program_offset = image.len() as u64;
        let mut segment = vec![0u8; 56];
        segment[8..16].copy_from_slice(&payload_offset.to_le_bytes());
        segment[32..40].copy_from_slice(&(payload as u64).to_le_bytes());
        image.append(&mut segment);
        image[32..40].copy_from_slice(&program_offset.to_le_bytes());
        image[40..48].copy_from_slice(&section_offset.to_le_bytes());
        image[54..56].copy_from_slice(&56u16.to_le_bytes());
        image[56..58].copy_from_slice(&1u16.to_le_bytes());
        image[58..60].copy_from_slice(&64u16.to_le_bytes());
        image[60..62].copy_from_slice(&2u16.to_le_bytes());
        image
    }

    #[test]
    fn a_well_formed_cubin_passes() {
        assert_eq!(check_cubin(&synthetic_cubin(100)), Ok(()));
    }

    #[test]
    fn a_cubin_that_lies_about_its_extent_is_refused() {
        let good = synthetic_cubin(100);
        let mut cases = Vec::new();
        cases.push(check_cubin(&good[..40]));
        cases.push(check_cubin(
            b"//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90\n",
        ));
        let mut wrong_class = good.clone();
        wrong_class[4] = 1;
        cases.push(check_cubin(&wrong_class));
        let mut wrong_machine = good.clone();
        wrong_machine[18..20].copy_from_slice(&62u16.to_le_bytes());
        cases.push(check_cubin(&wrong_machine));
        // Truncated: the tables at the end are cut off.
        cases.push(check_cubin(&good[..good.len() - 10]));
        let mut long_section = good.clone();
        let section_header = 64 + 100 + 64;
        long_section[section_header + 32..section_header + 40]
            .copy_from_slice(&10_000u64.to_le_bytes());
        cases.push(check_cubin(&long_section));
        let mut overflowing_section = good.clone();
        overflowing_section[section_header + 24..section_header + 32]
            .copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push(check_cubin(&overflowing_section));
        let mut long_segment = good.clone();
        let segment_header = 64 + 100 + 128;
        long_segment[segment_header + 32..segment_header + 40]
            .copy_from_slice(&10_000u64.to_le_bytes());
        cases.push(check_cubin(&long_segment));
        let mut small_entries = good.clone();
        small_entries[58..60].copy_from_slice(&32u16.to_le_bytes());
        cases.push(check_cubin(&small_entries));
        let mut extended = good;
        extended[60..62].copy_from_slice(&0u16.to_le_bytes());
        cases.push(check_cubin(&extended));

        let messages: Vec<String> = cases.into_iter().map(|case| case.unwrap_err()).collect();
        insta::assert_snapshot!(messages.join("\n"), @r"
        40 bytes is shorter than an ELF header (64 bytes)
        it does not start with the ELF magic (PTX goes in as text)
        it is not a 64-bit little-endian ELF file
        its ELF machine is 62, not CUDA (190)
        its program header table runs past the end of the file
        section 1 runs past the end of the file
        section 1 runs past the end of the file
        segment 0 runs past the end of the file
        its section headers are 32 bytes, not 64
        it uses extended section numbering, which cubins never do
        ");
    }

    #[test]
    fn call_errors_name_the_call_and_the_device() {
        let error = DriverError::Call {
            call: "cuMemAlloc",
            device: Some(1),
            name: "CUDA_ERROR_OUT_OF_MEMORY".to_owned(),
            description: "out of memory".to_owned(),
        };
        assert_eq!(
            error.to_string(),
            "cuMemAlloc on GPU 1 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
        assert_eq!(error.cuda_error_name(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        let without_device = DriverError::Call {
            call: "cuInit",
            device: None,
            name: "CUDA_ERROR_UNKNOWN".to_owned(),
            description: "unknown error".to_owned(),
        };
        assert_eq!(
            without_device.to_string(),
            "cuInit failed: CUDA_ERROR_UNKNOWN (unknown error)"
        );
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        // On a machine with a driver this returns a count; without one, an error. Either way
        // it must return.
        match visible_devices() {
            Ok(_) | Err(DriverError::LibraryMissing | DriverError::DriverTooOld { .. }) => {}
            Err(other) => panic!("unexpected driver failure: {other}"),
        }
    }
}
