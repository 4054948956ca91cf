//! How a command fails: the exit code each kind of failure maps to.

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

    /// A bench's failure: a choice that differs between ranks is the input refused; the rest
    /// failed at run time.
    pub fn bench(error: prepare::bench::BenchError) -> Failure {
        match error {
            prepare::bench::BenchError::OtherChoice { .. } => Failure::refused(error),
            _ => Failure::runtime(error),
        }
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
