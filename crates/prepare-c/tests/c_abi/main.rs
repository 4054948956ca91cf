//! The C ABI's tests: the committed header, the C program against the built library, and the
//! version the Python package shares.

mod c_program;
mod header;
mod versions;
