//! Settings NCCL reads only from the process environment, set for one step and removed after
//! it. A library must not leave its host's environment changed: a host's own later NCCL set-up
//! (PyTorch's) reads the same variables. So a variable is set only where it is unset, only for
//! as long as a [`Scoped`] lives, and removed when the last scope holding it ends, on every path
//! (an error, a panic); a value someone else wrote meanwhile is left alone.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::{Mutex, PoisonError};

/// The variables this process's scopes set, with the value set and how many scopes hold it.
/// The lock serialises this module's own changes; it cannot stop another thread's `getenv`.
static HELD: Mutex<BTreeMap<String, Held>> = Mutex::new(BTreeMap::new());

#[derive(Debug)]
struct Held {
    value: OsString,
    scopes: usize,
}

/// Variables set in the process environment while this lives (see the module's description).
#[derive(Debug)]
#[must_use = "the variables are removed when the scope is dropped"]
pub struct Scoped {
    // The names this scope holds: set by it, or by another scope still alive.
    names: Vec<String>,
}

impl Scoped {
    /// Sets each of `variables` that the environment does not hold yet; one another scope set
    /// is shared with it; one the process set itself is left as it is.
    pub fn set_where_unset(variables: &[(String, String)]) -> Scoped {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        let mut names = Vec::with_capacity(variables.len());
        for (name, value) in variables {
            if let Some(entry) = held.get_mut(name) {
                entry.scopes += 1;
                names.push(name.clone());
            } else if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
                held.insert(
                    name.clone(),
                    Held {
                        value: OsString::from(value),
                        scopes: 1,
                    },
                );
                names.push(name.clone());
            }
        }
        Scoped { names }
    }

    /// The names this scope holds set.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl Drop for Scoped {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        for name in &self.names {
            let Some(entry) = held.get_mut(name) else {
                continue;
            };
            entry.scopes -= 1;
            if entry.scopes > 0 {
                continue;
            }
            let Some(entry) = held.remove(name) else {
                continue;
            };
            // Unset before, so unset again; unless someone wrote another value meanwhile.
            if std::env::var_os(name).as_ref() == Some(&entry.value) {
                std::env::remove_var(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variables(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_variable_is_set_for_the_scope_and_removed_after_a_failure() {
        const NAME: &str = "PREPARE_TEST_SCOPED_FAILURE";
        std::env::remove_var(NAME);
        let step = || -> Result<(), String> {
            let _scope = Scoped::set_where_unset(&variables(&[(NAME, "0")]));
            assert_eq!(std::env::var(NAME).as_deref(), Ok("0"));
            Err("the step failed".to_owned())
        };
        assert!(step().is_err());
        assert_eq!(std::env::var_os(NAME), None);
    }

    #[test]
    fn a_variable_is_removed_after_a_panic() {
        const NAME: &str = "PREPARE_TEST_SCOPED_PANIC";
        std::env::remove_var(NAME);
        let unwound = std::panic::catch_unwind(|| {
            let _scope = Scoped::set_where_unset(&variables(&[(NAME, "host:1")]));
            panic!("the step panicked");
        });
        assert!(unwound.is_err());
        assert_eq!(std::env::var_os(NAME), None);
    }

    #[test]
    fn the_processs_own_value_is_never_touched() {
        const NAME: &str = "PREPARE_TEST_SCOPED_OWN";
        std::env::set_var(NAME, "1");
        let scope = Scoped::set_where_unset(&variables(&[(NAME, "0")]));
        assert!(scope.names().is_empty());
        assert_eq!(std::env::var(NAME).as_deref(), Ok("1"));
        drop(scope);
        assert_eq!(std::env::var(NAME).as_deref(), Ok("1"));
        std::env::remove_var(NAME);
    }

    #[test]
    fn overlapping_scopes_remove_the_variable_when_the_last_ends() {
        const NAME: &str = "PREPARE_TEST_SCOPED_OVERLAP";
        std::env::remove_var(NAME);
        let first = Scoped::set_where_unset(&variables(&[(NAME, "0")]));
        let second = Scoped::set_where_unset(&variables(&[(NAME, "0")]));
        drop(first);
        assert_eq!(
            std::env::var(NAME).as_deref(),
            Ok("0"),
            "the second still holds it"
        );
        drop(second);
        assert_eq!(std::env::var_os(NAME), None);
    }

    #[test]
    fn a_value_written_meanwhile_by_someone_else_stays() {
        const NAME: &str = "PREPARE_TEST_SCOPED_REWRITTEN";
        std::env::remove_var(NAME);
        let scope = Scoped::set_where_unset(&variables(&[(NAME, "0")]));
        std::env::set_var(NAME, "theirs");
        drop(scope);
        assert_eq!(std::env::var(NAME).as_deref(), Ok("theirs"));
        std::env::remove_var(NAME);
    }
}
