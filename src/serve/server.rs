//! Serving from a launcher's environment: a server started like torchrun (RANK, WORLD_SIZE,
//! LOCAL_RANK, MASTER_ADDR, MASTER_PORT) reads where it is from the environment, sets NCCL's
//! own variables, and starts the [`Handle`] with its packages and a few options:
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
use crate::tune::Policy;

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
    /// How the winner is picked.
    pub policy: Policy,
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
            policy: select.policy,
            id_file: None,
        }
    }
}

impl Options {
    /// The selection these options ask for.
    pub fn select_options(&self) -> SelectOptions {
        SelectOptions {
            tuning: self.tuning,
            policy: self.policy,
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
    /// The timeout is zero or above [`MAX_TIMEOUT`].
    #[error("the timeout {seconds} s is not above 0 s and at most {} s (a day)", MAX_TIMEOUT.as_secs())]
    Timeout {
        /// The timeout given, seconds.
        seconds: f64,
    },
}

/// Variables a rank process sets for itself before anything else runs, when they are unset:
/// `NCCL_COMM_ID` from `MASTER_ADDR` and `PREPARE_PORT` (default `MASTER_PORT` + 1, so it never
/// collides with a server's own store), and `NCCL_RUNTIME_CONNECT=0`, so NCCL connects inside
/// the bounded bootstrap rather than in the first collective.
pub fn environment_defaults(lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut defaults = Vec::new();
    if lookup("NCCL_COMM_ID").is_none() {
        if let (Some(address), Some(master_port)) = (lookup("MASTER_ADDR"), lookup("MASTER_PORT")) {
            let port = lookup("PREPARE_PORT")
                .and_then(|port| port.trim().parse::<u16>().ok())
                .or_else(|| {
                    master_port
                        .trim()
                        .parse::<u16>()
                        .ok()
                        .and_then(|port| port.checked_add(1))
                });
            if let Some(port) = port {
                let host = if address.contains(':') && !address.starts_with('[') {
                    format!("[{address}]")
                } else {
                    address
                };
                defaults.push(("NCCL_COMM_ID".to_owned(), format!("{host}:{port}")));
            }
        }
    }
    if lookup("NCCL_RUNTIME_CONNECT").is_none() {
        defaults.push(("NCCL_RUNTIME_CONNECT".to_owned(), "0".to_owned()));
    }
    defaults
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
    // NCCL reads its rendezvous and connection mode from the process environment: what to set
    // there, where unset, before the first NCCL call.
    nccl_variables: Vec<(String, String)>,
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
        let rendezvous = options
            .id_file
            .clone()
            .map_or(Rendezvous::CommId, Rendezvous::IdFile);
        let nccl_variables = environment_defaults(&lookup)
            .into_iter()
            .filter(|(name, _)| name != "NCCL_COMM_ID" || rendezvous == Rendezvous::CommId)
            .collect();
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
            nccl_variables,
        })
    }

    /// Where this rank is and how it meets the others.
    pub fn setup(&self) -> &RankSetup {
        &self.setup
    }

    /// The variables set for NCCL (where the process has not set them) when the rank starts.
    pub fn nccl_variables(&self) -> &[(String, String)] {
        &self.nccl_variables
    }

    /// Starts serving `packages` (one per dtype): the runtime, then selection for each.
    /// Collective: every rank calls it with the same packages and options.
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
    /// serving. Collective.
    pub fn runtime(&self) -> Result<Runtime, crate::runtime::RuntimeError> {
        for (name, value) in &self.nccl_variables {
            if std::env::var_os(name).is_none() {
                // NCCL reads these only from the environment; they are set before its first call
                // in this process.
                std::env::set_var(name, value);
            }
        }
        Runtime::start(&self.setup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(setup.rendezvous, Rendezvous::CommId);
        assert_eq!(setup.timeout, Duration::from_secs(60));
        assert_eq!(setup.host, "host-a");
        assert_eq!(
            server.nccl_variables(),
            pairs(&[
                ("NCCL_COMM_ID", "10.0.0.7:29501"),
                ("NCCL_RUNTIME_CONNECT", "0")
            ])
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
            server.nccl_variables(),
            pairs(&[("NCCL_RUNTIME_CONNECT", "0")])
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
        assert_eq!(select.policy, Policy::default());
        assert_eq!(
            Options::default().cache_dir,
            SelectOptions::default().cache_dir
        );
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_rendezvous_is_the_next_port_after_the_servers_store() {
        let defaults = environment_defaults(lookup(&[
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "29500"),
        ]));
        assert_eq!(
            defaults,
            pairs(&[
                ("NCCL_COMM_ID", "10.1.2.3:29501"),
                ("NCCL_RUNTIME_CONNECT", "0")
            ])
        );
    }

    #[test]
    fn prepare_port_ipv6_and_existing_settings_are_respected() {
        let defaults = environment_defaults(lookup(&[
            ("MASTER_ADDR", "fe80::1"),
            ("MASTER_PORT", "29500"),
            ("PREPARE_PORT", "40000"),
            ("NCCL_RUNTIME_CONNECT", "1"),
        ]));
        assert_eq!(defaults, pairs(&[("NCCL_COMM_ID", "[fe80::1]:40000")]));
        let none = environment_defaults(lookup(&[
            ("NCCL_COMM_ID", "host:1"),
            ("NCCL_RUNTIME_CONNECT", "0"),
        ]));
        assert!(none.is_empty());
        let overflow =
            environment_defaults(lookup(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "65535")]));
        assert_eq!(overflow, pairs(&[("NCCL_RUNTIME_CONNECT", "0")]));
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
