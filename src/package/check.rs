//! The checks a manifest passes on its own (contract, schema, checksum, consistency) and
//! against the ladder it hashes: what a reader refuses and a writer never writes.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use super::manifest::{BucketRecord, Manifest, PeerMemoryRecord};
use super::{
    kernel_file, manifest_schema, refused_if_any, PackageError, Problem, LADDER_FILE,
    PACKAGE_FORMATS,
};
use crate::kernels;
use crate::ladder::Ladder;

/// Parses and checks manifest bytes on their own (contract, schema, checksum, consistency), as
/// opening a package does before it reads any other file; `path` names it in errors.
pub fn parse_manifest_bytes(path: &Path, bytes: &[u8]) -> Result<Manifest, PackageError> {
    let manifest = parse_manifest(path, bytes)?;
    let found = manifest.compute_checksum();
    if found != manifest.checksum {
        return Err(PackageError::ManifestInconsistent {
            path: path.to_path_buf(),
            problems: vec![Problem {
                pointer: "/checksum".to_string(),
                message: format!("is {}; the content gives {found}", manifest.checksum),
            }],
        });
    }
    check_manifest(path, &manifest)?;
    Ok(manifest)
}

/// JSON syntax, then the contract (read before anything else), then the schema, then types.
pub(super) fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest, PackageError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|error| syntax_error(path, &error))?;
    if let Some(found) = value.get("format_version").and_then(Value::as_u64) {
        if !PACKAGE_FORMATS
            .iter()
            .any(|(version, _)| u64::from(*version) == found)
        {
            return Err(PackageError::UnknownFormat {
                path: path.to_path_buf(),
                found,
                writer: value
                    .get("tool_version")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            });
        }
    }
    check_schema(path, &value)?;
    serde_json::from_value(value).map_err(|error| PackageError::ManifestSchema {
        path: path.to_path_buf(),
        problems: vec![Problem {
            pointer: String::new(),
            message: error.to_string(),
        }],
    })
}

fn check_schema(path: &Path, value: &Value) -> Result<(), PackageError> {
    let problems: Vec<Problem> = manifest_validator()
        .iter_errors(value)
        .map(|error| Problem {
            pointer: error.instance_path().as_str().to_string(),
            message: error.to_string(),
        })
        .collect();
    refused_if_any(problems, |problems| PackageError::ManifestSchema {
        path: path.to_path_buf(),
        problems,
    })
}

/// The schema and the manifest's own consistency, which the writer checks too.
pub(super) fn check_manifest(path: &Path, manifest: &Manifest) -> Result<(), PackageError> {
    let value = serde_json::to_value(manifest).expect("a manifest always serializes");
    check_schema(path, &value)?;
    refused_if_any(manifest_problems(manifest), |problems| {
        PackageError::ManifestInconsistent {
            path: path.to_path_buf(),
            problems,
        }
    })
}

fn manifest_validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::validator_for(&manifest_schema())
            .expect("the manifest schema generated from the types is a valid schema")
    })
}

fn syntax_error(path: &Path, error: &serde_json::Error) -> PackageError {
    let message = error.to_string();
    // serde_json appends the position, which the error carries separately.
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    PackageError::ManifestSyntax {
        path: path.to_path_buf(),
        line: error.line(),
        column: error.column(),
        message: message
            .strip_suffix(&suffix)
            .unwrap_or(&message)
            .to_string(),
    }
}

/// What the manifest says that contradicts itself; checked before any path it names is read.
fn manifest_problems(manifest: &Manifest) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut problem =
        |pointer: String, message: String| problems.push(Problem { pointer, message });

    for (index, kernel) in manifest.kernels.iter().enumerate() {
        let expected = kernel_file(&kernel.name, manifest.arch);
        if kernel.file != expected {
            problem(
                format!("/kernels/{index}/file"),
                format!(
                    "is `{}`; kernel `{}` is `{expected}`",
                    kernel.file, kernel.name
                ),
            );
        }
        if let Some(previous) = index.checked_sub(1).map(|before| &manifest.kernels[before]) {
            if previous.name >= kernel.name {
                problem(
                    format!("/kernels/{index}/name"),
                    format!(
                        "`{}` follows `{}`; kernels are unique and sorted by name",
                        kernel.name, previous.name
                    ),
                );
            }
        }
    }

    for (position, bucket) in manifest.buckets.iter().enumerate() {
        let at = format!("/buckets/{position}");
        if bucket.index != position {
            problem(
                format!("{at}/index"),
                format!(
                    "is {}; the bucket at position {position} has index {position}",
                    bucket.index
                ),
            );
        }
        if !bucket
            .candidates
            .iter()
            .any(|candidate| candidate.profile == bucket.default)
        {
            problem(
                format!("{at}/default"),
                format!("`{}` is not one of the bucket's candidates", bucket.default),
            );
        }
        for (slot, candidate) in bucket.candidates.iter().enumerate() {
            let at = format!("{at}/candidates/{slot}");
            let Some(name) = &candidate.kernel else {
                if candidate.cluster_kernel
                    || candidate.cluster_scheduling
                    || candidate.blocks.is_some()
                {
                    problem(
                        at,
                        "an NCCL candidate has no cluster kernel, cluster scheduling or blocks"
                            .to_string(),
                    );
                }
                continue;
            };
            let Some(kernel) = manifest.kernel(name) else {
                problem(
                    format!("{at}/kernel"),
                    format!("`{name}` is not among the package's kernels"),
                );
                continue;
            };
            if candidate.cluster_kernel != kernel.cluster {
                problem(
                    format!("{at}/cluster_kernel"),
                    format!(
                        "is {}, but kernel `{name}` has cluster {}",
                        candidate.cluster_kernel, kernel.cluster
                    ),
                );
            }
            let scheduling = bucket.cluster_size.is_some() && !kernel.cluster;
            if candidate.cluster_scheduling != scheduling {
                problem(
                    format!("{at}/cluster_scheduling"),
                    format!(
                        "is {}; it follows from the bucket and the kernel: {scheduling}",
                        candidate.cluster_scheduling
                    ),
                );
            }
            if kernel.cluster && bucket.cluster_size.is_none() {
                problem(
                    format!("{at}/kernel"),
                    format!("cluster kernel `{name}` in a bucket without cluster_size"),
                );
            }
        }
    }

    if let Some(qualification) = &manifest.qualification {
        // One GPU per rank: this also bounds the list.
        if qualification.gpus.len() != manifest.ladder.world_size as usize {
            problem(
                "/qualification/gpus".to_string(),
                format!(
                    "has {} GPUs for a world of {} ranks",
                    qualification.gpus.len(),
                    manifest.ladder.world_size
                ),
            );
        }
        if qualification.buckets.len() != manifest.buckets.len() {
            problem(
                "/qualification/buckets".to_string(),
                format!(
                    "has {} entries for {} buckets",
                    qualification.buckets.len(),
                    manifest.buckets.len()
                ),
            );
        }
        for (position, (qualified, bucket)) in qualification
            .buckets
            .iter()
            .zip(&manifest.buckets)
            .enumerate()
        {
            let at = format!("/qualification/buckets/{position}");
            if qualified.index != bucket.index {
                problem(
                    format!("{at}/index"),
                    format!("is {}; expected {}", qualified.index, bucket.index),
                );
            }
            let found: Vec<&str> = qualified
                .candidates
                .iter()
                .map(|candidate| candidate.profile.as_str())
                .collect();
            let expected: Vec<&str> = bucket
                .candidates
                .iter()
                .map(|candidate| candidate.profile.as_str())
                .collect();
            if found != expected {
                problem(
                    format!("{at}/candidates"),
                    format!(
                        "names {}; the bucket's candidates are {}",
                        found.join(", "),
                        expected.join(", ")
                    ),
                );
            }
        }
    }
    problems
}

/// Where the manifest disagrees with the ladder it hashes.
pub(super) fn ladder_problems(manifest: &Manifest, ladder: &Ladder) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut problem = |pointer: &str, found: String, expected: String| {
        problems.push(Problem {
            pointer: pointer.to_string(),
            message: format!("is {found}; {LADDER_FILE} says {expected}"),
        });
    };
    let record = &manifest.ladder;
    if record.name != ladder.name {
        problem(
            "/ladder/name",
            format!("`{}`", crate::files::shorten(&record.name)),
            format!("`{}`", crate::files::shorten(&ladder.name)),
        );
    }
    if record.collective != ladder.collective {
        problem(
            "/ladder/collective",
            format!("{:?}", record.collective),
            format!("{:?}", ladder.collective),
        );
    }
    if record.dtype != ladder.dtype {
        problem(
            "/ladder/dtype",
            record.dtype.name().to_string(),
            ladder.dtype.name().to_string(),
        );
    }
    if record.world_size != ladder.world_size {
        problem(
            "/ladder/world_size",
            record.world_size.to_string(),
            ladder.world_size.to_string(),
        );
    }
    if !ladder.targets.contains(&manifest.arch) {
        let targets: Vec<&str> = ladder.targets.iter().map(|target| target.name()).collect();
        problem(
            "/arch",
            manifest.arch.to_string(),
            format!("the targets are {}", targets.join(", ")),
        );
    }
    if manifest.buckets.len() != ladder.buckets.len() {
        problem(
            "/buckets",
            format!("{} buckets", manifest.buckets.len()),
            format!("{}", ladder.buckets.len()),
        );
    }
    for (index, (record, bucket)) in manifest.buckets.iter().zip(&ladder.buckets).enumerate() {
        let at = |field: &str| format!("/buckets/{index}/{field}");
        let fields = [
            (
                "min_bytes",
                record.min_bytes,
                ladder.bucket_min_bytes(index),
            ),
            ("max_bytes", record.max_bytes, bucket.max_bytes),
            (
                "threads",
                u64::from(record.threads),
                u64::from(bucket.threads),
            ),
            ("blocks", u64::from(record.blocks), u64::from(bucket.blocks)),
        ];
        for (field, found, expected) in fields {
            if found != expected {
                problem(&at(field), found.to_string(), expected.to_string());
            }
        }
        if record.cluster_size != bucket.cluster_size {
            problem(
                &at("cluster_size"),
                format!("{:?}", record.cluster_size),
                format!("{:?}", bucket.cluster_size),
            );
        }
        if record.default != bucket.default {
            problem(
                &at("default"),
                format!("`{}`", record.default),
                format!("`{}`", bucket.default),
            );
        }
        let found: Vec<&str> = record
            .candidates
            .iter()
            .map(|candidate| candidate.profile.as_str())
            .collect();
        let expected: Vec<&str> = bucket.candidates.iter().map(String::as_str).collect();
        if found != expected {
            problem(&at("candidates"), found.join(", "), expected.join(", "));
            continue;
        }
        for (slot, candidate) in record.candidates.iter().enumerate() {
            let Some(profile) = ladder.profile(&candidate.profile) else {
                continue;
            };
            let at_candidate = |field: &str| at(&format!("candidates/{slot}/{field}"));
            if profile.algorithm != candidate.algorithm
                || profile.is_nccl() != candidate.kernel.is_none()
            {
                problem(
                    &at_candidate("algorithm"),
                    candidate.algorithm.name().to_string(),
                    profile.algorithm.name().to_string(),
                );
            }
            // What the writer records for this profile in this bucket, so that a candidate can
            // never launch another profile's kernel or geometry.
            let spec =
                kernels::kernel_for(profile, ladder.collective, ladder.dtype, ladder.world_size);
            let kernel = spec.as_ref().map(|spec| spec.name.as_str());
            if !profile.is_nccl() && candidate.kernel.as_deref() != kernel {
                problem(
                    &at_candidate("kernel"),
                    format!("{:?}", candidate.kernel),
                    format!("profile `{}` needs kernel {kernel:?}", profile.id),
                );
            }
            let after = kernels::epilogue_after(
                profile,
                ladder.collective,
                ladder.dtype,
                ladder.world_size,
            )
            .map(|spec| spec.name);
            if candidate.epilogue_kernel != after {
                problem(
                    &at_candidate("epilogue_kernel"),
                    format!("{:?}", candidate.epilogue_kernel),
                    format!("profile `{}` is followed by {after:?}", profile.id),
                );
            }
            let blocks = match (profile.is_nccl(), profile.blocks) {
                (true, _) => None,
                (false, Some(blocks)) if bucket.cluster_size.is_none() => Some(blocks),
                (false, _) => Some(bucket.blocks),
            };
            if candidate.blocks != blocks {
                problem(
                    &at_candidate("blocks"),
                    format!("{:?}", candidate.blocks),
                    format!("{blocks:?} for profile `{}` in this bucket", profile.id),
                );
            }
        }
    }
    let required = peer_memory(ladder, &manifest.buckets);
    let memory = &manifest.peer_memory;
    if memory.buffer_bytes != required.buffer_bytes {
        problem(
            "/peer_memory/buffer_bytes",
            memory.buffer_bytes.to_string(),
            format!("the buckets need {}", required.buffer_bytes),
        );
    }
    if memory.signal_bytes != required.signal_bytes {
        problem(
            "/peer_memory/signal_bytes",
            memory.signal_bytes.to_string(),
            format!("the candidates need {}", required.signal_bytes),
        );
    }
    problems
}

/// The peer memory a package of these buckets needs: also what a reader requires.
pub(super) fn peer_memory(ladder: &Ladder, buckets: &[BucketRecord]) -> PeerMemoryRecord {
    let custom = buckets
        .iter()
        .flat_map(|bucket| &bucket.candidates)
        .any(|candidate| candidate.kernel.is_some());
    PeerMemoryRecord {
        buffer_bytes: kernels::peer_buffer_bytes(ladder),
        signal_bytes: if custom { kernels::SIGNAL_BYTES } else { 0 },
    }
}
