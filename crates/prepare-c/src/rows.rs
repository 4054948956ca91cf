//! The reduce-scatter and the all-gather: messages of rows x width elements cut by the shape
//! rule ([`prepare::shape::owned_rows`]), and that rule itself for a caller sizing its
//! operands.
//!
//! The arguments a handle is not needed for (the dtype, the shape) are checked before the
//! handle, so a caller's mistake is named whatever the handle.

use std::ffi::c_void;

use prepare::ladder::Dtype;
use prepare::serve::Handle;
use prepare::shape::{owned_rows, RankRows, Shape, ShapeError};

use crate::boundary::{chain, dtype, guard, Failure};
use crate::{PrepareHandle, PrepareStatus};

/// Which of the two collectives a call is.
#[derive(Debug, Clone, Copy)]
enum RowCollective {
    ReduceScatter,
    AllGather,
}

/// The dtype and the shape of a call, checked (InvalidArgument).
fn shape_and_dtype(rows: u64, width: usize, code: i32) -> Result<(Shape, Dtype), Failure> {
    let dtype = dtype(code)?;
    let shape = Shape::new(rows, width as u64)
        .and_then(|shape| shape.bytes(dtype.size_bytes()).map(|_| shape))
        .map_err(|error| Failure::invalid(chain(&error)))?;
    Ok((shape, dtype))
}

/// How a call's ranks own its rows: the shape rule's, or the caller's counts (a v-form).
#[derive(Debug, Clone, Copy)]
enum Rows {
    Rule(usize),
    PerRank(*const usize, u32),
}

/// The caller's per-rank counts, read (InvalidArgument: NULL with counts to read).
///
/// # Safety
/// `rows_per_rank` is null or points to `ranks` readable `size_t`s.
unsafe fn counts(rows_per_rank: *const usize, ranks: u32) -> Result<Vec<u64>, Failure> {
    if ranks == 0 {
        return Ok(Vec::new());
    }
    if rows_per_rank.is_null() {
        return Err(Failure::invalid("rows_per_rank is NULL"));
    }
    // SAFETY: not null, and `ranks` long by the caller's promise.
    let counts = unsafe { std::slice::from_raw_parts(rows_per_rank, ranks as usize) };
    Ok(counts.iter().map(|&count| count as u64).collect())
}

/// Checks the arguments of one call, then enqueues it on the handle.
///
/// # Safety
/// As [`prepare_reduce_scatter`]; for a v-form, as [`prepare_reduce_scatter_v`].
unsafe fn enqueue(
    collective: RowCollective,
    handle: *const PrepareHandle,
    (input, output): (*const c_void, *mut c_void),
    (rows, width): (Rows, usize),
    dtype_code: i32,
    stream: *mut c_void,
) -> PrepareStatus {
    guard(|| {
        let invalid = |error: ShapeError| Failure::invalid(chain(&error));
        // The counts are checked as a list first (NULL, a sum that overflows), then against
        // the handle's world.
        let (total, given) = match rows {
            Rows::Rule(rows) => (rows as u64, None),
            Rows::PerRank(counts_at, ranks) => {
                // SAFETY: the caller's promise.
                let counts = unsafe { counts(counts_at, ranks) }?;
                let layout = RankRows::given(&counts, ranks).map_err(invalid)?;
                (layout.rows(), Some((counts, layout)))
            }
        };
        let (shape, dtype) = shape_and_dtype(total, width, dtype_code)?;
        // SAFETY: the caller's promise.
        let handle: &Handle = unsafe { crate::handle(handle) }?;
        let owned = match &given {
            None => shape.owned_rows(handle.world(), handle.rank()),
            Some((counts, layout)) => RankRows::given(counts, handle.world())
                .and_then(|_| layout.owned_rows(handle.rank())),
        }
        .map_err(invalid)?;
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
            match (collective, &given) {
                (RowCollective::ReduceScatter, None) => {
                    handle.reduce_scatter(input, output, rows, width, dtype, stream)
                }
                (RowCollective::AllGather, None) => {
                    handle.all_gather(input, output, rows, width, dtype, stream)
                }
                (RowCollective::ReduceScatter, Some((counts, _))) => {
                    handle.reduce_scatter_v(input, output, counts, width, dtype, stream)
                }
                (RowCollective::AllGather, Some((counts, _))) => {
                    handle.all_gather_v(input, output, counts, width, dtype, stream)
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
/// the same order: ranks that pass different shapes are caught on the host only with the call
/// check on (`PREPARE_CHECK_CALLS=1` when the handle starts: every rank's call then fails with
/// [`PrepareStatus::InvalidArgument`], nothing enqueued; docs/serving.md). A kernel that
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
            (Rows::Rule(rows), width),
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
            (Rows::Rule(rows), width),
            dtype,
            stream,
        )
    }
}

/// The reduce-scatter's v-form (vLLM's `reduce_scatterv`): as [`prepare_reduce_scatter`], but
/// rank r owns `rows_per_rank[r]` rows of `width` (an array of `ranks` counts, one per rank of
/// the world: contiguous runs in rank order, the message's rows their sum) instead of the
/// shape rule's. Every rank must pass the same counts, in the same calls and order; ranks
/// that pass different counts are caught only by the call check. Counts equal to the shape rule's go exactly as
/// [`prepare_reduce_scatter`] of their sum (the same kernel, the same bits); any others go
/// through the exact NCCL reduce-scatter (grouped sends of each rank's rows to its owner, then
/// the rank-order sum), exact at every world size. Invalid arguments, nothing enqueued:
/// `rows_per_rank` NULL with `ranks` above 0, counts whose sum overflows, then (with the
/// handle) `ranks` other than the world size; a width of 0, a dtype, NULL or overlapping
/// operands as [`prepare_reduce_scatter`]. The counts are read during the call only.
///
/// # Safety
/// As [`prepare_reduce_scatter`]; `rows_per_rank` is null or points to `ranks` readable
/// `size_t`s.
#[no_mangle]
pub unsafe extern "C" fn prepare_reduce_scatter_v(
    handle: *const PrepareHandle,
    input: *const c_void,
    output: *mut c_void,
    rows_per_rank: *const usize,
    ranks: u32,
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
            (Rows::PerRank(rows_per_rank, ranks), width),
            dtype,
            stream,
        )
    }
}

/// The all-gather's v-form (vLLM's `all_gatherv`): as [`prepare_all_gather`], rank r owning
/// `rows_per_rank[r]` rows, checked as [`prepare_reduce_scatter_v`] checks them. Counts equal
/// to the shape rule's go exactly as [`prepare_all_gather`]; any others through NCCL's grouped
/// sends and receives, bytes as given.
///
/// # Safety
/// As [`prepare_reduce_scatter_v`].
#[no_mangle]
pub unsafe extern "C" fn prepare_all_gather_v(
    handle: *const PrepareHandle,
    input: *const c_void,
    output: *mut c_void,
    rows_per_rank: *const usize,
    ranks: u32,
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
            (Rows::PerRank(rows_per_rank, ranks), width),
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

    /// The v-forms check their counts as a list before the handle, then the dtype and the
    /// shape of their sum.
    #[test]
    fn the_v_forms_check_their_counts_before_the_handle() {
        let null = std::ptr::null_mut();
        for call in [prepare_reduce_scatter_v, prepare_all_gather_v] {
            let counts: [usize; 3] = [2, 0, 5];
            // SAFETY: `counts` holds 3 counts; every other pointer is null, refused first.
            let status =
                unsafe { call(std::ptr::null(), null, null, counts.as_ptr(), 3, 4, 0, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(last_error(), "handle is NULL");
            // SAFETY: as above.
            let status = unsafe {
                call(
                    std::ptr::null(),
                    null,
                    null,
                    std::ptr::null(),
                    2,
                    4,
                    0,
                    null,
                )
            };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(last_error(), "rows_per_rank is NULL");
            let overflowing: [usize; 2] = [usize::MAX, 1];
            // SAFETY: as above.
            let status = unsafe {
                call(
                    std::ptr::null(),
                    null,
                    null,
                    overflowing.as_ptr(),
                    2,
                    4,
                    0,
                    null,
                )
            };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(
                last_error(),
                "rows_per_rank's counts on 2 ranks sum to more than 2^64 - 1 rows"
            );
            // SAFETY: as above.
            let status =
                unsafe { call(std::ptr::null(), null, null, counts.as_ptr(), 3, 0, 0, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(
                last_error(),
                "a message of 7 rows of width 0: the width must be at least 1"
            );
            // SAFETY: as above.
            let status =
                unsafe { call(std::ptr::null(), null, null, counts.as_ptr(), 3, 4, 9, null) };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert!(last_error().starts_with("dtype 9 is not a PrepareDtype"));
            // No counts to read: NULL is taken, and the world is checked with the handle.
            // SAFETY: as above.
            let status = unsafe {
                call(
                    std::ptr::null(),
                    null,
                    null,
                    std::ptr::null(),
                    0,
                    4,
                    0,
                    null,
                )
            };
            assert_eq!(status, PrepareStatus::InvalidArgument);
            assert_eq!(last_error(), "handle is NULL");
        }
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
