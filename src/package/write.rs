//! Writing a package: build the manifest from the ladder and the compilation, write every file
//! into a staging directory next to the output, sync, then rename it into place.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::manifest::{
    kernel_file, BucketRecord, CandidateRecord, CompilerRecord, KernelRecord, LadderRecord,
    Manifest, PeerMemoryRecord, Qualification,
};
use super::{
    sha256_hex, PackageError, PackageSummary, KERNELS_DIR, LADDER_FILE, MANIFEST_FILE,
    PACKAGE_FORMAT_VERSION,
};
use crate::compile::Compilation;
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
    let exists = check_output(out, force)?;
    let manifest = build_manifest(ladder_text, ladder, compilation, arch, qualification)?;
    let manifest_bytes = manifest.to_bytes();

    // Missing parent directories are made, and removed again if the export fails, so that a
    // failed export leaves nothing behind.
    let created = create_missing_directories(&parent)?;
    let written = write_and_install(
        out,
        &parent,
        &name,
        exists,
        &manifest,
        &manifest_bytes,
        compilation,
        ladder_text,
    );
    if written.is_err() {
        if let Some(created) = created {
            let _ = fs::remove_dir_all(created);
        }
    }
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

/// Makes `directory` and its missing ancestors; returns the outermost one it made.
fn create_missing_directories(directory: &Path) -> Result<Option<PathBuf>, PackageError> {
    let mut outermost = None;
    let mut missing = directory;
    while !missing.exists() {
        outermost = Some(missing.to_path_buf());
        match missing.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => missing = parent,
            _ => break,
        }
    }
    if outermost.is_some() {
        fs::create_dir_all(directory).map_err(|source| io_error("create", directory, source))?;
    }
    Ok(outermost)
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

    if exists {
        replace(out, parent, name, staging)?;
    } else {
        install(out, staging)?;
    }
    sync_directory(parent)
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
                }
            } else {
                let spec = kernels::kernel_for(profile, ladder.dtype).ok_or_else(|| {
                    PackageError::NoKernel {
                        profile: id.clone(),
                        dtype: ladder.dtype.name(),
                    }
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
    super::read::check_manifest(Path::new(MANIFEST_FILE), &manifest)?;
    Ok(manifest)
}

fn peer_memory(ladder: &Ladder, buckets: &[BucketRecord]) -> PeerMemoryRecord {
    let custom = buckets
        .iter()
        .flat_map(|bucket| &bucket.candidates)
        .any(|candidate| candidate.kernel.is_some());
    PeerMemoryRecord {
        buffer_bytes: kernels::peer_buffer_bytes(ladder),
        signal_bytes: if custom { kernels::SIGNAL_BYTES } else { 0 },
    }
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
    let name = out.file_name().ok_or_else(bad)?;
    let name = name.to_str().ok_or_else(bad)?.to_string();
    let parent = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Whether `out` exists; refuses it unless `force` and it is a package or an empty directory.
fn check_output(out: &Path, force: bool) -> Result<bool, PackageError> {
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
    // Replacing removes the old tree, so only something this tool wrote (or nothing) may go.
    let not_package = || PackageError::NotAPackage {
        path: out.to_path_buf(),
    };
    if !metadata.is_dir() {
        return Err(not_package());
    }
    let is_package = fs::symlink_metadata(out.join(MANIFEST_FILE)).is_ok_and(|meta| meta.is_file());
    let is_empty = fs::read_dir(out)
        .map_err(|source| io_error("read", out, source))?
        .next()
        .is_none();
    if is_package || is_empty {
        Ok(true)
    } else {
        Err(not_package())
    }
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

/// Replaces the existing `out` with the staged package: the old one moves aside, the new one
/// moves in, the old one is removed; if the new one cannot move in, the old one moves back.
fn replace(
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
        File::open(path)
            .and_then(|directory| directory.sync_all())
            .map_err(|source| io_error("sync", path, source))?;
    }
    Ok(())
}

fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> PackageError {
    PackageError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}
