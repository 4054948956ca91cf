//! Progress reporting: the library reports phases through a trait so that the binary can draw
//! bars and tests can stay silent.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Receives progress from long library operations.
pub trait Reporter: Sync {
    /// A phase with `total` steps begins.
    fn start(&self, phase: &str, total: u64);
    /// One step of the current phase is done; `item` names it.
    fn advance(&self, item: &str);
    /// The current phase is over.
    fn finish(&self);
    /// Something the user should know that changes no outcome (the cache is not kept); said
    /// once. Dropped unless the reporter shows it.
    fn note(&self, _message: &str) {}
}

/// A reporter that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Reporter for Silent {
    fn start(&self, _phase: &str, _total: u64) {}
    fn advance(&self, _item: &str) {}
    fn finish(&self) {}
}

/// Locks a reporter's state (reporters are called from several threads), also after a thread
/// panicked holding it: the state is only what to show, still fit to show.
pub fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
