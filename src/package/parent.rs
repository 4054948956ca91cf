//! The directory a package is written into: its missing directories made, each by one export
//! alone, and locked, so that writers of one directory stage and swap in turn; on failure an
//! export removes the directories it made while they are empty, and never what another wrote
//! there.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::PackageError;

/// How often the output's directory is made and locked again when another export removed it
/// meanwhile (it made the directory, then failed).
const LOCK_ATTEMPTS: usize = 16;

/// Makes `directory` and its missing ancestors and locks it: returns the directories this call
/// made, outermost first (each made by this process alone: `mkdir` fails for the others), and
/// the lock on `directory`, which is still the directory at that path.
pub(super) fn create_and_lock(
    directory: &Path,
) -> Result<(Vec<PathBuf>, nix::fcntl::Flock<File>), PackageError> {
    let mut created = Vec::new();
    for _ in 0..LOCK_ATTEMPTS {
        match create_missing_directories(directory, &mut created) {
            Ok(()) => {}
            Err((_, source)) if source.kind() == std::io::ErrorKind::NotFound => continue,
            Err((path, source)) => {
                remove_created(&created);
                return Err(io_error("create", &path, source));
            }
        }
        let lock = match lock_directory(directory) {
            Ok(lock) => lock,
            Err(PackageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue
            }
            Err(error) => {
                remove_created(&created);
                return Err(error);
            }
        };
        if is_at(&lock, directory) {
            return Ok((created, lock));
        }
    }
    remove_created(&created);
    Err(io_error(
        "create",
        directory,
        std::io::Error::other(format!(
            "it was removed again while it was being made, {LOCK_ATTEMPTS} times"
        )),
    ))
}

/// Makes the missing directories from the outermost down to `directory`, adding those this call
/// made to `created`; the path and error of the first that could not be made.
fn create_missing_directories(
    directory: &Path,
    created: &mut Vec<PathBuf>,
) -> Result<(), (PathBuf, std::io::Error)> {
    let mut missing = Vec::new();
    let mut current = directory;
    loop {
        match fs::metadata(current) {
            Ok(_) => break,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                missing.push(current);
                match current.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => current = parent,
                    _ => break,
                }
            }
            Err(error) => return Err((current.to_path_buf(), error)),
        }
    }
    for dir in missing.into_iter().rev() {
        match fs::create_dir(dir) {
            Ok(()) => created.push(dir.to_path_buf()),
            // Made by another export meanwhile: its own to remove, never this one's.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err((dir.to_path_buf(), error)),
        }
    }
    Ok(())
}

/// Removes the directories this export made, innermost first, while they are empty: one that
/// holds anything holds another's files (an export that found it made), and it and the
/// directories above it stay.
pub(super) fn remove_created(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        if fs::remove_dir(dir).is_err() {
            break;
        }
    }
}

/// Whether the directory locked as `lock` is still the one at `path`: the export that made it
/// may have removed it before the lock was granted.
fn is_at(lock: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (lock.metadata(), fs::metadata(path)) {
        (Ok(locked), Ok(now)) => (locked.dev(), locked.ino()) == (now.dev(), now.ino()),
        _ => false,
    }
}

/// An exclusive advisory lock on `dir`, held while a package is staged and swapped there and
/// released when dropped.
fn lock_directory(dir: &Path) -> Result<nix::fcntl::Flock<File>, PackageError> {
    let handle =
        crate::files::open_directory(dir).map_err(|source| io_error("open", dir, source))?;
    nix::fcntl::Flock::lock(handle, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| io_error("lock", dir, errno.into()))
}

/// The package error for `action` on `path` failing.
pub(super) fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> PackageError {
    PackageError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
