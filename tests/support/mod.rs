//! Shared by the tests of every group.

pub mod cli;
pub mod fixtures;
pub mod mutations;
pub mod one_gpu;
pub mod process;
pub mod repository;
pub mod timings;
