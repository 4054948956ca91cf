//! What every multi-GPU command shares: started by hand it launches one child per GPU (like
//! torchrun) and waits for them; started as a rank (RANK, WORLD_SIZE, ... set) it brings the
//! runtime up and runs the command's rank body.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prepare::launch::{launch, LaunchSpec, OutputSink, RankEnvironment, Stream};
use prepare::runtime::{environment_defaults, gpu_for_rank, RankSetup, Rendezvous, Runtime};

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

/// Prints the children's lines with their rank.
struct PrefixedOutput;

impl OutputSink for PrefixedOutput {
    #[allow(clippy::print_stdout, clippy::print_stderr)]
    fn line(&self, rank: u32, stream: Stream, line: &str) {
        match stream {
            Stream::Stdout => println!("[rank {rank}] {line}"),
            Stream::Stderr => eprintln!("[rank {rank}] {line}"),
        }
    }
}

/// The longest `--timeout`, seconds. Every bound computed from it (deadlines from now, the
/// launcher's twenty steps and ten minutes) stays far inside `Duration` and `Instant`.
const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

/// A timeout above zero and at most a day, in seconds.
fn parse_timeout(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if seconds > 0.0
        && seconds <= MAX_TIMEOUT_SECONDS
        && Duration::try_from_secs_f64(seconds).is_ok_and(|timeout| !timeout.is_zero())
    {
        Ok(seconds)
    } else {
        Err(format!(
            "{text} is not a positive number of seconds up to {MAX_TIMEOUT_SECONDS} (a day)"
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
            .filter(|timeout| !timeout.is_zero() && self.timeout <= MAX_TIMEOUT_SECONDS)
            .ok_or_else(|| {
                Failure::usage(anyhow::anyhow!(
                    "--timeout {} is not a positive number of seconds up to a day",
                    self.timeout
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
    /// A rank, with its environment.
    Rank(RankEnvironment),
}

/// Whether this process is a rank (RANK and friends set) or launches them.
pub fn role() -> Result<Role, Failure> {
    match RankEnvironment::from_lookup(|name| std::env::var(name).ok()) {
        Ok(environment) => Ok(Role::Rank(environment)),
        Err(_) if std::env::var_os("RANK").is_none() => Ok(Role::Launcher),
        Err(error) => Err(Failure::refused(error)),
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
        return Err(Failure::refused(anyhow::anyhow!(
            "prepare {command} needs at least 2 GPUs, one rank each; found {}",
            gpus.len()
        )));
    }
    let master_port = match std::env::var("MASTER_PORT") {
        Ok(port) => port
            .parse()
            .context("MASTER_PORT is not a port")
            .map_err(Failure::refused)?,
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
        args: std::env::args_os().skip(1).collect(),
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
    launch(&spec, &sink).map_err(|error| {
        let code = error.exit_code();
        let error = anyhow::Error::new(error);
        if code == 1 {
            Failure::refused(error)
        } else {
            Failure::runtime(error)
        }
    })
}

/// Brings this rank's runtime up: its GPU from LOCAL_RANK (and PREPARE_GPUS), the NCCL
/// settings it needs, the bounded bootstrap and the topology agreement.
pub fn start_rank(args: &RankArgs, environment: &RankEnvironment) -> Result<Runtime, Failure> {
    let timeout = args.timeout()?;
    let gpu = gpu_for_rank(environment, std::env::var("PREPARE_GPUS").ok().as_deref())
        .map_err(Failure::refused)?;
    let rendezvous = args
        .id_file
        .clone()
        .map_or(Rendezvous::CommId, Rendezvous::IdFile);
    // NCCL reads its rendezvous and connection mode from the environment; this rank process
    // has started no other thread yet.
    for (name, value) in environment_defaults(|name| std::env::var(name).ok()) {
        if name != "NCCL_COMM_ID" || rendezvous == Rendezvous::CommId {
            std::env::set_var(name, value);
        }
    }
    let setup = RankSetup {
        rank: environment.rank,
        world: environment.world_size,
        gpu,
        timeout,
        rendezvous,
        host: prepare::agree::host_identity(|name| std::env::var(name).ok()),
    };
    Runtime::start(&setup).map_err(Failure::runtime)
}

/// The GPU's architecture must be the package's: another one is the input refused.
pub fn check_architecture(
    runtime: &Runtime,
    package: &prepare::package::Package,
) -> Result<(), Failure> {
    prepare::collective::check_architecture(runtime, package).map_err(|error| match error {
        prepare::runtime::RuntimeError::WrongArchitecture { .. } => Failure::refused(error),
        other => Failure::runtime(other),
    })
}
