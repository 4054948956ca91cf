//! Devices and the rules a package must pass on one, as pure functions of a device
//! description so they are tested without a GPU: the architecture rule at export, the package
//! rules at startup (architecture, cluster launch, SM count), and the residency rule that drops
//! a candidate whose blocks cannot all run at once.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ladder::{Arch, Bucket, Ladder, Profile};

/// SMs a device needs to run clustered buckets: 8 clusters of 8 blocks, all resident at once.
pub const MIN_SMS_FOR_CLUSTERS: u32 = 64;

/// What the rules need to know about a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct DeviceDescription {
    /// The name the driver reports (`NVIDIA H200`).
    pub name: String,
    /// Its architecture.
    pub arch: Arch,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Whether it launches thread-block clusters (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`).
    pub cluster_launch: bool,
}

impl DeviceDescription {
    /// A GPU as the driver reports it: its compute capability gives the architecture, refused
    /// when this tool has no kernels or ladders for it (`ordinal` and `name` name the GPU).
    pub fn of_gpu(
        ordinal: usize,
        name: &str,
        compute_capability: (u32, u32),
        sm_count: u32,
        cluster_launch: bool,
    ) -> Result<DeviceDescription, DeviceError> {
        let (major, minor) = compute_capability;
        let arch = Arch::from_compute_capability(major, minor).ok_or_else(|| {
            DeviceError::UnknownArchitecture {
                device: ordinal,
                name: name.to_owned(),
                arch: format!("sm_{major}{minor}"),
            }
        })?;
        Ok(DeviceDescription {
            name: name.to_owned(),
            arch,
            sm_count,
            cluster_launch,
        })
    }
}

impl fmt::Display for DeviceDescription {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} ({}, {} SMs)",
            self.name, self.arch, self.sm_count
        )
    }
}

/// A package or ladder that does not fit an architecture or a device (exit code 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A GPU whose compute capability names no architecture this tool knows.
    #[error(
        "GPU {device} ({name}) is {arch}, an architecture prepare has no kernels or ladders for \
         (it knows {}) [unknown_architecture]",
        arch_list(&Arch::ALL)
    )]
    UnknownArchitecture {
        /// GPU ordinal.
        device: usize,
        /// Its name.
        name: String,
        /// Its compute capability as `sm_XY`.
        arch: String,
    },
    /// `prepare export` for an architecture the ladder does not list.
    #[error(
        "ladder {ladder} targets {} only, not {arch} [architecture_not_targeted]",
        arch_list(targets)
    )]
    ExportTargetRefused {
        /// The ladder's name.
        ladder: String,
        /// The architecture asked for.
        arch: Arch,
        /// The ladder's targets.
        targets: Vec<Arch>,
    },
    /// The device's architecture is not one the ladder lists.
    #[error(
        "{device} cannot run ladder {ladder}: it targets {} only [architecture_not_targeted]",
        arch_list(targets)
    )]
    ArchitectureNotTargeted {
        /// The device.
        device: DeviceDescription,
        /// The ladder's name.
        ladder: String,
        /// The ladder's targets.
        targets: Vec<Arch>,
    },
    /// The ladder has clustered buckets and the device cannot launch clusters.
    #[error(
        "{device} cannot run ladder {ladder}: its clustered buckets need thread-block cluster \
         launch, which the device lacks{} [cluster_launch_unsupported]",
        use_instead(ordinary_ladder.as_deref())
    )]
    ClusterLaunchUnsupported {
        /// The device.
        device: DeviceDescription,
        /// The ladder's name.
        ladder: String,
        /// The ladder to use instead, when the ladder names one.
        ordinary_ladder: Option<String>,
    },
    /// The ladder has clustered buckets and the device has too few SMs to hold them.
    #[error(
        "{device} cannot run ladder {ladder}: its clustered buckets launch 8 clusters of 8 blocks \
         that must all be resident at once, which needs at least {MIN_SMS_FOR_CLUSTERS} SMs{} \
         [too_few_sms_for_clusters]",
        use_instead(ordinary_ladder.as_deref())
    )]
    TooFewSmsForClusters {
        /// The device.
        device: DeviceDescription,
        /// The ladder's name.
        ladder: String,
        /// The ladder to use instead, when the ladder names one.
        ordinary_ladder: Option<String>,
    },
}

impl DeviceError {
    /// The rule's stable name, as printed in brackets.
    pub fn rule(&self) -> &'static str {
        match self {
            DeviceError::UnknownArchitecture { .. } => "unknown_architecture",
            DeviceError::ExportTargetRefused { .. }
            | DeviceError::ArchitectureNotTargeted { .. } => "architecture_not_targeted",
            DeviceError::ClusterLaunchUnsupported { .. } => "cluster_launch_unsupported",
            DeviceError::TooFewSmsForClusters { .. } => "too_few_sms_for_clusters",
        }
    }
}

fn arch_list(targets: &[Arch]) -> String {
    targets
        .iter()
        .map(|arch| arch.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn use_instead(ordinary_ladder: Option<&str>) -> String {
    match ordinary_ladder {
        Some(name) => format!("; use the ordinary ladder {name}"),
        None => "; use a ladder without clustered buckets".to_owned(),
    }
}

/// The architecture rule at export: a package is made only for an architecture the ladder
/// lists in `targets`.
pub fn check_export_target(ladder: &Ladder, arch: Arch) -> Result<(), DeviceError> {
    if ladder.targets.contains(&arch) {
        Ok(())
    } else {
        Err(DeviceError::ExportTargetRefused {
            ladder: ladder.name.clone(),
            arch,
            targets: ladder.targets.clone(),
        })
    }
}

/// The package rules: the device's architecture is one the ladder targets, and a ladder with
/// clustered buckets needs cluster launch and [`MIN_SMS_FOR_CLUSTERS`] SMs. (The package's own
/// architecture is compared with the device's where the package is opened.)
pub fn check_package_fits(ladder: &Ladder, device: &DeviceDescription) -> Result<(), DeviceError> {
    if !ladder.targets.contains(&device.arch) {
        return Err(DeviceError::ArchitectureNotTargeted {
            device: device.clone(),
            ladder: ladder.name.clone(),
            targets: ladder.targets.clone(),
        });
    }
    if ladder.has_clustered_buckets() {
        if !device.cluster_launch {
            return Err(DeviceError::ClusterLaunchUnsupported {
                device: device.clone(),
                ladder: ladder.name.clone(),
                ordinary_ladder: ladder.ordinary_ladder.clone(),
            });
        }
        if device.sm_count < MIN_SMS_FOR_CLUSTERS {
            return Err(DeviceError::TooFewSmsForClusters {
                device: device.clone(),
                ladder: ladder.name.clone(),
                ordinary_ladder: ladder.ordinary_ladder.clone(),
            });
        }
    }
    Ok(())
}

/// How much of a kernel can run at once: what the driver's occupancy query said for it at the
/// launch geometry.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// Clusters (`cuOccupancyMaxActiveClusters`), for clustered buckets.
    Clusters(u32),
    /// Blocks on the whole device (`cuOccupancyMaxActiveBlocksPerMultiprocessor` x SMs).
    Blocks(u32),
}

impl fmt::Display for Residency {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Residency::Clusters(1) => formatter.write_str("1 cluster"),
            Residency::Clusters(count) => write!(formatter, "{count} clusters"),
            Residency::Blocks(1) => formatter.write_str("1 block"),
            Residency::Blocks(count) => write!(formatter, "{count} blocks"),
        }
    }
}

/// Why a candidate was dropped on a machine; recorded with the choice, never a crash.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum DropReason {
    /// Not every block can be resident at once; since every block waits on its peers, such a
    /// launch could hang.
    NotResident {
        /// What must be resident.
        needed: Residency,
        /// What the occupancy query allows.
        resident: Residency,
    },
    /// Capturing it in a CUDA graph failed.
    CaptureFailed {
        /// The driver's or the launcher's message.
        message: String,
    },
    /// Its output differed from the reference sum.
    NotExact {
        /// Where and how it differed.
        message: String,
    },
    /// The ranks lack peer access to each other; every custom candidate is dropped.
    NoPeerAccess {
        /// Which ranks and why.
        message: String,
    },
    /// A symmetric NCCL profile's window cannot be made on some rank (its NCCL has no
    /// symmetric windows, or the memory could not be allocated).
    NoSymmetricWindow {
        /// Which rank and why.
        message: String,
    },
}

impl fmt::Display for DropReason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::NotResident { needed, resident } => write!(
                formatter,
                "not resident: needs {needed} at once, the occupancy query allows {resident}"
            ),
            DropReason::CaptureFailed { message } => write!(formatter, "capture failed: {message}"),
            DropReason::NotExact { message } => write!(formatter, "not exact: {message}"),
            DropReason::NoPeerAccess { message } => write!(formatter, "no peer access: {message}"),
            DropReason::NoSymmetricWindow { message } => {
                write!(formatter, "no symmetric window: {message}")
            }
        }
    }
}

/// What must be resident at once for a launch in this bucket: all its clusters when it is
/// clustered, else all the blocks the profile launches (its own `blocks`, or the bucket's).
pub fn required_residency(bucket: &Bucket, profile: Option<&Profile>) -> Residency {
    match bucket.cluster_size {
        Some(cluster_size) => Residency::Clusters(bucket.blocks.div_ceil(cluster_size.max(1))),
        None => Residency::Blocks(
            profile
                .and_then(|profile| profile.blocks)
                .unwrap_or(bucket.blocks),
        ),
    }
}

/// The residency rule at the bucket's geometry: every block (for clustered buckets every
/// cluster, `cuOccupancyMaxActiveClusters` >= blocks / 8) must be resident at once.
/// An occupancy figure in the wrong unit (blocks for a clustered bucket) proves nothing and
/// drops the candidate.
pub fn check_residency(bucket: &Bucket, resident: Residency) -> Result<(), DropReason> {
    compare(required_residency(bucket, None), resident)
}

/// The residency rule for one candidate: as [`check_residency`], with the profile's own block
/// count where it has one; NCCL profiles launch their own kernels and always pass.
pub fn check_candidate_residency(
    bucket: &Bucket,
    profile: &Profile,
    resident: Residency,
) -> Result<(), DropReason> {
    if profile.is_nccl() {
        return Ok(());
    }
    compare(required_residency(bucket, Some(profile)), resident)
}

fn compare(needed: Residency, resident: Residency) -> Result<(), DropReason> {
    let fits = match (needed, resident) {
        (Residency::Clusters(needed), Residency::Clusters(resident))
        | (Residency::Blocks(needed), Residency::Blocks(resident)) => resident >= needed,
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        Err(DropReason::NotResident { needed, resident })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::Algorithm;

    fn profile(algorithm: Algorithm, blocks: Option<u32>) -> Profile {
        Profile {
            id: "p".to_owned(),
            algorithm,
            transfer: None,
            protocol: None,
            schedule: None,
            active_clusters: None,
            blocks,
            max_ctas: None,
            min_ctas: None,
            window: None,
            order: None,
            epilogue: None,
        }
    }

    #[test]
    fn clustered_buckets_need_every_cluster_resident() {
        let clustered = Bucket::nccl_only(64, Some(8));
        assert_eq!(check_residency(&clustered, Residency::Clusters(8)), Ok(()));
        assert_eq!(check_residency(&clustered, Residency::Clusters(62)), Ok(()));
        assert_eq!(
            check_residency(&clustered, Residency::Clusters(7)),
            Err(DropReason::NotResident {
                needed: Residency::Clusters(8),
                resident: Residency::Clusters(7)
            })
        );
        // Blocks resident say nothing about clusters, which must each fit in one GPC.
        assert!(check_residency(&clustered, Residency::Blocks(264)).is_err());
    }

    #[test]
    fn ordinary_buckets_need_every_block_resident_with_the_profile_override() {
        let ordinary = Bucket::nccl_only(64, None);
        assert_eq!(check_residency(&ordinary, Residency::Blocks(64)), Ok(()));
        assert!(check_residency(&ordinary, Residency::Blocks(63)).is_err());
        assert!(check_residency(&ordinary, Residency::Clusters(64)).is_err());
        let wide = profile(Algorithm::Rsag, Some(128));
        assert_eq!(
            check_candidate_residency(&ordinary, &wide, Residency::Blocks(96)),
            Err(DropReason::NotResident {
                needed: Residency::Blocks(128),
                resident: Residency::Blocks(96)
            })
        );
        assert_eq!(
            check_candidate_residency(&ordinary, &wide, Residency::Blocks(132)),
            Ok(())
        );
        let nccl = profile(Algorithm::Nccl, None);
        assert_eq!(
            check_candidate_residency(&ordinary, &nccl, Residency::Blocks(0)),
            Ok(())
        );
    }

    #[test]
    fn drop_reasons_serialize_with_a_reason_tag_and_read_back() {
        let reasons = vec![
            DropReason::NotResident {
                needed: Residency::Clusters(8),
                resident: Residency::Clusters(5),
            },
            DropReason::CaptureFailed {
                message: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED".to_owned(),
            },
            DropReason::NotExact {
                message: "rank 1 element 7: 0x3f80 instead of 0x3f81".to_owned(),
            },
            DropReason::NoPeerAccess {
                message: "rank 0 cannot access rank 3".to_owned(),
            },
        ];
        let text = serde_json::to_string(&reasons).unwrap();
        assert_eq!(
            text,
            r#"[{"reason":"not_resident","needed":{"clusters":8},"resident":{"clusters":5}},{"reason":"capture_failed","message":"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},{"reason":"not_exact","message":"rank 1 element 7: 0x3f80 instead of 0x3f81"},{"reason":"no_peer_access","message":"rank 0 cannot access rank 3"}]"#
        );
        let back: Vec<DropReason> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, reasons);
        assert_eq!(
            reasons[0].to_string(),
            "not resident: needs 8 clusters at once, the occupancy query allows 5 clusters"
        );
    }

    #[test]
    fn a_gpu_is_described_by_its_compute_capability() {
        let known = DeviceDescription::of_gpu(1, "NVIDIA Example", (9, 0), 132, true).unwrap();
        assert_eq!(
            known,
            DeviceDescription {
                name: "NVIDIA Example".to_owned(),
                arch: Arch::Sm90,
                sm_count: 132,
                cluster_launch: true,
            }
        );
        let unknown =
            DeviceDescription::of_gpu(1, "NVIDIA Example", (7, 5), 40, false).unwrap_err();
        assert_eq!(unknown.rule(), "unknown_architecture");
        assert_eq!(
            unknown.to_string(),
            "GPU 1 (NVIDIA Example) is sm_75, an architecture prepare has no kernels or ladders \
             for (it knows sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, sm_121) \
             [unknown_architecture]"
        );
    }
}
