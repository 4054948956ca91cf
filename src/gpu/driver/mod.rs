//! Safe wrappers over the CUDA driver API (cudarc's dynamically loaded `driver` bindings), one
//! file a concern: errors (`error`), driver versions (`version`), the driver and its GPUs with
//! their primary contexts (`device`), device memory and IPC (`memory`), modules and the cubin
//! check (`module`), streams with their copies and waits (`stream`), geometries, occupancy and
//! launches (`launch`), events and graphs (`graph`).
//!
//! The layer knows nothing of ladders or of the kernels' contract. A kernel takes one parameter
//! by value, which a launch passes as bytes: it is checked when it is looked up to take exactly
//! one parameter of the size its caller names, and every launch to pass that many bytes, so a
//! launch can never hand the driver fewer bytes than the kernel reads.

mod device;
mod error;
mod graph;
mod launch;
mod memory;
mod module;
mod stream;
mod version;

pub use device::{visible_devices, Device, DeviceInfo, Driver};
pub use error::DriverError;
pub use graph::{Event, Graph};
pub use launch::{
    ClusterGeometry, Geometry, MAX_CLUSTER_SIZE, MAX_GRID_BLOCKS, MAX_THREADS_PER_BLOCK,
};
pub use memory::{
    CallerMemory, DeviceBuffer, DeviceCopy, DeviceMemory, HostWords, IpcHandle, PeerBuffer,
    PinnedBytes,
};
pub use module::{check_cubin, ClusterKernel, Function, Kernel, LoadedKernel, Module, ModuleImage};
pub use stream::Stream;
pub use version::{DriverVersion, MIN_DRIVER_VERSION};
