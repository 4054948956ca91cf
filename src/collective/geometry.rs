//! A candidate's launch geometry, from its bucket and profile within the kernels' contract, and
//! how much of it the GPU holds at once.

use crate::device::Residency;
use crate::gpu::driver::{DriverError, Function, Geometry};
use crate::kernels;
use crate::ladder::{Bucket, Profile};

/// The geometry a candidate launches with in a bucket: the profile's own blocks where it has
/// them, otherwise the bucket's geometry (see [`bucket_geometry`]).
pub fn geometry_for(bucket: &Bucket, profile: &Profile) -> Result<Geometry, DriverError> {
    match profile.blocks {
        Some(blocks) => Geometry::new(contract_blocks(blocks)?, bucket.threads),
        None => bucket_geometry(bucket),
    }
}

/// A bucket's launch geometry, clustered when the bucket is.
pub fn bucket_geometry(bucket: &Bucket) -> Result<Geometry, DriverError> {
    let blocks = contract_blocks(bucket.blocks)?;
    match bucket.cluster_size {
        Some(size) => Geometry::clustered(blocks, bucket.threads, size).map(Into::into),
        None => Geometry::new(blocks, bucket.threads),
    }
}

/// `blocks`, refused when the launch contract does not allow that many (its signal and state
/// words are laid out per block, up to [`kernels::MAX_BLOCKS`]).
fn contract_blocks(blocks: u32) -> Result<u32, DriverError> {
    if blocks as usize > kernels::MAX_BLOCKS {
        return Err(DriverError::InvalidGeometry {
            reason: format!(
                "{blocks} blocks; the launch contract allows 1 to {}",
                kernels::MAX_BLOCKS
            ),
        });
    }
    Ok(blocks)
}

/// How much of `geometry` can be resident on the GPU at once, for `kernel`: clusters from the
/// cluster occupancy query for a clustered geometry, otherwise blocks across the GPU.
/// [`check_candidate_residency`] compares it with what a bucket needs.
pub fn resident_capacity(kernel: &Function, geometry: Geometry) -> Result<Residency, DriverError> {
    match geometry.cluster() {
        Some(clustered) => kernel
            .max_active_clusters(clustered)
            .map(Residency::Clusters),
        None => kernel
            .max_active_blocks(geometry.threads())
            .map(Residency::Blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_geometry_follows_its_cluster_size_within_the_launch_contract() {
        let clustered = bucket_geometry(&Bucket::nccl_only(64, Some(8))).unwrap();
        assert_eq!(clustered.cluster_size(), Some(8));
        assert_eq!(
            bucket_geometry(&Bucket::nccl_only(64, None))
                .unwrap()
                .cluster_size(),
            None
        );
        assert_eq!(
            bucket_geometry(&Bucket::nccl_only(1025, None))
                .unwrap_err()
                .to_string(),
            "invalid launch geometry: 1025 blocks; the launch contract allows 1 to 1024"
        );
    }
}
