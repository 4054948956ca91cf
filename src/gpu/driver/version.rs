//! The CUDA version a driver supports, and the oldest this layer runs on.

use std::fmt;

/// The oldest driver this layer runs on: the bindings and the NVRTC cubins are CUDA 13.0's.
pub const MIN_DRIVER_VERSION: DriverVersion = DriverVersion {
    major: 13,
    minor: 0,
};

/// A CUDA version as the driver reports it (13.0 for 13000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl DriverVersion {
    /// Decodes `cuDriverGetVersion`'s `1000 * major + 10 * minor`.
    pub fn from_encoded(encoded: u32) -> DriverVersion {
        DriverVersion {
            major: encoded / 1000,
            minor: (encoded % 1000) / 10,
        }
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_and_order() {
        assert_eq!(
            DriverVersion::from_encoded(13000),
            DriverVersion {
                major: 13,
                minor: 0
            }
        );
        assert_eq!(DriverVersion::from_encoded(12090).to_string(), "12.9");
        assert!(DriverVersion::from_encoded(12090) < MIN_DRIVER_VERSION);
        assert!(DriverVersion::from_encoded(13010) > MIN_DRIVER_VERSION);
    }
}
