//! Command-line commands: each turns parsed flags into calls over the library and prints the
//! result. Failures carry the exit code they map to.

mod bench;
mod check;
mod export;
mod ranks;
mod schema;
mod show;
mod tune;
mod validate;

use clap::{Parser, Subcommand};

/// Prepares collective-communication packages and picks the fastest exact all-reduce.
#[derive(Debug, Parser)]
#[command(name = "prepare", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate ladder files and report every problem with its JSON path.
    Validate(validate::Args),
    /// Print a JSON Schema (the ladder's by default).
    Schema(schema::Args),
    /// Validate a ladder, compile its kernels and write a package.
    Export(export::Args),
    /// Show a package, its qualification and a choice.
    Show(show::Args),
    /// Bring the runtime up on every GPU and check NCCL and the custom kernels for exactness.
    Check(check::Args),
    /// Pick every bucket's fastest exact candidate on these GPUs and write the choice.
    Tune(tune::Args),
    /// Time every candidate of a package and NCCL against each other on these GPUs.
    Bench(bench::Args),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Schema(args) => schema::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Show(args) => show::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
}

/// A failed command and the exit code it maps to.
#[derive(Debug)]
pub enum Failure {
    /// The input was refused: invalid ladder, tampered or mismatched package, unfit device.
    Refused(anyhow::Error),
    /// The flags (or a launcher's variables) are wrong in a way clap cannot see: a GPU named
    /// twice, no architecture and no GPU to take it from.
    Usage(anyhow::Error),
    /// The driver, NVRTC, NCCL or a peer failed.
    Runtime(anyhow::Error),
}

impl Failure {
    /// Exit code 1: the input was refused.
    pub fn refused(error: impl Into<anyhow::Error>) -> Failure {
        Failure::Refused(error.into())
    }

    /// Exit code 2: the flags are wrong.
    pub fn usage(error: impl Into<anyhow::Error>) -> Failure {
        Failure::Usage(error.into())
    }

    /// Exit code 3: something failed at run time.
    pub fn runtime(error: impl Into<anyhow::Error>) -> Failure {
        Failure::Runtime(error.into())
    }

    /// A serving handle's failure: packages that do not fit these ranks are refused input; the
    /// rest (driver, NCCL, a peer missing, ranks disagreeing) failed at run time.
    pub fn serving(error: prepare::serve::ServeError) -> Failure {
        if error.is_refusal() {
            Failure::refused(error)
        } else {
            Failure::runtime(error)
        }
    }

    /// The error to print.
    pub fn error(&self) -> &anyhow::Error {
        match self {
            Failure::Refused(error) | Failure::Usage(error) | Failure::Runtime(error) => error,
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Refused(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Runtime(_) => 3,
        }
    }
}
