//! The driver itself and the GPUs it sees: loading and initialising the library, what each GPU
//! is, peer access between GPUs, and a GPU's primary context.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;

use super::error::{check, CallContext, DriverError};
use super::version::{DriverVersion, MIN_DRIVER_VERSION};

/// Room for `cuDeviceGetPCIBusId`'s `dddd:bb:dd.f` and its NUL.
const BUS_ID_BYTES: i32 = 32;

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
        let read = |attribute: sys::CUdevice_attribute, call| -> Result<i32, DriverError> {
            let mut value = 0;
            // SAFETY: `device` came from cuDeviceGet; writes one int to a live local.
            let result = unsafe { sys::cuDeviceGetAttribute(&raw mut value, attribute, device) };
            check(result, call, Some(ordinal))?;
            Ok(value)
        };
        // One attribute by its name, which also names the call in an error.
        macro_rules! attribute {
            ($name:ident) => {
                read(
                    Attribute::$name,
                    concat!("cuDeviceGetAttribute(", stringify!($name), ")"),
                )
            };
        }
        let major = attribute!(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute!(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm_count = attribute!(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let cluster_launch = attribute!(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)?;
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

/// Makes `context` (GPU `ordinal`'s) current on this thread.
pub(super) fn bind(context: &CudaContext, ordinal: usize) -> Result<(), DriverError> {
    context
        .bind_to_thread()
        .during("cuCtxSetCurrent", Some(ordinal))
}

/// One GPU with its primary context retained. Work goes through its
/// [`Stream`](super::Stream)s.
#[derive(Debug, Clone)]
pub struct Device {
    pub(super) ordinal: usize,
    pub(super) context: Arc<CudaContext>,
}

impl Device {
    /// Ordinal among the visible GPUs.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(super) fn bind(&self) -> Result<(), DriverError> {
        bind(&self.context, self.ordinal)
    }

    /// Runs `release` with this GPU's context current and idle, so no queued kernel, copy or
    /// fill still uses what it gives back: how the memory and modules of this layer are freed
    /// on drop. Errors cannot be reported from a drop; they only arise on a context that is
    /// already broken, which the calls that broke it reported.
    pub(crate) fn release_after_work(&self, release: impl FnOnce()) {
        if self.bind().is_ok() {
            // SAFETY: the context is current (bound above); waiting for its work has no
            // precondition.
            let _ = unsafe { sys::cuCtxSynchronize() };
            release();
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_prints_like_nvidia_smi() {
        let bytes: [u8; 16] = std::array::from_fn(|index| (index * 17) as u8);
        assert_eq!(
            format_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
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
