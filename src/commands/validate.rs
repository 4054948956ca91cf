//! `prepare validate`.

use super::Failure;

/// Flags of `prepare validate`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `prepare validate`.
pub fn run(_args: &Args) -> Result<(), Failure> {
    Err(Failure::runtime(anyhow::anyhow!("not built yet")))
}
