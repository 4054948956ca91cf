//! What every call does at the boundary: a failure becomes a status and the thread's last
//! error, a caught panic [`PrepareStatus::Internal`] (and nothing on the host's stderr); and
//! the checks of the caller's pointers, strings, collective and dtype codes.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use prepare::gpu::abort::{Abort, AbortReason};
use prepare::ladder::{Collective, Dtype};
use prepare::runtime::RuntimeError;
use prepare::select::SelectError;
use prepare::serve::ServeError;

use crate::{PrepareCollective, PrepareDtype, PrepareStatus};

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
        | ServeError::NotServed { .. }
        | ServeError::BadArgument { .. }
        | ServeError::CannotForce { .. }
        | ServeError::MessageTooLarge { .. }
        | ServeError::CallsDisagree { .. } => PrepareStatus::InvalidArgument,
        ServeError::DuplicatePackage { .. } | ServeError::WorldSize { .. } => {
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
        error if error.is_caller_mistake() => PrepareStatus::InvalidArgument,
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
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    // The last error of a call made once this thread's LAST_ERROR is gone (from a thread-exit
    // destructor): a pointer from `CString::into_raw`. It has no destructor, so it can always
    // be reached; the one it holds when the thread ends is not freed.
    static LATE_ERROR: Cell<*mut c_char> = const { Cell::new(std::ptr::null_mut()) };
    // Calls of this library running on this thread: a panic inside one is caught and reported
    // by `guard`, so the panic hook keeps it off the host's stderr.
    static INSIDE: Cell<usize> = const { Cell::new(0) };
    // Where the panic that `guard` is about to report happened.
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn set_last_error(message: &str) {
    let mut text = Some(CString::new(message.replace('\0', "\\0")).unwrap_or_default());
    let kept = LAST_ERROR.try_with(|last| {
        if let Some(text) = text.take() {
            *last.borrow_mut() = text;
        }
    });
    if let (Err(_), Some(text)) = (kept, text) {
        let _ = LATE_ERROR.try_with(|late| {
            let previous = late.replace(text.into_raw());
            if !previous.is_null() {
                // SAFETY: every pointer LATE_ERROR holds came from `CString::into_raw` and is
                // taken back once, here, when it is replaced.
                drop(unsafe { CString::from_raw(previous) });
            }
        });
    }
}

/// This thread's last error, as [`crate::prepare_last_error`] returns it: valid until the
/// thread's next failed call.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|last| last.borrow().as_ptr())
        .ok()
        .or_else(|| {
            LATE_ERROR
                .try_with(Cell::get)
                .ok()
                .filter(|late| !late.is_null())
                .map(<*mut c_char>::cast_const)
        })
        .unwrap_or(c"".as_ptr())
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

/// Installs, once, a panic hook that says nothing of a panic inside a call of this library
/// (`guard` reports it as [`PrepareStatus::Internal`]) and hands every other panic to the hook
/// that was there before, so a host's own panics are reported as they were.
fn quiet_panics_inside_calls() {
    static INSTALL: Once = Once::new();
    // The hook cannot be replaced while this thread panics; a later call installs it.
    if std::thread::panicking() {
        return;
    }
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if INSIDE.try_with(Cell::get).unwrap_or(0) == 0 {
                previous(info);
                return;
            }
            let location = info.location().map(ToString::to_string);
            let _ = PANIC_LOCATION.try_with(|place| *place.borrow_mut() = location);
        }));
    });
}

/// Runs a call's body: its failure or a caught panic becomes a status and the last error.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> PrepareStatus {
    quiet_panics_inside_calls();
    let _ = INSIDE.try_with(|calls| calls.set(calls.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(body));
    let _ = INSIDE.try_with(|calls| calls.set(calls.get().saturating_sub(1)));
    match result {
        Ok(Ok(())) => PrepareStatus::Ok,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.status
        }
        Err(payload) => {
            let location = PANIC_LOCATION
                .try_with(|place| place.borrow_mut().take())
                .ok()
                .flatten()
                .map_or_else(String::new, |location| format!(" (at {location})"));
            set_last_error(&format!(
                "internal error in prepare (please report it): {}{location}",
                panic_message(payload.as_ref())
            ));
            PrepareStatus::Internal
        }
    }
}

/// The one place C collective codes become the library's collectives.
pub(crate) fn collective(code: i32) -> Result<Collective, Failure> {
    const COLLECTIVES: [(i32, Collective); 4] = [
        (PrepareCollective::AllReduce as i32, Collective::AllReduce),
        (
            PrepareCollective::ReduceScatter as i32,
            Collective::ReduceScatter,
        ),
        (PrepareCollective::AllGather as i32, Collective::AllGather),
        (
            PrepareCollective::AllReduceAddRmsNorm as i32,
            Collective::AllReduceAddRmsNorm,
        ),
    ];
    COLLECTIVES
        .iter()
        .find(|(known, _)| *known == code)
        .map(|(_, collective)| *collective)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "collective {code} is not a PrepareCollective (0 all_reduce, 1 reduce_scatter, \
                 2 all_gather, 3 all_reduce_add_rms_norm)"
            ))
        })
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

    /// A call from a thread-exit destructor, once the thread's own storage is gone (a
    /// thread-local registered before the last error is destroyed after it): a status and a
    /// message, not an abort.
    #[test]
    fn a_failing_call_from_a_thread_exit_destructor_keeps_its_message() {
        struct AtExit(std::sync::mpsc::Sender<(PrepareStatus, String)>);
        impl Drop for AtExit {
            fn drop(&mut self) {
                // SAFETY: a null `options` is refused.
                let status = unsafe { crate::prepare_options_init(std::ptr::null_mut()) };
                let _ = self.0.send((status, last_error()));
            }
        }
        thread_local! {
            static AT_EXIT: RefCell<Option<AtExit>> = const { RefCell::new(None) };
        }
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            AT_EXIT.with(|at_exit| *at_exit.borrow_mut() = Some(AtExit(send)));
            assert_eq!(
                guard(|| Err(Failure::invalid("first"))),
                PrepareStatus::InvalidArgument
            );
        })
        .join()
        .expect("the thread ends without a panic");
        let (status, message) = receive.recv().expect("the destructor ran");
        assert_eq!(status, PrepareStatus::InvalidArgument);
        assert_eq!(message, "options is NULL");
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, PrepareStatus::Internal);
        assert!(last_error().contains("boom"), "{}", last_error());
    }

    /// In a child process (this test binary again, this test alone): a panic inside a call
    /// leaves stderr empty, while a panic of the host's own still reaches the hook that was
    /// there before.
    #[test]
    fn a_caught_panic_prints_nothing_and_a_hosts_panic_is_reported_as_before() {
        const CHILD: &str = "PREPARE_C_PANIC_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(guard(|| panic!("boom")), PrepareStatus::Internal);
            assert!(last_error().contains("boom (at "), "{}", last_error());
            assert!(std::panic::catch_unwind(|| panic!("the host's own panic")).is_err());
            return;
        }
        let test = "boundary::tests::a_caught_panic_prints_nothing_and_a_hosts_panic_is_reported_as_before";
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("the test binary runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{stderr}"
        );
        assert!(
            !stderr.contains("boom"),
            "a caught panic was printed:\n{stderr}"
        );
        assert!(stderr.contains("the host's own panic"), "{stderr}");
    }

    #[test]
    fn a_callers_mistake_found_by_the_runtime_is_an_invalid_argument() {
        let timeout = RuntimeError::TimeoutOutOfRange {
            rank: 0,
            seconds: 1e19,
        };
        let failure = Failure::from(ServeError::Select(SelectError::Runtime(timeout)));
        assert_eq!(failure.status, PrepareStatus::InvalidArgument);
        assert!(
            failure.message.contains("the timeout"),
            "{}",
            failure.message
        );
        let operands = RuntimeError::Operands {
            rank: 1,
            source: prepare::runtime::OperandError::TooShort {
                operand: "input",
                holds: 16,
                bytes: 32,
            },
        };
        let failure = Failure::from(ServeError::from(operands));
        assert_eq!(failure.status, PrepareStatus::InvalidArgument);
        assert_eq!(
            failure.message,
            "rank 1: the input holds 16 bytes, the message 32"
        );
        let disagree = ServeError::CallsDisagree {
            rank: 0,
            other: 1,
            ours: "all_reduce bf16 of 8 elements".to_owned(),
            theirs: "all_reduce bf16 of 9 elements".to_owned(),
        };
        let failure = Failure::from(disagree);
        assert_eq!(failure.status, PrepareStatus::InvalidArgument);
        assert!(
            failure
                .message
                .contains("rank 1 all_reduce bf16 of 9 elements"),
            "{}",
            failure.message
        );
        let fault = RuntimeError::Setup {
            rank: 0,
            message: "peer memory needs peer kernels".to_owned(),
        };
        assert_eq!(
            Failure::from(ServeError::from(fault)).status,
            PrepareStatus::RuntimeFailure
        );
    }

    #[test]
    fn collectives_map_in_one_place_in_the_order_of_the_library() {
        for (code, expected) in Collective::ALL.into_iter().enumerate() {
            assert_eq!(collective(i32::try_from(code).unwrap()).unwrap(), expected);
        }
        for code in [-1, 4, i32::MAX] {
            let failure = collective(code).unwrap_err();
            assert_eq!(failure.status, PrepareStatus::InvalidArgument);
            assert!(
                failure
                    .message
                    .starts_with(&format!("collective {code} is not a PrepareCollective")),
                "{}",
                failure.message
            );
        }
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
