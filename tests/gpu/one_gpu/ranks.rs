//! What every world of kernels loaded by their `KernelSpec` (rows.rs, fused.rs) shares on one
//! GPU: each rank's stream, registered buffer, signals and state; zeroing them together; the
//! arrival words and an abort's verdict; the late rank's wait; and one launch on every rank
//! checked eagerly with a rank late, then captured in one graph of every rank and replayed.

use prepare::gpu::abort::Abort;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Event, Geometry, Graph, Kernel, Module, ModuleImage, Stream,
};
use prepare::kernels::{MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES, STATE_ARRIVAL_WORDS, STATE_WORDS};
use prepare::ladder::Arch;

use super::checks::{check_connections, HELPERS};
use super::{DEADLINE, WAIT};
use crate::gpu::support::compile_ptx;
use crate::support::one_gpu::{judge_abort, Verdict};

/// Judges a finished run from the arrival words before it.
type Judge<'j> = dyn Fn(&[Vec<u64>]) -> Result<(), String> + 'j;

/// How long the late rank waits before its kernel starts.
const LATE: std::time::Duration = std::time::Duration::from_micros(30);
/// Replays of each graph.
const REPLAYS: usize = 2;

/// One rank's stream and the memory its peers reach.
pub(super) struct RankMemory {
    pub stream: Stream,
    /// The registered buffer: the input region, then the scratch.
    pub buffer: DeviceBuffer,
    signals: DeviceBuffer,
    pub state: DeviceBuffer,
}

/// Every rank of one world on one GPU.
pub(super) struct Ranks<'a> {
    pub device: &'a Device,
    pub members: Vec<RankMemory>,
    _helpers: Module,
    sleep: Kernel,
    fork: Event,
    joins: Vec<Event>,
}

impl<'a> Ranks<'a> {
    /// `world` ranks, each with a registered buffer of `buffer_bytes`, all zeroed.
    pub fn new(device: &'a Device, world: usize, buffer_bytes: usize) -> Ranks<'a> {
        check_connections(world);
        let members = (0..world)
            .map(|_| RankMemory {
                stream: device.new_stream().unwrap(),
                buffer: device.allocate(buffer_bytes).unwrap(),
                signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
                state: device.allocate(STATE_WORDS * 8).unwrap(),
            })
            .collect();
        let helpers = device
            .load_module(ModuleImage::Ptx(&compile_ptx(HELPERS, Arch::Sm90.name())))
            .unwrap();
        let this = Ranks {
            device,
            members,
            sleep: helpers.kernel("one_gpu_sleep", 8).unwrap(),
            _helpers: helpers,
            fork: device.new_event(false).unwrap(),
            joins: (0..world)
                .map(|_| device.new_event(false).unwrap())
                .collect(),
        };
        this.reset();
        this
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Zeroes every rank's signals, state and buffer together (no launch in flight): after an
    /// abort, the only way the kernels are usable again.
    pub fn reset(&self) {
        for rank in &self.members {
            rank.stream.synchronize_within(WAIT).unwrap();
        }
        for rank in &self.members {
            for memory in [&rank.signals, &rank.state, &rank.buffer] {
                rank.stream
                    .fill_u8(memory, 0..memory.len_bytes(), 0)
                    .unwrap();
            }
            rank.stream.synchronize_within(WAIT).unwrap();
        }
    }

    /// Every rank's buffer and signals, as a launch's parameters name them.
    pub fn peers(&self) -> ([u64; MAX_RANKS], [u64; MAX_RANKS]) {
        let mut buffers = [0_u64; MAX_RANKS];
        let mut signals = [0_u64; MAX_RANKS];
        for (peer, memory) in self.members.iter().enumerate() {
            buffers[peer] = memory.buffer.address();
            signals[peer] = memory.signals.address();
        }
        (buffers, signals)
    }

    /// Queues the late rank's wait on its stream, before its input lands and its kernel starts.
    pub fn wait_if_late(&self, rank: usize, late: Option<usize>) {
        if late == Some(rank) {
            let wait = (LATE.as_nanos() as u64).to_ne_bytes();
            self.members[rank]
                .stream
                .launch(&self.sleep, Geometry::new(1, 32).unwrap(), &wait)
                .unwrap();
        }
    }

    /// Every rank's arrival words.
    pub fn arrivals(&self) -> Vec<Vec<u64>> {
        self.members
            .iter()
            .map(|rank| {
                let mut words = vec![0_u64; MAX_BLOCKS];
                rank.stream
                    .read(&rank.state, STATE_ARRIVAL_WORDS * 8, &mut words)
                    .unwrap();
                words
            })
            .collect()
    }

    /// Waits for every rank's stream, then reads the abort words: the first rank's abort, judged
    /// against the arrivals from `before` (of `blocks` blocks a launch), is an error (the
    /// kernel's, or not co-scheduled), after which every rank is reset.
    pub fn finished(&self, before: &[Vec<u64>], blocks: usize) -> Result<(), String> {
        for rank in &self.members {
            rank.stream
                .synchronize_within(WAIT)
                .map_err(|error| error.to_string())?;
        }
        for (rank, memory) in self.members.iter().enumerate() {
            let mut word = [0_u64];
            memory.stream.read(&memory.state, 0, &mut word).unwrap();
            if let Some(abort) = Abort::decode(word[0]) {
                let verdict = judge_abort(
                    before,
                    &self.arrivals(),
                    blocks,
                    &vec![true; self.size()],
                    DEADLINE.as_nanos() as u64,
                );
                self.reset();
                return Err(match verdict {
                    Verdict::KernelAborted => format!("rank {rank} aborted: {abort}"),
                    Verdict::NotCoScheduled { never, late } => format!(
                        "not co-scheduled: {} block(s) never began, {} late",
                        never.len(),
                        late.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// What `enqueue(late)` queues on every rank, captured into one graph with each rank's
    /// stream a branch of it.
    fn capture(&self, enqueue: &dyn Fn(Option<usize>), late: Option<usize>) -> (Stream, Graph) {
        let mut stream = self.device.new_stream().unwrap();
        let graph = stream
            .capture(|capturing| {
                capturing.record(&self.fork)?;
                for rank in &self.members {
                    rank.stream.wait_for(&self.fork)?;
                }
                enqueue(late);
                for (rank, join) in self.members.iter().zip(&self.joins) {
                    rank.stream.record(join)?;
                    capturing.wait_for(join)?;
                }
                Ok::<(), prepare::gpu::driver::DriverError>(())
            })
            .unwrap();
        (stream, graph)
    }

    /// One launch on every rank, `enqueue(late)` queuing it: eagerly with rank `late` late, then
    /// captured in one graph of every rank and replayed [`REPLAYS`] times, each run judged by
    /// `judge(arrivals before it)` once every stream has finished.
    pub fn eager_then_graph(
        &self,
        late: usize,
        enqueue: &dyn Fn(Option<usize>),
        judge: &Judge<'_>,
    ) -> Result<(), String> {
        let before = self.arrivals();
        enqueue(Some(late));
        judge(&before).map_err(|why| format!("eager: {why}"))?;
        let (stream, graph) = self.capture(enqueue, Some(late));
        for replay in 0..REPLAYS {
            let before = self.arrivals();
            graph.launch().unwrap();
            stream
                .synchronize_within(WAIT)
                .map_err(|error| error.to_string())?;
            judge(&before).map_err(|why| format!("graph replay {replay}: {why}"))?;
        }
        Ok(())
    }
}
