//! `all_reduce_add_rms_norm` through an entry: a fused candidate is one launch of its kernel
//! with the epilogue's fields; a separate or NCCL one is the entry's all-reduce from `x` into
//! `normed`, then the `add_rms_norm` kernel reading `normed` and writing the residual and
//! `normed` (normed aliasing its input is allowed). Every operand is checked before anything
//! is enqueued, so a refused call leaves nothing half-written.

use super::epilogue_message::{
    check_epilogue, epilogue_startup_shape, EpilogueMessage, NORM_MAX_BLOCKS, NORM_THREADS,
    STARTUP_EPS,
};
use super::{Collectives, EntryId, Input, Launch, Operands};
use crate::abi::LaunchParams;
use crate::gpu::driver::{CallerMemory, DeviceBuffer, DeviceMemory, Geometry, Stream};
use crate::ladder::EpilogueForm;
use crate::runtime::{OperandError, Runtime, RuntimeError};

impl Collectives {
    /// The residual and weight start-up's checks write before each run of
    /// [`Collectives::enqueue`] (the residual as long as the largest message, the weight
    /// `STARTUP_HIDDEN` elements); `None` for a package of another collective.
    pub fn epilogue_buffers(&self) -> Option<(&DeviceBuffer, &DeviceBuffer)> {
        self.epilogue
            .as_ref()
            .map(|parts| (&parts.residual, &parts.weight))
    }

    /// Enqueues entry `id` of an `all_reduce_add_rms_norm` package for `message` on `stream`
    /// (queued or captured), after checking every operand ([`check_epilogue`]).
    pub fn enqueue_epilogue(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        message: &EpilogueMessage,
    ) -> Result<(), RuntimeError> {
        check_epilogue(self.dtype, message).map_err(self.operand_error())?;
        let elements = message.shape.elements() as usize;
        let operands = Operands {
            input: message.x,
            output: message.normed,
        };
        if let Some(EpilogueForm::Fused(_)) = self.entries[id].epilogue {
            return self.enqueue_fused(stream, id, message, operands);
        }
        self.enqueue_sum(runtime, stream, id, elements, operands)?;
        self.enqueue_add_rms_norm(runtime, stream, message)
    }

    /// [`Collectives::enqueue_operands`] of this collective: the message of `elements` in the
    /// start-up shape ([`epilogue_startup_shape`]) from `operands.input` into
    /// `operands.output` as `normed`, with the package's own residual and weight.
    pub(super) fn enqueue_own_epilogue(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        elements: usize,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let (residual, _) = self.epilogue_buffers().ok_or_else(|| RuntimeError::Setup {
            rank: self.rank,
            message: "the package holds no add_rms_norm kernel".to_owned(),
        })?;
        let message =
            self.startup_epilogue_message(elements, operands, CallerMemory::whole(residual))?;
        self.enqueue_epilogue(runtime, stream, id, &message)
    }

    /// Enqueues `message`, a message above the largest bucket, in pieces of whole rows
    /// ([`crate::shape::epilogue_pieces`]), each one call of entry `id` (a candidate of the
    /// largest bucket) on its rows: every operand but the weight offset by the same rows, so a
    /// row's bits are those of the whole message. Every check comes before the first piece (a
    /// refusal after some would leave the peers waiting): the operands, a row no larger than a
    /// piece, and `normed` and the residual each `x` itself or apart from it.
    pub fn enqueue_epilogue_in_pieces(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &EpilogueMessage,
        id: EntryId,
    ) -> Result<(), RuntimeError> {
        check_epilogue(self.dtype, message).map_err(self.operand_error())?;
        let piece = self.piece_elements() as u64;
        let pieces = crate::shape::epilogue_pieces(message.shape, piece).ok_or_else(|| {
            self.operand_error()(OperandError::RowLargerThanPiece {
                hidden: message.shape.width(),
                piece,
            })
        })?;
        if !message.may_go_in_pieces() {
            return Err(self.operand_error()(OperandError::PartlyOverlapping {
                what: "an all_reduce_add_rms_norm in pieces (of normed or the residual and x)"
                    .to_owned(),
            }));
        }
        for rows in pieces {
            let part = message.rows(rows, self.element_bytes);
            self.enqueue_epilogue(runtime, stream, id, &part)?;
        }
        Ok(())
    }

    /// The message start-up times an entry on at `elements` (the start-up shape,
    /// [`epilogue_startup_shape`]) on operands of its own: `x` and `normed` from `operands`,
    /// `residual` as long as the message, and the package's weight.
    pub fn startup_epilogue_message(
        &self,
        elements: usize,
        operands: Operands,
        residual: CallerMemory,
    ) -> Result<EpilogueMessage, RuntimeError> {
        let (_, weight) = self.epilogue_buffers().ok_or_else(|| RuntimeError::Setup {
            rank: self.rank,
            message: "the package holds no add_rms_norm kernel".to_owned(),
        })?;
        let shape = epilogue_startup_shape(elements as u64);
        let size = self.element_bytes;
        let bytes = shape.elements() * size;
        let part = |memory: CallerMemory| CallerMemory::prefix(&memory, bytes);
        Ok(EpilogueMessage {
            x: part(operands.input),
            residual: Some(part(residual)),
            weight: CallerMemory::prefix(weight, shape.width() * size),
            normed: part(operands.output),
            shape,
            eps: STARTUP_EPS,
        })
    }

    /// The fused kernel of entry `id`: one launch, the message's operands placed as the
    /// all-reduce's are ([`Collectives::plan`]), `normed` being its output.
    fn enqueue_fused(
        &self,
        stream: &Stream,
        id: EntryId,
        message: &EpilogueMessage,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let entry = &self.entries[id];
        let elements = message.shape.elements() as usize;
        let bytes = elements as u64 * self.element_bytes;
        super::check_entry(entry, elements, self.bucket_capacity[entry.bucket])
            .map_err(self.operand_error())?;
        let Some(Launch::Custom {
            kernel,
            geometry,
            scratch_offset,
            input,
        }) = &entry.launch
        else {
            unreachable!("a fused entry that runs is a custom kernel")
        };
        let Input::Peer(peer) = &self.input else {
            unreachable!("custom entries exist only with peer memory")
        };
        let plan = self.plan(stream, peer, &operands, bytes, *input)?;
        let mut params = peer.params(
            plan.input,
            plan.output,
            elements as u64,
            *scratch_offset,
            self.timeout,
        );
        set_epilogue_fields(&mut params, message, plan.output);
        stream
            .launch_loaded(kernel, *geometry, &params.to_bytes())
            .map_err(RuntimeError::driver(self.rank))?;
        self.finish(stream, peer, &operands, bytes, &plan)
    }

    /// NCCL's all-reduce of `message` (in rank order where `exact_only` asks for it, as
    /// [`Collectives::enqueue_nccl`]) into `normed`, then `add_rms_norm`: the path of a message
    /// above the ladder, after checking every operand.
    pub fn enqueue_nccl_epilogue(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &EpilogueMessage,
        exact_only: bool,
    ) -> Result<(), RuntimeError> {
        check_epilogue(self.dtype, message).map_err(self.operand_error())?;
        let operands = Operands {
            input: message.x,
            output: message.normed,
        };
        let elements = message.shape.elements() as usize;
        self.enqueue_nccl(runtime, stream, elements, operands, exact_only)?;
        self.enqueue_add_rms_norm(runtime, stream, message)
    }

    /// `add_rms_norm` over the sum in `message.normed`, into the residual and `normed`.
    fn enqueue_add_rms_norm(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &EpilogueMessage,
    ) -> Result<(), RuntimeError> {
        let parts = self.epilogue.as_ref().ok_or_else(|| RuntimeError::Setup {
            rank: self.rank,
            message: "the package holds no add_rms_norm kernel".to_owned(),
        })?;
        let mut params = LaunchParams {
            input: message.normed.address(),
            input_elements: message.shape.elements(),
            rank: self.rank,
            world: runtime.world(),
            ..LaunchParams::all_reduce(message.shape.elements())
        };
        set_epilogue_fields(&mut params, message, message.normed.address());
        let blocks = message.shape.rows().clamp(1, NORM_MAX_BLOCKS) as u32;
        let geometry =
            Geometry::new(blocks, NORM_THREADS).map_err(RuntimeError::driver(self.rank))?;
        stream
            .launch_loaded(&parts.kernel, geometry, &params.to_bytes())
            .map_err(RuntimeError::driver(self.rank))
    }
}

/// The epilogue's launch fields (kernels/prepare_abi.cuh), `normed` at `normed`.
fn set_epilogue_fields(params: &mut LaunchParams, message: &EpilogueMessage, normed: u64) {
    params.output = normed;
    params.output_elements = message.shape.elements();
    params.rows = message.shape.rows();
    params.width = message.shape.width();
    params.residual = message.residual.as_ref().map_or(0, DeviceMemory::address);
    params.weight = message.weight.address();
    params.normed = normed;
    params.eps = message.eps;
}
