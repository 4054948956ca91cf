//! Agreement between ranks. One-host agreement: every rank all-gathers what it knows of itself
//! (host identity, GPU, peer access to every other rank's GPU), and every rank applies the same
//! pure rule to the gathered records. Peer kernels are used only when all ranks are on one
//! host with full peer access; otherwise NCCL, the engine that spans hosts, is the only
//! candidate. Agreement on bytes: where every rank must hold the same (a package identity, the
//! options, a cache entry, a choice), each gives its bytes and [`disagreement`] names the
//! first rank whose bytes differ (`Runtime::agree_on` gathers and checks).

use serde::{Deserialize, Serialize};

/// Bytes each rank contributes to the all-gather: a record serialised as JSON, zero-padded.
pub const RECORD_BYTES: usize = 4096;

/// What one rank reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankRecord {
    /// The rank.
    pub rank: u32,
    /// The host's identity (`PREPARE_HOST_ID`, else the machine id and host name).
    pub host: String,
    /// The GPU's name.
    pub gpu_name: String,
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// The GPU's PCI bus id, to tell GPUs of one host apart.
    pub pci_bus_id: String,
    /// UUIDs of the GPUs of this host that this rank's GPU can map (peer access), itself
    /// included.
    pub reachable_gpus: Vec<String>,
}

/// Why records could not be read or agreed on.
#[derive(Debug, thiserror::Error)]
pub enum AgreeError {
    /// A record does not fit the fixed all-gather slot.
    #[error("rank {rank}'s record is {bytes} bytes, more than the {RECORD_BYTES} an all-gather slot holds")]
    TooLarge {
        /// The rank.
        rank: u32,
        /// Its size.
        bytes: usize,
    },
    /// A gathered slot is not a record.
    #[error("the record gathered from rank {rank} is unreadable: {message}")]
    Unreadable {
        /// The slot's rank.
        rank: u32,
        /// What was wrong.
        message: String,
    },
}

/// A rank holds other bytes than this rank where every rank must hold the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rank {rank}: rank {other} disagrees with this rank on {what}")]
pub struct Disagreement {
    /// This rank.
    pub rank: u32,
    /// The first rank whose bytes differ from this rank's.
    pub other: u32,
    /// What the ranks were to agree on (`the choice`).
    pub what: String,
    /// This rank's bytes.
    pub ours: Vec<u8>,
    /// The other rank's bytes.
    pub theirs: Vec<u8>,
}

/// Whether every rank gave `ours`: `gathered` holds every rank's bytes in rank order, each as
/// long as `ours`. `None` when all agree, else the first rank that differs.
pub fn disagreement(rank: u32, ours: &[u8], gathered: &[u8], what: &str) -> Option<Disagreement> {
    if ours.is_empty() {
        return None;
    }
    let (other, theirs) = gathered
        .chunks(ours.len())
        .enumerate()
        .find(|(_, theirs)| *theirs != ours)?;
    Some(Disagreement {
        rank,
        other: other as u32,
        what: what.to_owned(),
        ours: ours.to_vec(),
        theirs: theirs.to_vec(),
    })
}

impl RankRecord {
    /// The record as one fixed-size all-gather slot.
    pub fn encode(&self) -> Result<Vec<u8>, AgreeError> {
        let mut bytes = serde_json::to_vec(self).map_err(|error| AgreeError::Unreadable {
            rank: self.rank,
            message: error.to_string(),
        })?;
        if bytes.len() > RECORD_BYTES {
            return Err(AgreeError::TooLarge {
                rank: self.rank,
                bytes: bytes.len(),
            });
        }
        bytes.resize(RECORD_BYTES, 0);
        Ok(bytes)
    }

    /// Every rank's record from the gathered slots, in rank order; each slot must hold the
    /// record of the rank it came from.
    pub fn decode_all(gathered: &[u8]) -> Result<Vec<RankRecord>, AgreeError> {
        gathered
            .chunks(RECORD_BYTES)
            .enumerate()
            .map(|(slot, chunk)| {
                let slot = slot as u32;
                let end = chunk
                    .iter()
                    .position(|&byte| byte == 0)
                    .unwrap_or(chunk.len());
                let record: RankRecord =
                    serde_json::from_slice(&chunk[..end]).map_err(|error| {
                        AgreeError::Unreadable {
                            rank: slot,
                            message: error.to_string(),
                        }
                    })?;
                if record.rank == slot {
                    Ok(record)
                } else {
                    Err(AgreeError::Unreadable {
                        rank: slot,
                        message: format!("it says it is rank {}", record.rank),
                    })
                }
            })
            .collect()
    }
}

/// What the ranks agreed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum Topology {
    /// One host, every GPU reaches every other: custom peer kernels may run.
    PeerKernels,
    /// NCCL only, and why.
    NcclOnly {
        /// The reason, for the choice file and for people.
        reason: String,
    },
}

/// The rule every rank applies to the same gathered records.
pub fn agree(records: &[RankRecord]) -> Topology {
    let world = records.len();
    let mut hosts: Vec<&str> = records.iter().map(|record| record.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.len() > 1 {
        return Topology::NcclOnly {
            reason: format!(
                "the ranks are on {} hosts ({}); peer kernels need one host",
                hosts.len(),
                hosts.join(", ")
            ),
        };
    }
    let mut buses: Vec<&str> = records
        .iter()
        .map(|record| record.pci_bus_id.as_str())
        .collect();
    buses.sort_unstable();
    buses.dedup();
    if buses.len() < world {
        return Topology::NcclOnly {
            reason: "two ranks drive the same GPU; peer kernels need one GPU per rank".to_owned(),
        };
    }
    let mut missing = Vec::new();
    for record in records {
        for peer in records {
            if peer.rank != record.rank && !record.reachable_gpus.contains(&peer.gpu_uuid) {
                missing.push(format!("rank {} -> rank {}", record.rank, peer.rank));
            }
        }
    }
    if missing.is_empty() {
        Topology::PeerKernels
    } else {
        Topology::NcclOnly {
            reason: format!("no peer access: {}", missing.join(", ")),
        }
    }
}

/// This host's identity: `PREPARE_HOST_ID` when set (tests pretend several hosts with it),
/// else the machine id and host name.
pub fn host_identity(lookup: impl Fn(&str) -> Option<String>) -> String {
    if let Some(id) = lookup("PREPARE_HOST_ID").filter(|id| !id.is_empty()) {
        return id;
    }
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|text| text.trim().to_owned())
            .unwrap_or_default()
    };
    let machine = read("/etc/machine-id");
    let name = read("/proc/sys/kernel/hostname");
    format!("{name}/{machine}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank on `host` whose GPU reaches the GPUs of the ranks in `reaches`.
    fn record(rank: u32, host: &str, reaches: &[bool]) -> RankRecord {
        RankRecord {
            rank,
            host: host.to_owned(),
            gpu_name: "NVIDIA H200".to_owned(),
            gpu_uuid: format!("GPU-{rank}"),
            pci_bus_id: format!("0000:{rank:02x}:00.0"),
            reachable_gpus: reaches
                .iter()
                .enumerate()
                .filter(|(_, reached)| **reached)
                .map(|(peer, _)| format!("GPU-{peer}"))
                .collect(),
        }
    }

    #[test]
    fn one_host_with_full_peer_access_uses_peer_kernels() {
        let records: Vec<_> = (0..4).map(|rank| record(rank, "a", &[true; 4])).collect();
        assert_eq!(agree(&records), Topology::PeerKernels);
    }

    #[test]
    fn two_hosts_use_nccl_only() {
        let records = vec![record(0, "a", &[true; 2]), record(1, "b", &[true; 2])];
        assert_eq!(
            agree(&records),
            Topology::NcclOnly {
                reason: "the ranks are on 2 hosts (a, b); peer kernels need one host".to_owned()
            }
        );
    }

    #[test]
    fn one_missing_link_turns_peer_kernels_off_and_is_named() {
        let mut records: Vec<_> = (0..3).map(|rank| record(rank, "a", &[true; 3])).collect();
        records[2].reachable_gpus.retain(|uuid| uuid != "GPU-0");
        assert_eq!(
            agree(&records),
            Topology::NcclOnly {
                reason: "no peer access: rank 2 -> rank 0".to_owned()
            }
        );
    }

    #[test]
    fn shared_gpu_uses_nccl_only() {
        let mut records: Vec<_> = (0..2).map(|rank| record(rank, "a", &[true; 2])).collect();
        let first = records[0].pci_bus_id.clone();
        records[1].pci_bus_id = first;
        assert!(matches!(agree(&records), Topology::NcclOnly { .. }));
    }

    #[test]
    fn records_round_trip_through_fixed_slots() {
        let records: Vec<_> = (0..3)
            .map(|rank| record(rank, "host", &[true; 3]))
            .collect();
        let gathered: Vec<u8> = records
            .iter()
            .flat_map(|record| record.encode().unwrap())
            .collect();
        assert_eq!(gathered.len(), 3 * RECORD_BYTES);
        assert_eq!(RankRecord::decode_all(&gathered).unwrap(), records);
    }

    #[test]
    fn a_slot_from_the_wrong_rank_is_refused() {
        let gathered: Vec<u8> = [record(0, "h", &[true; 2]), record(0, "h", &[true; 2])]
            .iter()
            .flat_map(|record| record.encode().unwrap())
            .collect();
        let error = RankRecord::decode_all(&gathered).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the record gathered from rank 1 is unreadable: it says it is rank 0"
        );
    }

    #[test]
    fn the_first_rank_with_other_bytes_is_named() {
        let gathered = [b"same".as_slice(), b"same", b"diff", b"also"].concat();
        assert_eq!(disagreement(0, b"same", &gathered[..8], "the choice"), None);
        let found = disagreement(1, b"same", &gathered, "the choice").expect("rank 2 differs");
        assert_eq!((found.rank, found.other), (1, 2));
        assert_eq!(found.theirs, b"diff");
        assert_eq!(
            found.to_string(),
            "rank 1: rank 2 disagrees with this rank on the choice"
        );
        // The odd rank out names the first rank that differs from it.
        let found = disagreement(2, b"diff", &gathered, "the choice").expect("rank 0 differs");
        assert_eq!(
            (found.other, found.theirs.as_slice()),
            (0, b"same".as_slice())
        );
    }

    #[test]
    fn host_identity_honours_the_override() {
        let id =
            host_identity(|name| (name == "PREPARE_HOST_ID").then(|| "fake-host-b".to_owned()));
        assert_eq!(id, "fake-host-b");
        let real = host_identity(|_| None);
        assert!(real.contains('/'));
    }
}
