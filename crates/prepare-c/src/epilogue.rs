//! The all-reduce + residual add + RMSNorm: `x` (rows x hidden on every rank), the residual
//! (the same on every rank, overwritten with the sum plus itself) or NULL, the weight (hidden)
//! and eps, giving `normed` on every rank.
//!
//! The arguments a handle is not needed for (the dtype, the shape, the hidden size, eps and
//! NULL operands) are checked before the handle, so a caller's mistake is named whatever the
//! handle.

use std::ffi::c_void;

use prepare::collective::{HIDDEN_MULTIPLE, MAX_HIDDEN};
use prepare::ladder::Dtype;
use prepare::serve::Handle;
use prepare::shape::Shape;

use crate::boundary::{chain, dtype, guard, Failure};
use crate::{PrepareHandle, PrepareStatus};

/// The dtype, the shape, the hidden size and eps of a call, checked (InvalidArgument).
fn checked(rows: usize, hidden: usize, eps: f32, code: i32) -> Result<(Shape, Dtype), Failure> {
    let dtype = dtype(code)?;
    let shape =
        Shape::new(rows as u64, hidden as u64).map_err(|error| Failure::invalid(chain(&error)))?;
    if shape.width() % HIDDEN_MULTIPLE != 0 || shape.width() > MAX_HIDDEN {
        return Err(Failure::invalid(format!(
            "a hidden size of {hidden} elements is not taken: RMSNorm's kernels take a multiple \
             of {HIDDEN_MULTIPLE} from {HIDDEN_MULTIPLE} to {MAX_HIDDEN}"
        )));
    }
    if eps.is_nan() || eps < 0.0 {
        return Err(Failure::invalid(format!(
            "eps is {eps}; it must be 0 or more (not negative, not NaN)"
        )));
    }
    Ok((shape, dtype))
}

/// Enqueues the all-reduce + residual add + RMSNorm of `rows` x `hidden` elements of `dtype` on
/// `stream` (a `cudaStream_t`; NULL for the legacy default stream): `normed` (rows x hidden)
/// receives RMSNorm(the sum of every rank's `x` + `residual`) times `weight` (hidden elements),
/// and `residual` (rows x hidden, the same on every rank) is overwritten with that sum plus
/// itself; a NULL `residual` is none (then `normed` is the RMSNorm of the sum). The bits are
/// the epilogue's reference on every rank and every exact candidate, fused or not. `normed`
/// may be `x` (then `x` is not kept); `normed` overlapping `residual` is an invalid argument,
/// as are a `hidden` that is not a multiple of 8 or above 2^24, a negative or NaN `eps`, a
/// NULL `x`, `weight` or `normed`, and `residual`, `weight` or `normed` off 16-byte alignment.
/// `rows` 0 enqueues nothing. It only enqueues, so it can be captured in the caller's CUDA
/// graph; the message goes to the agreed candidate for the bytes of `x`, or NCCL's all-reduce
/// then the add + RMSNorm kernel above the package's largest bucket. Every rank must make the
/// same calls in the same order. The arguments but the operands' memory are checked before the
/// handle.
///
/// # Safety
/// `handle` is null or a live handle; every operand is device memory of this rank's GPU of the
/// length the shape gives it that stays allocated until the work has run (or while a graph
/// holding it is replayed); `stream` is a live stream of this GPU or NULL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn prepare_all_reduce_add_rms_norm(
    handle: *const PrepareHandle,
    x: *const c_void,
    residual: *mut c_void,
    weight: *const c_void,
    normed: *mut c_void,
    rows: usize,
    hidden: usize,
    eps: f32,
    dtype: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    guard(|| {
        let (shape, dtype) = checked(rows, hidden, eps, dtype)?;
        if shape.rows() > 0 {
            for (name, pointer) in [
                ("x", x),
                ("weight", weight),
                ("normed", normed.cast_const()),
            ] {
                if pointer.is_null() {
                    return Err(Failure::invalid(format!("{name} is NULL")));
                }
            }
        }
        // SAFETY: the caller's promise.
        let handle: &Handle = unsafe { crate::handle(handle) }?;
        // SAFETY: the caller promises a live stream (or NULL) and memory that outlives the
        // work; the handle checks every operand is of this GPU and holds its part.
        unsafe {
            handle.all_reduce_add_rms_norm(
                x as u64,
                residual as u64,
                weight as u64,
                normed as u64,
                shape.rows(),
                shape.width(),
                eps,
                dtype,
                stream as u64,
            )
        }?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last_error() -> String {
        // SAFETY: prepare_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(crate::prepare_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// A call with a null handle and operands at a made-up address (never read: every case is
    /// refused first): its status and last error.
    fn called(rows: usize, hidden: usize, eps: f32, dtype: i32, null_x: bool) -> String {
        let some = 0x1000 as *mut c_void;
        let x = if null_x {
            std::ptr::null()
        } else {
            some.cast_const()
        };
        // SAFETY: the handle is null, refused before any pointer is used.
        let status = unsafe {
            prepare_all_reduce_add_rms_norm(
                std::ptr::null(),
                x,
                std::ptr::null_mut(),
                some.cast_const(),
                some,
                rows,
                hidden,
                eps,
                dtype,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(status, PrepareStatus::InvalidArgument);
        last_error()
    }

    #[test]
    fn the_dtype_shape_hidden_size_eps_and_null_operands_are_checked_before_the_handle() {
        assert_eq!(called(4, 8192, 1e-6, 0, false), "handle is NULL");
        assert_eq!(called(0, 8, 0.0, 2, true), "handle is NULL");
        assert_eq!(
            called(4, 12, 1e-6, 0, false),
            "a hidden size of 12 elements is not taken: RMSNorm's kernels take a multiple of 8 \
             from 8 to 16777216"
        );
        assert!(called(1, (1 << 24) + 8, 1e-6, 0, false).starts_with("a hidden size of 16777224"));
        assert_eq!(
            called(4, 0, 1e-6, 0, false),
            "a message of 4 rows of width 0: the width must be at least 1"
        );
        assert!(called(4, 8, 1e-6, 9, false).starts_with("dtype 9 is not a PrepareDtype"));
        assert_eq!(
            called(4, 8, -1.0, 0, false),
            "eps is -1; it must be 0 or more (not negative, not NaN)"
        );
        assert!(called(4, 8, f32::NAN, 0, false).starts_with("eps is NaN"));
        assert_eq!(called(4, 8, 0.0, 0, true), "x is NULL");
    }
}
