//! `prepare check`: brings the runtime up on every GPU (one process each, like torchrun),
//! compares NCCL's all-reduce with the reference sum and, given a package, runs every custom
//! candidate once per bucket and requires the reference's exact bytes on every rank.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prepare::check::{check_rank, SoakCollective};
use prepare::launch::{launch, LaunchSpec, OutputSink, RankEnvironment, Stream};
use prepare::runtime::{environment_defaults, gpu_for_rank, RankSetup, Rendezvous, Runtime};

use super::Failure;

/// Flags of `prepare check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// GPUs to use, one rank each (`0,1`); all visible GPUs when omitted.
    #[arg(long, value_delimiter = ',')]
    gpus: Option<Vec<u32>>,
    /// Seconds any step may take before the rank gives up and names who is missing.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// A package (from `prepare export`) whose custom candidates are checked for exactness.
    #[arg(long, value_name = "DIR")]
    package: Option<PathBuf>,
    /// Collectives to repeat after the checks.
    #[arg(long, default_value_t = 0)]
    soak: u32,
    /// Which collective the soak repeats.
    #[arg(long, value_enum, default_value = "nccl")]
    soak_collective: SoakKind,
    /// Rank 0 writes the NCCL id here and the others read it, instead of NCCL_COMM_ID.
    #[arg(long, value_name = "FILE")]
    id_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SoakKind {
    Nccl,
    Custom,
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

fn timeout(args: &Args) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|timeout| !timeout.is_zero())
        .ok_or_else(|| {
            Failure::refused(anyhow::anyhow!(
                "--timeout {} is not a positive number of seconds",
                args.timeout
            ))
        })
}

/// Runs `prepare check`.
pub fn run(args: &Args) -> Result<(), Failure> {
    let timeout = timeout(args)?;
    match RankEnvironment::from_lookup(|name| std::env::var(name).ok()) {
        Ok(environment) => run_rank(args, &environment, timeout),
        Err(_) if std::env::var_os("RANK").is_none() => run_launcher(args, timeout),
        Err(error) => Err(Failure::refused(error)),
    }
}

fn run_launcher(args: &Args, timeout: Duration) -> Result<(), Failure> {
    let gpus = if let Some(gpus) = &args.gpus {
        gpus.clone()
    } else {
        let count = prepare::gpu::driver::visible_devices().map_err(Failure::runtime)?;
        (0..count as u32).collect()
    };
    if gpus.len() < 2 {
        return Err(Failure::refused(anyhow::anyhow!(
            "prepare check needs at least 2 GPUs, one rank each; found {}",
            gpus.len()
        )));
    }
    let master_port = match std::env::var("MASTER_PORT") {
        Ok(port) => port
            .parse()
            .context("MASTER_PORT is not a port")
            .map_err(Failure::refused)?,
        Err(_) => free_port().map_err(Failure::runtime)?,
    };
    let spec = LaunchSpec {
        program: std::env::current_exe()
            .context("cannot find this program")
            .map_err(Failure::runtime)?,
        args: std::env::args_os().skip(1).collect(),
        gpus,
        master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".to_owned()),
        master_port,
        env: Vec::new(),
        // The ranks bound themselves; this only catches a rank that cannot.
        deadline: Some(timeout * 4 + Duration::from_secs(60)),
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

/// A port that was free a moment ago, for the rendezvous (NCCL takes the next one).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot pick a port")?;
    Ok(listener.local_addr()?.port())
}

#[allow(clippy::print_stdout)]
fn run_rank(args: &Args, environment: &RankEnvironment, timeout: Duration) -> Result<(), Failure> {
    let gpu = gpu_for_rank(environment, std::env::var("PREPARE_GPUS").ok().as_deref())
        .map_err(Failure::refused)?;
    let package = match &args.package {
        Some(dir) => Some(prepare::package::open_package(dir).map_err(Failure::refused)?),
        None => None,
    };
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
    let runtime = Runtime::start(&setup).map_err(Failure::runtime)?;
    let record = &runtime.records()[runtime.rank() as usize];
    println!(
        "rank {}/{} on GPU {gpu} ({}, {}), {:?}",
        runtime.rank(),
        runtime.world(),
        record.gpu_name,
        record.gpu_uuid,
        runtime.topology()
    );
    let soak_collective = match args.soak_collective {
        SoakKind::Nccl => SoakCollective::Nccl,
        SoakKind::Custom => SoakCollective::Custom,
    };
    let report = check_rank(
        &runtime,
        package.as_ref(),
        args.soak,
        soak_collective,
        &|line| println!("{line}"),
    )
    .map_err(Failure::runtime)?;
    for candidate in &report.candidates {
        match &candidate.skipped {
            None => println!(
                "bucket {:>2} {:<20} exact at {} elements",
                candidate.bucket, candidate.profile, candidate.elements
            ),
            Some(reason) => println!(
                "bucket {:>2} {:<20} dropped: {reason:?}",
                candidate.bucket, candidate.profile
            ),
        }
    }
    println!("check passed");
    Ok(())
}
