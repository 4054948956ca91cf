//! Symmetric NCCL profiles (`"window": "symmetric"`): NCCL sums in a window of its own, memory
//! from `ncclMemAlloc` that every rank registers on the profile's own communicator, so NCCL may
//! run its symmetric-memory kernels there. A message is copied into the window, all-reduced in
//! place and copied out, in window-sized pieces when it is larger than the window.
//!
//! Making a window takes two steps around the agreement on drops: each rank allocates its
//! memory (a rank whose NCCL has no symmetric windows, or out of memory, drops the profile's
//! entries, and the agreement drops them everywhere), then the ranks that all kept the profile
//! split its communicator and register the window together.

use super::{Collectives, EntryId, Operands, SymmetricWindow, Windows};
use crate::gpu::driver::{DeviceMemory, Stream};
use crate::gpu::nccl::{symmetric_windows, Communicator};
use crate::ladder::Ladder;
use crate::runtime::{Runtime, RuntimeError};

/// Allocates the memory of every symmetric profile's window on this rank (no communicator
/// yet): local, so a rank that cannot is dropped by the agreement, not stuck in a collective.
/// Without peer access between the ranks (`peer_reason`) NCCL cannot map a window either.
pub(super) fn allocate_windows(
    runtime: &Runtime,
    ladder: &Ladder,
    peer_reason: Option<&str>,
) -> Windows {
    let rank = runtime.rank();
    let support = match peer_reason {
        Some(reason) => Err(format!("no peer access: {reason}")),
        None => symmetric_windows(),
    };
    ladder
        .profiles
        .iter()
        .map(|profile| (profile, ladder.symmetric_window_bytes(&profile.id) as usize))
        .filter(|&(_, bytes)| bytes > 0)
        .map(|(profile, bytes)| {
            let window = support
                .clone()
                .and_then(|()| {
                    runtime
                        .allocate_window_memory(bytes)
                        .map_err(|error| error.to_string())
                })
                .map(|memory| SymmetricWindow {
                    communicator: None,
                    range: memory.range(),
                    memory: Some(memory),
                })
                .map_err(|reason| format!("rank {rank}: {reason}"));
            (profile.id.clone(), window)
        })
        .collect()
}

/// After the agreement: splits a communicator for every window some entry still uses and
/// registers the window on it, in ladder order on every rank; frees the others. Collective.
pub(super) fn register_windows(
    runtime: &Runtime,
    ladder: &Ladder,
    windows: &mut Windows,
    used: impl Fn(&str) -> bool,
) -> Result<(), RuntimeError> {
    for (id, window) in windows.iter_mut() {
        if !used(id) {
            *window = Err("no entry uses it".to_owned());
            continue;
        }
        let Ok(window) = window else {
            unreachable!("a window some rank could not make drops every entry that uses it")
        };
        let profile = ladder.profile(id).expect("a window belongs to a profile");
        let communicator = runtime.split_nccl(profile.max_ctas, profile.min_ctas)?;
        let memory = window.memory.take().expect("a window is registered once");
        runtime.register_symmetric_window(&communicator, memory)?;
        window.communicator = Some(communicator);
    }
    Ok(())
}

impl SymmetricWindow {
    /// The profile's own communicator.
    pub(super) fn communicator(&self) -> &Communicator {
        self.communicator
            .as_ref()
            .expect("a window in use was registered on its communicator")
    }

    /// Aborts the profile's communicator, if it was made.
    pub(super) fn abort(&self) {
        if let Some(communicator) = &self.communicator {
            communicator.abort();
        }
    }
}

impl Collectives {
    /// The window at `index` of the windows, which a live symmetric entry names.
    pub(super) fn window(&self, index: usize) -> &SymmetricWindow {
        self.windows[index]
            .1
            .as_ref()
            .expect("a live symmetric entry has its window")
    }

    /// Enqueues a symmetric NCCL all-reduce of `elements` on `stream`: each window-sized piece
    /// copied in, summed in place by NCCL, copied out.
    pub(super) fn enqueue_symmetric(
        &self,
        stream: &Stream,
        id: EntryId,
        window: usize,
        elements: usize,
        operands: &Operands,
    ) -> Result<(), RuntimeError> {
        let window = self.window(window);
        let memory = window.range;
        let element_bytes = self.element_bytes as usize;
        let piece = memory.len_bytes() / element_bytes;
        let bytes = elements as u64 * self.element_bytes;
        if elements > piece {
            let entry = &self.entries[id];
            let what = format!(
                "{} in bucket {}: a message larger than its symmetric window goes in pieces, and",
                entry.profile, entry.bucket
            );
            operands
                .check_chunkable(bytes, &what)
                .map_err(self.operand_error())?;
        }
        for (first, count) in super::pieces(elements, piece) {
            let offset = first * element_bytes;
            let length = count * element_bytes;
            stream
                .copy_device(&memory, 0, &operands.input, offset, length)
                .map_err(RuntimeError::driver(self.rank))?;
            window.communicator().all_reduce(
                stream,
                &memory,
                &memory,
                count,
                super::nccl_type(self.dtype),
            )?;
            stream
                .copy_device(&operands.output, offset, &memory, 0, length)
                .map_err(RuntimeError::driver(self.rank))?;
        }
        Ok(())
    }
}
