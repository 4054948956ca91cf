//! Everything that calls into NVIDIA libraries through raw pointers: the one module of the
//! crate allowed `unsafe`. Each `unsafe` block says in a `// SAFETY:` line why it is sound; the
//! rest of the crate uses the safe types exported here.

#![allow(unsafe_code)]

pub mod nvrtc;
