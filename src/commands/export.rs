//! `prepare export`.

use super::Failure;

/// Flags of `prepare export`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `prepare export`.
pub fn run(_args: &Args) -> Result<(), Failure> {
    Err(Failure::runtime(anyhow::anyhow!("not built yet")))
}
