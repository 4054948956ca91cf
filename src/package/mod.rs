//! Packages: what `prepare export` writes for one architecture and what a server opens at
//! startup. A package is a directory holding the ladder as given, one cubin per kernel, and a
//! manifest that describes and hashes them; the sha256 of the manifest is the package's identity.
//!
//! ```text
//! pkg/
//!   manifest.json
//!   ladder.json
//!   kernels/<kernel>.<arch>.cubin
//! ```
//!
//! Writing is atomic (a staging directory renamed into place) and deterministic (no timestamps:
//! the same ladder, compilation and tool give the same bytes). Reading verifies every hash and
//! refuses a changed, missing or extra file by name.

mod check;
mod compare;
mod manifest;
mod parent;
mod read;
mod write;

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::ladder::{Arch, Ladder};

pub use check::parse_manifest_bytes;
pub use compare::manifest_differences;
pub use manifest::{
    BucketQualification, BucketRecord, CandidateQualification, CandidateRecord, CompilerRecord,
    KernelRecord, LadderRecord, Manifest, Outcome, PeerMemoryRecord, Qualification, QualifiedGpu,
};
pub use read::{open_package, open_package_retrying};
pub use write::{build_manifest, check_output, write_package, write_qualified_package};

/// The package contract this tool writes.
pub const PACKAGE_FORMAT_VERSION: u32 = 1;

/// Every package contract this tool reads, with the first tool version that writes it.
pub const PACKAGE_FORMATS: &[(u32, &str)] = &[(1, "prepare 0.1")];

/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The ladder's file name.
pub const LADDER_FILE: &str = "ladder.json";
/// The directory holding the cubins.
pub const KERNELS_DIR: &str = "kernels";

/// The cubin path of a kernel inside a package.
pub fn kernel_file(name: &str, arch: Arch) -> String {
    format!("{KERNELS_DIR}/{name}.{arch}.cubin")
}

/// An opened, verified package.
#[derive(Debug, Clone)]
pub struct Package {
    dir: PathBuf,
    identity: String,
    manifest: Manifest,
    ladder: Ladder,
    cubins: Vec<Vec<u8>>,
}

impl Package {
    /// The directory it was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The package's identity: sha256 of `manifest.json`, lowercase hex.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// What a choice made for this package must match: see [`PackageId`].
    pub fn id(&self) -> PackageId<'_> {
        PackageId {
            identity: &self.identity,
            dir: &self.dir,
            buckets: &self.manifest.buckets,
        }
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The ladder, validated.
    pub fn ladder(&self) -> &Ladder {
        &self.ladder
    }

    /// The architecture the package runs on.
    pub fn arch(&self) -> Arch {
        self.manifest.arch
    }

    /// The cubin of the kernel with this name.
    pub fn cubin(&self, kernel: &str) -> Option<&[u8]> {
        self.manifest
            .kernels
            .iter()
            .position(|record| record.name == kernel)
            .map(|index| self.cubins[index].as_slice())
    }

    /// Every kernel with its cubin, sorted by name.
    pub fn kernels(&self) -> impl Iterator<Item = (&KernelRecord, &[u8])> {
        self.manifest
            .kernels
            .iter()
            .zip(self.cubins.iter().map(Vec::as_slice))
    }
}

/// A package as a choice names it: its identity and the ranges of its buckets, which a choice
/// must match, and the directory it was opened from, for messages.
#[derive(Debug, Clone, Copy)]
pub struct PackageId<'a> {
    /// sha256 of `manifest.json`, lowercase hex.
    pub identity: &'a str,
    /// The directory it was opened from.
    pub dir: &'a Path,
    /// Its buckets, in ladder order.
    pub buckets: &'a [BucketRecord],
}

/// What `write_package` produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSummary {
    /// The package directory.
    pub dir: PathBuf,
    /// sha256 of `manifest.json`.
    pub identity: String,
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// Kernels written.
    pub kernels: usize,
    /// Buckets described.
    pub buckets: usize,
    /// Whether an existing package was replaced.
    pub replaced: bool,
}

/// Why a package could not be written or opened.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// The output exists and replacing it was not asked for.
    #[error("{} already exists", path.display())]
    Exists {
        /// The output directory.
        path: PathBuf,
    },
    /// Replacing was asked for, but the output is not an empty directory or a package this
    /// tool wrote.
    #[error(
        "refusing to replace {}: {reason}; --force replaces only an empty directory or a package prepare wrote, with nothing else in it",
        path.display()
    )]
    NotAPackage {
        /// The output path.
        path: PathBuf,
        /// Why it is not (naming the first entry that is not the package's).
        reason: String,
    },
    /// The output path names no directory (empty, `/` or `..`).
    #[error("{} does not name a directory to write", path.display())]
    BadOutput {
        /// The output path.
        path: PathBuf,
    },
    /// A file system operation failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The architecture is not one of the ladder's targets.
    #[error(
        "ladder `{}` does not target {arch}; its targets are {targets}",
        crate::files::shorten(ladder)
    )]
    NotTargeted {
        /// The ladder's name.
        ladder: String,
        /// The architecture asked for.
        arch: Arch,
        /// The ladder's targets, comma-separated.
        targets: String,
    },
    /// The ladder text given does not parse to the ladder given.
    #[error("the ladder text does not validate to the ladder it came with")]
    LadderTextMismatch,
    /// A bucket names a profile the ladder lacks.
    #[error(
        "bucket {bucket} names profile `{}`, which the ladder does not define",
        crate::files::shorten(profile)
    )]
    UnknownProfile {
        /// The bucket's index.
        bucket: usize,
        /// The profile id.
        profile: String,
    },
    /// No kernel implements a custom profile.
    #[error(
        "no kernel implements profile `{}` for {dtype}",
        crate::files::shorten(profile)
    )]
    NoKernel {
        /// The profile id.
        profile: String,
        /// The element type.
        dtype: &'static str,
    },
    /// The compilation lacks a kernel a candidate needs.
    #[error(
        "the compilation has no kernel `{kernel}`, which profile `{}` needs",
        crate::files::shorten(profile)
    )]
    MissingKernel {
        /// The kernel's name.
        kernel: String,
        /// The profile that needs it.
        profile: String,
    },
    /// A compiled kernel disagrees with the package: another architecture, a duplicate, or a
    /// cluster flag unlike the kernel table's.
    #[error("kernel `{kernel}` in the compilation: {problem}")]
    BadKernel {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        problem: String,
    },
    /// The path to open is not a directory.
    #[error("{} is not a package directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory has no manifest.
    #[error("{} is not a package: it has no {MANIFEST_FILE}", dir.display())]
    NoManifest {
        /// The directory.
        dir: PathBuf,
    },
    /// The manifest is not valid JSON.
    #[error("{}:{line}:{column}: not valid JSON: {message}", path.display())]
    ManifestSyntax {
        /// The manifest's path.
        path: PathBuf,
        /// Line, from 1.
        line: usize,
        /// Column, from 1.
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// The manifest's contract is not one this tool reads.
    #[error("{}: {}", path.display(), describe_unknown_format(*found, writer.as_deref()))]
    UnknownFormat {
        /// The manifest's path.
        path: PathBuf,
        /// The `format_version` found.
        found: u64,
        /// The `tool_version` the manifest names, if it has one.
        writer: Option<String>,
    },
    /// The manifest breaks the manifest schema.
    #[error("{} breaks the manifest schema:{}", path.display(), bullets(problems))]
    ManifestSchema {
        /// The manifest's path.
        path: PathBuf,
        /// Each problem, with its JSON path.
        problems: Vec<Problem>,
    },
    /// The manifest contradicts itself or the ladder.
    #[error("{} is inconsistent:{}", path.display(), bullets(problems))]
    ManifestInconsistent {
        /// The manifest's path.
        path: PathBuf,
        /// Each problem, with its JSON path.
        problems: Vec<Problem>,
    },
    /// Files do not match the manifest.
    #[error("package {} does not match its manifest:{}", dir.display(), bullets(problems))]
    Files {
        /// The package directory.
        dir: PathBuf,
        /// Each changed, missing or extra file.
        problems: Vec<FileProblem>,
    },
    /// The package was replaced (by an export) while it was being read.
    #[error("package {} changed while it was read (an export replaced it); open it again", dir.display())]
    Changed {
        /// The package directory.
        dir: PathBuf,
    },
    /// `ladder.json` matches its hash but is not a valid ladder.
    #[error("{} is not a valid ladder:\n{report}", path.display())]
    InvalidLadder {
        /// The ladder's path.
        path: PathBuf,
        /// The validation report.
        report: String,
    },
}

/// A problem at a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The JSON pointer it is about (`/kernels/0/file`); empty for the whole document.
    pub pointer: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pointer = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(formatter, "{pointer}: {}", self.message)
    }
}

/// A package file that does not match the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    /// The path relative to the package, `/`-separated.
    pub path: String,
    /// What is wrong with it.
    pub kind: FileProblemKind,
}

/// How a file fails to match the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileProblemKind {
    /// Its sha256 is not the one the manifest records.
    Changed {
        /// The manifest's sha256.
        expected: String,
        /// The file's sha256.
        found: String,
    },
    /// The manifest's content does not give the checksum it records.
    ChecksumMismatch {
        /// The checksum recorded.
        expected: String,
        /// The checksum the content gives.
        found: String,
    },
    /// The manifest lists it but it is absent.
    Missing,
    /// It is present but the manifest does not list it.
    Extra,
    /// It is listed but is not a regular file (a directory, a link).
    NotAFile,
    /// Its name is not UTF-8 (the path holds it escaped), so it is no file of the package.
    NotUtf8,
    /// Reading it failed.
    Unreadable(String),
}

impl fmt::Display for FileProblem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = &self.path;
        match &self.kind {
            FileProblemKind::Changed { expected, found } => write!(
                formatter,
                "{path}: changed (its sha256 is {found}, {MANIFEST_FILE} records {expected})"
            ),
            FileProblemKind::ChecksumMismatch { expected, found } => write!(
                formatter,
                "{path}: changed (its content's checksum is {found}, it records {expected})"
            ),
            FileProblemKind::Missing => write!(formatter, "{path}: missing"),
            FileProblemKind::Extra => {
                write!(formatter, "{path}: not part of the package")
            }
            FileProblemKind::NotAFile => write!(formatter, "{path}: not a regular file"),
            FileProblemKind::NotUtf8 => write!(formatter, "{path}: its name is not UTF-8"),
            FileProblemKind::Unreadable(error) => write!(formatter, "{path}: unreadable: {error}"),
        }
    }
}

/// `Ok` when there are no problems, else the refusal `error` makes of them.
fn refused_if_any<P>(
    problems: Vec<P>,
    error: impl FnOnce(Vec<P>) -> PackageError,
) -> Result<(), PackageError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(error(problems))
    }
}

fn bullets<T: fmt::Display>(items: &[T]) -> String {
    items.iter().fold(String::new(), |mut text, item| {
        let _ = write!(text, "\n  {item}");
        text
    })
}

fn describe_unknown_format(found: u64, writer: Option<&str>) -> String {
    let readable = PACKAGE_FORMATS
        .iter()
        .map(|(version, tool)| format!("{version} (written by {tool})"))
        .collect::<Vec<_>>()
        .join(", ");
    let tool = crate::TOOL_VERSION;
    let reads = format!("this prepare ({tool}) reads format {readable}");
    let newest = PACKAGE_FORMATS
        .iter()
        .map(|(version, _)| u64::from(*version))
        .max()
        .unwrap_or(0);
    let again = "or export the package again with this prepare";
    match writer {
        Some(writer) if found > newest => format!(
            "package format_version {found} was written by prepare {writer}; {reads}. Read it with prepare {writer} or newer, {again}"
        ),
        None if found > newest => format!(
            "package format_version {found} is newer than this prepare ({tool}) reads (format {readable}). Read it with a newer prepare, {again}"
        ),
        Some(writer) => format!(
            "package format_version {found} (naming prepare {writer} as its writer) is not one any prepare writes; {reads}"
        ),
        None => format!("package format_version {found} is not one any prepare writes; {reads}"),
    }
}

/// The manifest's JSON Schema, as committed in `schemas/manifest.schema.json`.
pub fn manifest_schema() -> serde_json::Value {
    crate::json_schema::schema_for::<Manifest>()
}
