//! `prepare`: validates collective-communication ladders, compiles their kernels into hashed
//! packages, and picks, on the serving machine, the fastest all-reduce that gives the reference
//! sum's exact bytes, the same choice on every rank.
//!
//! The library never prints; progress goes through [`progress::Reporter`].

pub mod abi;
pub mod agree;
pub mod bench;
pub mod cache;
pub mod check;
pub mod collective;
pub mod compile;
pub mod decimal;
pub mod device;
pub mod files;
pub mod gpu;
pub mod hash;
pub mod json_schema;
pub mod kernels;
pub mod ladder;
pub mod launch;
pub mod package;
pub mod pieces;
pub mod progress;
pub mod qualify;
pub mod reference;
pub mod runtime;
pub mod schema;
pub mod select;
pub mod serve;
pub mod shape;
pub mod show;
pub mod timing;
pub mod tune;

/// The tool's version, written into packages and cache keys.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");
