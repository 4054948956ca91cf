//! Opening a package: the manifest's contract, schema and checksum first, then every file
//! against the manifest, then the ladder, then the manifest against the ladder.
//!
//! Every file is read through one handle on the package directory, so an export swapping a new
//! package in meanwhile cannot mix two packages: the reader gets the old package, or, when the
//! old files are removed under it, a refusal that says the package changed while it was read
//! (which [`open_package_retrying`] answers by opening it once more).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use super::check::{check_manifest, ladder_problems, parse_manifest};
use super::manifest::Manifest;
use super::{
    refused_if_any, FileProblem, FileProblemKind, Package, PackageError, Problem, KERNELS_DIR,
    LADDER_FILE, MANIFEST_FILE,
};
use crate::files::{self, read_limited_at};
use crate::hash::sha256_hex;
use crate::ladder::Ladder;

/// Opens the package in `dir` and verifies it: a contract this tool reads, a manifest that fits
/// the schema and its checksum, every file's sha256 and size, no missing or extra file, a valid
/// ladder that agrees with the manifest.
pub fn open_package(dir: &Path) -> Result<Package, PackageError> {
    open_observed(dir, &|| {})
}

fn open_observed(dir: &Path, after_manifest: &dyn Fn()) -> Result<Package, PackageError> {
    let handle = match files::open_directory(dir) {
        Ok(handle) => handle,
        Err(error) if error.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(PackageError::NotADirectory {
                path: dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(PackageError::Io {
                action: "open the package",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    open_through(dir, &handle, after_manifest).map_err(|error| {
        // A file that went missing or changed may be a package swapped in meanwhile, not a
        // damaged one: said as such, never as a false report about a file.
        if matches!(
            error,
            PackageError::Files { .. } | PackageError::NoManifest { .. }
        ) && swapped(dir, &handle)
        {
            PackageError::Changed {
                dir: dir.to_path_buf(),
            }
        } else {
            error
        }
    })
}

/// Opens the package as [`open_package`] does, once more when it changed while it was read (an
/// export replaced it): what a server opens its package with at start.
pub fn open_package_retrying(dir: &Path) -> Result<Package, PackageError> {
    match open_package(dir) {
        Err(PackageError::Changed { .. }) => open_package(dir),
        other => other,
    }
}

/// Whether the directory open as `handle` is no longer the one at `dir`, or was removed.
fn swapped(dir: &Path, handle: &fs::File) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(opened) = handle.metadata() else {
        return true;
    };
    match fs::metadata(dir) {
        Ok(now) => (now.dev(), now.ino()) != (opened.dev(), opened.ino()) || opened.nlink() == 0,
        Err(_) => true,
    }
}

/// `after_manifest` runs between reading the manifest and the other files (tests swap the
/// package there).
fn open_through(
    dir: &Path,
    handle: &fs::File,
    after_manifest: &dyn Fn(),
) -> Result<Package, PackageError> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_bytes = match read_limited_at(handle, Path::new(MANIFEST_FILE), files::MANIFEST) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(PackageError::NoManifest {
                dir: dir.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(PackageError::Io {
                action: "read",
                path: manifest_path,
                source,
            });
        }
    };
    let manifest = parse_manifest(&manifest_path, &manifest_bytes)?;
    let found = manifest.compute_checksum();
    if found != manifest.checksum {
        return Err(PackageError::Files {
            dir: dir.to_path_buf(),
            problems: vec![FileProblem {
                path: MANIFEST_FILE.to_string(),
                kind: FileProblemKind::ChecksumMismatch {
                    expected: manifest.checksum.clone(),
                    found,
                },
            }],
        });
    }
    check_manifest(&manifest_path, &manifest)?;
    after_manifest();

    let mut contents = verify_files(dir, handle, &manifest)?;
    let ladder_bytes = contents
        .remove(LADDER_FILE)
        .expect("verified files include the ladder");
    let cubins = manifest
        .kernels
        .iter()
        .map(|kernel| {
            contents
                .remove(&kernel.file)
                .expect("verified files include every kernel")
        })
        .collect();

    let ladder_path = dir.join(LADDER_FILE);
    let ladder = parse_ladder(&ladder_path, &ladder_bytes)?;
    refused_if_any(ladder_problems(&manifest, &ladder), |problems| {
        PackageError::ManifestInconsistent {
            path: manifest_path,
            problems,
        }
    })?;

    Ok(Package {
        dir: dir.to_path_buf(),
        identity: sha256_hex(&manifest_bytes),
        manifest,
        ladder,
        cubins,
    })
}

/// Compares every file of the package open as `handle` with the manifest; returns the contents
/// of the ladder and the cubins by relative path.
fn verify_files(
    dir: &Path,
    handle: &fs::File,
    manifest: &Manifest,
) -> Result<BTreeMap<String, Vec<u8>>, PackageError> {
    // Per file: its sha256 and, for a cubin, its kernel's index and recorded size.
    type Expected<'manifest> = (&'manifest str, Option<(usize, u64)>);
    let mut expected: BTreeMap<String, Expected> = BTreeMap::new();
    expected.insert(LADDER_FILE.to_string(), (&manifest.ladder.sha256, None));
    for (index, kernel) in manifest.kernels.iter().enumerate() {
        expected.insert(
            kernel.file.clone(),
            (&kernel.sha256, Some((index, kernel.size_bytes))),
        );
    }

    let mut problems = Vec::new();
    let mut present = BTreeSet::new();
    let mut listing = Vec::new();
    list(handle, "", &mut listing).map_err(|(relative, source)| PackageError::Io {
        action: "list",
        path: dir.join(relative),
        source,
    })?;
    for (relative, kind) in listing {
        let is_listed = relative == MANIFEST_FILE || expected.contains_key(&relative);
        match kind {
            EntryKind::NotUtf8 => problems.push(FileProblem {
                path: relative,
                kind: FileProblemKind::NotUtf8,
            }),
            EntryKind::File if is_listed => {
                present.insert(relative);
            }
            EntryKind::Directory if relative == KERNELS_DIR => {}
            EntryKind::Other | EntryKind::Directory if is_listed || relative == KERNELS_DIR => {
                problems.push(FileProblem {
                    path: relative,
                    kind: FileProblemKind::NotAFile,
                });
            }
            EntryKind::Directory => problems.push(FileProblem {
                path: format!("{relative}/"),
                kind: FileProblemKind::Extra,
            }),
            _ => problems.push(FileProblem {
                path: relative,
                kind: FileProblemKind::Extra,
            }),
        }
    }

    let mut contents = BTreeMap::new();
    let mut sizes = Vec::new();
    for (relative, (expected_sha, size)) in expected {
        if !present.contains(&relative) {
            if !problems.iter().any(|problem| problem.path == relative) {
                problems.push(FileProblem {
                    path: relative,
                    kind: FileProblemKind::Missing,
                });
            }
            continue;
        }
        let limit = if relative == LADDER_FILE {
            files::LADDER
        } else {
            files::CUBIN
        };
        match read_limited_at(handle, Path::new(&relative), limit) {
            Ok(bytes) => {
                let found = sha256_hex(&bytes);
                if found != expected_sha {
                    problems.push(FileProblem {
                        path: relative,
                        kind: FileProblemKind::Changed {
                            expected: expected_sha.to_string(),
                            found,
                        },
                    });
                    continue;
                }
                if let Some((index, recorded)) = size {
                    if recorded != bytes.len() as u64 {
                        sizes.push(Problem {
                            pointer: format!("/kernels/{index}/size_bytes"),
                            message: format!(
                                "is {recorded}; {relative}, whose sha256 it records, holds {} bytes",
                                bytes.len()
                            ),
                        });
                    }
                }
                contents.insert(relative, bytes);
            }
            Err(error) => problems.push(FileProblem {
                path: relative,
                kind: FileProblemKind::Unreadable(error.to_string()),
            }),
        }
    }

    problems.sort_by(|left, right| left.path.cmp(&right.path));
    refused_if_any(problems, |problems| PackageError::Files {
        dir: dir.to_path_buf(),
        problems,
    })?;
    refused_if_any(sizes, |problems| PackageError::ManifestInconsistent {
        path: dir.join(MANIFEST_FILE),
        problems,
    })?;
    Ok(contents)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Directory,
    Other,
    /// Its name, escaped in the listing, is not UTF-8.
    NotUtf8,
}

/// Every entry under the directory `relative` of the package open as `root`, links not
/// followed; only the kernels directory is descended into, since nothing else in a package is
/// a directory.
fn list(
    root: &fs::File,
    relative: &str,
    entries: &mut Vec<(String, EntryKind)>,
) -> Result<(), (String, std::io::Error)> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::{fstatat, Mode, SFlag};
    let at = if relative.is_empty() { "." } else { relative };
    let fail = |error: nix::errno::Errno| (relative.to_string(), std::io::Error::from(error));
    let mut directory = nix::dir::Dir::openat(
        root,
        at,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail)?;
    let mut names = Vec::new();
    for entry in directory.iter() {
        let entry = entry.map_err(fail)?;
        let Ok(name) = entry.file_name().to_str() else {
            // No package file has such a name, and it cannot be named in a message as it is.
            let escaped = entry.file_name().to_bytes().escape_ascii().to_string();
            let path = if relative.is_empty() {
                escaped
            } else {
                format!("{relative}/{escaped}")
            };
            entries.push((path, EntryKind::NotUtf8));
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        names.push(name.to_owned());
    }
    for name in names {
        let path = if relative.is_empty() {
            name
        } else {
            format!("{relative}/{name}")
        };
        let status = fstatat(
            root,
            path.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|error| (path.clone(), std::io::Error::from(error)))?;
        let format = SFlag::from_bits_truncate(status.st_mode) & SFlag::S_IFMT;
        let kind = if format == SFlag::S_IFREG {
            EntryKind::File
        } else if format == SFlag::S_IFDIR {
            EntryKind::Directory
        } else {
            EntryKind::Other
        };
        if kind == EntryKind::Directory && path == KERNELS_DIR {
            list(root, &path, entries)?;
        }
        entries.push((path, kind));
    }
    Ok(())
}

fn parse_ladder(path: &Path, bytes: &[u8]) -> Result<Ladder, PackageError> {
    crate::ladder::validate_ladder_bytes(bytes).map_err(|report| PackageError::InvalidLadder {
        path: path.to_path_buf(),
        report: format!("{}\n{}", report.summary(), report.render_for(path)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Compilation;
    use crate::ladder::Arch;

    /// A package of an NCCL-only ladder (it needs no kernel) named `name`, written at `out`.
    fn write_nccl_package(out: &Path, name: &str) {
        let text = format!(
            r#"{{ "format_version": 1, "name": "{name}", "collective": "all_reduce",
  "dtype": "bf16", "world_size": 2, "targets": ["sm_90"],
  "profiles": [ {{ "id": "nccl", "algorithm": "nccl" }} ],
  "buckets": [ {{ "max_bytes": 65536, "threads": 512, "blocks": 8, "candidates": ["nccl"],
    "default": "nccl" }} ] }}"#
        );
        let ladder = crate::ladder::validate_ladder_text(&text).unwrap();
        let compilation = Compilation {
            nvrtc_version: (13, 0),
            options: Vec::new(),
            kernels: Vec::new(),
        };
        super::super::write_package(out, &text, &ladder, &compilation, Arch::Sm90, false).unwrap();
    }

    fn swap(staged: &Path, out: &Path) {
        super::super::write::exchange(staged, out).unwrap();
    }

    #[test]
    fn a_reader_racing_a_swap_gets_the_old_package_or_a_changed_refusal() {
        let scratch = tempfile::tempdir().unwrap();
        let out = scratch.path().join("pkg");
        let staged = scratch.path().join("staged");
        write_nccl_package(&out, "old");
        write_nccl_package(&staged, "new");

        // Swapped after the manifest was read, the old package still whole: it is what is read.
        let package = open_observed(&out, &|| swap(&staged, &out)).unwrap();
        assert_eq!(package.ladder().name, "old");
        assert_eq!(open_package(&out).unwrap().ladder().name, "new");

        // Swapped and the old one removed, as an export does: a refusal that says so, and the
        // retry at serve start reads the new one.
        swap(&staged, &out);
        let error = open_observed(&out, &|| {
            swap(&staged, &out);
            std::fs::remove_dir_all(&staged).unwrap();
        })
        .unwrap_err();
        assert!(matches!(error, PackageError::Changed { .. }), "{error}");
        assert!(error.to_string().contains("changed while it was read"));
        assert_eq!(open_package_retrying(&out).unwrap().ladder().name, "new");
    }
}
