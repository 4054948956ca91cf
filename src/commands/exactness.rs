//! The exactness flags of every command that selects or checks (`tune`, `bench`, `check`): the
//! policy is exact by default, so a candidate whose output differs from the reference sum is
//! kept out unless `--allow-inexact` is given. `--exact-only` is still accepted, does nothing
//! and says so.

use std::ffi::OsString;

/// The flag that only says the default; the launcher does not pass it on to the ranks, so that
/// the note is printed once.
pub const EXACT_ONLY: &str = "--exact-only";

/// What `--exact-only` says on stderr.
pub const EXACT_ONLY_NOTE: &str = "note: --exact-only is the default: candidates whose output \
     differs from the reference sum are kept out unless --allow-inexact is given";

/// Flags of the exactness policy.
#[derive(Debug, Clone, clap::Args)]
pub struct ExactnessArgs {
    /// Also keep candidates whose output differs from the reference sum (plain NCCL all-reduce
    /// or reduce-scatter beyond two ranks): the winner may then change the model's output.
    #[arg(long, conflicts_with = "exact_only")]
    pub allow_inexact: bool,
    /// The default (kept for old command lines): candidates that differ from the reference sum
    /// are kept out.
    #[arg(long)]
    pub exact_only: bool,
}

impl ExactnessArgs {
    /// Says on stderr that `--exact-only` is the default, when it was given: the launcher says
    /// it (its ranks are not given the flag), and of ranks started by hand, rank 0.
    #[allow(clippy::print_stderr)]
    pub fn note(&self, launcher: bool) {
        let says = launcher || std::env::var("RANK").is_ok_and(|rank| rank.trim() == "0");
        if self.exact_only && says {
            eprintln!("{EXACT_ONLY_NOTE}");
        }
    }
}

/// The command line the launcher passes to every rank: its own, without `--exact-only`, which
/// changes nothing and whose note the launcher has printed.
pub fn rank_arguments(arguments: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    arguments
        .into_iter()
        .filter(|argument| argument != EXACT_ONLY)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_are_not_given_exact_only() {
        let given = [
            "tune",
            "--exact-only",
            "--package",
            "pkg",
            "--out=--exact-only",
        ];
        let passed = rank_arguments(given.iter().map(OsString::from));
        assert_eq!(passed, ["tune", "--package", "pkg", "--out=--exact-only"]);
    }
}
