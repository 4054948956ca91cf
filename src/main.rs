//! The `prepare` command: parses flags, runs a command over the library, prints its output and
//! picks the exit code (0 success, 1 input refused, 2 usage, 3 runtime failure).

mod commands;

use std::process::ExitCode;

fn main() -> ExitCode {
    // NVRTC builds that use the CUDA compute cache answer a repeated compile without running
    // ptxas, so without the resource report packages record; kernels load as cubins, so the
    // driver's JIT cache is never needed either.
    if std::env::var_os("CUDA_CACHE_DISABLE").is_none() {
        std::env::set_var("CUDA_CACHE_DISABLE", "1");
    }
    let cli = commands::Cli::from_command_line();
    // A panic is a bug, but the exit code stays one of the four documented: 3, after the
    // panic's own message.
    let Ok(result) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| commands::run(cli)))
    else {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: internal error (a bug in prepare; the message above says where)");
        }
        return ExitCode::from(3);
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // Errors quote files (a ladder's keys, a manifest's names): escaped for the
            // terminal. The line goes out in one write: stderr is unbuffered, and a rank ended
            // by its launcher between two writes would leave half a line.
            let message = format!("{:#}", failure.error());
            let line = format!("error: {}\n", prepare::files::escape_control(&message));
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            ExitCode::from(failure.exit_code())
        }
    }
}
