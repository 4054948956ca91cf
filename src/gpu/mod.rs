//! Everything that calls into NVIDIA libraries (driver, NVRTC, NCCL) through raw pointers: the
//! one module of the crate allowed `unsafe`. Each `unsafe` block says in a `// SAFETY:` line why
//! it is sound; the rest of the crate uses the safe types exported here.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
// FFI takes C ints; ranks, counts and ids here are small.
#![allow(clippy::cast_possible_wrap)]

pub mod abort;
pub mod driver;
pub mod nccl;
pub mod nvrtc;
mod search;
