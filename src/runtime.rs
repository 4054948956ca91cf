//! A rank's runtime on its GPU: the bounded NCCL bootstrap (a nonblocking communicator polled
//! to the deadline, then a blocking split for the collectives), the one-host agreement, and the
//! peer memory shared by CUDA IPC that the custom kernels use. Every step is bounded by the
//! rank's timeout; a step that passes it aborts the communicator and names what it waited for.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::agree::{self, RankRecord, Topology, RECORD_BYTES};
use crate::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, DriverError, IpcHandle, PeerBuffer, Stream,
};
use crate::gpu::nccl::{
    CommConfig, Communicator, InitEnvironment, NcclError, NcclMemory, UniqueId,
};
use crate::kernels::{LaunchParams, MAX_RANKS, SIGNAL_WORDS, STATE_WORDS};

mod operand_error;
mod timeout;
pub use operand_error::OperandError;
pub use timeout::{timeout_from_seconds, timeout_in_range, MAX_TIMEOUT};

/// How the ranks find each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// An address, `host:port` or `[ipv6]:port` (`NCCL_COMM_ID`'s form): every rank builds the
    /// same id from it and rank 0 serves the rendezvous there. NCCL reads nothing of it from
    /// the environment but on rank 0, during its init call ([`bootstrap_environment`]).
    CommId(String),
    /// Rank 0 writes its id to this file; the others wait for it (a shared file system).
    IdFile(PathBuf),
    /// An NCCL unique id the caller made on one rank (`UniqueId::new`) and gave every rank
    /// (a server sends it over its own process group or store).
    UniqueId(Box<[u8; 128]>),
}

/// What a rank needs to start.
#[derive(Debug, Clone)]
pub struct RankSetup {
    /// This rank.
    pub rank: u32,
    /// Ranks in the world.
    pub world: u32,
    /// The GPU ordinal this rank drives.
    pub gpu: usize,
    /// Bounds every step: bootstrap, agreement, collectives, kernel waits.
    pub timeout: Duration,
    /// How the ranks find each other.
    pub rendezvous: Rendezvous,
    /// This host's identity.
    pub host: String,
}

/// Why a rank's runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The driver failed.
    #[error("rank {rank}")]
    Driver {
        /// This rank.
        rank: u32,
        /// What failed.
        source: DriverError,
    },
    /// NCCL failed.
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// A peer did not take part before the deadline.
    #[error("rank {rank}: {step} did not finish within {seconds:.1} s: {who}")]
    Timeout {
        /// This rank.
        rank: u32,
        /// What was waited for.
        step: String,
        /// The time allowed.
        seconds: f64,
        /// Which ranks may be missing.
        who: String,
    },
    /// The id file could not be written or read.
    #[error("rank {rank}: id file {path}: {message}")]
    IdFile {
        /// This rank.
        rank: u32,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The gathered records could not be read.
    #[error(transparent)]
    Agree(#[from] agree::AgreeError),
    /// A rank holds other bytes where every rank must hold the same.
    #[error(transparent)]
    Disagreement(#[from] agree::Disagreement),
    /// A kernel gave up waiting for a peer (or found its launch invalid, or a peer's message of
    /// another shape) and left its abort word, which names the rank.
    #[error("rank {rank}: {step}: {abort}")]
    Aborted {
        /// This rank.
        rank: u32,
        /// What was running.
        step: String,
        /// The decoded abort word.
        abort: crate::gpu::abort::Abort,
    },
    /// A package is for another architecture than this rank's GPU.
    #[error("rank {rank}: the package is for {package}, this GPU is {device}")]
    WrongArchitecture {
        /// This rank.
        rank: u32,
        /// The package's architecture.
        package: String,
        /// The GPU's.
        device: String,
    },
    /// The rank or the world is out of range.
    #[error("rank {rank} of {world} ranks: prepare runs 2 to {MAX_RANKS} ranks, each below the world size")]
    RankOutOfRange {
        /// This rank.
        rank: u32,
        /// Ranks in the world.
        world: u32,
    },
    /// The timeout is not above zero and at most [`MAX_TIMEOUT`].
    #[error("rank {rank}: the timeout {seconds} s is not above 0 s and at most {} s (a day)", MAX_TIMEOUT.as_secs())]
    TimeoutOutOfRange {
        /// This rank.
        rank: u32,
        /// The timeout given, seconds.
        seconds: f64,
    },
    /// The communicator handed over is another rank's or another world's than the setup says.
    #[error("rank {rank}: the adopted communicator is rank {adopted_rank} of {adopted_world}, not rank {rank} of {world}")]
    CommunicatorMismatch {
        /// This rank.
        rank: u32,
        /// Ranks in the world.
        world: u32,
        /// The communicator's rank.
        adopted_rank: u32,
        /// The communicator's world.
        adopted_world: u32,
    },
    /// Another rank was given another package or other options than this one.
    #[error("rank {rank}: rank {other} {what}; every rank must be given the same")]
    RanksDiffer {
        /// This rank.
        rank: u32,
        /// The first rank that differs.
        other: u32,
        /// What it was given ("loaded another package ... than this rank").
        what: String,
    },
    /// An all-reduce asked of an entry that it cannot take.
    #[error("rank {rank}")]
    Operands {
        /// This rank.
        rank: u32,
        /// What is wrong with it.
        source: OperandError,
    },
    /// A step this rank cannot take in the state it is in (peer memory without peer kernels, an
    /// output already released, a gather past its slot): the order of the calls is at fault.
    #[error("rank {rank}: {message}")]
    Setup {
        /// This rank.
        rank: u32,
        /// What is wrong.
        message: String,
    },
}

impl RuntimeError {
    /// Whether the caller's arguments are at fault rather than the machine: a rank, world or
    /// timeout out of range, a communicator of another rank, ranks given different packages or
    /// options, an all-reduce an entry cannot take. The C ABI returns these as InvalidArgument.
    pub fn is_caller_mistake(&self) -> bool {
        matches!(
            self,
            RuntimeError::RankOutOfRange { .. }
                | RuntimeError::TimeoutOutOfRange { .. }
                | RuntimeError::CommunicatorMismatch { .. }
                | RuntimeError::RanksDiffer { .. }
                | RuntimeError::Operands { .. }
        )
    }

    pub(crate) fn driver(rank: u32) -> impl Fn(DriverError) -> RuntimeError + Copy {
        move |source| RuntimeError::Driver { rank, source }
    }
}

/// Who may be missing when a step times out: with two ranks it can only be the other one.
fn missing_peers(rank: u32, world: u32) -> String {
    if world == 2 {
        format!("rank {} did not arrive", 1 - rank)
    } else {
        "one of the other ranks did not arrive (NCCL does not say which)".to_owned()
    }
}

/// The kernel module's driver version (`580.159.04`), read from `/sys/module/nvidia/version`;
/// where that is missing, the CUDA driver API level (`CUDA 13.0`).
pub fn driver_version() -> String {
    if let Ok(text) = std::fs::read_to_string("/sys/module/nvidia/version") {
        let version = text.trim();
        if !version.is_empty() {
            return version.to_owned();
        }
    }
    match crate::gpu::driver::Driver::open() {
        Ok(driver) => format!("CUDA {}", driver.version()),
        Err(_) => "unknown".to_owned(),
    }
}

/// NCCL's version, `2.28.9`.
pub fn nccl_version() -> Result<String, RuntimeError> {
    let (major, minor, patch) = crate::gpu::nccl::version()?;
    Ok(format!("{major}.{minor}.{patch}"))
}

/// A rank's runtime: its GPU, stream, communicators and the agreed topology.
#[derive(Debug)]
pub struct Runtime {
    rank: u32,
    world: u32,
    timeout: Duration,
    device: Device,
    stream: Stream,
    records: Vec<RankRecord>,
    topology: Topology,
    // Dropped before the communicators: buffers wait for the device's work when freed.
    gather_send: DeviceBuffer,
    gather_receive: DeviceBuffer,
    communicator: Communicator,
    // Splits share its resources; it lives as long as they do.
    bootstrap: Communicator,
    // Whether splits share the bootstrap communicator's resources (not for an adopted one).
    share: bool,
}

/// What NCCL is given through the process environment while this rank's bootstrap
/// communicator initialises, each only where the process has not set it and removed after
/// ([`InitEnvironment`]): on rank 0 of an address rendezvous, `NCCL_COMM_ID` for the init call
/// (NCCL serves the rendezvous only when it is set); for the ranks of a launcher
/// (an address or an id file), `NCCL_RUNTIME_CONNECT=0` until the communicator is ready, so
/// that NCCL connects inside the bounded bootstrap rather than in the first collective. An id
/// the caller made and handed over gets nothing.
pub fn bootstrap_environment(setup: &RankSetup) -> InitEnvironment {
    let mut environment = InitEnvironment::default();
    if let Rendezvous::CommId(address) = &setup.rendezvous {
        if setup.rank == 0 {
            environment
                .during_call
                .push(("NCCL_COMM_ID".to_owned(), address.clone()));
        }
    }
    if matches!(
        setup.rendezvous,
        Rendezvous::CommId(_) | Rendezvous::IdFile(_)
    ) {
        environment
            .until_ready
            .push(("NCCL_RUNTIME_CONNECT".to_owned(), "0".to_owned()));
    }
    environment
}

fn unique_id(setup: &RankSetup, deadline: Instant) -> Result<UniqueId, RuntimeError> {
    match &setup.rendezvous {
        Rendezvous::CommId(address) => Ok(UniqueId::from_address(address)?),
        Rendezvous::UniqueId(bytes) => Ok(UniqueId::from_bytes(**bytes)),
        Rendezvous::IdFile(path) => {
            let file_error = |message: String| RuntimeError::IdFile {
                rank: setup.rank,
                path: path.clone(),
                message,
            };
            if setup.rank == 0 {
                // Only an id file this tool wrote is replaced.
                crate::files::check_id_file_ours(path)
                    .map_err(|error| file_error(error.to_string()))?;
                let id = UniqueId::new()?;
                crate::files::write_atomically(path, &crate::files::encode_id_file(&id.to_bytes()))
                    .map_err(|error| file_error(error.to_string()))?;
                return Ok(id);
            }
            loop {
                match crate::files::read_limited(path, crate::files::ID_FILE) {
                    Ok(bytes) => {
                        let id = crate::files::decode_id_file(&bytes)
                            .and_then(|id| <[u8; 128]>::try_from(id).ok())
                            .ok_or_else(|| {
                                file_error(
                                    "is not an id file prepare wrote (a header line and the \
                                     128 bytes of an NCCL id)"
                                        .to_owned(),
                                )
                            })?;
                        return Ok(UniqueId::from_bytes(id));
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(file_error(error.to_string())),
                }
                if Instant::now() >= deadline {
                    return Err(RuntimeError::Timeout {
                        rank: setup.rank,
                        step: format!("waiting for rank 0 to write {}", path.display()),
                        seconds: setup.timeout.as_secs_f64(),
                        who: "rank 0 did not arrive".to_owned(),
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Runtime {
    /// Opens the GPU, joins the communicator, splits the blocking one, and agrees the
    /// topology, all within `setup.timeout`.
    pub fn start(setup: &RankSetup) -> Result<Runtime, RuntimeError> {
        Runtime::start_with(setup, None)
    }

    /// Like [`Runtime::start`], but splits from a communicator the serving process already
    /// has (see [`Communicator::adopt`]) instead of joining a new one; `setup.rendezvous` is
    /// not used.
    pub fn start_from_parent(
        setup: &RankSetup,
        parent: Communicator,
    ) -> Result<Runtime, RuntimeError> {
        Runtime::start_with(setup, Some(parent))
    }

    fn start_with(
        setup: &RankSetup,
        parent: Option<Communicator>,
    ) -> Result<Runtime, RuntimeError> {
        let rank = setup.rank;
        if setup.world < 2 || setup.world as usize > MAX_RANKS || rank >= setup.world {
            return Err(RuntimeError::RankOutOfRange {
                rank,
                world: setup.world,
            });
        }
        // Before any deadline is computed from it: one far past a day would overflow.
        if !timeout_in_range(setup.timeout) {
            return Err(RuntimeError::TimeoutOutOfRange {
                rank,
                seconds: setup.timeout.as_secs_f64(),
            });
        }
        let deadline = Instant::now() + setup.timeout;
        let driver = Driver::open().map_err(RuntimeError::driver(rank))?;
        let device = driver
            .open_device(setup.gpu)
            .map_err(RuntimeError::driver(rank))?;
        let info = driver
            .describe(setup.gpu)
            .map_err(RuntimeError::driver(rank))?;
        let stream = device.new_stream().map_err(RuntimeError::driver(rank))?;

        // NCCL binds the communicator to the thread's current device: the stream's context.
        stream.bind_current().map_err(RuntimeError::driver(rank))?;
        // Splits share the parent's resources, and so its abort flag, only when the parent is
        // this runtime's own: aborting them must never abort a server's communicator.
        let share = parent.is_none();
        let bootstrap = if let Some(parent) = parent {
            if (parent.rank(), parent.world()) != (rank, setup.world) {
                return Err(RuntimeError::CommunicatorMismatch {
                    rank,
                    world: setup.world,
                    adopted_rank: parent.rank(),
                    adopted_world: parent.world(),
                });
            }
            parent
        } else {
            let id = unique_id(setup, deadline)?;
            let environment = bootstrap_environment(setup);
            Communicator::init_in(&id, rank, setup.world, &environment, deadline)
                .map_err(|error| timeout_names_peer(error, setup.world))?
        };
        let communicator = bootstrap
            .split(
                CommConfig {
                    split_share: share,
                    ..CommConfig::default()
                },
                deadline,
            )
            .map_err(|error| timeout_names_peer(error, setup.world))?;

        let gather_send = device
            .allocate(RECORD_BYTES)
            .map_err(RuntimeError::driver(rank))?;
        let gather_receive = device
            .allocate(RECORD_BYTES * setup.world as usize)
            .map_err(RuntimeError::driver(rank))?;
        let mut runtime = Runtime {
            rank,
            world: setup.world,
            timeout: setup.timeout,
            device,
            stream,
            records: Vec::new(),
            topology: Topology::NcclOnly {
                reason: "not agreed yet".to_owned(),
            },
            gather_send,
            gather_receive,
            communicator,
            bootstrap,
            share,
        };

        let count = driver.device_count().map_err(RuntimeError::driver(rank))?;
        let mut reachable_gpus = vec![info.uuid.clone()];
        for other in (0..count).filter(|other| *other != setup.gpu) {
            if driver
                .can_access_peer(setup.gpu, other)
                .map_err(RuntimeError::driver(rank))?
            {
                reachable_gpus.push(
                    driver
                        .describe(other)
                        .map_err(RuntimeError::driver(rank))?
                        .uuid,
                );
            }
        }
        let record = RankRecord {
            rank,
            host: setup.host.clone(),
            gpu_name: info.name,
            gpu_uuid: info.uuid,
            pci_bus_id: info.pci_bus_id,
            reachable_gpus,
        };
        let gathered = runtime.all_gather(&record.encode()?, "the agreement all-gather")?;
        runtime.records = RankRecord::decode_all(&gathered)?;
        runtime.topology = agree::agree(&runtime.records);
        Ok(runtime)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks in the world.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The timeout every step runs under.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The GPU.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The rank's stream, on which collectives run.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The blocking communicator the NCCL candidate runs on.
    pub fn communicator(&self) -> &Communicator {
        &self.communicator
    }

    /// A blocking communicator with an NCCL profile's settings (`maxCTAs`, `minCTAs`), split
    /// from the bootstrap communicator within the timeout. Splitting is collective: every rank
    /// asks for the same splits in the same order.
    pub fn split_nccl(
        &self,
        max_ctas: Option<u32>,
        min_ctas: Option<u32>,
    ) -> Result<Communicator, RuntimeError> {
        self.stream
            .bind_current()
            .map_err(RuntimeError::driver(self.rank))?;
        let config = CommConfig {
            split_share: self.share,
            max_ctas,
            min_ctas,
            ..CommConfig::default()
        };
        self.bootstrap
            .split(config, Instant::now() + self.timeout)
            .map_err(|error| timeout_names_peer(error, self.world))
    }

    /// Allocates `bytes` of NCCL memory on this rank's GPU for a symmetric window.
    pub fn allocate_window_memory(&self, bytes: usize) -> Result<NcclMemory, RuntimeError> {
        self.stream
            .bind_current()
            .map_err(RuntimeError::driver(self.rank))?;
        Ok(NcclMemory::allocate(&self.device, bytes, self.rank)?)
    }

    /// Registers `memory` as this rank's part of a symmetric window of `communicator` (a split
    /// of this runtime's), within the timeout; the communicator keeps the memory until its abort
    /// has returned. Collective: every rank registers the same size.
    pub fn register_symmetric_window(
        &self,
        communicator: &Communicator,
        memory: NcclMemory,
    ) -> Result<(), RuntimeError> {
        self.stream
            .bind_current()
            .map_err(RuntimeError::driver(self.rank))?;
        self.bounded(
            communicator,
            &self.stream,
            "registering a symmetric window",
            || Ok(communicator.register_symmetric_window(memory)?),
        )
    }

    /// Every rank's record, in rank order.
    pub fn records(&self) -> &[RankRecord] {
        &self.records
    }

    /// What the ranks agreed.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Gathers `local` (at most [`RECORD_BYTES`], the same length on every rank) from every
    /// rank, in rank order, under a watchdog that aborts the communicator at the deadline.
    pub fn all_gather(&self, local: &[u8], step: &str) -> Result<Vec<u8>, RuntimeError> {
        let bytes = local.len();
        if bytes > RECORD_BYTES {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!("{step}: {bytes} bytes exceed the {RECORD_BYTES} of a slot"),
            });
        }
        let driver = RuntimeError::driver(self.rank);
        self.stream
            .write(&self.gather_send, 0, local)
            .map_err(driver)?;
        self.bounded(&self.communicator, &self.stream, step, || {
            self.communicator
                .all_gather(&self.stream, &self.gather_send, &self.gather_receive, bytes)
                .map_err(RuntimeError::from)
        })?;
        let mut gathered = vec![0_u8; bytes * self.world as usize];
        self.stream
            .read(&self.gather_receive, 0, &mut gathered)
            .map_err(RuntimeError::driver(self.rank))?;
        Ok(gathered)
    }

    /// Every rank gives `bytes` for `what` (`the choice`; the same length on every rank, at
    /// most [`RECORD_BYTES`]): [`RuntimeError::Disagreement`] names the first rank that gave
    /// other bytes. Collective.
    pub fn agree_on(&self, bytes: &[u8], what: &str) -> Result<(), RuntimeError> {
        let gathered = self.all_gather(bytes, &format!("{what} agreement"))?;
        match agree::disagreement(self.rank, bytes, &gathered, what) {
            None => Ok(()),
            Some(disagreement) => Err(disagreement.into()),
        }
    }

    /// All-gathers `local` (any length, the same on every rank) in slot-sized pieces; returns
    /// each rank's bytes, in rank order.
    pub fn all_gather_pieces(
        &self,
        local: &[u8],
        step: &str,
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        let world = self.world as usize;
        let mut ranks = vec![Vec::with_capacity(local.len()); world];
        for piece in local.chunks(RECORD_BYTES) {
            let gathered = self.all_gather(piece, step)?;
            for (rank, bytes) in gathered.chunks(piece.len()).enumerate() {
                ranks[rank].extend_from_slice(bytes);
            }
        }
        Ok(ranks)
    }

    /// Runs `enqueue` (NCCL work through `communicator` on `stream`) and waits for `stream`,
    /// all under a watchdog: past the timeout the communicator is aborted and the error names
    /// the step and the rank that may be missing, so no NCCL call can hang the rank.
    pub fn bounded(
        &self,
        communicator: &Communicator,
        stream: &Stream,
        step: &str,
        enqueue: impl FnOnce() -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let watchdog = communicator.watchdog(Instant::now() + self.timeout);
        let waited = enqueue().and_then(|()| {
            stream
                .synchronize_within(self.timeout)
                .map_err(RuntimeError::driver(self.rank))
        });
        let timed_out = matches!(
            waited,
            Err(RuntimeError::Driver {
                source: DriverError::Timeout { .. },
                ..
            })
        );
        // A watchdog that fired also makes the NCCL call or the wait fail: the timeout is the
        // cause to report.
        if watchdog.disarm() || timed_out {
            communicator.abort();
            return Err(RuntimeError::Timeout {
                rank: self.rank,
                step: step.to_owned(),
                seconds: self.timeout.as_secs_f64(),
                who: missing_peers(self.rank, self.world),
            });
        }
        waited
    }

    /// Allocates this rank's peer memory (`buffer_bytes` of buffer, the signal flags and the
    /// state words), zeroes all three (the flags-in-data kernels need zeroed scratch), and maps
    /// every peer's by CUDA IPC. Needs the peer-kernel topology.
    pub fn map_peer_memory(&self, buffer_bytes: usize) -> Result<PeerMemory, RuntimeError> {
        if let Topology::NcclOnly { reason } = &self.topology {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!("peer memory needs peer kernels, but {reason}"),
            });
        }
        let driver = RuntimeError::driver(self.rank);
        let buffer = self.device.allocate(buffer_bytes).map_err(driver)?;
        let signals = self
            .device
            .allocate(SIGNAL_WORDS * 8)
            .map_err(RuntimeError::driver(self.rank))?;
        let state = self
            .device
            .allocate(STATE_WORDS * 8)
            .map_err(RuntimeError::driver(self.rank))?;
        for memory in [&buffer, &signals, &state] {
            self.stream
                .fill_u8(memory, 0..memory.len_bytes(), 0)
                .map_err(RuntimeError::driver(self.rank))?;
        }
        // Zeroed before any peer can see the handles, which travel after this.
        self.stream
            .synchronize()
            .map_err(RuntimeError::driver(self.rank))?;
        let mut handles = Vec::with_capacity(128);
        for memory in [&buffer, &signals] {
            handles.extend_from_slice(
                &memory
                    .ipc_handle()
                    .map_err(RuntimeError::driver(self.rank))?
                    .0,
            );
        }
        let gathered = self.all_gather(&handles, "the IPC handle all-gather")?;
        let mut peer_buffers = Vec::new();
        let mut peer_signals = Vec::new();
        for (peer, slot) in gathered.chunks(128).enumerate() {
            if peer == self.rank as usize {
                peer_buffers.push(None);
                peer_signals.push(None);
                continue;
            }
            let open = |bytes: &[u8]| {
                let mut handle = [0_u8; 64];
                handle.copy_from_slice(bytes);
                self.device
                    .open_ipc(&IpcHandle(handle))
                    .map_err(RuntimeError::driver(self.rank))
            };
            peer_buffers.push(Some(open(&slot[..64])?));
            peer_signals.push(Some(open(&slot[64..])?));
        }
        // No rank may launch a kernel on peers' memory before every rank has mapped it: this
        // gather is the barrier.
        self.all_gather(&[0], "the peer mapping barrier")?;
        Ok(PeerMemory {
            rank: self.rank,
            world: self.world,
            buffer,
            signals,
            state,
            peer_buffers,
            peer_signals,
        })
    }
}

fn timeout_names_peer(error: NcclError, world: u32) -> RuntimeError {
    match error {
        NcclError::Timeout {
            step,
            rank,
            seconds,
        } => RuntimeError::Timeout {
            rank,
            step: step.to_owned(),
            seconds,
            who: missing_peers(rank, world),
        },
        other => RuntimeError::Nccl(other),
    }
}

/// A rank's registered memory and its peers' mapped into this process.
#[derive(Debug)]
pub struct PeerMemory {
    rank: u32,
    world: u32,
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    peer_buffers: Vec<Option<PeerBuffer>>,
    peer_signals: Vec<Option<PeerBuffer>>,
}

impl PeerMemory {
    /// This rank's registered buffer (the input region starts at byte 0).
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// This rank's state words (abort word first).
    pub fn state(&self) -> &DeviceBuffer {
        &self.state
    }

    /// Rank `rank`'s registered buffer as mapped here: this rank's own, or a peer's mapping;
    /// `None` outside the world.
    pub fn rank_buffer(&self, rank: u32) -> Option<&dyn DeviceMemory> {
        if rank == self.rank {
            return Some(&self.buffer);
        }
        self.peer_buffers
            .get(rank as usize)
            .and_then(Option::as_ref)
            .map(|buffer| buffer as &dyn DeviceMemory)
    }

    /// The kernel parameters for an all-reduce of `elements` at device address `input`, summed
    /// into device address `output`, for a kernel whose scratch starts at `scratch_offset` in
    /// every rank's buffer.
    pub fn params(
        &self,
        input: u64,
        output: u64,
        elements: u64,
        scratch_offset: u64,
        timeout: Duration,
    ) -> LaunchParams {
        let mut buffers = [0_u64; MAX_RANKS];
        let mut signals = [0_u64; MAX_RANKS];
        for rank in 0..self.world as usize {
            let (buffer, signal) = if rank == self.rank as usize {
                (self.buffer.address(), self.signals.address())
            } else {
                (
                    self.peer_buffers[rank]
                        .as_ref()
                        .map_or(0, DeviceMemory::address),
                    self.peer_signals[rank]
                        .as_ref()
                        .map_or(0, DeviceMemory::address),
                )
            };
            buffers[rank] = buffer;
            signals[rank] = signal;
        }
        LaunchParams {
            buffers,
            signals,
            state: self.state.address(),
            output,
            input,
            scratch_offset,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            rank: self.rank,
            world: self.world,
            ..LaunchParams::all_reduce(elements)
        }
    }
}
