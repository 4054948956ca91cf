//! Why a driver operation failed, and the helpers that turn a raw `CUresult` into that error
//! naming the call and the GPU.

use std::time::Duration;

use cudarc::driver::result::DriverError as CudaResult;
use cudarc::driver::sys;

use super::version::DriverVersion;

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
        /// The geometry it was given, as text (`64 blocks x 512 threads`).
        geometry: String,
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
pub(super) fn check(
    result: sys::CUresult,
    call: &'static str,
    device: Option<usize>,
) -> Result<(), DriverError> {
    result
        .result()
        .map_err(|error| DriverError::call(call, device, error))
}

pub(super) trait CallContext<T> {
    fn during(self, call: &'static str, device: Option<usize>) -> Result<T, DriverError>;
}

impl<T> CallContext<T> for Result<T, CudaResult> {
    fn during(self, call: &'static str, device: Option<usize>) -> Result<T, DriverError> {
        self.map_err(|error| DriverError::call(call, device, error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
