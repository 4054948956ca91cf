//! Loading a package on one rank: the architecture check, the splits, peer memory, every
//! kernel loaded and every (bucket, candidate) pair made an [`Entry`], then the agreement on
//! which entries every rank can run.

use super::copy_engine::{CopyEngine, CopyEngineKernels};
use super::drops::{agree_drops, qualified_wrong};
use super::geometry::{geometry_for, resident_capacity};
use super::order::RankOrder;
use super::{symmetric, Collectives, Entry, Input, Launch, MOVE_CHUNK_BYTES};
use crate::abi::PARAMS_BYTES;
use crate::agree::Topology;
use crate::device::{check_candidate_residency, DropReason};
use crate::gpu::driver::ModuleImage;
use crate::kernels::{self, InputAccess};
use crate::ladder::{Arch, Ladder};
use crate::package::Package;
use crate::runtime::{Runtime, RuntimeError};

/// Bytes of the private output buffer each GPU allocates for a ladder's custom kernels: the
/// largest message of any bucket with a candidate whose peers read this rank's input region
/// until its launch ends (one-shot pull, the copy-engine one-shot), whose sum cannot go there;
/// at least [`MOVE_CHUNK_BYTES`], the chunk of a move between overlapping ranges. Every other
/// kernel writes a sum the caller's output cannot take into the input region. 0 when the
/// ladder has no custom kernel.
pub fn private_output_bytes(ladder: &Ladder) -> u64 {
    if kernels::input_region_bytes(ladder) == 0 {
        return 0;
    }
    let reads_until_end = |profile: &str| {
        ladder
            .profile(profile)
            .and_then(|profile| {
                kernels::kernel_for(profile, ladder.collective, ladder.dtype, ladder.world_size)
            })
            .and_then(|spec| kernels::input_access(&spec))
            == Some(InputAccess::Peers {
                output_may_alias: false,
            })
    };
    ladder
        .buckets
        .iter()
        .filter(|bucket| bucket.candidates.iter().any(|id| reads_until_end(id)))
        .map(|bucket| bucket.max_bytes.next_multiple_of(kernels::ALIGNMENT_BYTES))
        .max()
        .unwrap_or(0)
        .max(MOVE_CHUNK_BYTES)
}

/// The largest message of the ladder, in elements.
fn capacity_elements(ladder: &Ladder) -> usize {
    let largest = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    largest.div_ceil(ladder.dtype.size_bytes()) as usize
}

/// Where a ladder's messages and its kernels' scratch lie in every rank's registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLayout {
    /// Bytes at the buffer's start that hold a message: the largest of any bucket, so NCCL
    /// reads the same buffer as the custom kernels even where only NCCL takes a bucket.
    pub input_region: u64,
    /// Bytes of scratch after the input region.
    pub scratch: u64,
}

impl PeerLayout {
    /// The layout of `ladder`'s registered buffer.
    pub fn of(ladder: &Ladder) -> PeerLayout {
        let message_bytes = capacity_elements(ladder) as u64 * ladder.dtype.size_bytes();
        PeerLayout {
            input_region: kernels::input_region_bytes(ladder)
                .max(message_bytes.next_multiple_of(kernels::REGION_ALIGNMENT_BYTES)),
            scratch: kernels::scratch_region_bytes(ladder),
        }
    }

    /// Bytes of the whole registered buffer.
    pub fn buffer_bytes(&self) -> u64 {
        self.input_region + self.scratch
    }

    /// Where `spec`'s scratch starts in every rank's buffer, the `scratch_offset` it is
    /// launched with.
    pub fn scratch_offset(&self, ladder: &Ladder, spec: &kernels::KernelSpec) -> u64 {
        self.input_region + kernels::scratch_offset_after_input(ladder, spec)
    }
}

/// The package's architecture must be this rank's GPU's.
pub fn check_architecture(runtime: &Runtime, package: &Package) -> Result<(), RuntimeError> {
    let rank = runtime.rank();
    let info = crate::gpu::driver::Driver::open()
        .and_then(|driver| driver.describe(runtime.device().ordinal()))
        .map_err(RuntimeError::driver(rank))?;
    let (major, minor) = info.compute_capability;
    if Arch::from_compute_capability(major, minor) == Some(package.arch()) {
        return Ok(());
    }
    Err(RuntimeError::WrongArchitecture {
        rank,
        package: package.arch().to_string(),
        device: info.arch_name(),
    })
}

impl Collectives {
    /// Loads `package` on this rank, after checking its architecture against the GPU.
    /// Collective: every rank calls it for the same package.
    pub fn new(runtime: &Runtime, package: &Package) -> Result<Collectives, RuntimeError> {
        check_architecture(runtime, package)?;
        let rank = runtime.rank();
        // Every rank must load the same package, or their launches would differ.
        runtime
            .agree_on(package.identity().as_bytes(), "the package")
            .map_err(|error| match error {
                RuntimeError::Disagreement(disagreement) => RuntimeError::RanksDiffer {
                    rank,
                    other: disagreement.other,
                    what: format!(
                        "loaded another package (identity {}) than this rank ({})",
                        String::from_utf8_lossy(&disagreement.theirs),
                        package.identity()
                    ),
                },
                error => error,
            })?;
        let ladder = package.ladder();
        let capacity = capacity_elements(ladder);
        // Profiles with communicator settings each run on their own split, made in ladder
        // order on every rank; a symmetric profile's comes with its window, after the drop
        // agreement (symmetric.rs).
        let mut splits = Vec::new();
        let mut split_of = Vec::new();
        for profile in &ladder.profiles {
            if profile.has_own_communicator() && !profile.is_nccl_symmetric() {
                splits.push(runtime.split_nccl(profile.max_ctas, profile.min_ctas)?);
                split_of.push((profile.id.clone(), splits.len() - 1));
            }
        }
        let peer_reason = match runtime.topology() {
            Topology::PeerKernels => None,
            Topology::NcclOnly { reason } => Some(reason.clone()),
        };
        let has_custom = kernels::input_region_bytes(ladder) > 0;
        let message_bytes = capacity * ladder.dtype.size_bytes() as usize;
        let layout = PeerLayout::of(ladder);
        let input_region = layout.input_region;
        let input = if peer_reason.is_none() && has_custom {
            Input::Peer(runtime.map_peer_memory(layout.buffer_bytes() as usize)?)
        } else {
            Input::Plain(
                runtime
                    .device()
                    .allocate(message_bytes.max(2))
                    .map_err(RuntimeError::driver(rank))?,
            )
        };
        let private = match &input {
            Input::Peer(_) => Some(
                runtime
                    .device()
                    .allocate(private_output_bytes(ladder) as usize)
                    .map_err(RuntimeError::driver(rank))?,
            ),
            Input::Plain(_) => None,
        };
        let out_of_place = runtime
            .device()
            .allocate(message_bytes.max(2))
            .map_err(RuntimeError::driver(rank))?;

        // Each loaded kernel keeps its module loaded.
        let mut modules = Vec::new();
        if matches!(input, Input::Peer(_)) {
            for (record, cubin) in package.kernels() {
                let module = runtime
                    .device()
                    .load_module(ModuleImage::Cubin(cubin))
                    .map_err(RuntimeError::driver(rank))?;
                modules.push((record.name.clone(), module));
            }
        }
        // Between hosts too: it touches no peer memory.
        let rank_order = RankOrder::load(runtime, package, capacity)?;
        let epilogue = super::epilogue_message::EpilogueParts::load(runtime, package, capacity)?;
        let mut windows = symmetric::allocate_windows(runtime, ladder, peer_reason.as_deref());
        let mut entries = Vec::new();
        for (bucket_index, bucket) in ladder.buckets.iter().enumerate() {
            for id in &bucket.candidates {
                let profile = ladder
                    .profile(id)
                    .expect("a validated ladder names only its profiles");
                let mut entry = Entry {
                    bucket: bucket_index,
                    profile: profile.id.clone(),
                    nccl: profile.is_nccl(),
                    dropped: None,
                    launch: None,
                    epilogue: profile.epilogue_form(ladder.collective),
                };
                // A kernel the package's qualification found wrong stays out wherever it runs.
                let found_wrong = qualified_wrong(package, bucket_index, &profile.id);
                if let (Some(reason), false) = (found_wrong, profile.is_nccl()) {
                    entry.dropped = Some(reason);
                } else if profile.is_nccl_symmetric() {
                    let window = windows
                        .iter()
                        .position(|(name, _)| *name == profile.id)
                        .expect("every symmetric profile a bucket names has a window");
                    match &windows[window].1 {
                        Ok(_) => entry.launch = Some(Launch::NcclSymmetric { window }),
                        Err(message) => {
                            entry.dropped = Some(DropReason::NoSymmetricWindow {
                                message: message.clone(),
                            });
                        }
                    }
                } else if profile.is_nccl_rank_order() {
                    if rank_order.is_none() {
                        return Err(RuntimeError::Setup {
                            rank,
                            message: format!(
                                "the package holds no {} for profile {}",
                                kernels::rank_order_sum(ladder.dtype, ladder.world_size).name,
                                profile.id
                            ),
                        });
                    }
                    entry.launch = Some(Launch::NcclRankOrder);
                } else if profile.is_nccl() {
                    let split = split_of
                        .iter()
                        .find(|(name, _)| *name == profile.id)
                        .map(|(_, index)| *index);
                    entry.launch = Some(Launch::Nccl { split });
                } else if let Some(reason) = &peer_reason {
                    entry.dropped = Some(DropReason::NoPeerAccess {
                        message: reason.clone(),
                    });
                } else {
                    let spec = kernels::kernel_for(
                        profile,
                        ladder.collective,
                        ladder.dtype,
                        ladder.world_size,
                    )
                    .expect("every custom profile has a kernel");
                    let (_, module) = modules
                        .iter()
                        .find(|(name, _)| *name == spec.name)
                        .expect("a verified package holds every kernel its ladder needs");
                    let kernel = module
                        .load(&spec.name, spec.cluster, PARAMS_BYTES)
                        .map_err(RuntimeError::driver(rank))?;
                    let geometry =
                        geometry_for(bucket, profile).map_err(RuntimeError::driver(rank))?;
                    let resident =
                        resident_capacity(&kernel, geometry).map_err(RuntimeError::driver(rank))?;
                    match check_candidate_residency(bucket, profile, resident) {
                        Ok(()) => {
                            entry.launch = Some(match spec.copy_engine_barriers() {
                                Some([start, end]) => Launch::CopyEngine(CopyEngineKernels {
                                    main: kernel,
                                    geometry,
                                    start: module
                                        .load(&start, false, PARAMS_BYTES)
                                        .map_err(RuntimeError::driver(rank))?,
                                    end: module
                                        .load(&end, false, PARAMS_BYTES)
                                        .map_err(RuntimeError::driver(rank))?,
                                }),
                                None => Launch::Custom {
                                    input: kernels::input_access(&spec)
                                        .expect("a kernel of this crate"),
                                    kernel,
                                    geometry,
                                    scratch_offset: layout.scratch_offset(ladder, &spec),
                                },
                            });
                        }
                        Err(reason) => entry.dropped = Some(reason),
                    }
                }
                entries.push(entry);
            }
        }
        // An all-gather's copy engine has no scratch: its copies go straight to the output.
        let copy_engine = entries
            .iter()
            .any(|entry| matches!(entry.launch, Some(Launch::CopyEngine(_))))
            .then(|| {
                CopyEngine::new(
                    runtime,
                    kernels::copy_engine_slot_bytes(ladder).unwrap_or(0),
                    ladder.dtype.size_bytes(),
                    runtime.timeout(),
                )
            })
            .transpose()?;
        let mut collectives = Collectives {
            entries,
            input,
            private,
            out_of_place: Some(out_of_place),
            copy_engine,
            rank_order,
            epilogue,
            capacity,
            collective: ladder.collective,
            input_region,
            dtype: ladder.dtype,
            element_bytes: ladder.dtype.size_bytes(),
            bucket_capacity: ladder
                .buckets
                .iter()
                .map(|bucket| bucket.max_bytes.div_ceil(ladder.dtype.size_bytes()) as usize)
                .collect(),
            splits,
            windows: Vec::new(),
            timeout: runtime.timeout(),
            rank,
        };
        let local: Vec<Option<DropReason>> = collectives
            .entries
            .iter()
            .map(|entry| entry.dropped.clone())
            .collect();
        let agreed = agree_drops(runtime, &local, "the residency agreement")?;
        collectives.apply_drops(agreed);
        let entries = &collectives.entries;
        let used = |id: &str| {
            entries
                .iter()
                .any(|entry| entry.profile == id && entry.launch.is_some())
        };
        symmetric::register_windows(runtime, ladder, &mut windows, used)?;
        collectives.windows = windows;
        Ok(collectives)
    }
}
