//! The handle's all-reduce + residual add + RMSNorm: `x` (rows x hidden on every rank), the
//! residual (rows x hidden, the same on every rank, overwritten with the sum plus itself) or
//! none, the weight (hidden) and eps, giving `normed` on every rank. Routed by the bytes of
//! `x` like the all-reduce: the bucket's winner, fused or not, and above the ladder pieces of
//! whole rows or NCCL's all-reduce then `add_rms_norm`, whichever start-up timed faster.
//!
//! Every operand is checked before anything is enqueued (`prepare::collective::check_epilogue`):
//! a hidden size no kernel takes, an operand of the wrong length, a negative or NaN eps,
//! `normed` overlapping the residual, each a clear error.

use super::call::Call;
use super::{Handle, ServeError, Served};
use crate::collective::{EpilogueMessage, HIDDEN_MULTIPLE, MAX_HIDDEN};
use crate::gpu::driver::Stream;
use crate::ladder::{Collective, Dtype};
use crate::runtime::{OperandError, RuntimeError};
use crate::shape::epilogue_pieces;
use crate::shape::Shape;

impl Handle {
    /// Enqueues `all_reduce_add_rms_norm` of `rows` x `hidden` elements of `dtype` on `stream`:
    /// `normed` = RMSNorm(sum of `x` over the ranks + `residual`) x `weight`, the residual
    /// overwritten with that sum plus itself (`residual` 0: none, then `normed` is the RMSNorm
    /// of the sum). `normed` may be `x`; it may not overlap the residual. `rows` 0 enqueues
    /// nothing.
    ///
    /// # Safety
    ///
    /// As [`Handle::all_reduce`]: `stream` must be a live stream of this rank's GPU (or 0),
    /// and every operand must stay allocated until the enqueued work has run. Each is checked
    /// to be device memory of this GPU holding what the shape gives it.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    pub unsafe fn all_reduce_add_rms_norm(
        &self,
        x: u64,
        residual: u64,
        weight: u64,
        normed: u64,
        rows: u64,
        hidden: u64,
        eps: f32,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        let rank = self.rank();
        let (served, shape) = self.epilogue_shape(rows, hidden, dtype)?;
        let call = Call::Epilogue {
            dtype,
            rows,
            hidden,
            eps,
            residual: residual != 0,
        };
        if rows == 0 {
            // SAFETY: the caller promises the stream is live (or 0).
            return unsafe { self.agree_empty_call(stream, &call) };
        }
        let size = dtype.size_bytes();
        let too_large = || ServeError::MessageTooLarge {
            rank,
            elements: usize::try_from(shape.elements()).unwrap_or(usize::MAX),
        };
        let device = self.runtime.device();
        let bad = |what: &'static str| move |source| ServeError::BadArgument { rank, what, source };
        // SAFETY: the caller promises the stream is live (or 0) for as long as it is used here.
        let stream = unsafe { device.borrow_stream(stream) }.map_err(bad("the stream"))?;
        let operand = |address: u64, elements: u64, what: &'static str| {
            let bytes = elements
                .checked_mul(size)
                .and_then(|bytes| usize::try_from(bytes).ok())
                .ok_or_else(too_large)?;
            // SAFETY: the caller promises it stays allocated until the queued work has run.
            unsafe { device.caller_memory(address, bytes) }.map_err(bad(what))
        };
        let message = EpilogueMessage {
            x: operand(x, shape.elements(), "x")?,
            residual: match residual {
                0 => None,
                address => Some(operand(address, shape.elements(), "the residual")?),
            },
            weight: operand(weight, hidden, "the weight")?,
            normed: operand(normed, shape.elements(), "normed")?,
            shape,
            eps,
        };
        self.agree_call(&stream, &call)?;
        self.enqueue_epilogue(served, &stream, &message)
    }

    /// Like [`Handle::all_reduce_add_rms_norm`], on memory and a stream this crate already
    /// checked; each operand must be exactly the length the shape gives it.
    pub fn all_reduce_add_rms_norm_on(
        &self,
        stream: &Stream,
        message: &EpilogueMessage,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        let (served, _) =
            self.epilogue_shape(message.shape.rows(), message.shape.width(), dtype)?;
        crate::collective::check_epilogue(dtype, message).map_err(|source| {
            RuntimeError::Operands {
                rank: self.rank(),
                source,
            }
        })?;
        let call = Call::Epilogue {
            dtype,
            rows: message.shape.rows(),
            hidden: message.shape.width(),
            eps: message.eps,
            residual: message.residual.is_some(),
        };
        self.agree_call(stream, &call)?;
        self.enqueue_epilogue(served, stream, message)
    }

    /// The served package of the collective and the message's shape, refused when no kernel
    /// takes its hidden size.
    fn epilogue_shape(
        &self,
        rows: u64,
        hidden: u64,
        dtype: Dtype,
    ) -> Result<(&Served, Shape), ServeError> {
        let served = self.served(Collective::AllReduceAddRmsNorm, dtype)?;
        let refused = |source| RuntimeError::Operands {
            rank: self.rank(),
            source,
        };
        let shape =
            Shape::new(rows, hidden).map_err(|source| refused(OperandError::Shape(source)))?;
        // Before any operand's length is taken from it.
        if hidden % HIDDEN_MULTIPLE != 0 || hidden > MAX_HIDDEN {
            return Err(refused(OperandError::HiddenNotTaken {
                hidden,
                largest: MAX_HIDDEN,
            })
            .into());
        }
        Ok((served, shape))
    }

    /// Routes `message` by the bytes of `x`: the bucket's winner; above the ladder, pieces of
    /// whole rows through the candidate start-up timed fastest in pieces, where the choice says
    /// so, a row fits a piece and `normed` and the residual are each `x` or apart from it;
    /// otherwise, and where a plain NCCL winner must sum in rank order, NCCL's all-reduce then
    /// `add_rms_norm`.
    fn enqueue_epilogue(
        &self,
        served: &Served,
        stream: &Stream,
        message: &EpilogueMessage,
    ) -> Result<(), ServeError> {
        let bytes = message.shape.elements() * served.dtype.size_bytes();
        self.watched(stream, || {
            match served.route(bytes) {
                Some(id) if !served.rank_ordered.contains(&id) => served
                    .collectives
                    .enqueue_epilogue(&self.runtime, stream, id, message)?,
                None if served.rank_ordered.is_empty()
                    && message.may_go_in_pieces()
                    && epilogue_pieces(
                        message.shape,
                        served.collectives.piece_elements() as u64,
                    )
                    .is_some() =>
                {
                    match served.pieces {
                        Some(id) => served.collectives.enqueue_epilogue_in_pieces(
                            &self.runtime,
                            stream,
                            message,
                            id,
                        )?,
                        None => served.collectives.enqueue_nccl_epilogue(
                            &self.runtime,
                            stream,
                            message,
                            served.selection.choice.policy.exact_only,
                        )?,
                    }
                }
                _ => served.collectives.enqueue_nccl_epilogue(
                    &self.runtime,
                    stream,
                    message,
                    served.selection.choice.policy.exact_only,
                )?,
            }
            Ok(())
        })
    }
}
