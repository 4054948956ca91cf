//! Dropped candidates: those the package's qualification found wrong, and the agreement that
//! gives every rank the same drops with the same reasons.

use crate::device::DropReason;
use crate::package::Package;
use crate::runtime::{Runtime, RuntimeError};

/// Bytes of one gathered drop reason (JSON, cut to fit).
const REASON_SLOT_BYTES: usize = 1024;

/// The drop the package's qualification recorded for a candidate when it says the kernel is
/// wrong (not exact, or it could not be captured); residency and peer access depend on the
/// machine and are decided here again.
pub(super) fn qualified_wrong(
    package: &Package,
    bucket: usize,
    profile: &str,
) -> Option<DropReason> {
    let qualification = package.manifest().qualification.as_ref()?;
    let candidate = qualification
        .buckets
        .iter()
        .find(|recorded| recorded.index == bucket)?
        .candidates
        .iter()
        .find(|candidate| candidate.profile == profile)?;
    match &candidate.outcome {
        crate::package::Outcome::Dropped(
            reason @ (DropReason::NotExact { .. } | DropReason::CaptureFailed { .. }),
        ) => Some(reason.clone()),
        _ => None,
    }
}

/// Agrees which entries every rank drops: an entry any rank drops is dropped everywhere, with
/// the reason of the lowest such rank, so every rank ends with the same list. Collective.
pub fn agree_drops(
    runtime: &Runtime,
    local: &[Option<DropReason>],
    step: &str,
) -> Result<Vec<Option<DropReason>>, RuntimeError> {
    let world = runtime.world() as usize;
    let mut agreed = vec![None; local.len()];
    for (chunk_index, chunk) in local.chunks(crate::agree::RECORD_BYTES).enumerate() {
        let flags: Vec<u8> = chunk
            .iter()
            .map(|reason| u8::from(reason.is_some()))
            .collect();
        let gathered = runtime.all_gather(&flags, step)?;
        for position in 0..chunk.len() {
            let id = chunk_index * crate::agree::RECORD_BYTES + position;
            let first = (0..world).find(|rank| gathered[rank * chunk.len() + position] != 0);
            let Some(first) = first else {
                continue;
            };
            // The reason travels from the rank that has it, so every rank records the same.
            let mut slot = vec![0_u8; REASON_SLOT_BYTES];
            if runtime.rank() as usize == first {
                let reason = local[id].as_ref().expect("this rank dropped it");
                let bytes = encode_reason(reason);
                slot[..bytes.len()].copy_from_slice(&bytes);
            }
            let reasons = runtime.all_gather(&slot, step)?;
            let theirs = &reasons[first * REASON_SLOT_BYTES..(first + 1) * REASON_SLOT_BYTES];
            agreed[id] = Some(decode_reason(theirs, first));
        }
    }
    Ok(agreed)
}

/// A drop reason as JSON that fits a slot; a message too long is cut.
fn encode_reason(reason: &DropReason) -> Vec<u8> {
    let mut reason = reason.clone();
    loop {
        let bytes = serde_json::to_vec(&reason).expect("a drop reason serializes");
        if bytes.len() <= REASON_SLOT_BYTES {
            return bytes;
        }
        let message = match &mut reason {
            DropReason::CaptureFailed { message }
            | DropReason::NotExact { message }
            | DropReason::NoPeerAccess { message }
            | DropReason::NoSymmetricWindow { message } => message,
            DropReason::NotResident { .. } => unreachable!("a residency reason is short"),
        };
        let keep = message.len().saturating_sub(64);
        let mut cut = keep;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" ...");
    }
}

fn decode_reason(slot: &[u8], rank: usize) -> DropReason {
    let end = slot
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(slot.len());
    serde_json::from_slice(&slot[..end]).unwrap_or_else(|_| DropReason::CaptureFailed {
        message: format!("rank {rank} dropped it; its reason could not be read"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_to_fit_a_slot_and_read_back() {
        let reason = DropReason::NotExact {
            message: "é".repeat(2000),
        };
        let bytes = encode_reason(&reason);
        assert!(bytes.len() <= REASON_SLOT_BYTES);
        let mut slot = vec![0_u8; REASON_SLOT_BYTES];
        slot[..bytes.len()].copy_from_slice(&bytes);
        let DropReason::NotExact { message } = decode_reason(&slot, 1) else {
            panic!("the variant survives");
        };
        assert!(message.ends_with(" ..."));
        assert!(message.starts_with('é'));
    }

    #[test]
    fn an_unreadable_slot_names_the_rank() {
        let slot = vec![b'x'; REASON_SLOT_BYTES];
        assert_eq!(
            decode_reason(&slot, 3).to_string(),
            "capture failed: rank 3 dropped it; its reason could not be read"
        );
    }
}
