//! The GPU layer: the one part of the crate that calls into the CUDA driver. Everything else
//! uses its safe types; every `unsafe` block here says why it is sound in a `SAFETY:` line.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abort;
pub mod driver;
