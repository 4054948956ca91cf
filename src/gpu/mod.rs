//! The one module that calls the GPU libraries (driver, NVRTC, NCCL) through FFI. Everything
//! else in the crate uses the safe types defined here; every `unsafe` block says why it is
//! sound.
#![allow(unsafe_code)]
// FFI takes C ints; ranks, counts and ids here are small.
#![allow(clippy::cast_possible_wrap)]

pub mod nccl;
