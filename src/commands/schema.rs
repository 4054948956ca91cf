//! `prepare schema`.

use super::Failure;

/// Flags of `prepare schema`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `prepare schema`.
pub fn run(_args: &Args) -> Result<(), Failure> {
    Err(Failure::runtime(anyhow::anyhow!("not built yet")))
}
