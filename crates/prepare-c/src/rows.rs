//! The reduce-scatter and the all-gather: messages of rows x width elements cut by the shape
//! rule ([`prepare::shape::owned_rows`]), and that rule itself for a caller sizing its
//! operands.
//!
//! The arguments a handle is not needed for (the dtype, the shape) are checked before the
//! handle, so a caller's mistake is named whatever the handle.

use std::ffi::c_void;

use prepare::ladder::Dtype;
use prepare::serve::Handle;
use prepare::shape::{owned_rows, Shape};

use crate::boundary::{chain, dtype, guard, Failure};
use crate::{PrepareHandle, PrepareStatus};

/// Which of the two collectives a call is.
#[derive(Debug, Clone, Copy)]
enum RowCollective {
    ReduceScatter,
    AllGather,
}

/// The dtype and the shape of a call, checked (InvalidArgument).
fn shape_and_dtype(rows: usize, width: usize, code: i32) -> Result<(Shape, Dtype), Failure> {
    let dtype = dtype(code)?;
    let shape = Shape::new(rows as u64, width as u64)
        .and_then(|shape| shape.bytes(dtype.size_bytes()).map(|_| shape))
        .map_err(|error| Failure::invalid(chain(&error)))?;
    Ok((shape, dtype))
}

/// Checks the arguments of one call, then enqueues it on the handle.
///
/// # Safety
/// As [`prepare_reduce_scatter`].
unsafe fn enqueue(
    collective: RowCollective,
    handle: *const PrepareHandle,
    (input, output): (*const c_void, *mut c_void),
    (rows, width): (usize, usize),
    dtype_code: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    guard(|| {
        let (shape, dtype) = shape_and_dtype(rows, width, dtype_code)?;
        // SAFETY: the caller's promise.
        let handle: &Handle = unsafe { crate::handle(handle) }?;
        let owned = shape
            .owned_rows(handle.world(), handle.rank())
            .map_err(|error| Failure::invalid(chain(&error)))?;
        // Which operand holds the whole message and which this rank's rows: an empty operand
        // (a rank owning no rows, or no rows at all) is not read and may be NULL.
        let (input_rows, output_rows) = match collective {
            RowCollective::ReduceScatter => (shape.rows(), owned.end - owned.start),
            RowCollective::AllGather => (owned.end - owned.start, shape.rows()),
        };
        if input_rows > 0 && input.is_null() {
            return Err(Failure::invalid("input is NULL"));
        }
        if output_rows > 0 && output.is_null() {
            return Err(Failure::invalid("output is NULL"));
        }
        let (input, output, stream) = (input as u64, output as u64, stream as u64);
        let (rows, width) = (shape.rows(), shape.width());
        // SAFETY: the caller promises a live stream (or NULL) and memory that outlives the
        // work; the handle checks both operands are of this GPU and hold this rank's part.
        unsafe {
            match collective {
                RowCollective::ReduceScatter => {
                    handle.reduce_scatter(input, output, rows, width, dtype, stream)
                }
                RowCollective::AllGather => {
                    handle.all_gather(input, output, rows, width, dtype, stream)
                }
            }
        }?;
        Ok(())
    })
}

/// Enqueues the reduce-scatter (sum) of a message of `rows` x `width` elements of `dtype` on
/// `stream` (a `cudaStream_t`; NULL for the legacy default stream): every rank's `input` holds
/// the whole message (`rows * width` elements), and this rank's `output` receives its own rows
/// of the sum ([`prepare_owned_rows`]: a contiguous run of whole rows in rank order, the first
/// `rows % world` ranks one row more; `owned * width` elements), each element the fp32 sum in
/// rank order rounded once, on every candidate that is exact. In place when `output` is this
/// rank's rows inside `input` (`input + first * width` elements); any other overlap of the two
/// is an invalid argument. `rows` 0 enqueues nothing; a `width` of 0 is an invalid argument.
/// An operand of no elements (the output of a rank that owns no rows) is not read and may be
/// NULL; such a rank still calls. It only enqueues, so it can be captured in the caller's CUDA
/// graph; the message goes to the agreed kernel for its whole bytes, or NCCL above the
/// package's largest bucket. Every rank must make the same calls (the same rows and width) in
/// the same order: ranks that pass different shapes are not caught on the host. A kernel that
/// gave up waiting for a peer makes the next call fail with [`PrepareStatus::PeerTimeout`].
/// The dtype and the shape are checked before the handle.
///
/// # Safety
/// `handle` is null or a live handle; `input` and `output` are device memory of this rank's
/// GPU holding this rank's part that stay allocated until the work has run (or while a graph
/// holding it is replayed); `stream` is a live stream of this GPU or NULL.
#[no_mangle]
pub unsafe extern "C" fn prepare_reduce_scatter(
    handle: *const PrepareHandle,
    input: *const c_void,
    output: *mut c_void,
    rows: usize,
    width: usize,
    dtype: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    // SAFETY: the caller's promise.
    unsafe {
        enqueue(
            RowCollective::ReduceScatter,
            handle,
            (input, output),
            (rows, width),
            dtype,
            stream,
        )
    }
}

/// Enqueues the all-gather of a message of `rows` x `width` elements of `dtype` on `stream`:
/// this rank's `input` holds its own rows ([`prepare_owned_rows`]; `owned * width` elements),
/// and every rank's `output` receives the whole message (`rows * width` elements), each rank's
/// rows at their place, bytes as given. In place when `input` is this rank's rows inside
/// `output` (`output + first * width` elements); any other overlap of the two is an invalid
/// argument. `rows` 0 enqueues nothing; a `width` of 0 is an invalid argument. The input of a
/// rank that owns no rows is not read and may be NULL; such a rank still calls. Otherwise as
/// [`prepare_reduce_scatter`].
///
/// # Safety
/// As [`prepare_reduce_scatter`].
#[no_mangle]
pub unsafe extern "C" fn prepare_all_gather(
    handle: *const PrepareHandle,
    input: *const c_void,
    output: *mut c_void,
    rows: usize,
    width: usize,
    dtype: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    // SAFETY: the caller's promise.
    unsafe {
        enqueue(
            RowCollective::AllGather,
            handle,
            (input, output),
            (rows, width),
            dtype,
            stream,
        )
    }
}

/// The rows of a message of `rows` that rank `rank` of `world` owns in a reduce-scatter or an
/// all-gather: `*first` (when not NULL) receives the first of them and `*count` (when not
/// NULL) how many, a contiguous run in rank order, `rows / world` long and one more for the
/// first `rows % world` ranks (0 for a rank past the rows). Where the world divides the rows
/// this is the layout of NCCL's and PyTorch's reduce-scatter and all-gather. Needs no handle;
/// a rank not below `world` is an invalid argument.
///
/// # Safety
/// `first` and `count` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn prepare_owned_rows(
    rows: usize,
    world: u32,
    rank: u32,
    first: *mut usize,
    count: *mut usize,
) -> PrepareStatus {
    guard(|| {
        let owned = owned_rows(rows as u64, world, rank)
            .map_err(|error| Failure::invalid(chain(&error)))?;
        // Both fit: they are at most `rows`, a usize.
        let (start, len) = (owned.start as usize, (owned.end - owned.start) as usize);
        // SAFETY: each is null (not written) or writable by the caller's promise.
        unsafe {
            if let Some(first) = first.as_mut() {
                *first = start;
            }
            if let Some(count) = count.as_mut() {
                *count = len;
            }
        }
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

    fn owned(rows: usize, world: u32, rank: u32) -> Result<(usize, usize), String> {
        let (mut first, mut count) = (usize::MAX, usize::MAX);
        // SAFETY: both point to live usizes.
        let status =
            unsafe { prepare_owned_rows(rows, world, rank, &raw mut first, &raw mut count) };
        match status {
            PrepareStatus::Ok => Ok((first, count)),
            _ => Err(last_error()),
        }
    }

    #[test]
    fn owned_rows_is_the_shape_rule() {
        for world in 1..=9 {
            for rows in [0, 1, 2, 7, 8, 9, 2047, 2048, 4097] {
                for rank in 0..world {
                    let expected = owned_rows(rows as u64, world, rank).unwrap();
                    let (first, count) = owned(rows, world, rank).unwrap();
                    assert_eq!(
                        (first as u64, (first + count) as u64),
                        (expected.start, expected.end)
                    );
                }
            }
        }
        assert_eq!(owned(10, 4, 1), Ok((3, 3)));
        assert_eq!(owned(10, 4, 3), Ok((8, 2)));
        assert_eq!(owned(2, 4, 3), Ok((2, 0)));
        // SAFETY: null outputs are not written.
        let status =
            unsafe { prepare_owned_rows(5, 2, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(status, PrepareStatus::Ok);
    }

    #[test]
    fn owned_rows_refuses_a_rank_outside_the_world() {
        assert_eq!(
            owned(10, 2, 2),
            Err("rank 2 is not below the world size 2".to_owned())
        );
        assert!(owned(10, 0, 0).is_err());
    }

    /// Checked before the handle, so a null handle shows them.
    #[test]
    fn the_dtype_and_the_shape_are_checked_before_the_handle() {
        let null = std::ptr::null_mut();
        for call in [prepare_reduce_scatter, prepare_all_gather] {
            // SAFETY: every pointer is null, refused before any is used.
            let status = unsafe { call(std::ptr::null(), null, null, 4, 0, 0, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(
                last_error(),
                "a message of 4 rows of width 0: the width must be at least 1"
            );
            // SAFETY: as above.
            let status = unsafe { call(std::ptr::null(), null, null, 4, 3, 9, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert!(last_error().starts_with("dtype 9 is not a PrepareDtype"));
            // SAFETY: as above.
            let status = unsafe { call(std::ptr::null(), null, null, usize::MAX, 2, 0, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert!(last_error().contains("more than 2^64 - 1 elements"));
            // 2^63 elements fit a u64, their bytes do not.
            // SAFETY: as above.
            let status = unsafe { call(std::ptr::null(), null, null, 1 << 32, 1 << 31, 0, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(
                last_error(),
                "a message of 4294967296 rows of width 2147483648 in 2-byte elements holds more \
                 than 2^64 - 1 bytes"
            );
            // SAFETY: as above.
            let status = unsafe { call(std::ptr::null(), null, null, 0, 1, 2, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(last_error(), "handle is NULL");
        }
    }
}
