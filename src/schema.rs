//! JSON Schemas generated from the Rust types.
