//! Serving from a launcher's environment: a server started like torchrun (RANK, WORLD_SIZE,
//! LOCAL_RANK, MASTER_ADDR, MASTER_PORT) reads where it is from the environment and starts the
//! [`Handle`] with its packages and a few options, leaving the environment as it was:
//!
//! ```no_run
//! use prepare::serve::{Options, Server};
//!
//! # fn main() -> anyhow::Result<()> {
//! let package = prepare::package::open_package_retrying("pkg/h200_nvlink_tp2".as_ref())?;
//! let handle = Server::from_env(Options::default())?.start(&[package])?;
//! # Ok(())
//! # }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use super::{Handle, ServeError};
use crate::launch::{RankEnvironment, RankEnvironmentError};
use crate::package::Package;
use crate::progress::Reporter;
use crate::runtime::{RankSetup, Rendezvous, Runtime};
use crate::select::{SelectError, SelectOptions};
use crate::tune::choice::Tuning;

pub use crate::runtime::MAX_TIMEOUT;

/// How a server starts serving.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Bounds every start-up step (bootstrap, agreement, each collective of the selection) and
    /// every kernel's wait for a peer. Above zero and at most [`MAX_TIMEOUT`]; 60 s by default.
    pub timeout: Duration,
    /// Where choices are cached; `None` keeps no cache. By default `$XDG_CACHE_HOME/prepare`,
    /// else `~/.cache/prepare`.
    pub cache_dir: Option<PathBuf>,
    /// Time the candidates on this machine (the default), or take each bucket's default.
    pub tuning: Tuning,
    /// Time again even when the cache holds a choice.
    pub retune: bool,
    /// A candidate replaces the bucket's default only when faster by more than this fraction
    /// (0.03 by default: 3%).
    pub margin: f64,
    /// Keep candidates whose output differs from the reference sum (plain NCCL beyond two
    /// ranks) among those timed and chosen. False by default: the policy is exact-only, so
    /// which kernel wins never changes the output, and such a candidate cannot be forced.
    pub allow_inexact: bool,
    /// Rank 0 writes the NCCL id to this file and the other ranks read it (a file system they
    /// all see), instead of meeting at MASTER_ADDR and PREPARE_PORT (default MASTER_PORT + 1).
    pub id_file: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        let select = SelectOptions::default();
        Options {
            timeout: Duration::from_secs(60),
            cache_dir: select.cache_dir,
            tuning: select.tuning,
            retune: select.retune,
            margin: select.margin,
            allow_inexact: select.allow_inexact,
            id_file: None,
        }
    }
}

impl Options {
    /// The selection these options ask for.
    pub fn select_options(&self) -> SelectOptions {
        SelectOptions {
            tuning: self.tuning,
            margin: self.margin,
            allow_inexact: self.allow_inexact,
            cache_dir: self.cache_dir.clone(),
            retune: self.retune,
            ..SelectOptions::default()
        }
    }
}

/// Why the environment or the options do not say how to start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A launcher's variable is missing or invalid.
    #[error(transparent)]
    Environment(#[from] RankEnvironmentError),
    /// `PREPARE_GPUS` names no GPU for this rank.
    #[error("rank {rank}: {message}")]
    Gpus {
        /// This rank.
        rank: u32,
        /// What is wrong.
        message: String,
    },
    /// The variables do not say where the ranks meet.
    #[error("{message}")]
    Rendezvous {
        /// What is missing or wrong.
        message: String,
    },
    /// The timeout is zero or above [`MAX_TIMEOUT`].
    #[error("the timeout {seconds} s is not above 0 s and at most {} s (a day)", MAX_TIMEOUT.as_secs())]
    Timeout {
        /// The timeout given, seconds.
        seconds: f64,
    },
}

/// Where the ranks of a launcher meet when they are given no id file: `NCCL_COMM_ID` when set,
/// else `MASTER_ADDR` at `PREPARE_PORT` (default `MASTER_PORT` + 1, so that it never collides
/// with a server's own store on `MASTER_PORT`). Nothing is written to the environment: NCCL is
/// given the address through the id and, on rank 0, for its init call only
/// ([`crate::runtime::bootstrap_environment`]).
pub fn rendezvous_address(lookup: impl Fn(&str) -> Option<String>) -> Result<String, SetupError> {
    if let Some(address) = lookup("NCCL_COMM_ID") {
        return Ok(address);
    }
    let rendezvous = |message: String| SetupError::Rendezvous { message };
    let (Some(address), Some(master_port)) = (lookup("MASTER_ADDR"), lookup("MASTER_PORT")) else {
        return Err(rendezvous(
            "neither NCCL_COMM_ID nor MASTER_ADDR and MASTER_PORT are set".to_owned(),
        ));
    };
    let port = match lookup("PREPARE_PORT") {
        Some(port) => port.trim().parse::<u16>().map_err(|_| {
            rendezvous(format!(
                "PREPARE_PORT={port:?} is not a port number (0 to 65535)"
            ))
        })?,
        None => master_port
            .trim()
            .parse::<u16>()
            .ok()
            .and_then(|port| port.checked_add(1))
            .ok_or_else(|| {
                rendezvous(format!(
                    "MASTER_PORT={master_port:?} has no next port for the rendezvous; set \
                     PREPARE_PORT"
                ))
            })?,
    };
    let host = if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address
    };
    Ok(format!("{host}:{port}"))
}

/// The GPU a rank drives: entry `LOCAL_RANK` of `PREPARE_GPUS` when set, else `LOCAL_RANK`.
pub fn gpu_for_rank(
    environment: &RankEnvironment,
    gpus: Option<&str>,
) -> Result<usize, SetupError> {
    let Some(list) = gpus.filter(|list| !list.trim().is_empty()) else {
        return Ok(environment.local_rank as usize);
    };
    let parsed: Result<Vec<usize>, _> = list.split(',').map(|gpu| gpu.trim().parse()).collect();
    let setup = |message: String| SetupError::Gpus {
        rank: environment.rank,
        message,
    };
    let gpus = parsed.map_err(|_| {
        setup(format!(
            "PREPARE_GPUS={list:?} is not a list of GPU numbers"
        ))
    })?;
    gpus.get(environment.local_rank as usize)
        .copied()
        .ok_or_else(|| {
            setup(format!(
                "LOCAL_RANK {} has no GPU in PREPARE_GPUS={list:?}",
                environment.local_rank
            ))
        })
}

/// A rank ready to start: where it is (from the environment) and how it starts.
#[derive(Debug, Clone)]
pub struct Server {
    setup: RankSetup,
    options: Options,
}

impl Server {
    /// Reads this process's environment: RANK, WORLD_SIZE, LOCAL_RANK (default RANK),
    /// MASTER_ADDR and MASTER_PORT; the GPU is LOCAL_RANK, or entry LOCAL_RANK of
    /// PREPARE_GPUS; PREPARE_HOST_ID overrides the host's identity.
    pub fn from_env(options: Options) -> Result<Server, SetupError> {
        Server::from_lookup(|name| std::env::var(name).ok(), options)
    }

    /// Like [`Server::from_env`], reading the variables through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        options: Options,
    ) -> Result<Server, SetupError> {
        if options.timeout.is_zero() || options.timeout > MAX_TIMEOUT {
            return Err(SetupError::Timeout {
                seconds: options.timeout.as_secs_f64(),
            });
        }
        let environment = RankEnvironment::from_lookup(&lookup)?;
        let gpu = gpu_for_rank(&environment, lookup("PREPARE_GPUS").as_deref())?;
        let rendezvous = match &options.id_file {
            Some(path) => Rendezvous::IdFile(path.clone()),
            None => Rendezvous::CommId(rendezvous_address(&lookup)?),
        };
        Ok(Server {
            setup: RankSetup {
                rank: environment.rank,
                world: environment.world_size,
                gpu,
                timeout: options.timeout,
                rendezvous,
                host: crate::agree::host_identity(&lookup),
            },
            options,
        })
    }

    /// Where this rank is and how it meets the others.
    pub fn setup(&self) -> &RankSetup {
        &self.setup
    }

    /// Starts serving `packages` (one per collective and dtype): the runtime, then selection for
    /// each. Collective: every rank calls it with the same packages and options.
    pub fn start(&self, packages: &[Package]) -> Result<Handle, ServeError> {
        self.start_reporting(packages, &crate::progress::Silent)
    }

    /// Like [`Server::start`], reporting the selection's progress.
    pub fn start_reporting(
        &self,
        packages: &[Package],
        reporter: &dyn Reporter,
    ) -> Result<Handle, ServeError> {
        let runtime = self.runtime().map_err(SelectError::from)?;
        Handle::select(runtime, packages, &self.options.select_options(), reporter)
    }

    /// Brings only the runtime up (bootstrap and topology agreement), for work other than
    /// serving. Collective. The process environment is left as it was.
    pub fn runtime(&self) -> Result<Runtime, crate::runtime::RuntimeError> {
        Runtime::start(&self.setup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nccl::InitEnvironment;
    use crate::runtime::bootstrap_environment;
    use crate::tune::Policy;

    /// The variables `pairs`, looked up as the environment would be.
    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let variables: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        move |name| variables.get(name).cloned()
    }

    const TORCHRUN: [(&str, &str); 6] = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "29500"),
        ("PREPARE_HOST_ID", "host-a"),
    ];

    #[test]
    fn torchrun_variables_say_where_the_rank_is_and_how_ranks_meet() {
        let server = Server::from_lookup(lookup(&TORCHRUN), Options::default()).unwrap();
        let setup = server.setup();
        assert_eq!((setup.rank, setup.world, setup.gpu), (1, 2, 1));
        assert_eq!(
            setup.rendezvous,
            Rendezvous::CommId("10.0.0.7:29501".to_owned())
        );
        assert_eq!(setup.timeout, Duration::from_secs(60));
        assert_eq!(setup.host, "host-a");
        // Rank 1 only connects: its id is built from the address, and NCCL is given only how
        // to connect, while the bootstrap lasts.
        assert_eq!(
            bootstrap_environment(setup),
            InitEnvironment {
                during_call: Vec::new(),
                until_ready: pairs(&[("NCCL_RUNTIME_CONNECT", "0")]),
            }
        );
        // Rank 0 serves the rendezvous, which NCCL does only while NCCL_COMM_ID is set.
        let mut variables = TORCHRUN.to_vec();
        variables[0] = ("RANK", "0");
        let server = Server::from_lookup(lookup(&variables), Options::default()).unwrap();
        assert_eq!(
            bootstrap_environment(server.setup()),
            InitEnvironment {
                during_call: pairs(&[("NCCL_COMM_ID", "10.0.0.7:29501")]),
                until_ready: pairs(&[("NCCL_RUNTIME_CONNECT", "0")]),
            }
        );
    }

    #[test]
    fn the_gpu_list_and_an_id_file_are_honoured() {
        let mut variables = TORCHRUN.to_vec();
        variables.push(("PREPARE_GPUS", "4,6"));
        let options = Options {
            id_file: Some(PathBuf::from("/shared/id")),
            timeout: Duration::from_secs(5),
            ..Options::default()
        };
        let server = Server::from_lookup(lookup(&variables), options).unwrap();
        assert_eq!(server.setup().gpu, 6);
        assert_eq!(server.setup().timeout, Duration::from_secs(5));
        assert_eq!(
            server.setup().rendezvous,
            Rendezvous::IdFile(PathBuf::from("/shared/id"))
        );
        // The ranks meet through the file, so NCCL is given no address.
        assert_eq!(
            bootstrap_environment(server.setup()),
            InitEnvironment {
                during_call: Vec::new(),
                until_ready: pairs(&[("NCCL_RUNTIME_CONNECT", "0")]),
            }
        );
    }

    #[test]
    fn missing_or_invalid_variables_are_named() {
        let without_rank: Vec<_> = TORCHRUN
            .iter()
            .copied()
            .filter(|(name, _)| *name != "RANK")
            .collect();
        let error = Server::from_lookup(lookup(&without_rank), Options::default()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "RANK is not set (a rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
        );
        let mut variables = TORCHRUN.to_vec();
        variables[0] = ("RANK", "2");
        let error = Server::from_lookup(lookup(&variables), Options::default()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "RANK=\"2\" is not valid: an integer from 0 to 1"
        );
        let mut variables = TORCHRUN.to_vec();
        variables.push(("PREPARE_GPUS", "4"));
        let error = Server::from_lookup(lookup(&variables), Options::default()).unwrap_err();
        assert!(matches!(error, SetupError::Gpus { rank: 1, .. }), "{error}");
    }

    #[test]
    fn a_timeout_of_zero_or_above_a_day_is_refused() {
        for timeout in [Duration::ZERO, MAX_TIMEOUT + Duration::from_millis(1)] {
            let options = Options {
                timeout,
                ..Options::default()
            };
            let error = Server::from_lookup(lookup(&TORCHRUN), options).unwrap_err();
            assert!(
                error
                    .to_string()
                    .ends_with("is not above 0 s and at most 86400 s (a day)"),
                "{error}"
            );
        }
        let options = Options {
            timeout: MAX_TIMEOUT,
            ..Options::default()
        };
        assert!(Server::from_lookup(lookup(&TORCHRUN), options).is_ok());
    }

    #[test]
    fn the_options_become_the_selection() {
        let options = Options {
            cache_dir: None,
            tuning: Tuning::Static,
            retune: true,
            ..Options::default()
        };
        let select = options.select_options();
        assert_eq!(select.cache_dir, None);
        assert_eq!(select.tuning, Tuning::Static);
        assert!(select.retune);
        assert_eq!(select.policy(), Policy::default());
        assert_eq!(
            Options::default().cache_dir,
            SelectOptions::default().cache_dir
        );
    }

    #[test]
    fn the_policy_is_exact_unless_inexact_candidates_are_allowed() {
        let exact = Options::default().select_options().policy();
        assert!(exact.exact_only);
        assert!(Policy::default().exact_only);
        let options = Options {
            allow_inexact: true,
            margin: 0.05,
            ..Options::default()
        };
        assert_eq!(
            options.select_options().policy(),
            Policy {
                margin: 0.05,
                exact_only: false,
                ..Policy::default()
            }
        );
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_rendezvous_is_the_next_port_after_the_servers_store() {
        let address = rendezvous_address(lookup(&[
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ]));
        assert_eq!(address.unwrap(), "10.1.2.3:29501");
    }

    #[test]
    fn prepare_port_ipv6_and_nccl_comm_id_are_respected() {
        let address = rendezvous_address(lookup(&[
            ("MASTER_ADDR", "fe80::1"),
            ("MASTER_PORT", "29500"),
            ("PREPARE_PORT", "40000"),
        ]));
        assert_eq!(address.unwrap(), "[fe80::1]:40000");
        let given = rendezvous_address(lookup(&[
            ("NCCL_COMM_ID", "host:1"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ]));
        assert_eq!(given.unwrap(), "host:1");
    }

    #[test]
    fn a_rendezvous_without_a_port_is_refused_naming_the_variable() {
        let overflow =
            rendezvous_address(lookup(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "65535")]));
        assert_eq!(
            overflow.unwrap_err().to_string(),
            "MASTER_PORT=\"65535\" has no next port for the rendezvous; set PREPARE_PORT"
        );
        let invalid = rendezvous_address(lookup(&[
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "29500"),
            ("PREPARE_PORT", "x"),
        ]));
        assert_eq!(
            invalid.unwrap_err().to_string(),
            "PREPARE_PORT=\"x\" is not a port number (0 to 65535)"
        );
        let mut variables = TORCHRUN.to_vec();
        variables.push(("PREPARE_PORT", "70000"));
        let error = Server::from_lookup(lookup(&variables), Options::default()).unwrap_err();
        assert!(matches!(error, SetupError::Rendezvous { .. }), "{error}");
        // With an id file the address is not needed.
        let options = Options {
            id_file: Some(PathBuf::from("/shared/id")),
            ..Options::default()
        };
        assert!(Server::from_lookup(lookup(&variables), options).is_ok());
    }

    #[test]
    fn each_rank_takes_its_entry_of_the_gpu_list() {
        let environment = RankEnvironment {
            rank: 3,
            world_size: 4,
            local_rank: 1,
            master_addr: "h".to_owned(),
            master_port: 1,
        };
        assert_eq!(gpu_for_rank(&environment, None).unwrap(), 1);
        assert_eq!(gpu_for_rank(&environment, Some("4,6")).unwrap(), 6);
        assert_eq!(
            gpu_for_rank(&environment, Some("4"))
                .unwrap_err()
                .to_string(),
            "rank 3: LOCAL_RANK 1 has no GPU in PREPARE_GPUS=\"4\""
        );
        assert_eq!(
            gpu_for_rank(&environment, Some("a,b"))
                .unwrap_err()
                .to_string(),
            "rank 3: PREPARE_GPUS=\"a,b\" is not a list of GPU numbers"
        );
    }
}
