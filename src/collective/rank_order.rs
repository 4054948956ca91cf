//! The exact NCCL all-reduce (`"order": "rank"`, and the NCCL fallback beyond two ranks under
//! the exact policy): the message is cut into the RSAG's slices (`kernels::slice_of`); every
//! rank sends slice s of its message to rank s and receives its own slice from every peer,
//! in one NCCL group of `ncclSend` and `ncclRecv`, into a scratch buffer of `world` slots; the
//! package's kernel sums the slots in rank order (the reference sum); `ncclAllGather` gathers
//! the sums. Nothing touches peer memory, so it runs between hosts too.
//!
//! The uneven last slice: when every slice is the same whole number of vectors and the output
//! is 16-byte aligned, the kernel writes this rank's slice of the sum into the output and the
//! all-gather runs in place there. Otherwise the slots are padded to the largest slice: the
//! kernel sums into this rank's own slot, the all-gather runs in place over the padded slots,
//! and each slice is copied from its slot to the output.
//!
//! A message larger than the scratch holds goes in passes of the largest bucket's message,
//! first to last, or last to first when the output lies after an input it overlaps, so no
//! pass overwrites input a later pass still sends.

use super::order::{rank_order_applies, RankOrder};
use super::{Collectives, EntryId};
use crate::abi::{LaunchParams, PARAMS_BYTES};
use crate::gpu::driver::{CallerMemory, DeviceMemory, Geometry, ModuleImage, Stream};
use crate::gpu::nccl::{Communicator, Transfer};
use crate::kernels::{self, slice_of, slot_bytes};
use crate::ladder::{Collective, Ladder, Profile};
use crate::package::Package;
use crate::runtime::{OperandError, Runtime, RuntimeError};

use super::Operands;

/// Threads per block of the sum kernel.
const SUM_THREADS: u32 = 512;

impl RankOrder {
    /// The package's sum kernel, loaded, with scratch for passes of `pass_elements`; `None`
    /// when the package holds no sum kernel (two ranks and no profile naming it).
    pub(super) fn load(
        runtime: &Runtime,
        package: &Package,
        pass_elements: usize,
    ) -> Result<Option<RankOrder>, RuntimeError> {
        let rank = runtime.rank();
        let ladder = package.ladder();
        let spec = kernels::rank_order_sum(ladder.dtype, ladder.world_size);
        let Some((_, cubin)) = package
            .kernels()
            .find(|(record, _)| record.name == spec.name)
        else {
            return Ok(None);
        };
        let module = runtime
            .device()
            .load_module(ModuleImage::Cubin(cubin))
            .map_err(RuntimeError::driver(rank))?;
        let kernel = module
            .load(&spec.name, false, PARAMS_BYTES)
            .map_err(RuntimeError::driver(rank))?;
        let slot = slot_bytes(pass_elements as u64, ladder.dtype, ladder.world_size);
        let scratch = runtime
            .device()
            .allocate((slot * u64::from(ladder.world_size)) as usize)
            .map_err(RuntimeError::driver(rank))?;
        Ok(Some(RankOrder {
            kernel,
            scratch,
            pass_elements: pass_elements.max(1),
            dtype: ladder.dtype,
        }))
    }

    /// Enqueues one pass of at most `pass_elements` from `input` into `output` (any overlap).
    fn enqueue_pass(
        &self,
        communicator: &Communicator,
        stream: &Stream,
        elements: usize,
        input: CallerMemory,
        output: CallerMemory,
    ) -> Result<(), RuntimeError> {
        let rank = communicator.rank();
        let world = communicator.world();
        let dtype = self.dtype;
        let elements = elements as u64;
        let slot = slot_bytes(elements, dtype, world) as usize;
        let slice = |s: u32| slice_of(s, elements, dtype, world);
        let start = |s: u32| (slice(s).first_element(dtype) * dtype.size_bytes()) as usize;
        let length = |s: u32| slice(s).bytes(dtype) as usize;
        let driver = |source| RuntimeError::Driver { rank, source };
        let scratch = CallerMemory::whole(&self.scratch);
        // This rank's own slice goes to its own slot by a copy; every peer's in one group.
        let own = slot * rank as usize;
        if length(rank) > 0 {
            stream
                .copy_device(&scratch, own, &input, start(rank), length(rank))
                .map_err(driver)?;
        }
        let peers: Vec<u32> = (0..world).filter(|&peer| peer != rank).collect();
        let sends: Vec<Transfer<'_>> = peers
            .iter()
            .map(|&peer| Transfer {
                peer,
                memory: &input,
                offset: start(peer),
                bytes: length(peer),
            })
            .collect();
        let receives: Vec<Transfer<'_>> = peers
            .iter()
            .map(|&peer| Transfer {
                peer,
                memory: &scratch,
                offset: slot * peer as usize,
                bytes: length(rank),
            })
            .collect();
        communicator.send_receive(stream, &sends, &receives)?;
        // Every slice the same whole vectors: the sums gather in the output itself. Decided by
        // the message size alone, so every rank makes the same NCCL calls; an output this rank
        // cannot store vectors into gets its sum by a copy from its slot.
        let even = elements % dtype.per_vector() == 0
            && (elements / dtype.per_vector()) % u64::from(world) == 0;
        let direct = even && output.address() % kernels::ALIGNMENT_BYTES == 0;
        let sum_into = if direct {
            output.offset(start(rank) as u64).address()
        } else {
            scratch.address() + own as u64
        };
        let vectors = slice(rank).end_vector - slice(rank).begin_vector + 1;
        let blocks = vectors
            .div_ceil(u64::from(SUM_THREADS))
            .clamp(1, crate::abi::MAX_BLOCKS as u64) as u32;
        let geometry = Geometry::new(blocks, SUM_THREADS).map_err(driver)?;
        let params = LaunchParams {
            output: sum_into,
            input: scratch.address(),
            rank,
            world,
            ..LaunchParams::all_reduce(elements)
        };
        stream
            .launch_loaded(&self.kernel, geometry, &params.to_bytes())
            .map_err(driver)?;
        if even {
            if !direct && length(rank) > 0 {
                stream
                    .copy_device(&output, start(rank), &scratch, own, length(rank))
                    .map_err(driver)?;
            }
            let mine =
                CallerMemory::prefix(&output.offset(start(rank) as u64), length(rank) as u64);
            communicator.all_gather(stream, &mine, &output, length(rank))?;
            return Ok(());
        }
        let mine = CallerMemory::prefix(&scratch.offset(own as u64), slot as u64);
        communicator.all_gather(stream, &mine, &scratch, slot)?;
        for s in (0..world).filter(|&s| length(s) > 0) {
            stream
                .copy_device(&output, start(s), &scratch, slot * s as usize, length(s))
                .map_err(driver)?;
        }
        Ok(())
    }
}

impl Collectives {
    /// The entries of plain NCCL profiles that the rank-order path serves instead: every one
    /// where [`rank_order_applies`] and the package holds the sum kernel, none otherwise.
    pub fn rank_ordered_entries(
        &self,
        ladder: &Ladder,
        world: u32,
        exact_only: bool,
    ) -> Vec<EntryId> {
        if !(rank_order_applies(ladder.collective, world, exact_only) && self.has_rank_order()) {
            return Vec::new();
        }
        (0..self.entries().len())
            .filter(|&id| {
                ladder
                    .profile(&self.entries()[id].profile)
                    .is_some_and(Profile::is_plain_nccl)
            })
            .collect()
    }

    /// Whether this package can sum NCCL's all-reduce in rank order (it holds the sum kernel).
    pub fn has_rank_order(&self) -> bool {
        self.rank_order.is_some()
    }

    /// Enqueues the NCCL fallback for a message of `elements` on the runtime's communicator:
    /// the exact rank-order path where [`rank_order_applies`] and the package holds its kernel,
    /// `ncclAllReduce` otherwise. Any size, any operands of the message's length.
    pub fn enqueue_nccl(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        elements: usize,
        operands: Operands,
        exact_only: bool,
    ) -> Result<(), RuntimeError> {
        if rank_order_applies(Collective::AllReduce, runtime.world(), exact_only)
            && self.has_rank_order()
        {
            let bytes = elements as u64 * self.element_bytes;
            operands
                .check_lengths(bytes)
                .map_err(self.operand_error())?;
            return self.enqueue_rank_order(runtime.communicator(), stream, elements, operands);
        }
        runtime
            .communicator()
            .all_reduce(
                stream,
                &operands.input,
                &operands.output,
                elements,
                super::nccl_type(self.dtype),
            )
            .map_err(RuntimeError::from)
    }

    /// Enqueues the rank-order path on `communicator`, in passes (see the module's
    /// documentation). The operands' lengths are checked by the caller.
    pub(super) fn enqueue_rank_order(
        &self,
        communicator: &Communicator,
        stream: &Stream,
        elements: usize,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let Some(rank_order) = &self.rank_order else {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: "the package holds no rank-order sum kernel".to_owned(),
            });
        };
        let passes: Vec<(usize, usize)> =
            super::pieces(elements, rank_order.pass_elements).collect();
        // Every rank takes the passes first to last, since a pass is one exchange of every
        // rank's slices and its order cannot depend on one rank's operands. An output that
        // starts inside the input, after it, would then overwrite a later pass's input: refused
        // before anything is enqueued.
        let overwrites_later_input = operands.output.address() > operands.input.address()
            && operands.output.address()
                < operands.input.address() + operands.input.len_bytes() as u64;
        if passes.len() > 1 && overwrites_later_input {
            return Err((self.operand_error())(OperandError::PartlyOverlapping {
                what: format!(
                    "the exact NCCL all-reduce of {elements} elements, in {} passes,",
                    passes.len()
                ),
            }));
        }
        for &(first, count) in &passes {
            let offset = first as u64 * self.element_bytes;
            let length = count as u64 * self.element_bytes;
            let part = |memory: CallerMemory| CallerMemory::prefix(&memory.offset(offset), length);
            rank_order.enqueue_pass(
                communicator,
                stream,
                count,
                part(operands.input),
                part(operands.output),
            )?;
        }
        Ok(())
    }
}
