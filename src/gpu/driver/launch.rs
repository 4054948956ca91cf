//! Kernel launches: one-dimensional geometries, with or without clusters, the occupancy a
//! geometry reaches, and launching a kernel on a stream with its parameter's bytes.

use std::ffi::c_void;
use std::fmt;
use std::ops::Deref;

use cudarc::driver::sys;

use super::error::{check, CallContext, DriverError};
use super::module::{ClusterKernel, Function, Kernel, LoadedKernel};
use super::stream::Stream;

/// Largest portable thread-block cluster.
pub const MAX_CLUSTER_SIZE: u32 = 8;

/// Most blocks in a one-dimensional grid (`gridDimX`).
pub const MAX_GRID_BLOCKS: u32 = i32::MAX as u32;

/// Most threads in one block on every supported architecture.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

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

/// Lets the launch begin while the previous kernel of its stream ends (programmatic dependent
/// launch): the kernels wait for that kernel's completion before touching memory
/// (`wait_for_previous_grid` in kernels/prepare_sync.cuh), so only the launch and the block
/// scheduling overlap it.
fn overlap_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: as in `cluster_attribute`.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    attribute
}

/// A launch's configuration; `attributes` must live until the launch call returns.
fn launch_config(
    geometry: &Geometry,
    stream: sys::CUstream,
    attributes: &mut [sys::CUlaunchAttribute],
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
        attrs: attributes.as_mut_ptr(),
        numAttrs: attributes.len() as u32,
    }
}

impl Function {
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
        let mut attributes = [cluster_attribute(geometry.0.cluster_size.unwrap_or(1))];
        let config = launch_config(&geometry.0, std::ptr::null_mut(), &mut attributes);
        let mut clusters = 0;
        // SAFETY: the function's module is loaded in the current context; `config` and the
        // attributes it points to live across the call; writes one int.
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

impl Stream {
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
        // The overlap attribute first, the cluster's second: each only where it applies.
        let mut attributes = [
            overlap_attribute(),
            cluster_attribute(geometry.cluster_size.unwrap_or(1)),
        ];
        let first = usize::from(!function.overlaps_previous);
        let end = 1 + usize::from(geometry.cluster_size.is_some());
        let config = launch_config(&geometry, self.raw, &mut attributes[first..end]);
        let mut arguments = [params.as_ptr().cast_mut().cast::<c_void>()];
        // SAFETY: the function was checked at lookup to take exactly one parameter of
        // `parameter_bytes`, and `params` holds that many bytes (checked above), so the driver
        // reads exactly `params`, which is borrowed for the call (the driver copies it before
        // returning). `config` and its
        // attributes live across the call; the function's module is loaded in the current
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
                            geometry: geometry.to_string(),
                        })?;
                self.launch_cluster(kernel, clustered, params)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
