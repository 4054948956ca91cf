//! Writing a package: build the manifest from the ladder and the compilation, write every file
//! into a staging directory next to the output, sync, then move it into place: a rename for a
//! new output; for `--force`, one atomic exchange with the old package (`renameat2` with
//! `RENAME_EXCHANGE`), after which the old one is removed. Where the file system cannot
//! exchange, the old package moves aside and the new one in, two renames: a crash between them
//! leaves no package at the output, the new one staged beside it and the old one in
//! `.<name>.replaced-*/old`, which the next export to the same place moves back before it
//! removes anything. Writers of one directory hold an advisory lock on it while they stage and
//! swap, so one never removes another's staging, and every staging or replaced directory found
//! under the lock was left by a killed run and is removed.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::check::{check_manifest, peer_memory};
use super::manifest::{
    BucketRecord, CandidateRecord, CompilerRecord, KernelRecord, LadderRecord, Manifest,
    Qualification,
};
use super::parent::{create_and_lock, io_error, remove_created};
use super::{
    kernel_file, PackageError, PackageSummary, KERNELS_DIR, LADDER_FILE, MANIFEST_FILE,
    PACKAGE_FORMAT_VERSION,
};
use crate::compile::Compilation;
use crate::hash::sha256_hex;
use crate::kernels;
use crate::ladder::{Arch, Ladder};

/// Writes a package for `arch` into `out`, without qualification.
///
/// `ladder_text` is the ladder file's text as given (stored as `ladder.json`); `ladder` is what
/// it validated to; `compilation` holds the kernels compiled for `arch`. An existing `out` is
/// refused unless `force`; with `force` an existing package (or empty directory) is replaced
/// atomically. A failure leaves `out` as it was and nothing else behind.
pub fn write_package(
    out: &Path,
    ladder_text: &str,
    ladder: &Ladder,
    compilation: &Compilation,
    arch: Arch,
    force: bool,
) -> Result<PackageSummary, PackageError> {
    write_qualified_package(out, ladder_text, ladder, compilation, arch, None, force)
}

/// Writes a package as [`write_package`] does, recording the qualification run on GPUs.
pub fn write_qualified_package(
    out: &Path,
    ladder_text: &str,
    ladder: &Ladder,
    compilation: &Compilation,
    arch: Arch,
    qualification: Option<Qualification>,
    force: bool,
) -> Result<PackageSummary, PackageError> {
    let (parent, name) = split_output(out)?;
    check_output(out, force)?;
    let manifest = build_manifest(ladder_text, ladder, compilation, arch, qualification)?;
    let manifest_bytes = manifest.to_bytes();

    // Missing parent directories are made, and those this export made are removed again if it
    // fails while they are empty, so that a failed export leaves nothing behind and never
    // removes what another wrote there meanwhile.
    let (created, lock) = create_and_lock(&parent)?;
    let mut exists = false;
    let written = remove_leftovers(&parent, &name).and_then(|()| {
        // Checked again under the lock: another export may have written it meanwhile.
        exists = check_output(out, force)?;
        write_and_install(
            out,
            &parent,
            &name,
            exists,
            &manifest,
            &manifest_bytes,
            compilation,
            ladder_text,
        )
    });
    if written.is_err() {
        // Under the lock, so that an export waiting for it finds its directory gone and makes
        // it again rather than write into a removed one.
        remove_created(&created);
    }
    drop(lock);
    written?;

    Ok(PackageSummary {
        dir: out.to_path_buf(),
        identity: sha256_hex(&manifest_bytes),
        arch,
        kernels: manifest.kernels.len(),
        buckets: manifest.buckets.len(),
        replaced: exists,
    })
}

#[allow(clippy::too_many_arguments)]
fn write_and_install(
    out: &Path,
    parent: &Path,
    name: &str,
    exists: bool,
    manifest: &Manifest,
    manifest_bytes: &[u8],
    compilation: &Compilation,
    ladder_text: &str,
) -> Result<(), PackageError> {
    let prefix = format!(".{name}.staging-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // The umask applies, so the package gets the permissions of any directory made there.
        builder.permissions(fs::Permissions::from_mode(0o777));
    }
    let staging = builder
        .tempdir_in(parent)
        .map_err(|source| io_error("create a staging directory in", parent, source))?;
    let root = staging.path();
    let kernels_dir = root.join(KERNELS_DIR);
    fs::create_dir(&kernels_dir).map_err(|source| io_error("create", &kernels_dir, source))?;
    for (record, kernel) in manifest.kernels.iter().zip(sorted_kernels(compilation)) {
        write_synced(&root.join(&record.file), &kernel.cubin)?;
    }
    write_synced(&root.join(LADDER_FILE), ladder_text.as_bytes())?;
    write_synced(&root.join(MANIFEST_FILE), manifest_bytes)?;
    sync_directory(&kernels_dir)?;
    sync_directory(root)?;

    fault_point("staged");
    if exists {
        replace(out, parent, name, staging)?;
    } else {
        install(out, staging)?;
    }
    sync_directory(parent)
}

/// Builds with the `testing` feature (the tests') end the process here when `PREPARE_FAULT`
/// names `step`, as a kill would, so that tests can see what each step leaves behind; other
/// builds never read it.
fn fault_point(step: &str) {
    if cfg!(feature = "testing")
        && std::env::var_os("PREPARE_FAULT").is_some_and(|fault| fault == step)
    {
        std::process::abort();
    }
}

/// Removes what killed exports to `parent/name` left: staging directories, and replaced
/// packages, after moving a replaced package back when the output is missing (a kill between
/// the two renames of the fallback swap). Called under the directory's lock, so nothing found
/// belongs to a running export.
fn remove_leftovers(parent: &Path, name: &str) -> Result<(), PackageError> {
    let staging = format!(".{name}.staging-");
    let replaced = format!(".{name}.replaced-");
    let out = parent.join(name);
    let entries = fs::read_dir(parent).map_err(|source| io_error("list", parent, source))?;
    let mut leftovers: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| io_error("list", parent, source))?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if file_name.starts_with(&staging) || file_name.starts_with(&replaced) {
            leftovers.push(entry.path());
        }
    }
    leftovers.sort();
    for leftover in &leftovers {
        let old = leftover.join("old");
        let is_replaced = leftover
            .file_name()
            .and_then(|file_name| file_name.to_str())
            .is_some_and(|file_name| file_name.starts_with(&replaced));
        if is_replaced
            && fs::symlink_metadata(&out).is_err()
            && fs::symlink_metadata(&old).is_ok_and(|metadata| metadata.is_dir())
        {
            fs::rename(&old, &out)
                .map_err(|source| io_error("restore the previous package from", &old, source))?;
        }
        let metadata = fs::symlink_metadata(leftover)
            .map_err(|source| io_error("inspect", leftover, source))?;
        let removed = if metadata.is_dir() {
            fs::remove_dir_all(leftover)
        } else {
            fs::remove_file(leftover)
        };
        removed.map_err(|source| io_error("remove the leftover", leftover, source))?;
    }
    Ok(())
}

/// The manifest a package for `arch` gets: a pure function of its inputs.
pub fn build_manifest(
    ladder_text: &str,
    ladder: &Ladder,
    compilation: &Compilation,
    arch: Arch,
    qualification: Option<Qualification>,
) -> Result<Manifest, PackageError> {
    if crate::ladder::validate_ladder_text(ladder_text)
        .ok()
        .as_ref()
        != Some(ladder)
    {
        return Err(PackageError::LadderTextMismatch);
    }
    if !ladder.targets.contains(&arch) {
        return Err(PackageError::NotTargeted {
            ladder: ladder.name.clone(),
            arch,
            targets: ladder
                .targets
                .iter()
                .map(|target| target.name())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }

    let mut kernels = Vec::with_capacity(compilation.kernels.len());
    for kernel in sorted_kernels(compilation) {
        if kernel.arch != arch {
            return Err(PackageError::BadKernel {
                kernel: kernel.name.clone(),
                problem: format!("compiled for {}, not {arch}", kernel.arch),
            });
        }
        if kernels
            .last()
            .is_some_and(|previous: &KernelRecord| previous.name == kernel.name)
        {
            return Err(PackageError::BadKernel {
                kernel: kernel.name.clone(),
                problem: "appears twice".to_string(),
            });
        }
        kernels.push(KernelRecord {
            name: kernel.name.clone(),
            file: kernel_file(&kernel.name, arch),
            entry: kernel.name.clone(),
            source: kernel.source.clone(),
            cluster: kernel.cluster,
            sha256: sha256_hex(&kernel.cubin),
            size_bytes: kernel.cubin.len() as u64,
            registers: kernel.registers,
            shared_bytes: kernel.shared_bytes,
            spill_store_bytes: kernel.spill_store_bytes,
            spill_load_bytes: kernel.spill_load_bytes,
            stack_bytes: kernel.stack_bytes,
        });
    }

    let mut buckets = Vec::with_capacity(ladder.buckets.len());
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        let mut candidates = Vec::with_capacity(bucket.candidates.len());
        for id in &bucket.candidates {
            let profile = ladder
                .profile(id)
                .ok_or_else(|| PackageError::UnknownProfile {
                    bucket: index,
                    profile: id.clone(),
                })?;
            let candidate = if profile.is_nccl() {
                CandidateRecord {
                    profile: id.clone(),
                    algorithm: profile.algorithm,
                    kernel: None,
                    cluster_kernel: false,
                    cluster_scheduling: false,
                    blocks: None,
                    epilogue_kernel: kernels::epilogue_after(
                        profile,
                        ladder.collective,
                        ladder.dtype,
                        ladder.world_size,
                    )
                    .map(|spec| spec.name),
                }
            } else {
                let spec = kernels::kernel_for(
                    profile,
                    ladder.collective,
                    ladder.dtype,
                    ladder.world_size,
                )
                .ok_or_else(|| PackageError::NoKernel {
                    profile: id.clone(),
                    dtype: ladder.dtype.name(),
                })?;
                let record = kernels
                    .iter()
                    .find(|record| record.name == spec.name)
                    .ok_or_else(|| PackageError::MissingKernel {
                        kernel: spec.name.clone(),
                        profile: id.clone(),
                    })?;
                if record.cluster != spec.cluster {
                    return Err(PackageError::BadKernel {
                        kernel: spec.name,
                        problem: format!(
                            "compiled as {}, but the kernel table says {}",
                            cluster_word(record.cluster),
                            cluster_word(spec.cluster)
                        ),
                    });
                }
                // A profile's own block count applies only outside clustered buckets, whose
                // geometry is fixed.
                let blocks = match profile.blocks {
                    Some(blocks) if !bucket.is_clustered() => blocks,
                    _ => bucket.blocks,
                };
                CandidateRecord {
                    profile: id.clone(),
                    algorithm: profile.algorithm,
                    kernel: Some(spec.name),
                    cluster_kernel: spec.cluster,
                    cluster_scheduling: bucket.is_clustered() && !spec.cluster,
                    blocks: Some(blocks),
                    epilogue_kernel: kernels::epilogue_after(
                        profile,
                        ladder.collective,
                        ladder.dtype,
                        ladder.world_size,
                    )
                    .map(|spec| spec.name),
                }
            };
            candidates.push(candidate);
        }
        buckets.push(BucketRecord {
            index,
            min_bytes: ladder.bucket_min_bytes(index),
            max_bytes: bucket.max_bytes,
            threads: bucket.threads,
            blocks: bucket.blocks,
            cluster_size: bucket.cluster_size,
            candidates,
            default: bucket.default.clone(),
        });
    }

    let peer_memory = peer_memory(ladder, &buckets);
    let mut manifest = Manifest {
        format_version: PACKAGE_FORMAT_VERSION,
        tool_version: crate::TOOL_VERSION.to_string(),
        ladder: LadderRecord {
            name: ladder.name.clone(),
            sha256: sha256_hex(ladder_text.as_bytes()),
            collective: ladder.collective,
            dtype: ladder.dtype,
            world_size: ladder.world_size,
        },
        arch,
        compiler: CompilerRecord {
            nvrtc_version: format!(
                "{}.{}",
                compilation.nvrtc_version.0, compilation.nvrtc_version.1
            ),
            options: compilation.options.clone(),
        },
        kernels,
        buckets,
        peer_memory,
        qualification,
        checksum: String::new(),
    };
    manifest.seal();
    // The reader's own checks, so that nothing is written that open_package would refuse (a
    // kernel name that is no file name, a qualification that does not fit the buckets).
    check_manifest(Path::new(MANIFEST_FILE), &manifest)?;
    Ok(manifest)
}

fn cluster_word(cluster: bool) -> &'static str {
    if cluster {
        "a cluster kernel"
    } else {
        "an ordinary kernel"
    }
}

fn sorted_kernels(compilation: &Compilation) -> Vec<&crate::compile::CompiledKernel> {
    let mut kernels: Vec<_> = compilation.kernels.iter().collect();
    kernels.sort_by(|left, right| left.name.cmp(&right.name));
    kernels
}

/// The directory to stage in and the output's file name.
fn split_output(out: &Path) -> Result<(PathBuf, String), PackageError> {
    let bad = || PackageError::BadOutput {
        path: out.to_path_buf(),
    };
    // `Path` drops a trailing `.` (`new/.` has the file name `new`), but renaming onto it fails:
    // the path as written must end in a name.
    {
        use std::os::unix::ffi::OsStrExt as _;
        let written = out.as_os_str().as_bytes();
        let end = written.len()
            - written
                .iter()
                .rev()
                .take_while(|&&byte| byte == b'/')
                .count();
        let last = written[..end]
            .rsplit(|&byte| byte == b'/')
            .next()
            .unwrap_or_default();
        if last.is_empty() || last == b"." || last == b".." {
            return Err(bad());
        }
    }
    let name = out.file_name().ok_or_else(bad)?;
    let name = name.to_str().ok_or_else(bad)?.to_string();
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Whether `out` exists; refuses it unless `force` and it is an empty directory or a package
/// this tool wrote: a `manifest.json` that parses as a prepare manifest (any format version;
/// its hashes need not verify, so a damaged package may be replaced) and nothing in the
/// directory but the manifest, the ladder and the cubins it names. Replacing removes the old
/// tree, so anything else is refused, naming the first entry that is not the package's.
pub fn check_output(out: &Path, force: bool) -> Result<bool, PackageError> {
    split_output(out)?;
    let metadata = match fs::symlink_metadata(out) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(io_error("inspect", out, source)),
    };
    if !force {
        return Err(PackageError::Exists {
            path: out.to_path_buf(),
        });
    }
    let refuse = |reason: String| PackageError::NotAPackage {
        path: out.to_path_buf(),
        reason,
    };
    if !metadata.is_dir() {
        return Err(refuse("it is not a directory".to_string()));
    }
    let mut entries = Vec::new();
    list_entries(out, Path::new(""), &mut entries)?;
    if entries.is_empty() {
        return Ok(true);
    }
    let named = match crate::files::read_limited(&out.join(MANIFEST_FILE), crate::files::MANIFEST) {
        Ok(bytes) => named_files(&bytes).ok_or_else(|| {
            let others: Vec<&str> = entries
                .iter()
                .map(|(relative, _)| relative.as_str())
                .filter(|relative| *relative != MANIFEST_FILE)
                .take(3)
                .collect();
            let holds = if others.is_empty() {
                String::new()
            } else {
                format!(" (it also holds {})", others.join(", "))
            };
            refuse(format!(
                "its {MANIFEST_FILE} is not a prepare package manifest{holds}"
            ))
        })?,
        Err(error) => {
            return Err(refuse(format!(
                "it holds {} and no readable {MANIFEST_FILE} ({error})",
                entries[0].0
            )))
        }
    };
    for (relative, is_directory) in &entries {
        let ours = if *is_directory {
            relative == KERNELS_DIR
        } else {
            named.contains(relative)
        };
        if !ours {
            return Err(refuse(format!(
                "{relative} is not part of the package there"
            )));
        }
    }
    Ok(true)
}

/// The files a manifest of any format version names: itself, the ladder and every kernel's
/// `file`; `None` when the text is not a prepare manifest.
fn named_files(bytes: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct AnyManifest {
        #[allow(dead_code)]
        format_version: u64,
        #[allow(dead_code)]
        tool_version: String,
        #[allow(dead_code)]
        ladder: serde::de::IgnoredAny,
        kernels: Vec<AnyKernel>,
    }
    #[derive(serde::Deserialize)]
    struct AnyKernel {
        file: String,
    }
    let manifest: AnyManifest = serde_json::from_slice(bytes).ok()?;
    let mut named = vec![MANIFEST_FILE.to_string(), LADDER_FILE.to_string()];
    for kernel in manifest.kernels {
        // Only a plain file inside the kernels directory can be a package's.
        let inside = kernel
            .file
            .strip_prefix(KERNELS_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|file| {
                !file.is_empty() && !file.contains('/') && file != "." && file != ".."
            });
        if inside {
            named.push(kernel.file);
        }
    }
    Some(named)
}

/// Every entry under `dir` (links not followed, the kernels directory descended into), as a
/// `/`-separated path relative to the output and whether it is a directory, sorted.
fn list_entries(
    root: &Path,
    relative: &Path,
    entries: &mut Vec<(String, bool)>,
) -> Result<(), PackageError> {
    let dir = root.join(relative);
    let mut found = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|source| io_error("list", &dir, source))? {
        let entry = entry.map_err(|source| io_error("list", &dir, source))?;
        let file_type = entry
            .file_type()
            .map_err(|source| io_error("inspect", &entry.path(), source))?;
        let name = relative.join(entry.file_name());
        let name = name
            .components()
            .map(|component| component.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        // A link is not the package's even where its name is: only regular files are written.
        let is_file = file_type.is_file();
        found.push((name, file_type.is_dir(), is_file));
    }
    found.sort();
    for (name, is_directory, is_file) in found {
        if is_directory && name == KERNELS_DIR {
            entries.push((name.clone(), true));
            list_entries(root, Path::new(KERNELS_DIR), entries)?;
        } else if !is_file {
            // Anything but a regular file or the kernels directory is foreign: named so that the
            // check refuses it.
            entries.push((
                format!("{name}{}", if is_directory { "/" } else { "" }),
                false,
            ));
        } else {
            entries.push((name, false));
        }
    }
    Ok(())
}

/// Renames the staged package to `out`, which did not exist.
fn install(out: &Path, staging: tempfile::TempDir) -> Result<(), PackageError> {
    // Checked again because renaming a directory over an empty one succeeds silently.
    if fs::symlink_metadata(out).is_ok() {
        return Err(PackageError::Exists {
            path: out.to_path_buf(),
        });
    }
    match fs::rename(staging.path(), out) {
        Ok(()) => {
            // The staging path no longer exists; nothing is left to clean up.
            let _ = staging.keep();
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            Err(PackageError::Exists {
                path: out.to_path_buf(),
            })
        }
        Err(source) => Err(io_error("rename the staged package to", out, source)),
    }
}

/// Replaces the existing `out` with the staged package in one atomic exchange, then removes the
/// old one (now at the staging path); where the file system cannot exchange, with two renames.
fn replace(
    out: &Path,
    parent: &Path,
    name: &str,
    staging: tempfile::TempDir,
) -> Result<(), PackageError> {
    match exchange(staging.path(), out) {
        Ok(()) => {
            // A reader that opened the old package keeps its directory handle; its files go
            // now, and such a reader reports that the package changed while it was read.
            fault_point("exchanged");
            sync_directory(parent)?;
            drop(staging);
            Ok(())
        }
        Err(error) if exchange_unsupported(&error) => {
            replace_by_renames(out, parent, name, staging)
        }
        Err(source) => Err(io_error("swap in the staged package at", out, source)),
    }
}

/// Swaps two directories in one rename.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn exchange(staged: &Path, out: &Path) -> std::io::Result<()> {
    let here = nix::fcntl::AT_FDCWD;
    nix::fcntl::renameat2(
        here,
        staged,
        here,
        out,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(std::io::Error::from)
}

/// Swaps two directories in one rename.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn exchange(_staged: &Path, _out: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Whether the exchange failed for want of support (old kernels, some file systems) rather
/// than for a reason that two renames would meet too.
fn exchange_unsupported(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::Unsupported
        || matches!(
            error.raw_os_error(),
            Some(code) if code == nix::errno::Errno::EINVAL as i32 || code == nix::errno::Errno::ENOSYS as i32
        )
}

/// The fallback swap: the old package moves aside, the new one moves in, the old one is
/// removed; if the new one cannot move in, the old one moves back.
fn replace_by_renames(
    out: &Path,
    parent: &Path,
    name: &str,
    staging: tempfile::TempDir,
) -> Result<(), PackageError> {
    let holder = tempfile::Builder::new()
        .prefix(&format!(".{name}.replaced-"))
        .tempdir_in(parent)
        .map_err(|source| io_error("create a directory in", parent, source))?;
    let aside = holder.path().join("old");
    fs::rename(out, &aside).map_err(|source| io_error("move aside", out, source))?;
    if let Err(source) = fs::rename(staging.path(), out) {
        return match fs::rename(&aside, out) {
            Ok(()) => Err(io_error("rename the staged package to", out, source)),
            Err(restore) => {
                // Keep the old package where it is rather than delete it with the holder.
                let kept = holder.keep().join("old");
                Err(io_error(
                    "restore the previous package, which is kept at",
                    &kept,
                    restore,
                ))
            }
        };
    }
    let _ = staging.keep();
    // The new package is in place; the old one goes with the holder.
    drop(holder);
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), PackageError> {
    let mut file = File::create_new(path).map_err(|source| io_error("create", path, source))?;
    file.write_all(bytes)
        .map_err(|source| io_error("write", path, source))?;
    file.sync_all()
        .map_err(|source| io_error("sync", path, source))
}

fn sync_directory(path: &Path) -> Result<(), PackageError> {
    // Directories are synced so that renames and new entries survive a crash; only Unix lets a
    // directory be opened for that.
    if cfg!(unix) {
        crate::files::open_directory(path)
            .and_then(|directory| directory.sync_all())
            .map_err(|source| io_error("sync", path, source))?;
    }
    Ok(())
}
