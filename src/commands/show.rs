//! `prepare show`.

use super::Failure;

/// Flags of `prepare show`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `prepare show`.
pub fn run(_args: &Args) -> Result<(), Failure> {
    Err(Failure::runtime(anyhow::anyhow!("not built yet")))
}
