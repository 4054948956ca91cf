//! Modules loaded from cubins (checked first: the driver trusts an ELF image's tables) or PTX,
//! and the kernels looked up in them, each checked to take one parameter of the size its caller
//! names. A cluster kernel is a [`ClusterKernel`], which launches only with a
//! [`ClusterGeometry`](super::ClusterGeometry): launched without cluster dimensions it would
//! die with an illegal instruction and poison the context.

use std::ffi::{c_void, CString};
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::sys;

use super::device::Device;
use super::error::{check, DriverError};

impl Device {
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
pub(super) struct ModuleHandle {
    module: sys::CUmodule,
    pub(super) device: Device,
}

// SAFETY: a CUmodule is a driver handle, not host memory; the driver API may use it from any
// thread once its context is current, which every use here arranges through `Device::bind`.
unsafe impl Send for ModuleHandle {}

// SAFETY: as for Send: no method mutates host state behind the handle.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        self.device.release_after_work(|| {
            // SAFETY: the context is current and idle, so no kernel of the module still runs;
            // every Function holds this handle, so none outlives it; unloaded exactly once.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        });
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
        let mut function = Function {
            raw: function,
            entry: entry.to_owned(),
            parameter_bytes,
            module: Arc::clone(&self.handle),
            overlaps_previous: false,
        };
        function.check_parameters()?;
        // Programmatic dependent launch exists from sm_90 on; the kernels wait for the previous
        // kernel there (`griddepcontrol.wait`), and older code is launched without it.
        function.overlaps_previous = function.attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_BINARY_VERSION,
            "cuFuncGetAttribute(BINARY_VERSION)",
        )? >= 90;
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
    pub(super) raw: sys::CUfunction,
    pub(super) entry: String,
    pub(super) parameter_bytes: usize,
    pub(super) module: Arc<ModuleHandle>,
    /// Whether it is launched allowing programmatic dependent launch (code for sm_90 and up).
    pub(super) overlaps_previous: bool,
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

    pub(super) fn attribute(
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
        // The parameter at `index` as (offset, size); `None` past the last one.
        let parameter = |index: usize| {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: the function's module is loaded (held by self); writes two locals. An
            // index past the last parameter is answered with CUDA_ERROR_INVALID_VALUE.
            let result =
                unsafe { sys::cuFuncGetParamInfo(self.raw, index, &raw mut offset, &raw mut size) };
            if result == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
                return Ok(None);
            }
            check(result, "cuFuncGetParamInfo", Some(self.ordinal()))?;
            Ok(Some((offset, size)))
        };
        let Some((offset, size)) = parameter(0)? else {
            return Err(mismatch("no parameters".to_owned()));
        };
        if parameter(1)?.is_some() {
            return Err(mismatch("more than one parameter".to_owned()));
        }
        if offset != 0 || size != expected {
            return Err(mismatch(format!(
                "one parameter of {size} bytes at offset {offset}"
            )));
        }
        Ok(())
    }
}

/// Declares kernel types that differ only in how they may launch, each a [`Function`] it
/// dereferences to.
macro_rules! kernel_types {
    ($($(#[$doc:meta])* $kernel:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $kernel {
            function: Function,
        }

        impl Deref for $kernel {
            type Target = Function;
            fn deref(&self) -> &Function {
                &self.function
            }
        }
    )*};
}

kernel_types! {
    /// An ordinary kernel: no cluster instructions, so it may launch with or without cluster
    /// dimensions.
    Kernel;
    /// A kernel with cluster instructions: it launches only with a
    /// [`ClusterGeometry`](super::ClusterGeometry).
    ClusterKernel;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `bytes` into `image` at byte `at` (the little-endian fields of an ELF file).
    fn put(image: &mut [u8], at: usize, bytes: &[u8]) {
        image[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// A minimal ELF64 cubin: header, one PROGBITS section of `payload` bytes, its section
    /// table, one segment over the payload.
    fn synthetic_cubin(payload: usize) -> Vec<u8> {
        let mut image = vec![0u8; 64];
        put(&mut image, 0, &[0x7f, b'E', b'L', b'F']);
        image[4] = 2;
        image[5] = 1;
        put(&mut image, 18, &190u16.to_le_bytes());
        let payload_offset = image.len() as u64;
        image.extend(std::iter::repeat_n(0xab, payload));
        let section_offset = image.len() as u64;
        let mut null_section = vec![0u8; 64];
        let mut section = vec![0u8; 64];
        put(&mut section, 4, &1u32.to_le_bytes());
        put(&mut section, 24, &payload_offset.to_le_bytes());
        put(&mut section, 32, &(payload as u64).to_le_bytes());
        image.append(&mut null_section);
        image.append(&mut section);
        let program_offset = image.len() as u64;
        let mut segment = vec![0u8; 56];
        put(&mut segment, 8, &payload_offset.to_le_bytes());
        put(&mut segment, 32, &(payload as u64).to_le_bytes());
        image.append(&mut segment);
        put(&mut image, 32, &program_offset.to_le_bytes());
        put(&mut image, 40, &section_offset.to_le_bytes());
        put(&mut image, 54, &56u16.to_le_bytes());
        put(&mut image, 56, &1u16.to_le_bytes());
        put(&mut image, 58, &64u16.to_le_bytes());
        put(&mut image, 60, &2u16.to_le_bytes());
        image
    }

    #[test]
    fn a_well_formed_cubin_passes() {
        assert_eq!(check_cubin(&synthetic_cubin(100)), Ok(()));
    }

    #[test]
    fn a_cubin_that_lies_about_its_extent_is_refused() {
        let good = synthetic_cubin(100);
        // The check of `good` with `bytes` written at byte `at`.
        let changed = |at: usize, bytes: &[u8]| {
            let mut image = good.clone();
            put(&mut image, at, bytes);
            check_cubin(&image)
        };
        let section_header = 64 + 100 + 64;
        let segment_header = 64 + 100 + 128;
        let cases = [
            check_cubin(&good[..40]),
            check_cubin(b"//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90\n"),
            changed(4, &[1]),
            changed(18, &62u16.to_le_bytes()),
            // Truncated: the tables at the end are cut off.
            check_cubin(&good[..good.len() - 10]),
            changed(section_header + 32, &10_000u64.to_le_bytes()),
            changed(section_header + 24, &u64::MAX.to_le_bytes()),
            changed(segment_header + 32, &10_000u64.to_le_bytes()),
            changed(58, &32u16.to_le_bytes()),
            changed(60, &0u16.to_le_bytes()),
        ];

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
}
