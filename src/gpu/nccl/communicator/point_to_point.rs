//! Grouped point-to-point transfers: `ncclSend` and `ncclRecv` between `ncclGroupStart` and
//! `ncclGroupEnd`, so every transfer of a rank proceeds at once and none waits for another.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::nccl::sys;

use super::{api, check, Communicator, NcclError};
use crate::gpu::driver::{DeviceMemory, Stream};

/// How long a nonblocking communicator's group is polled before it counts as hung: enqueueing
/// waits only for the local launch (and, on first use of a peer, its connection).
const GROUP_WAIT: Duration = Duration::from_secs(120);

/// One transfer of a group: `bytes` at `offset` in `memory`, to or from rank `peer`.
#[derive(Clone, Copy)]
pub struct Transfer<'a> {
    /// The other rank.
    pub peer: u32,
    /// The memory sent from or received into.
    pub memory: &'a dyn DeviceMemory,
    /// Where in `memory` the bytes start.
    pub offset: usize,
    /// How many bytes.
    pub bytes: usize,
}

impl std::fmt::Debug for Transfer<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Transfer")
            .field("peer", &self.peer)
            .field("address", &self.memory.address())
            .field("offset", &self.offset)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Communicator {
    /// Checks a transfer before anything is enqueued: a peer of the communicator other than
    /// this rank, memory on the stream's GPU that holds the bytes.
    fn check_transfer(
        &self,
        call: &'static str,
        stream: &Stream,
        transfer: &Transfer<'_>,
    ) -> Result<(), NcclError> {
        let problem = |message: String| NcclError::Buffers {
            call,
            rank: self.rank,
            message,
        };
        if transfer.peer >= self.world || transfer.peer == self.rank {
            return Err(problem(format!(
                "peer {} is not another rank of {} ranks",
                transfer.peer, self.world
            )));
        }
        if transfer.memory.ordinal() != stream.ordinal() {
            return Err(problem(format!(
                "a buffer of GPU {} used on a stream of GPU {}",
                transfer.memory.ordinal(),
                stream.ordinal()
            )));
        }
        let end = transfer.offset.checked_add(transfer.bytes);
        if end.is_none_or(|end| end > transfer.memory.len_bytes()) {
            return Err(problem(format!(
                "{} bytes at offset {} of a buffer of {} bytes",
                transfer.bytes,
                transfer.offset,
                transfer.memory.len_bytes()
            )));
        }
        Ok(())
    }

    /// Enqueues every send and receive on `stream` as one NCCL group: each transfer's bytes go
    /// to (or come from) its peer, which must enqueue the matching receive (or send) of the same
    /// length in its own group. Every transfer is checked before any is enqueued; a transfer of
    /// no bytes is left out. A nonblocking communicator's group is polled until it is enqueued.
    /// The memory frees itself only after its device's work is done, so it outlives the group.
    pub fn send_receive(
        &self,
        stream: &Stream,
        sends: &[Transfer<'_>],
        receives: &[Transfer<'_>],
    ) -> Result<(), NcclError> {
        let api = api()?;
        self.ensure_live()?;
        for send in sends {
            self.check_transfer("ncclSend", stream, send)?;
        }
        for receive in receives {
            self.check_transfer("ncclRecv", stream, receive)?;
        }
        let raw_stream: sys::cudaStream_t = stream.bound_raw()?.cast();
        let comm = self.handle.raw;
        // SAFETY: no arguments; it opens a group on this thread.
        let started = unsafe { (api.group_start)() };
        check(api, "ncclGroupStart", self.rank, started, comm)?;
        let mut enqueued = Ok(());
        for send in sends.iter().filter(|send| send.bytes > 0) {
            // SAFETY: the bytes lie inside memory of the stream's device (checked above), freed
            // only after that device's work completes; the stream is live and its context
            // current; the peer is a rank of the communicator.
            let result = unsafe {
                (api.send)(
                    (send.memory.address() as usize + send.offset) as *const c_void,
                    send.bytes,
                    sys::ncclDataType_t::ncclUint8,
                    send.peer as i32,
                    comm,
                    raw_stream,
                )
            };
            enqueued = check(api, "ncclSend", self.rank, result, comm);
            if enqueued.is_err() {
                break;
            }
        }
        for receive in receives.iter().filter(|receive| receive.bytes > 0) {
            if enqueued.is_err() {
                break;
            }
            // SAFETY: as for the sends.
            let result = unsafe {
                (api.recv)(
                    (receive.memory.address() as usize + receive.offset) as *mut c_void,
                    receive.bytes,
                    sys::ncclDataType_t::ncclUint8,
                    receive.peer as i32,
                    comm,
                    raw_stream,
                )
            };
            enqueued = check(api, "ncclRecv", self.rank, result, comm);
        }
        // The group is closed whatever happened inside it, or this thread's next NCCL call
        // would join it.
        // SAFETY: no arguments; it closes the group opened above.
        let ended = unsafe { (api.group_end)() };
        let ended = check(api, "ncclGroupEnd", self.rank, ended, comm);
        enqueued?;
        ended?;
        if self.nonblocking {
            self.wait_ready("grouped sends and receives", Instant::now() + GROUP_WAIT)?;
        }
        Ok(())
    }
}
