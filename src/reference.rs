//! The reference sum every custom candidate must equal byte for byte.
