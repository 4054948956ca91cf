//! The sticky abort word (`state[0]` of the launch contract): what a kernel leaves there when a
//! wait passed its deadline or its launch broke the contract, decoded into the reason and the
//! rank it names.

use crate::abi::{ABORT_FLAG, ABORT_INVALID_LAUNCH, ABORT_PEER_TIMEOUT, ABORT_SHAPE_MISMATCH};

/// Why a kernel gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// A peer did not arrive before the deadline; the word names that peer.
    PeerTimeout,
    /// The parameters or geometry break the launch contract; the word names this rank.
    InvalidLaunch,
    /// A peer launched the same message with another shape (element count or rows): the ranks
    /// disagree on rows or width. The start barrier found it before any of the message was read
    /// or written; the word names that peer.
    ShapeMismatch,
    /// A reason code this tool does not know (a newer kernel, or a corrupted word).
    Unknown(u32),
}

/// A decoded, non-zero abort word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abort {
    /// The raw word, kept for messages.
    pub word: u64,
    /// Why the kernel stopped.
    pub reason: AbortReason,
    /// The rank the word names: the missing peer for a timeout, the peer of another shape for
    /// a shape mismatch, this rank otherwise.
    pub rank: u32,
}

impl Abort {
    /// Decodes `state[0]`: `None` while healthy (zero). A non-zero word without the flag bit is
    /// still an abort (reported as an unknown reason) so that a corrupted word is never ignored.
    pub fn decode(word: u64) -> Option<Abort> {
        if word == 0 {
            return None;
        }
        let code = (word & !ABORT_FLAG) >> 32;
        let reason = match (word & ABORT_FLAG != 0, code) {
            (true, ABORT_PEER_TIMEOUT) => AbortReason::PeerTimeout,
            (true, ABORT_INVALID_LAUNCH) => AbortReason::InvalidLaunch,
            (true, ABORT_SHAPE_MISMATCH) => AbortReason::ShapeMismatch,
            _ => AbortReason::Unknown(code as u32),
        };
        Some(Abort {
            word,
            reason,
            rank: (word & 0xffff_ffff) as u32,
        })
    }

    /// The peer that never arrived, for a timeout.
    pub fn missing_peer(&self) -> Option<u32> {
        (self.reason == AbortReason::PeerTimeout).then_some(self.rank)
    }
}

impl std::fmt::Display for Abort {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rank, word) = (self.rank, self.word);
        match self.reason {
            AbortReason::PeerTimeout => write!(
                formatter,
                "peer rank {rank} did not arrive before the deadline (abort word {word:#018x})"
            ),
            AbortReason::InvalidLaunch => write!(
                formatter,
                "rank {rank} refused its launch: the parameters or geometry break the launch \
                 contract (abort word {word:#018x})"
            ),
            AbortReason::ShapeMismatch => write!(
                formatter,
                "rank {rank} launched the same collective with a message of another shape than \
                 this rank's (its element count or rows differ): every rank must pass the same \
                 rows and width; the kernel stopped before reading or writing any of it (abort \
                 word {word:#018x})"
            ),
            AbortReason::Unknown(code) => write!(
                formatter,
                "kernel aborted with unknown reason {code}, naming rank {rank} (abort word \
                 {word:#018x})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_healthy() {
        assert_eq!(Abort::decode(0), None);
    }

    #[test]
    fn every_reason_decodes_with_the_rank_it_names() {
        let words = [
            ABORT_FLAG | (ABORT_PEER_TIMEOUT << 32) | 5,
            ABORT_FLAG | (ABORT_INVALID_LAUNCH << 32) | 1,
            ABORT_FLAG | (7 << 32) | 1,
            ABORT_FLAG | (ABORT_SHAPE_MISMATCH << 32) | 3,
            // Without the flag bit: corrupted, still an abort.
            (ABORT_PEER_TIMEOUT << 32) | 2,
        ];
        let aborts: Vec<Abort> = words
            .iter()
            .map(|&word| Abort::decode(word).unwrap())
            .collect();
        assert_eq!(aborts[0].missing_peer(), Some(5));
        assert_eq!(aborts[1].missing_peer(), None);
        assert_eq!(aborts[3].reason, AbortReason::ShapeMismatch);
        assert_eq!(aborts[3].missing_peer(), None);
        assert_eq!(aborts[4].reason, AbortReason::Unknown(1));
        let messages: Vec<String> = aborts.iter().map(ToString::to_string).collect();
        insta::assert_snapshot!(messages.join("\n"), @r"
        peer rank 5 did not arrive before the deadline (abort word 0x8000000100000005)
        rank 1 refused its launch: the parameters or geometry break the launch contract (abort word 0x8000000200000001)
        kernel aborted with unknown reason 7, naming rank 1 (abort word 0x8000000700000001)
        rank 3 launched the same collective with a message of another shape than this rank's (its element count or rows differ): every rank must pass the same rows and width; the kernel stopped before reading or writing any of it (abort word 0x8000000300000003)
        kernel aborted with unknown reason 1, naming rank 2 (abort word 0x0000000100000002)
        ");
    }
}
