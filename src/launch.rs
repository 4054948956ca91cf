//! The launcher: one child process per GPU, started like torchrun (RANK, WORLD_SIZE,
//! LOCAL_RANK, MASTER_ADDR, MASTER_PORT), every GPU left visible to every child so each can
//! still ask about peer access. The first child to fail ends the others, and its failure is
//! the launcher's, naming the rank.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How often the launcher looks at its children.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What to start and how.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments, the same for every rank.
    pub args: Vec<OsString>,
    /// Ranks to start on this host, one per entry of `gpus`.
    pub gpus: Vec<u32>,
    /// The rendezvous host, `MASTER_ADDR`.
    pub master_addr: String,
    /// The rendezvous port, `MASTER_PORT`.
    pub master_port: u16,
    /// Extra variables for every child.
    pub env: Vec<(OsString, OsString)>,
    /// Past this the launcher ends every child and reports which were still running.
    pub deadline: Option<Duration>,
}

/// A port that was free a moment ago, for MASTER_PORT, whose next port (the rendezvous NCCL
/// listens on, see [`crate::serve::rendezvous_address`]) was free too.
pub fn free_port_pair() -> std::io::Result<u16> {
    let mut last_error = None;
    for _ in 0..64 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = first.local_addr()?.port();
        let Some(next) = port.checked_add(1) else {
            continue;
        };
        match std::net::TcpListener::bind(("127.0.0.1", next)) {
            Ok(_) => return Ok(port),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| std::io::Error::other("no free pair of ports")))
}

/// Which of a child's streams a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives the children's output, one line at a time.
pub trait OutputSink: Send + Sync {
    /// A line (without its newline) that `rank` wrote to `stream`.
    fn line(&self, rank: u32, stream: Stream, line: &str);
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A child could not be started.
    #[error("could not start rank {rank} ({program})")]
    Spawn {
        /// The rank.
        rank: u32,
        /// The program.
        program: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A child exited with a non-zero code or was killed; the others were ended.
    #[error("rank {rank} failed: {how}; the other ranks were stopped")]
    RankFailed {
        /// The first rank that failed.
        rank: u32,
        /// Its exit code, when it exited.
        code: Option<i32>,
        /// "exited with code 3" or "was killed by signal 9".
        how: String,
    },
    /// The deadline passed with children still running.
    #[error("ranks {running:?} were still running after {seconds} s and were stopped")]
    Deadline {
        /// Ranks still running at the deadline.
        running: Vec<u32>,
        /// The deadline.
        seconds: u64,
    },
    /// Waiting on a child failed.
    #[error("could not wait for rank {rank}")]
    Wait {
        /// The rank.
        rank: u32,
        /// What the OS said.
        source: std::io::Error,
    },
}

impl LaunchError {
    /// The exit code the launcher should end with: the failed rank's own code when it is one
    /// of the tool's (1 refused, 2 usage, 3 runtime), otherwise 3 (a runtime failure: a rank
    /// that panicked, was killed or is another program), so the command's code is always 0-3.
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchError::RankFailed {
                code: Some(code), ..
            } if (1..=3).contains(code) => *code as u8,
            _ => 3,
        }
    }
}

fn describe(status: ExitStatus) -> (Option<i32>, String) {
    if let Some(code) = status.code() {
        return (Some(code), format!("exited with code {code}"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return (None, format!("was killed by signal {signal}"));
        }
    }
    (None, format!("ended with {status}"))
}

fn forward(
    rank: u32,
    stream: Stream,
    reader: impl Read + Send + 'static,
    sink: Arc<dyn OutputSink>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    sink.line(rank, stream, text.trim_end_matches(['\n', '\r']));
                }
            }
        }
    })
}

struct Running {
    rank: u32,
    child: Child,
    done: bool,
}

/// Kills every child's process group, so that what a child started goes too and the output
/// pipes close.
fn stop_all(children: &mut [Running]) {
    for running in children.iter() {
        if let Ok(pid) = i32::try_from(running.child.id()) {
            // A group that is already gone makes killpg fail harmlessly.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    for running in children.iter_mut().filter(|running| !running.done) {
        let _ = running.child.wait();
        running.done = true;
    }
}

/// Starts one child per GPU and waits for all of them. Every child sees `RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` and `PREPARE_GPUS` (the GPU
/// list, so the child selects `PREPARE_GPUS[LOCAL_RANK]`). The first failure ends the others.
pub fn launch(spec: &LaunchSpec, sink: &Arc<dyn OutputSink>) -> Result<(), LaunchError> {
    let world = spec.gpus.len();
    let gpu_list = spec
        .gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut children: Vec<Running> = Vec::with_capacity(world);
    let mut forwarders = Vec::new();
    for rank in 0..world as u32 {
        let mut command = Command::new(&spec.program);
        command
            .args(&spec.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", spec.master_port.to_string())
            .env("PREPARE_GPUS", &gpu_list)
            .envs(spec.env.iter().map(|(key, value)| (key, value)))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(source) => {
                stop_all(&mut children);
                return Err(LaunchError::Spawn {
                    rank,
                    program: spec.program.display().to_string(),
                    source,
                });
            }
        };
        if let Some(stdout) = child.stdout.take() {
            forwarders.push(forward(rank, Stream::Stdout, stdout, Arc::clone(sink)));
        }
        if let Some(stderr) = child.stderr.take() {
            forwarders.push(forward(rank, Stream::Stderr, stderr, Arc::clone(sink)));
        }
        children.push(Running {
            rank,
            child,
            done: false,
        });
    }

    let started = Instant::now();
    let result = loop {
        let mut failure = None;
        for running in children.iter_mut().filter(|running| !running.done) {
            match running.child.try_wait() {
                Ok(Some(status)) => {
                    running.done = true;
                    if !status.success() && failure.is_none() {
                        let (code, how) = describe(status);
                        failure = Some(LaunchError::RankFailed {
                            rank: running.rank,
                            code,
                            how,
                        });
                    }
                }
                Ok(None) => {}
                Err(source) => {
                    running.done = true;
                    failure.get_or_insert(LaunchError::Wait {
                        rank: running.rank,
                        source,
                    });
                }
            }
        }
        if let Some(failure) = failure {
            stop_all(&mut children);
            break Err(failure);
        }
        if children.iter().all(|running| running.done) {
            // What the children left running in their groups would hold the pipes open.
            stop_all(&mut children);
            break Ok(());
        }
        if let Some(deadline) = spec.deadline {
            if started.elapsed() > deadline {
                let running = children
                    .iter()
                    .filter(|running| !running.done)
                    .map(|running| running.rank)
                    .collect();
                stop_all(&mut children);
                break Err(LaunchError::Deadline {
                    running,
                    seconds: deadline.as_secs(),
                });
            }
        }
        thread::sleep(POLL_INTERVAL);
    };
    // The pipes close once every child is gone, so the forwarders finish.
    for forwarder in forwarders {
        let _ = forwarder.join();
    }
    result
}

/// This process's place in a launch, read from torchrun's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnvironment {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub world_size: u32,
    /// `LOCAL_RANK` (defaults to `RANK`).
    pub local_rank: u32,
    /// `MASTER_ADDR`.
    pub master_addr: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
}

/// Why torchrun's variables could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RankEnvironmentError {
    /// A variable is missing.
    #[error("{name} is not set (a rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")]
    Missing {
        /// The variable.
        name: &'static str,
    },
    /// A variable does not parse.
    #[error("{name}={} is not valid: {expected}", crate::files::shorten(&format!("{value:?}")))]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What would be valid.
        expected: String,
    },
}

impl RankEnvironment {
    /// Reads the variables through `lookup` (`std::env::var` in a process).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<RankEnvironment, RankEnvironmentError> {
        let required =
            |name: &'static str| lookup(name).ok_or(RankEnvironmentError::Missing { name });
        let number = |name: &'static str, value: String, max: u32| {
            value
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|number| *number <= max)
                .ok_or(RankEnvironmentError::Invalid {
                    name,
                    value,
                    expected: format!("an integer from 0 to {max}"),
                })
        };
        let world_size = number("WORLD_SIZE", required("WORLD_SIZE")?, 1024)?;
        if world_size == 0 {
            return Err(RankEnvironmentError::Invalid {
                name: "WORLD_SIZE",
                value: "0".to_owned(),
                expected: "at least 1".to_owned(),
            });
        }
        let rank = number("RANK", required("RANK")?, world_size - 1)?;
        let local_rank = match lookup("LOCAL_RANK") {
            Some(value) => number("LOCAL_RANK", value, 1023)?,
            None => rank,
        };
        let master_addr = required("MASTER_ADDR")?;
        let port_text = required("MASTER_PORT")?;
        let master_port = port_text
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or(RankEnvironmentError::Invalid {
                name: "MASTER_PORT",
                value: port_text,
                expected: "a port from 1 to 65535".to_owned(),
            })?;
        Ok(RankEnvironment {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        })
    }
}
