//! What every multi-GPU command shares: started by hand it launches one child per GPU (like
//! torchrun) and waits for them; started as a rank (RANK, WORLD_SIZE, ... set) it brings the
//! runtime up and runs the command's rank body.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prepare::launch::{launch, LaunchSpec, OutputSink, RankEnvironment, Stream};
use prepare::package::Package;
use prepare::runtime::Runtime;
use prepare::serve::{Options, Server, MAX_TIMEOUT};

use super::Failure;

/// Flags every multi-GPU command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct RankArgs {
    /// GPUs to use, one rank each (`0,1`); all visible GPUs when omitted.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub gpus: Option<Vec<u32>>,
    /// Seconds any step may take before the rank gives up and names who is missing (at most a
    /// day).
    #[arg(long, default_value_t = 60.0, value_name = "SECS", value_parser = parse_timeout)]
    pub timeout: f64,
    /// Rank 0 writes the NCCL id here and the others read it, instead of NCCL_COMM_ID. The
    /// launcher removes a file left by an earlier run; ranks started by hand need it removed.
    /// Only a file prepare wrote (it starts with a header line) is ever removed or replaced.
    #[arg(long, value_name = "FILE")]
    pub id_file: Option<PathBuf>,
}

/// Flags of a command that runs a package on every GPU (`tune`, `bench`).
#[derive(Debug, Clone, clap::Args)]
pub struct PackageRankArgs {
    /// The package (from `prepare export`) to select from or time.
    #[arg(long, value_name = "DIR")]
    pub package: PathBuf,
    #[command(flatten)]
    pub ranks: RankArgs,
}

impl PackageRankArgs {
    /// Opens the package; one that cannot be opened is the input refused.
    pub fn open_package(&self) -> Result<Package, Failure> {
        prepare::package::open_package_retrying(&self.package).map_err(Failure::refused)
    }

    /// Launches `prepare COMMAND` once per GPU, after refusing a bad package before any rank
    /// starts.
    pub fn launch(&self, command: &str) -> Result<(), Failure> {
        self.open_package()?;
        launch_ranks(command, &self.ranks, self.ranks.gpu_list()?, Vec::new())
    }

    /// Brings this rank's runtime up ([`start_rank`]) on a GPU of the package's architecture.
    pub fn start_rank(&self, package: &Package) -> Result<Runtime, Failure> {
        let runtime = start_rank(&self.ranks)?;
        check_architecture(&runtime, package)?;
        Ok(runtime)
    }
}

/// Prints the children's lines with their rank.
struct PrefixedOutput;

impl OutputSink for PrefixedOutput {
    #[allow(clippy::print_stdout, clippy::print_stderr)]
    fn line(&self, rank: u32, stream: Stream, line: &str) {
        let line = without_own_rank(rank, line);
        match stream {
            Stream::Stdout => println!("[rank {rank}] {line}"),
            Stream::Stderr => eprintln!("[rank {rank}] {line}"),
        }
    }
}

/// A rank's line without the rank it names itself: the library's errors start with `rank 1: `
/// (a server's log needs it), and the launcher's prefix already says it, so `error: rank 1:
/// ...` from rank 1 prints as `[rank 1] error: ...`. Only the first mention that opens the
/// line or a part of an error chain (after `: `) goes; another rank's is kept.
fn without_own_rank(rank: u32, line: &str) -> std::borrow::Cow<'_, str> {
    let own = format!("rank {rank}: ");
    let opens = |at: usize| at == 0 || line[..at].ends_with(": ");
    match line
        .match_indices(&own)
        .map(|(at, _)| at)
        .find(|&at| opens(at))
    {
        Some(at) => format!("{}{}", &line[..at], &line[at + own.len()..]).into(),
        None => line.into(),
    }
}

/// A timeout above zero and at most a day, in seconds. Every bound computed from it
/// (deadlines from now, the launcher's twenty steps and ten minutes) stays far inside
/// `Duration` and `Instant`.
fn parse_timeout(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| {
        format!(
            "`{}` is not a number of seconds",
            prepare::files::quoted(text)
        )
    })?;
    if seconds > 0.0
        && seconds <= MAX_TIMEOUT.as_secs_f64()
        && Duration::try_from_secs_f64(seconds).is_ok_and(|timeout| !timeout.is_zero())
    {
        Ok(seconds)
    } else {
        Err(format!(
            "{} is not a positive number of seconds up to {} (a day)",
            prepare::files::quoted(text),
            MAX_TIMEOUT.as_secs()
        ))
    }
}

/// Refuses a GPU named twice: two ranks on one GPU would deadlock in their first collective.
pub fn check_distinct_gpus(gpus: &[u32]) -> Result<(), Failure> {
    for (position, gpu) in gpus.iter().enumerate() {
        if gpus[..position].contains(gpu) {
            return Err(Failure::usage(anyhow::anyhow!(
                "--gpus names GPU {gpu} twice; each rank needs a GPU of its own"
            )));
        }
    }
    Ok(())
}

/// Refuses a directory the ranks would fail to write only after their GPU work: a file, or one
/// this process may not write. `flag` names it in the refusal.
pub fn check_writable(flag: &str, dir: Option<&std::path::Path>) -> Result<(), Failure> {
    let Some(dir) = dir else {
        return Ok(());
    };
    prepare::files::check_writable_directory(dir)
        .with_context(|| format!("{flag} {} cannot be written", dir.display()))
        .map_err(Failure::refused)
}

impl RankArgs {
    /// The timeout as a duration (its range was checked when the flags were parsed).
    pub fn timeout(&self) -> Result<Duration, Failure> {
        Duration::try_from_secs_f64(self.timeout)
            .ok()
            .filter(|timeout| !timeout.is_zero() && *timeout <= MAX_TIMEOUT)
            .ok_or_else(|| {
                Failure::usage(anyhow::anyhow!(
                    "--timeout {} is not a positive number of seconds up to a day",
                    prepare::files::quoted(&self.timeout.to_string())
                ))
            })
    }

    /// The GPUs to launch on: `--gpus`, else every visible GPU.
    pub fn gpu_list(&self) -> Result<Vec<u32>, Failure> {
        if let Some(gpus) = &self.gpus {
            check_distinct_gpus(gpus)?;
            return Ok(gpus.clone());
        }
        let count = prepare::gpu::driver::visible_devices().map_err(Failure::runtime)?;
        Ok((0..count as u32).collect())
    }
}

/// This process's role.
pub enum Role {
    /// Started by hand: launch the ranks.
    Launcher,
    /// A rank: its environment says where it is.
    Rank,
}

/// Whether this process is a rank (RANK and friends set) or launches them. Variables that
/// are set but wrong are a usage error, like a wrong flag.
pub fn role() -> Result<Role, Failure> {
    match RankEnvironment::from_lookup(|name| std::env::var(name).ok()) {
        Ok(_) => Ok(Role::Rank),
        Err(_) if std::env::var_os("RANK").is_none() => Ok(Role::Launcher),
        Err(error) => Err(Failure::usage(error)),
    }
}

/// Starts this program once per GPU with the same arguments plus `env`, prefixes their output,
/// and fails with the first failed rank's code.
pub fn launch_ranks(
    command: &str,
    args: &RankArgs,
    gpus: Vec<u32>,
    env: Vec<(OsString, OsString)>,
) -> Result<(), Failure> {
    let timeout = args.timeout()?;
    if gpus.len() < 2 {
        // Too few GPUs named is the flags' fault; too few here, the machine's.
        let found = if args.gpus.is_some() {
            "--gpus names"
        } else {
            "found"
        };
        let error = anyhow::anyhow!(
            "prepare {command} needs at least 2 GPUs, one rank each; {found} {}",
            gpus.len()
        );
        return Err(if args.gpus.is_some() {
            Failure::usage(error)
        } else {
            Failure::refused(error)
        });
    }
    let master_port = match std::env::var("MASTER_PORT") {
        Ok(port) => port
            .parse()
            .context("MASTER_PORT is not a port")
            .map_err(Failure::usage)?,
        Err(_) => prepare::launch::free_port_pair()
            .context("cannot pick a port for the ranks to meet")
            .map_err(Failure::runtime)?,
    };
    // A file left by an earlier run would hand the other ranks its stale id before rank 0
    // writes the new one; only a file this tool wrote is removed.
    if let Some(path) = &args.id_file {
        prepare::files::remove_id_file(path)
            .with_context(|| format!("--id-file {}", path.display()))
            .map_err(Failure::refused)?;
    }
    let spec = LaunchSpec {
        program: std::env::current_exe()
            .context("cannot find this program")
            .map_err(Failure::runtime)?,
        args: super::exactness::rank_arguments(std::env::args_os().skip(1)),
        gpus,
        master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".to_owned()),
        master_port,
        env,
        // The ranks bound every step themselves; this only catches a rank that cannot. A long
        // command (qualification, tuning) takes many steps, so the bound is generous.
        deadline: Some(
            timeout
                .saturating_mul(20)
                .saturating_add(Duration::from_secs(600)),
        ),
    };
    let sink: Arc<dyn OutputSink> = Arc::new(PrefixedOutput);
    // The launcher ends as its first failed rank did.
    launch(&spec, &sink).map_err(|error| {
        let code = error.exit_code();
        let error = anyhow::Error::new(error);
        match code {
            1 => Failure::refused(error),
            2 => Failure::usage(error),
            _ => Failure::runtime(error),
        }
    })
}

/// Brings this rank's runtime up from the launcher's variables: its GPU from LOCAL_RANK (and
/// PREPARE_GPUS), the NCCL settings it needs, the bounded bootstrap and the topology
/// agreement. Variables that do not say where the rank is are a usage error.
pub fn start_rank(args: &RankArgs) -> Result<Runtime, Failure> {
    let options = Options {
        timeout: args.timeout()?,
        id_file: args.id_file.clone(),
        ..Options::default()
    };
    // This rank process has started no other thread yet, so NCCL's variables are set safely.
    let server = Server::from_env(options).map_err(Failure::usage)?;
    server.runtime().map_err(Failure::runtime)
}

/// The GPU's architecture must be the package's: another one is the input refused.
pub fn check_architecture(runtime: &Runtime, package: &Package) -> Result<(), Failure> {
    prepare::collective::check_architecture(runtime, package).map_err(|error| match error {
        prepare::runtime::RuntimeError::WrongArchitecture { .. } => Failure::refused(error),
        other => Failure::runtime(other),
    })
}

#[cfg(test)]
mod tests {
    use super::without_own_rank;

    #[test]
    fn a_rank_line_names_its_rank_once() {
        let cases = [
            ("error: rank 1: cannot load", "error: cannot load"),
            ("rank 1: ready", "ready"),
            (
                "error: cannot start: rank 1: no GPU",
                "error: cannot start: no GPU",
            ),
            // Another rank's name, or this rank's inside a sentence, stays.
            (
                "error: rank 1: rank 0 did not arrive",
                "error: rank 0 did not arrive",
            ),
            ("error: rank 0: timed out", "error: rank 0: timed out"),
            ("bucket 3 on rank 1: exact", "bucket 3 on rank 1: exact"),
        ];
        for (line, printed) in cases {
            assert_eq!(without_own_rank(1, line), printed, "{line}");
        }
    }
}
