//! The call check: with `PREPARE_CHECK_CALLS=1` in a rank's environment when its handle starts
//! (or [`Handle::set_call_checks`]), every serving call first agrees with every rank on what
//! it is (the collective, the dtype and the shape: the all-reduce's elements; the rows, the
//! rule's or the caller's per-rank list, and the width; the fused call's rows, hidden size,
//! eps and whether it has a residual) before anything is enqueued.
//!
//! Without it a call is checked against this rank's operands only: ranks that pass different
//! shapes meet in the kernels, which refuse them through the shape word and leave the abort
//! word, or in NCCL, which waits until the communicator is aborted. The check costs an
//! all-gather of one small slot and a wait for it on the host at every call, so it is off by
//! default, as `TORCH_DISTRIBUTED_DEBUG=DETAIL`'s collective checks are: it is for finding a
//! server's mismatched calls. Every rank sees every rank's call, so when they differ every
//! rank refuses its call ([`ServeError::CallsDisagree`], naming the first rank whose call
//! differs from its own) with nothing of it enqueued on any rank. A rank whose call was
//! refused before the check (an operand of the wrong length) leaves the others waiting in the
//! check until the handle's timeout, which aborts the communicator. While the stream is being
//! captured the check is not made (the host cannot wait inside a capture); the eager calls
//! before a capture are checked.

use super::call::{refusal, Call};
use super::{Handle, ServeError};
use crate::gpu::driver::Stream;
use crate::runtime::RuntimeError;

impl Handle {
    /// Turns the call check on or off for this rank's later calls (it starts as
    /// `PREPARE_CHECK_CALLS` says). Every rank must set the same.
    pub fn set_call_checks(&mut self, on: bool) {
        self.checks_calls = on;
    }

    /// Whether this rank's calls are checked ([`Handle::set_call_checks`]).
    pub fn checks_calls(&self) -> bool {
        self.checks_calls
    }

    /// [`Handle::agree_call`] for a call that enqueues nothing (no elements or rows), on the
    /// caller's raw `stream`, borrowed only with the check on.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of this rank's GPU (or 0) while this call runs.
    #[allow(unsafe_code)]
    pub(super) unsafe fn agree_empty_call(
        &self,
        stream: u64,
        call: &Call<'_>,
    ) -> Result<(), ServeError> {
        if !self.checks_calls {
            return Ok(());
        }
        let rank = self.rank();
        // SAFETY: the caller promises the stream is live (or 0) while this call runs.
        let stream = unsafe { self.runtime.device().borrow_stream(stream) }.map_err(|source| {
            ServeError::BadArgument {
                rank,
                what: "the stream",
                source,
            }
        })?;
        self.agree_call(&stream, call)
    }

    /// With the check on and `stream` not being captured: every rank's call is `call`, or the
    /// refusal. Collective, made before anything of the call is enqueued.
    pub(super) fn agree_call(&self, stream: &Stream, call: &Call<'_>) -> Result<(), ServeError> {
        if !self.checks_calls {
            return Ok(());
        }
        let rank = self.rank();
        if stream.is_capturing().map_err(RuntimeError::driver(rank))? {
            return Ok(());
        }
        let gathered = self.runtime.all_gather(&call.slot(), "the call check")?;
        refusal(rank, call, &gathered).map_or(Ok(()), Err)
    }
}
