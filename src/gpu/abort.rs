//! The sticky abort word (`state[0]` of the launch contract): what a kernel leaves there when a
//! wait passed its deadline, decoded into which peer it waited for and why.

use crate::kernels::{ABORT_FLAG, ABORT_PEER_TIMEOUT};

/// Why a kernel gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// A peer did not arrive before the deadline.
    PeerTimeout,
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
    /// The peer rank it was waiting for.
    pub peer: u32,
}

impl Abort {
    /// Decodes `state[0]`: `None` while healthy (zero). A non-zero word without the flag bit is
    /// still an abort (reported as an unknown reason) so that a corrupted word is never ignored.
    pub fn decode(word: u64) -> Option<Abort> {
        if word == 0 {
            return None;
        }
        let code = ((word & !ABORT_FLAG) >> 32) as u32;
        let reason = if word & ABORT_FLAG != 0 && u64::from(code) == ABORT_PEER_TIMEOUT {
            AbortReason::PeerTimeout
        } else {
            AbortReason::Unknown(code)
        };
        Some(Abort {
            word,
            reason,
            peer: (word & 0xffff_ffff) as u32,
        })
    }
}

impl std::fmt::Display for Abort {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason {
            AbortReason::PeerTimeout => write!(
                formatter,
                "peer rank {} did not arrive before the deadline (abort word {:#018x})",
                self.peer, self.word
            ),
            AbortReason::Unknown(code) => write!(
                formatter,
                "kernel aborted with unknown reason {code} naming peer rank {} (abort word {:#018x})",
                self.peer, self.word
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
    fn peer_timeout_names_the_peer() {
        let word = ABORT_FLAG | (ABORT_PEER_TIMEOUT << 32) | 5;
        let abort = Abort::decode(word).unwrap();
        assert_eq!(abort.reason, AbortReason::PeerTimeout);
        assert_eq!(abort.peer, 5);
        assert_eq!(
            abort.to_string(),
            "peer rank 5 did not arrive before the deadline (abort word 0x8000000100000005)"
        );
    }

    #[test]
    fn unknown_reason_and_missing_flag_still_abort() {
        let abort = Abort::decode(ABORT_FLAG | (7 << 32) | 1).unwrap();
        assert_eq!(abort.reason, AbortReason::Unknown(7));
        assert_eq!(abort.peer, 1);
        let corrupted = Abort::decode((ABORT_PEER_TIMEOUT << 32) | 2).unwrap();
        assert_eq!(corrupted.reason, AbortReason::Unknown(1));
        assert_eq!(corrupted.peer, 2);
    }
}
