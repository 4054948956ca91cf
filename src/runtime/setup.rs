//! What a caller gives a rank, checked once where every face passes (the Rust handle, the C
//! ABI and the Python package all start a [`Runtime`](super::Runtime)), and which of the
//! runtime's errors are the caller's mistakes rather than the machine's.

use std::time::Duration;

use super::{RankSetup, RuntimeError};
use crate::kernels::MAX_RANKS;

/// The longest timeout, a day: every deadline computed from it stays far inside `Instant`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Whether `timeout` is in the range every face holds a rank's timeout to: above zero and at
/// most [`MAX_TIMEOUT`].
pub fn timeout_in_range(timeout: Duration) -> bool {
    !timeout.is_zero() && timeout <= MAX_TIMEOUT
}

/// `seconds` as a timeout in that range; `None` for any other number, NaN, the infinities and
/// those that round to zero nanoseconds included.
pub fn timeout_from_seconds(seconds: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|timeout| timeout_in_range(*timeout))
}

impl RankSetup {
    /// Refuses a rank or world out of range (2 to [`MAX_RANKS`] ranks) and a timeout out of
    /// range, before anything computes a deadline from it or opens the GPU.
    pub fn check(&self) -> Result<(), RuntimeError> {
        let rank = self.rank;
        if self.world < 2 || self.world as usize > MAX_RANKS || rank >= self.world {
            return Err(RuntimeError::RankOutOfRange {
                rank,
                world: self.world,
            });
        }
        if !timeout_in_range(self.timeout) {
            return Err(RuntimeError::TimeoutOutOfRange {
                rank,
                seconds: self.timeout.as_secs_f64(),
            });
        }
        Ok(())
    }
}

impl RuntimeError {
    /// Whether the caller's arguments are at fault rather than the machine: a rank, world or
    /// timeout out of range, a communicator of another rank, ranks given different packages or
    /// options, an all-reduce an entry cannot take. The C ABI returns these as InvalidArgument.
    pub fn is_caller_mistake(&self) -> bool {
        matches!(
            self,
            RuntimeError::RankOutOfRange { .. }
                | RuntimeError::TimeoutOutOfRange { .. }
                | RuntimeError::CommunicatorMismatch { .. }
                | RuntimeError::RanksDiffer { .. }
                | RuntimeError::Operands { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Silent;
    use crate::runtime::{Rendezvous, Runtime};
    use crate::select::SelectError;
    use crate::serve::ServeError;

    fn setup(rank: u32, world: u32, timeout: Duration) -> RankSetup {
        RankSetup {
            rank,
            world,
            gpu: 0,
            timeout,
            rendezvous: Rendezvous::CommId,
            host: "host".to_owned(),
        }
    }

    #[test]
    fn seconds_become_a_timeout_only_above_zero_and_at_most_a_day() {
        for seconds in [1e-9, 0.5, 60.0, 86_400.0] {
            assert!(timeout_from_seconds(seconds).is_some(), "{seconds}");
        }
        for seconds in [
            1e19,
            86_401.0,
            86_400.000_001,
            5e-324,
            1e-10,
            0.0,
            -0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(timeout_from_seconds(seconds), None, "{seconds}");
        }
    }

    /// Before the driver is opened, so these hold on a machine without one; a deadline
    /// computed from the longest `Duration` would have overflowed. The serving handle starts
    /// its runtime first, so it refuses them the same way.
    #[test]
    fn the_runtime_refuses_a_timeout_or_rank_out_of_range_as_the_callers_mistake() {
        let cases = [
            (setup(0, 2, Duration::MAX), "the timeout"),
            (setup(0, 2, Duration::from_secs(86_401)), "86401 s"),
            (setup(0, 2, Duration::ZERO), "the timeout 0 s"),
            (setup(2, 2, Duration::from_secs(1)), "rank 2 of 2 ranks"),
            (setup(0, 9, Duration::from_secs(1)), "rank 0 of 9 ranks"),
        ];
        for (setup, message) in cases {
            let options = crate::select::SelectOptions::default();
            let served = crate::serve::Handle::start(&setup, &[], &options, &Silent);
            assert!(
                matches!(
                    served,
                    Err(ServeError::Select(SelectError::Runtime(ref error))) if error.is_caller_mistake()
                ),
                "{served:?}"
            );
            let error = Runtime::start(&setup).expect_err("refused");
            assert!(error.is_caller_mistake(), "{error:?}");
            assert!(error.to_string().contains(message), "{error}");
            assert!(
                matches!(
                    error,
                    RuntimeError::TimeoutOutOfRange { .. } | RuntimeError::RankOutOfRange { .. }
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn only_arguments_are_the_callers_mistakes() {
        let mistakes = [
            RuntimeError::CommunicatorMismatch {
                rank: 0,
                world: 2,
                adopted_rank: 1,
                adopted_world: 2,
            },
            RuntimeError::RanksDiffer {
                rank: 0,
                other: 1,
                what: "loaded another package than this rank".to_owned(),
            },
        ];
        assert!(mistakes.iter().all(RuntimeError::is_caller_mistake));
        let faults = [
            RuntimeError::Setup {
                rank: 0,
                message: "peer memory needs peer kernels".to_owned(),
            },
            RuntimeError::Timeout {
                rank: 0,
                step: "the bootstrap".to_owned(),
                seconds: 1.0,
                who: "rank 1 did not arrive".to_owned(),
            },
        ];
        assert!(!faults.iter().any(RuntimeError::is_caller_mistake));
    }
}
