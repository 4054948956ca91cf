//! Enqueueing the copies a plan asks for ([`super::operands::moves`]): each between the
//! caller's operands, this rank's registered buffer and its private output buffer, located by
//! device address.

use super::{Collectives, Operands, PlannedCopy};
use crate::gpu::driver::{DeviceMemory, Stream};
use crate::runtime::{PeerMemory, RuntimeError};

impl Collectives {
    /// Enqueues `copies`, each between the operands, the registered buffer and the private
    /// output buffer.
    pub(super) fn copy(
        &self,
        stream: &Stream,
        peer: &PeerMemory,
        operands: &Operands,
        copies: &[PlannedCopy],
    ) -> Result<(), RuntimeError> {
        let rank = self.rank;
        for copy in copies {
            let (destination, destination_offset) =
                self.locate(peer, operands, copy.destination, copy.bytes)?;
            let (source, source_offset) = self.locate(peer, operands, copy.source, copy.bytes)?;
            stream
                .copy_device(
                    destination,
                    destination_offset,
                    source,
                    source_offset,
                    copy.bytes as usize,
                )
                .map_err(RuntimeError::driver(rank))?;
        }
        Ok(())
    }

    /// The memory among the operands, the registered buffer and the private output buffer
    /// that holds `bytes` at device address `address`, and the offset there.
    pub(super) fn locate<'m>(
        &'m self,
        peer: &'m PeerMemory,
        operands: &'m Operands,
        address: u64,
        bytes: u64,
    ) -> Result<(&'m dyn DeviceMemory, usize), RuntimeError> {
        let memories: [&dyn DeviceMemory; 4] = [
            &operands.input,
            &operands.output,
            peer.buffer(),
            self.private(),
        ];
        memories
            .into_iter()
            .find(|memory| {
                address >= memory.address()
                    && address + bytes <= memory.address() + memory.len_bytes() as u64
            })
            .map(|memory| (memory, (address - memory.address()) as usize))
            .ok_or_else(|| RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "a copy of {bytes} bytes at {address:#x} lies outside the operands and this \
                     rank's buffers"
                ),
            })
    }
}
