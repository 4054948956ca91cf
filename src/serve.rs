//! The serving handle: what a tensor-parallel server holds once start-up selection is done.
//! One runtime (one bootstrap, one communicator) serves one package per (collective, dtype);
//! the handle all-reduces the server's own device memory on the server's own stream, enqueue only, so a
//! server captures it in its own CUDA graphs. Messages up to a package's largest bucket go to
//! the bucket's agreed winner; larger ones to NCCL on the same communicator. Nothing is
//! allocated, registered or opened after start: a caller's memory is never registered for
//! IPC, and what peers must read is copied into the handle's registered buffer inside the
//! enqueued work (see [`Collectives::enqueue_operands`]). Once selection is done the handle
//! keeps per package the peer buffer, a small private output buffer and the kernels; the
//! full-size output that checking and timing wrote into is freed.
//!
//! The C ABI and the Python package are thin layers over this module; a Rust server started
//! like torchrun starts it through [`Server`].

mod agreement;
mod call;
mod epilogue;
mod error;
mod rows;
mod server;

use std::fmt;

use crate::collective::{Collectives, EntryId, Operands};
use crate::gpu::abort::Abort;
use crate::gpu::driver::{CallerMemory, DeviceBuffer, HostWords, Stream};
use crate::gpu::nccl::Communicator;
use crate::ladder::{Collective, Dtype};
use crate::package::Package;
use crate::progress::Reporter;
use crate::runtime::{RankSetup, Runtime, RuntimeError};
use crate::select::{select, SelectError, SelectOptions, Selection};
use crate::tune::choice::Choice;
use call::Call;

pub use call::CHECK_CALLS_VARIABLE;
use error::abort_error;
pub use error::ServeError;
pub use server::{gpu_for_rank, rendezvous_address, Options, Server, SetupError, MAX_TIMEOUT};

/// Where a message of a given size goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// A bucket of the package: its agreed winner.
    Bucket {
        /// The bucket's index in the ladder.
        index: usize,
        /// The winner's profile id.
        profile: &'a str,
    },
    /// Above the package's largest bucket: NCCL, in rank order where `rank_order_applies`.
    AboveLadder,
    /// Above the package's largest bucket, in pieces of its largest message: every whole
    /// piece by the candidate start-up timed fastest in pieces, the last shorter one by the
    /// winner of its bucket (NCCL when the output partly overlaps the input).
    Pieces {
        /// The largest bucket's candidate that takes every whole piece.
        profile: &'a str,
    },
}

impl fmt::Display for Route<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Bucket { index, profile } => write!(formatter, "{profile} (bucket {index})"),
            Route::AboveLadder => formatter.write_str("nccl (above the ladder's largest bucket)"),
            Route::Pieces { profile } => write!(
                formatter,
                "{profile} in pieces of the largest bucket's message (above the ladder)"
            ),
        }
    }
}

/// One package served by the handle.
#[derive(Debug)]
struct Served {
    collective: Collective,
    dtype: Dtype,
    ladder: String,
    collectives: Collectives,
    // Each bucket's largest message in bytes and the entry of its winner, ascending.
    routes: Vec<(u64, EntryId)>,
    // The entry that takes every whole piece of a message above the largest bucket; `None`:
    // NCCL takes such messages whole.
    pieces: Option<EntryId>,
    // One piece's staging buffer, for a reduce-scatter or all-gather served in pieces.
    staging: Option<DeviceBuffer>,
    // Plain NCCL entries served by the rank-order path instead (`rank_ordered_entries`).
    rank_ordered: Vec<EntryId>,
    selection: Selection,
}

impl Served {
    fn route(&self, bytes: u64) -> Option<EntryId> {
        self.routes
            .iter()
            .find(|(max_bytes, _)| bytes <= *max_bytes)
            .map(|(_, id)| *id)
    }
}

/// The entry that takes every whole piece above the ladder when the choice says pieces: the
/// above-ladder decision's winner, a candidate of the largest bucket; `None` (NCCL) otherwise,
/// or when that candidate does not run here.
fn pieces_entry(collectives: &Collectives, choice: &Choice) -> Option<EntryId> {
    let winner = choice.above_ladder.pieces_winner()?;
    collectives.find_live(choice.buckets.last()?.decision.index, winner)
}

/// A rank's serving handle. Collective to create: every rank starts it with the same packages
/// and options. All-reduces must be enqueued in the same order on every rank, from one thread
/// at a time and on one stream (or in one graph) at a time: the custom kernels count their
/// launches in device memory.
#[derive(Debug)]
pub struct Handle {
    // Dropped before the runtime: kernels and peer memory before the communicators.
    served: Vec<Served>,
    // Per served package, the abort word as last copied from the device.
    abort_words: HostWords,
    // Whether every call first agrees with every rank on what it is (agreement.rs).
    checks_calls: bool,
    runtime: Runtime,
}

impl Handle {
    /// Brings the runtime up (bootstrap and topology agreement, bounded by `setup.timeout`) and
    /// selects for every package (one per collective and dtype).
    pub fn start(
        setup: &RankSetup,
        packages: &[Package],
        options: &SelectOptions,
        reporter: &dyn Reporter,
    ) -> Result<Handle, ServeError> {
        let runtime = Runtime::start(setup).map_err(SelectError::from)?;
        Handle::select(runtime, packages, options, reporter)
    }

    /// Like [`Handle::start`], splitting from the serving process's own communicator (see
    /// [`Communicator::adopt`]).
    pub fn start_from_parent(
        setup: &RankSetup,
        parent: Communicator,
        packages: &[Package],
        options: &SelectOptions,
        reporter: &dyn Reporter,
    ) -> Result<Handle, ServeError> {
        let runtime = Runtime::start_from_parent(setup, parent).map_err(SelectError::from)?;
        Handle::select(runtime, packages, options, reporter)
    }

    /// Loads and selects every package on a runtime that is up. Collective.
    pub fn select(
        runtime: Runtime,
        packages: &[Package],
        options: &SelectOptions,
        reporter: &dyn Reporter,
    ) -> Result<Handle, ServeError> {
        let rank = runtime.rank();
        if packages.is_empty() {
            return Err(ServeError::NoPackage { rank });
        }
        for (index, package) in packages.iter().enumerate() {
            let ladder = package.ladder();
            if ladder.world_size != runtime.world() {
                return Err(ServeError::WorldSize {
                    rank,
                    ladder: ladder.name.clone(),
                    expected: ladder.world_size,
                    world: runtime.world(),
                });
            }
            if let Some(first) = packages[..index].iter().find(|other| {
                (other.ladder().collective, other.ladder().dtype)
                    == (ladder.collective, ladder.dtype)
            }) {
                return Err(ServeError::DuplicatePackage {
                    rank,
                    collective: ladder.collective,
                    dtype: ladder.dtype.name(),
                    first: first.ladder().name.clone(),
                    second: ladder.name.clone(),
                });
            }
        }
        // Before anything is loaded or timed: a cache a rank cannot write is found on every
        // rank alike.
        let options = &crate::select::agree_cache(&runtime, options, reporter)?;
        let mut served = Vec::with_capacity(packages.len());
        for package in packages {
            let started = std::time::Instant::now();
            let free_memory = || {
                runtime
                    .device()
                    .memory_info()
                    .map(|(free, _)| free as u64)
                    .map_err(RuntimeError::driver(rank))
            };
            let free_before = free_memory()?;
            let mut collectives = Collectives::new(&runtime, package).map_err(SelectError::from)?;
            let load = started.elapsed();
            let mut selection = select(&runtime, &mut collectives, package, options, reporter)?;
            // Checking and timing wrote into the collectives' own out-of-place output; serving
            // writes only the caller's memory, so the package keeps what it serves with.
            collectives.release_output();
            selection.times.load = load;
            let pieces = pieces_entry(&collectives, &selection.choice);
            // A reduce-scatter's or all-gather's piece is not one run of the caller's memory on
            // one side: it goes through a buffer of one piece (`enqueue_rows_in_pieces`).
            let staging = match pieces {
                Some(_) if collectives.has_rows() => {
                    let bytes =
                        collectives.piece_elements() * package.ladder().dtype.size_bytes() as usize;
                    Some(
                        runtime
                            .device()
                            .allocate(bytes.max(16))
                            .map_err(RuntimeError::driver(rank))?,
                    )
                }
                _ => None,
            };
            selection.load_memory_bytes = free_before.saturating_sub(free_memory()?);
            let routes = selection
                .choice
                .buckets
                .iter()
                .map(|bucket| {
                    let id = collectives
                        .find(bucket.decision.index, &bucket.decision.winner)
                        .expect("the choice names a candidate of its bucket");
                    (bucket.max_bytes, id)
                })
                .collect();
            let rank_ordered = collectives.rank_ordered_entries(
                package.ladder(),
                runtime.world(),
                selection.choice.policy.exact_only,
            );
            served.push(Served {
                collective: package.ladder().collective,
                dtype: package.ladder().dtype,
                ladder: package.ladder().name.clone(),
                collectives,
                routes,
                pieces,
                staging,
                rank_ordered,
                selection,
            });
        }
        let abort_words = runtime
            .device()
            .host_words(served.len())
            .map_err(RuntimeError::driver(rank))?;
        Ok(Handle {
            served,
            abort_words,
            checks_calls: call::checks_calls(std::env::var(CHECK_CALLS_VARIABLE).ok().as_deref()),
            runtime,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.runtime.rank()
    }

    /// Ranks in the world.
    pub fn world(&self) -> u32 {
        self.runtime.world()
    }

    /// The runtime (device, communicators, topology).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The collectives and dtypes served, in the order the packages were given.
    pub fn served_keys(&self) -> impl Iterator<Item = (Collective, Dtype)> + '_ {
        self.served
            .iter()
            .map(|served| (served.collective, served.dtype))
    }

    fn position(&self, collective: Collective, dtype: Dtype) -> Result<usize, ServeError> {
        self.served
            .iter()
            .position(|served| (served.collective, served.dtype) == (collective, dtype))
            .ok_or_else(|| ServeError::NotServed {
                rank: self.rank(),
                collective,
                dtype,
                served: served_names(self.served_keys()),
            })
    }

    fn served(&self, collective: Collective, dtype: Dtype) -> Result<&Served, ServeError> {
        Ok(&self.served[self.position(collective, dtype)?])
    }

    /// The name of the ladder whose package serves `collective` in `dtype`.
    pub fn ladder(&self, collective: Collective, dtype: Dtype) -> Result<&str, ServeError> {
        Ok(&self.served(collective, dtype)?.ladder)
    }

    /// Routes bucket `bucket` of the package of `collective` in `dtype` to `profile` instead of
    /// its agreed winner, for tests and comparisons that must run one candidate at every size.
    /// Every rank must force the same, before the collectives it affects (the ranks' launches
    /// must match). A candidate dropped on this machine cannot be forced, nor, under the exact
    /// policy, one whose output differs from the reference sum ([`Choice::force_refusal`]).
    pub fn force(
        &mut self,
        collective: Collective,
        dtype: Dtype,
        bucket: usize,
        profile: &str,
    ) -> Result<(), ServeError> {
        let rank = self.rank();
        let position = self.position(collective, dtype)?;
        let served = &mut self.served[position];
        let invalid = |reason: String| ServeError::CannotForce { rank, reason };
        let Some(route) = served.routes.get_mut(bucket) else {
            return Err(invalid(format!(
                "bucket {bucket} does not exist; {} has {} buckets",
                served.ladder,
                served.routes.len()
            )));
        };
        let Some(id) = served.collectives.find(bucket, profile) else {
            return Err(invalid(format!(
                "{profile} is not a candidate of bucket {bucket} of {}",
                served.ladder
            )));
        };
        if let Some(reason) = &served.collectives.entries()[id].dropped {
            return Err(invalid(format!(
                "{profile} in bucket {bucket} was dropped on this machine: {reason}"
            )));
        }
        if let Some(reason) = served.selection.choice.force_refusal(bucket, profile) {
            return Err(invalid(reason));
        }
        route.1 = id;
        Ok(())
    }

    /// The agreed choice for `collective` in `dtype`.
    pub fn choice(&self, collective: Collective, dtype: Dtype) -> Result<&Choice, ServeError> {
        Ok(&self.served(collective, dtype)?.selection.choice)
    }

    /// What selection did for `collective` in `dtype` and how long it took.
    pub fn selection(
        &self,
        collective: Collective,
        dtype: Dtype,
    ) -> Result<&Selection, ServeError> {
        Ok(&self.served(collective, dtype)?.selection)
    }

    /// Where a message of `bytes` of `collective` in `dtype` goes.
    pub fn route(
        &self,
        collective: Collective,
        dtype: Dtype,
        bytes: u64,
    ) -> Result<Route<'_>, ServeError> {
        let served = self.served(collective, dtype)?;
        Ok(match served.route(bytes) {
            Some(id) => {
                let entry = &served.collectives.entries()[id];
                Route::Bucket {
                    index: entry.bucket,
                    profile: &entry.profile,
                }
            }
            None => match served.pieces {
                Some(id) => Route::Pieces {
                    profile: &served.collectives.entries()[id].profile,
                },
                None => Route::AboveLadder,
            },
        })
    }

    /// The zero-copy region of the package of `collective` in `dtype`: this rank's registered
    /// memory that peers can read. A message written here (from byte 0) is all-reduced without any copy by every
    /// candidate. One region per package: every tensor a server places here shares it, so it
    /// holds one message at a time. `None` when no custom kernel runs (only NCCL), where any
    /// memory is as good.
    pub fn zero_copy_region(
        &self,
        collective: Collective,
        dtype: Dtype,
    ) -> Result<Option<CallerMemory>, ServeError> {
        Ok(self.served(collective, dtype)?.collectives.input_region())
    }

    /// Enqueues the all-reduce of `elements` of `dtype` from device address `input` into
    /// `output` (the same address for in place) on the caller's `stream` (a `CUstream` or
    /// `cudaStream_t`; 0 for the legacy default stream), with the agreed winner for that size.
    /// It only enqueues, so it can be captured in the caller's graph. Zero elements enqueue
    /// nothing.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of this rank's GPU (or 0), and `input` and `output` must
    /// stay allocated until the enqueued work has run (or the graph it was captured in is no
    /// longer replayed). Both are checked to be device memory of this GPU large enough for
    /// the message.
    #[allow(unsafe_code)]
    pub unsafe fn all_reduce(
        &self,
        input: u64,
        output: u64,
        elements: usize,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        let rank = self.rank();
        let served = self.served(Collective::AllReduce, dtype)?;
        let call = Call::AllReduce {
            dtype,
            elements: elements as u64,
        };
        if elements == 0 {
            // SAFETY: the caller promises the stream is live (or 0).
            return unsafe { self.agree_empty_call(stream, &call) };
        }
        let bytes = (elements as u64)
            .checked_mul(dtype.size_bytes())
            .and_then(|bytes| usize::try_from(bytes).ok())
            .ok_or(ServeError::MessageTooLarge { rank, elements })?;
        let device = self.runtime.device();
        let bad = |what: &'static str| move |source| ServeError::BadArgument { rank, what, source };
        // SAFETY: the caller promises the stream is live (or 0) for as long as it is used here.
        let stream = unsafe { device.borrow_stream(stream) }.map_err(bad("the stream"))?;
        // SAFETY: the caller promises both stay allocated until the queued work has run.
        let input = unsafe { device.caller_memory(input, bytes) }.map_err(bad("the input"))?;
        // SAFETY: as above.
        let output = unsafe { device.caller_memory(output, bytes) }.map_err(bad("the output"))?;
        self.agree_call(&stream, &call)?;
        self.enqueue(served, &stream, Operands { input, output }, elements)
    }

    /// Like [`Handle::all_reduce`], on memory and a stream this crate already checked.
    pub fn all_reduce_on(
        &self,
        stream: &Stream,
        operands: Operands,
        elements: usize,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        let served = self.served(Collective::AllReduce, dtype)?;
        let call = Call::AllReduce {
            dtype,
            elements: elements as u64,
        };
        self.agree_call(stream, &call)?;
        if elements == 0 {
            return Ok(());
        }
        self.enqueue(served, stream, operands, elements)
    }

    fn enqueue(
        &self,
        served: &Served,
        stream: &Stream,
        operands: Operands,
        elements: usize,
    ) -> Result<(), ServeError> {
        self.watched(stream, || {
            self.enqueue_routed(served, stream, operands, elements)
        })
    }

    /// Runs `enqueue` between the checks of every serving call: before, the abort words as
    /// last copied (a handle whose kernels gave up is not used again); after, their copies
    /// refreshed. Neither while `stream` is being captured.
    pub(crate) fn watched(
        &self,
        stream: &Stream,
        enqueue: impl FnOnce() -> Result<(), ServeError>,
    ) -> Result<(), ServeError> {
        let capturing = stream
            .is_capturing()
            .map_err(RuntimeError::driver(self.rank()))?;
        if !capturing {
            self.check_seen()?;
        }
        enqueue()?;
        if !capturing {
            self.refresh_abort_words()?;
        }
        Ok(())
    }

    fn enqueue_routed(
        &self,
        served: &Served,
        stream: &Stream,
        operands: Operands,
        elements: usize,
    ) -> Result<(), ServeError> {
        let bytes = elements as u64 * served.dtype.size_bytes();
        match served.route(bytes) {
            Some(id) if !served.rank_ordered.contains(&id) => {
                served.collectives.enqueue_operands(
                    &self.runtime,
                    stream,
                    id,
                    elements,
                    operands,
                )?;
            }
            // In pieces unless a piece could go to a plain NCCL winner that must sum in rank
            // order here: that message goes whole to the rank-order path below.
            None if served.pieces.is_some()
                && served.rank_ordered.is_empty()
                && operands.may_be_chunked(bytes) =>
            {
                let whole = served.collectives.piece_elements() as u64 * served.dtype.size_bytes();
                served.collectives.enqueue_chunked(
                    &self.runtime,
                    stream,
                    elements,
                    operands,
                    |piece| match served.pieces {
                        Some(id) if piece == whole => id,
                        _ => served
                            .route(piece)
                            .expect("a piece is at most the largest bucket's message"),
                    },
                )?;
            }
            // Above the ladder, or a plain NCCL winner that sums in rank order here.
            _ => served.collectives.enqueue_nccl(
                &self.runtime,
                stream,
                elements,
                operands,
                served.selection.choice.policy.exact_only,
            )?,
        }
        Ok(())
    }

    /// Queues copies of every package's abort word into pinned host memory, on the runtime's
    /// own stream, so the next call sees a kernel's give-up without waiting for any stream.
    fn refresh_abort_words(&self) -> Result<(), ServeError> {
        let rank = self.rank();
        for (index, served) in self.served.iter().enumerate() {
            if let Some(state) = served.collectives.state() {
                self.runtime
                    .stream()
                    .copy_word_to_host(state, 0, &self.abort_words, index)
                    .map_err(RuntimeError::driver(rank))?;
            }
        }
        Ok(())
    }

    /// The abort words as last copied, as an error if any kernel gave up.
    fn check_seen(&self) -> Result<(), ServeError> {
        for index in 0..self.served.len() {
            if let Some(abort) = Abort::decode(self.abort_words.get(index)) {
                return Err(abort_error(self.rank(), abort));
            }
        }
        Ok(())
    }

    /// Reads every package's abort word now (waiting only for the copy, not for the caller's
    /// streams): [`ServeError::PeerTimeout`] naming the peer when a kernel gave up waiting for
    /// it. [`Handle::all_reduce`] also checks, against the words as copied after the previous
    /// call, except while the stream is being captured.
    pub fn check(&self) -> Result<(), ServeError> {
        self.check_seen()?;
        for served in &self.served {
            served
                .collectives
                .check_abort(self.runtime.stream(), "serving")?;
        }
        Ok(())
    }
}

/// `all_reduce bf16, all_reduce fp32`: what a handle serves, for its refusals.
fn served_names(keys: impl Iterator<Item = (Collective, Dtype)>) -> String {
    keys.map(|(collective, dtype)| format!("{collective} {dtype}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes an NCCL unique id for [`crate::runtime::Rendezvous::UniqueId`]: call it on one rank
/// and give the bytes to every rank.
pub fn unique_id() -> Result<[u8; 128], ServeError> {
    Ok(crate::gpu::nccl::UniqueId::new()
        .map_err(RuntimeError::from)?
        .to_bytes())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::progress::Silent;
    use crate::runtime::Rendezvous;

    fn setup(rank: u32, world: u32, timeout: Duration) -> RankSetup {
        RankSetup {
            rank,
            world,
            gpu: 0,
            timeout,
            rendezvous: Rendezvous::CommId("127.0.0.1:29501".to_owned()),
            host: "host".to_owned(),
        }
    }

    /// Before the driver is opened, so these hold on a machine without one; a deadline
    /// computed from the longest `Duration` would have overflowed. The handle starts its
    /// runtime first, so it refuses them the same way.
    #[test]
    fn a_timeout_or_rank_out_of_range_is_refused_as_the_callers_mistake() {
        let cases = [
            (setup(0, 2, Duration::MAX), "the timeout"),
            (setup(0, 2, Duration::from_secs(86_401)), "86401 s"),
            (setup(0, 2, Duration::ZERO), "the timeout 0 s"),
            (setup(2, 2, Duration::from_secs(1)), "rank 2 of 2 ranks"),
            (setup(0, 9, Duration::from_secs(1)), "rank 0 of 9 ranks"),
        ];
        for (setup, message) in cases {
            let options = SelectOptions::default();
            let served = Handle::start(&setup, &[], &options, &Silent);
            assert!(
                matches!(
                    served,
                    Err(ServeError::Select(SelectError::Runtime(ref error)))
                        if error.is_caller_mistake()
                ),
                "{served:?}"
            );
            let error = Runtime::start(&setup).expect_err("refused");
            assert!(error.to_string().contains(message), "{error}");
            assert!(
                matches!(
                    error,
                    RuntimeError::TimeoutOutOfRange { .. } | RuntimeError::RankOutOfRange { .. }
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn a_package_is_refused_or_missing_by_its_collective_and_dtype() {
        let duplicate = ServeError::DuplicatePackage {
            rank: 1,
            collective: Collective::AllReduce,
            dtype: Dtype::Bf16.name(),
            first: "a".to_owned(),
            second: "b".to_owned(),
        };
        assert_eq!(
            duplicate.to_string(),
            "rank 1: packages a and b both hold all_reduce bf16; give one package per collective \
             and dtype"
        );
        let missing = ServeError::NotServed {
            rank: 0,
            collective: Collective::ReduceScatter,
            dtype: Dtype::Bf16,
            served: served_names(
                [
                    (Collective::AllReduce, Dtype::Bf16),
                    (Collective::AllReduce, Dtype::Fp32),
                ]
                .into_iter(),
            ),
        };
        assert_eq!(
            missing.to_string(),
            "rank 0: no package holds reduce_scatter bf16; this handle serves all_reduce bf16, \
             all_reduce fp32"
        );
        assert!(duplicate.is_refusal() && missing.is_refusal());
    }

    #[test]
    fn only_arguments_are_the_callers_mistakes() {
        let mistakes = [
            RuntimeError::CommunicatorMismatch {
                rank: 0,
                world: 2,
                adopted_rank: 1,
                adopted_world: 2,
            },
            RuntimeError::RanksDiffer {
                rank: 0,
                other: 1,
                what: "loaded another package than this rank".to_owned(),
            },
            RuntimeError::Operands {
                rank: 0,
                source: crate::runtime::OperandError::PartlyOverlapping {
                    what: "a message in pieces".to_owned(),
                },
            },
        ];
        assert!(mistakes.iter().all(RuntimeError::is_caller_mistake));
        let faults = [
            RuntimeError::Setup {
                rank: 0,
                message: "peer memory needs peer kernels".to_owned(),
            },
            RuntimeError::Timeout {
                rank: 0,
                step: "the bootstrap".to_owned(),
                seconds: 1.0,
                who: "rank 1 did not arrive".to_owned(),
            },
        ];
        assert!(!faults.iter().any(RuntimeError::is_caller_mistake));
    }
}
