//! Command-line commands: each turns parsed flags into calls over the library and prints the
//! result. Failures carry the exit code they map to.

mod bench;
mod bench_epilogue;
mod check;
mod exactness;
mod export;
mod failure;
mod ranks;
mod schema;
mod show;
mod tune;
mod validate;

use clap::{Parser, Subcommand};

pub use failure::Failure;

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

impl Cli {
    /// The command line, parsed; a refusal (exit 2) quotes what it was given as every error
    /// does, through [`prepare::files::quoted`].
    pub fn from_command_line() -> Cli {
        Cli::try_parse().unwrap_or_else(|error| quoting_briefly(error).exit())
    }
}

/// Clap's refusal with the values it quotes (the argument, the flag, the value given) through
/// [`prepare::files::quoted`]; what it says about them is unchanged.
fn quoting_briefly(mut error: clap::Error) -> clap::Error {
    use clap::error::ContextValue;
    use prepare::files::quoted;
    let values: Vec<_> = error
        .context()
        .filter_map(|(kind, value)| match value {
            ContextValue::String(text) => Some((kind, ContextValue::String(quoted(text)))),
            ContextValue::Strings(texts) => Some((
                kind,
                ContextValue::Strings(texts.iter().map(|text| quoted(text)).collect()),
            )),
            _ => None,
        })
        .collect();
    for (kind, value) in values {
        error.insert(kind, value);
    }
    error
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
