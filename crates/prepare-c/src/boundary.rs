//! What every call does at the boundary: a failure becomes a status and the thread's last
//! error, a caught panic [`PrepareStatus::Internal`]; and the checks of the caller's pointers,
//! strings and dtype codes.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use prepare::gpu::abort::{Abort, AbortReason};
use prepare::ladder::Dtype;
use prepare::runtime::RuntimeError;
use prepare::select::SelectError;
use prepare::serve::ServeError;

use crate::{PrepareDtype, PrepareStatus};

/// A failure on its way to the caller: a status and its message.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: PrepareStatus,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: PrepareStatus::InvalidArgument,
            message: message.into(),
        }
    }
}

impl From<ServeError> for Failure {
    fn from(error: ServeError) -> Failure {
        Failure {
            status: status(&error),
            message: chain(&error),
        }
    }
}

/// The status a serving error is returned as.
fn status(error: &ServeError) -> PrepareStatus {
    match error {
        ServeError::NoPackage { .. }
        | ServeError::DtypeNotServed { .. }
        | ServeError::BadArgument { .. }
        | ServeError::CannotForce { .. }
        | ServeError::MessageTooLarge { .. } => PrepareStatus::InvalidArgument,
        ServeError::DuplicateDtype { .. } | ServeError::WorldSize { .. } => {
            PrepareStatus::PackageRefused
        }
        ServeError::PeerTimeout { .. } => PrepareStatus::PeerTimeout,
        ServeError::Runtime(error) | ServeError::Select(SelectError::Runtime(error)) => {
            runtime_status(error)
        }
        ServeError::Select(_) | ServeError::Aborted { .. } => PrepareStatus::RuntimeFailure,
    }
}

fn runtime_status(error: &RuntimeError) -> PrepareStatus {
    match error {
        RuntimeError::Timeout { .. }
        | RuntimeError::Aborted {
            abort:
                Abort {
                    reason: AbortReason::PeerTimeout,
                    ..
                },
            ..
        } => PrepareStatus::PeerTimeout,
        RuntimeError::WrongArchitecture { .. } => PrepareStatus::PackageRefused,
        _ => PrepareStatus::RuntimeFailure,
    }
}

/// An error and its sources, joined with ": ".
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

thread_local! {
    pub(crate) static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a panic without a message"
    }
}

/// Runs a call's body: its failure or a caught panic becomes a status and the last error.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> PrepareStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => PrepareStatus::Ok,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.status
        }
        Err(payload) => {
            set_last_error(&format!(
                "internal error in prepare (please report it): {}",
                panic_message(payload.as_ref())
            ));
            PrepareStatus::Internal
        }
    }
}

/// The one place C dtype codes become the library's dtypes.
pub(crate) fn dtype(code: i32) -> Result<Dtype, Failure> {
    const DTYPES: [(i32, Dtype); 3] = [
        (PrepareDtype::Bf16 as i32, Dtype::Bf16),
        (PrepareDtype::Fp16 as i32, Dtype::Fp16),
        (PrepareDtype::Fp32 as i32, Dtype::Fp32),
    ];
    DTYPES
        .iter()
        .find(|(known, _)| *known == code)
        .map(|(_, dtype)| *dtype)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "dtype {code} is not a PrepareDtype (0 bf16, 1 fp16, 2 fp32)"
            ))
        })
}

/// A non-null pointer's target, or InvalidArgument naming the argument.
///
/// # Safety
/// `pointer` is null or points to a live `T` for `'a`.
pub(crate) unsafe fn reference<'a, T>(pointer: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises a null or live pointer; null is refused by `as_ref`.
    unsafe { pointer.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

/// A C string's bytes, or InvalidArgument naming the argument.
///
/// # Safety
/// `text` is null or a NUL-terminated string live for `'a`.
pub(crate) unsafe fn c_str<'a>(text: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null (checked above) and NUL-terminated by the caller's promise.
    Ok(unsafe { CStr::from_ptr(text) })
}

/// Writes `value` through `out`, or InvalidArgument naming it when null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn write<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not null (checked above) and writable by the caller's promise.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` with its NUL into `buffer` when it fits; always reports the size needed.
///
/// # Safety
/// `buffer` is null or valid for `capacity` bytes; `needed` is null or writable.
pub(crate) unsafe fn copy_out(
    text: &str,
    buffer: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> Result<(), Failure> {
    let size = text.len() + 1;
    if !needed.is_null() {
        // SAFETY: not null, and writable by the caller's promise.
        unsafe { needed.write(size) };
    }
    if buffer.is_null() {
        if needed.is_null() {
            return Err(Failure::invalid("buffer and needed are both NULL"));
        }
        return Ok(());
    }
    if capacity < size {
        return Err(Failure::invalid(format!(
            "the buffer holds {capacity} bytes, {size} are needed (with the NUL)"
        )));
    }
    // SAFETY: `buffer` holds at least `size` bytes (checked above) and does not overlap the
    // Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), text.len());
        buffer.add(text.len()).write(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: prepare_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(crate::prepare_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, PrepareStatus::Internal);
        assert!(last_error().contains("boom"), "{}", last_error());
    }

    #[test]
    fn dtypes_map_in_one_place() {
        assert_eq!(dtype(0).unwrap(), Dtype::Bf16);
        assert_eq!(dtype(1).unwrap(), Dtype::Fp16);
        assert_eq!(dtype(2).unwrap(), Dtype::Fp32);
        let failure = dtype(7).unwrap_err();
        assert_eq!(failure.status, PrepareStatus::InvalidArgument);
        assert!(failure.message.contains("dtype 7"));
    }

    #[test]
    fn copy_out_reports_the_size_and_refuses_a_short_buffer() {
        let mut needed = 0;
        // SAFETY: a null buffer and a live `needed`.
        let asked = unsafe { copy_out("abc", std::ptr::null_mut(), 0, &raw mut needed) };
        assert!(asked.is_ok());
        assert_eq!(needed, 4);
        let mut short = [0 as c_char; 3];
        // SAFETY: a live buffer of 3 bytes.
        let failure = unsafe { copy_out("abc", short.as_mut_ptr(), short.len(), &raw mut needed) }
            .unwrap_err();
        assert!(
            failure.message.contains("4 are needed"),
            "{}",
            failure.message
        );
        let mut room = [1 as c_char; 4];
        // SAFETY: a live buffer of 4 bytes.
        unsafe { copy_out("abc", room.as_mut_ptr(), room.len(), std::ptr::null_mut()) }.unwrap();
        // SAFETY: copy_out wrote a NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(room.as_ptr()) }.to_bytes(), b"abc");
    }
}
