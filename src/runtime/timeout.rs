//! The range of a rank's timeout, which [`Runtime::start`](super::Runtime::start) holds every
//! face to (the Rust handle, the C ABI and the Python package all start a runtime there).

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(!timeout_in_range(Duration::MAX));
        assert!(timeout_in_range(MAX_TIMEOUT));
    }
}
