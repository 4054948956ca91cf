//! `prepare schema`: prints a JSON Schema generated from the types, byte for byte the file
//! committed under `schemas/`.

use std::io::Write;

use prepare::schema::SchemaName;

use super::Failure;

/// Flags of `prepare schema`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The schema to print.
    #[arg(value_enum, default_value = "ladder")]
    name: SchemaName,
}

/// Runs `prepare schema`.
pub fn run(args: &Args) -> Result<(), Failure> {
    std::io::stdout()
        .lock()
        .write_all(args.name.generate_text().as_bytes())
        .map_err(|error| {
            Failure::runtime(anyhow::Error::new(error).context("cannot write the schema"))
        })
}
