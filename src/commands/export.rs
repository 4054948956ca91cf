//! `prepare export`: validate a ladder, check the architecture, compile its kernels and write
//! a package. With GPUs (`--gpus`, or every visible GPU when no `--arch` is given) it also
//! qualifies every candidate on them: the package is staged, one rank per GPU qualifies it
//! (see `prepare::qualify`), and the package is written with the result.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prepare::device::DeviceDescription;
use prepare::ladder::{validate_ladder_bytes, Arch, Ladder, LadderError};
use prepare::package::{
    self, Outcome, Package, PackageError, PackageSummary, Qualification, QualifiedGpu,
};
use prepare::progress::Reporter;

use super::ranks::{self, RankArgs, Role};
use super::Failure;

/// Where the launcher tells the ranks the staged package is.
const STAGED_PACKAGE_VARIABLE: &str = "PREPARE_QUALIFY_PACKAGE";
/// Where rank 0 writes the qualification for the launcher.
const REPORT_VARIABLE: &str = "PREPARE_QUALIFY_REPORT";

/// Flags of `prepare export`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ladder file to export.
    #[arg(long, value_name = "FILE")]
    collective_ladder: PathBuf,
    /// The package directory to write. A package already there that is the one this export
    /// writes is left as it is (up to date); another is refused unless --force is given.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The GPU architecture to compile for, one of the ladder's targets (sm_90, sm_120, ...).
    #[arg(long, value_name = "ARCH", value_parser = parse_arch, conflicts_with = "gpus")]
    arch: Option<Arch>,
    #[command(flatten)]
    ranks: RankArgs,
    /// Replace an existing package at --out (atomically; on failure the old one stays).
    #[arg(long)]
    force: bool,
}

fn parse_arch(name: &str) -> Result<Arch, String> {
    Arch::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Arch::ALL.iter().map(|arch| arch.name()).collect();
        format!("unknown architecture; expected one of {}", known.join(", "))
    })
}

/// Runs `prepare export`.
pub fn run(args: &Args) -> Result<(), Failure> {
    // A rank of `export --gpus` is started by the launcher below with the staged package named;
    // an export run inside someone else's torchrun job is not one.
    if std::env::var_os(STAGED_PACKAGE_VARIABLE).is_some() {
        if let Role::Rank = ranks::role()? {
            return qualify_rank(args);
        }
    }
    let (text, ladder) = read_ladder(&args.collective_ladder)?;

    let gpus = match (args.arch, &args.ranks.gpus) {
        (Some(_), _) => None,
        (None, Some(gpus)) => {
            ranks::check_distinct_gpus(gpus)?;
            Some(gpus.clone())
        }
        (None, None) => {
            let visible = prepare::gpu::driver::visible_devices().unwrap_or(0);
            if visible == 0 {
                let targets: Vec<&str> = ladder.targets.iter().map(|arch| arch.name()).collect();
                return Err(Failure::usage(anyhow!(
                    "name the architecture to compile for with --arch (ladder `{}` targets {}); \
                     no GPU is visible here to take it from",
                    prepare::files::shorten(&ladder.name),
                    targets.join(", ")
                )));
            }
            Some((0..visible as u32).collect())
        }
    };
    let (arch, uuids) = match (&gpus, args.arch) {
        (Some(gpus), _) => {
            args.ranks.timeout()?;
            gpus_architecture(&ladder, gpus)?
        }
        (None, Some(arch)) => (arch, Vec::new()),
        (None, None) => unreachable!("no --arch means GPUs"),
    };
    // One GPU cannot run a collective: compile for it, and say that nothing was qualified.
    let gpus = gpus.filter(|gpus| {
        let several = gpus.len() > 1 || args.ranks.gpus.is_some();
        if !several {
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "one GPU is visible: compiling for its {arch} without qualification, which \
                     needs two or more (name them with --gpus)"
                );
            }
        }
        several
    });
    prepare::device::check_export_target(&ladder, arch).map_err(Failure::refused)?;

    // What can be told before compiling is, so the answer does not wait on NVRTC (and the
    // output is checked again when the package is written).
    let qualified_on = gpus.as_ref().map(|_| uuids.as_slice());
    let existing = existing_package(args, &text, &ladder, arch, qualified_on)?;

    let reporter = BarReporter::new();
    let compilation = prepare::compile::compile_ladder(&ladder, arch, &reporter)
        .with_context(|| {
            format!(
                "cannot compile the kernels of `{}` for {arch}",
                prepare::files::shorten(&ladder.name)
            )
        })
        .map_err(Failure::runtime)?;
    if let Some(existing) = existing {
        return up_to_date(args, &text, &ladder, &compilation, &existing);
    }
    let qualification = match gpus {
        None => None,
        Some(gpus) => Some(qualify_on(args, &text, &ladder, &compilation, arch, gpus)?),
    };
    let written = package::write_qualified_package(
        &args.out,
        &text,
        &ladder,
        &compilation,
        arch,
        qualification.clone(),
        args.force,
    );
    let summary = match written {
        // Another export wrote it meanwhile: up to date if it is the package this one writes.
        Err(error @ PackageError::Exists { .. }) => {
            return match existing_package(args, &text, &ladder, arch, qualified_on)? {
                Some(existing) => up_to_date(args, &text, &ladder, &compilation, &existing),
                None => Err(write_failure(error)),
            };
        }
        written => written.map_err(write_failure)?,
    };
    let replaced = if summary.replaced {
        " (replaced the previous package)"
    } else {
        ""
    };
    let headline = format!(
        "Exported `{}` for {} to {}{replaced}",
        ladder.name,
        summary.arch,
        summary.dir.display()
    );
    print_summary(&headline, &summary, &ladder, qualification.as_ref())
}

/// The package already at `--out` when it may be the one this export writes: nothing there,
/// or `--force` (which replaces whatever package is there), is `None`. What is known before
/// compiling (the tool, the ladder, the architecture, the compiler's options, the GPUs it is
/// qualified on, given as `qualify_on`) must be the same, or it is refused.
fn existing_package(
    args: &Args,
    text: &str,
    ladder: &Ladder,
    arch: Arch,
    qualify_on: Option<&[String]>,
) -> Result<Option<Package>, Failure> {
    match package::check_output(&args.out, args.force) {
        Ok(_) => return Ok(None),
        Err(PackageError::Exists { .. }) => {}
        Err(error) => return Err(write_failure(error)),
    }
    let existing = match package::open_package(&args.out) {
        Ok(existing) => existing,
        // Only a package that --force would replace is offered --force.
        Err(error) => {
            return Err(match package::check_output(&args.out, true) {
                Err(refusal) => write_failure(refusal),
                Ok(_) => Failure::refused(anyhow!(
                    "{} already exists and does not open as a package ({error}); pass --force to \
                     replace it",
                    args.out.display()
                )),
            })
        }
    };
    let manifest = existing.manifest();
    let known = package::Manifest {
        format_version: package::PACKAGE_FORMAT_VERSION,
        tool_version: prepare::TOOL_VERSION.to_owned(),
        ladder: package::LadderRecord {
            name: ladder.name.clone(),
            sha256: prepare::hash::sha256_hex(text.as_bytes()),
            collective: ladder.collective,
            dtype: ladder.dtype,
            world_size: ladder.world_size,
        },
        arch,
        compiler: package::CompilerRecord {
            options: prepare::compile::compile_options(arch),
            ..manifest.compiler.clone()
        },
        ..manifest.clone()
    };
    let mut differences = package::manifest_differences(manifest, &known);
    differences.extend(qualification_difference(
        manifest.qualification.as_ref(),
        qualify_on,
    ));
    if differences.is_empty() {
        Ok(Some(existing))
    } else {
        Err(differs(&args.out, &differences))
    }
}

/// Whether the package there was qualified as this export would qualify it: on none of the
/// GPUs, or on these (their UUIDs in rank order).
fn qualification_difference(
    existing: Option<&Qualification>,
    qualify_on: Option<&[String]>,
) -> Option<String> {
    let qualified_on = existing.map(|qualification| {
        qualification
            .gpus
            .iter()
            .map(|gpu| gpu.uuid.clone())
            .collect::<Vec<_>>()
    });
    match (qualified_on, qualify_on) {
        (None, None) => None,
        (Some(theirs), Some(ours)) if theirs == ours => None,
        (Some(theirs), None) => Some(format!(
            "it was qualified on {}, this export qualifies on none",
            gpu_list(&theirs)
        )),
        (None, Some(ours)) => Some(format!(
            "it holds no qualification, this export qualifies on {}",
            gpu_list(ours)
        )),
        (Some(theirs), Some(ours)) => Some(format!(
            "it was qualified on {}, this export qualifies on {}",
            gpu_list(&theirs),
            gpu_list(ours)
        )),
    }
}

/// `2 GPUs (GPU-a, GPU-b)`.
fn gpu_list(uuids: &[String]) -> String {
    format!("{} GPUs ({})", uuids.len(), uuids.join(", "))
}

/// The refusal of a package that is not the one this export writes.
fn differs(out: &Path, differences: &[String]) -> Failure {
    Failure::refused(anyhow!(
        "{} holds another package than this export writes: {}; pass --force to replace it",
        out.display(),
        differences.join("; ")
    ))
}

/// Compares the package already at `--out` with the one this export would write, now that
/// the kernels are compiled: the same identity is up to date (nothing is written or qualified
/// again), another is refused, naming what differs.
fn up_to_date(
    args: &Args,
    text: &str,
    ladder: &Ladder,
    compilation: &prepare::compile::Compilation,
    existing: &Package,
) -> Result<(), Failure> {
    // Its qualification, checked above to be on the GPUs this export would qualify on.
    let qualification = existing.manifest().qualification.clone();
    let manifest =
        package::build_manifest(text, ladder, compilation, existing.arch(), qualification)
            .map_err(write_failure)?;
    let identity = prepare::hash::sha256_hex(&manifest.to_bytes());
    if identity != existing.identity() {
        let mut differences = package::manifest_differences(existing.manifest(), &manifest);
        if differences.is_empty() {
            differences.push(format!(
                "its identity is {}, this export's {identity}",
                existing.identity()
            ));
        }
        return Err(differs(&args.out, &differences));
    }
    let summary = PackageSummary {
        dir: args.out.clone(),
        identity,
        arch: existing.arch(),
        kernels: manifest.kernels.len(),
        buckets: manifest.buckets.len(),
        replaced: false,
    };
    let headline = format!(
        "Up to date: `{}` for {} at {} is the package this export writes; nothing was written",
        ladder.name,
        summary.arch,
        summary.dir.display()
    );
    print_summary(&headline, &summary, ladder, manifest.qualification.as_ref())
}

/// The headline, then the package's identity, kernels, buckets, what each candidate of the
/// fused epilogue runs, and qualification.
fn print_summary(
    headline: &str,
    summary: &PackageSummary,
    ladder: &Ladder,
    qualification: Option<&Qualification>,
) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    // The ladder's name and the path given come from the user: escaped for the terminal.
    writeln!(out, "{}", prepare::files::escape_control(headline))
        .and_then(|()| writeln!(out, "  identity  {}", summary.identity))
        .and_then(|()| writeln!(out, "  kernels   {}", summary.kernels))
        .and_then(|()| writeln!(out, "  buckets   {}", summary.buckets))
        .and_then(|()| {
            for (form, ids) in prepare::ladder::epilogue_forms(ladder) {
                let ids = prepare::files::escape_control(&ids.join(", ")).into_owned();
                writeln!(out, "  {}: {ids}", form.describe())?;
            }
            Ok(())
        })
        .and_then(|()| match qualification {
            None => Ok(()),
            Some(qualification) => {
                let outcomes = || {
                    qualification
                        .buckets
                        .iter()
                        .flat_map(|bucket| &bucket.candidates)
                };
                let qualified = outcomes()
                    .filter(|candidate| matches!(candidate.outcome, Outcome::Qualified { .. }))
                    .count();
                writeln!(
                out,
                "  qualified {qualified} of {} candidates on {} GPUs ({}); `prepare show` lists \
                 each",
                outcomes().count(),
                qualification.gpus.len(),
                qualification
                    .gpus
                    .first()
                    .map_or("", |gpu| gpu.name.as_str())
            )
            }
        })
        .context("cannot write to standard output")
        .map_err(Failure::runtime)
}

/// The architecture of the GPUs, which must all be the same and fit the ladder's rules, and
/// their UUIDs.
fn gpus_architecture(ladder: &Ladder, gpus: &[u32]) -> Result<(Arch, Vec<String>), Failure> {
    let driver = prepare::gpu::driver::Driver::open().map_err(Failure::runtime)?;
    let mut arch = None;
    let mut uuids = Vec::with_capacity(gpus.len());
    for &gpu in gpus {
        let info = driver.describe(gpu as usize).map_err(Failure::runtime)?;
        uuids.push(info.uuid.clone());
        let description = DeviceDescription::of_gpu(
            info.ordinal,
            &info.name,
            info.compute_capability,
            info.sm_count,
            info.cluster_launch,
        )
        .map_err(Failure::refused)?;
        prepare::device::check_package_fits(ladder, &description)
            .with_context(|| format!("GPU {gpu}"))
            .map_err(Failure::refused)?;
        match arch {
            None => arch = Some(description.arch),
            Some(first) if first == description.arch => {}
            Some(first) => {
                return Err(Failure::refused(anyhow!(
                    "GPU {gpu} is {}, GPU {} is {first}: a package is for one architecture",
                    description.arch,
                    gpus[0]
                )))
            }
        }
    }
    let arch = arch.ok_or_else(|| Failure::usage(anyhow!("--gpus names no GPU")))?;
    Ok((arch, uuids))
}

/// Stages the package, launches one rank per GPU to qualify it, and reads the result.
fn qualify_on(
    args: &Args,
    text: &str,
    ladder: &Ladder,
    compilation: &prepare::compile::Compilation,
    arch: Arch,
    gpus: Vec<u32>,
) -> Result<Qualification, Failure> {
    let staging = tempfile::Builder::new()
        .prefix("prepare-qualify-")
        .tempdir()
        .context("cannot make a staging directory")
        .map_err(Failure::runtime)?;
    let staged = staging.path().join("package");
    let report = staging.path().join("qualification.json");
    package::write_package(&staged, text, ladder, compilation, arch, false).map_err(|error| {
        Failure::runtime(anyhow::Error::new(error).context("cannot stage the package"))
    })?;
    ranks::launch_ranks(
        "export --gpus",
        &args.ranks,
        gpus,
        vec![
            (STAGED_PACKAGE_VARIABLE.into(), staged.into_os_string()),
            (REPORT_VARIABLE.into(), report.clone().into_os_string()),
        ],
    )?;
    let bytes = std::fs::read(&report)
        .with_context(|| format!("rank 0 wrote no qualification to {}", report.display()))
        .map_err(Failure::runtime)?;
    serde_json::from_slice(&bytes)
        .with_context(|| {
            format!(
                "cannot read the qualification rank 0 wrote to {}",
                report.display()
            )
        })
        .map_err(Failure::runtime)
}

/// A rank of `export --gpus`: qualifies the staged package on this rank's GPU; rank 0 writes
/// the agreed result for the launcher.
#[allow(clippy::print_stdout)]
fn qualify_rank(args: &Args) -> Result<(), Failure> {
    let variable = |name: &str| {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            Failure::usage(anyhow!(
                "this rank of `prepare export` was started without {name}; start export \
                 without RANK set and it launches its ranks itself"
            ))
        })
    };
    let staged = variable(STAGED_PACKAGE_VARIABLE)?;
    let report_path = variable(REPORT_VARIABLE)?;
    let package = package::open_package(&staged).map_err(Failure::refused)?;
    let runtime = ranks::start_rank(&args.ranks)?;
    ranks::check_architecture(&runtime, &package)?;
    let mut collectives =
        prepare::collective::Collectives::new(&runtime, &package).map_err(Failure::runtime)?;
    let report = prepare::qualify::qualify(
        &runtime,
        &mut collectives,
        package.ladder(),
        prepare::qualify::QualifyOptions::default(),
        &|line| println!("{line}"),
    )
    .map_err(Failure::runtime)?;
    if let Some(sequence) = &report.sequence {
        if sequence.used_before != sequence.used_after {
            return Err(Failure::runtime(anyhow!(
                "rank {}: device memory in use changed across the graph replays, from {} to {} \
                 bytes",
                runtime.rank(),
                sequence.used_before,
                sequence.used_after
            )));
        }
    }
    if runtime.rank() == 0 {
        let qualification = Qualification {
            gpus: runtime
                .records()
                .iter()
                .map(|record| QualifiedGpu {
                    name: record.gpu_name.clone(),
                    uuid: record.gpu_uuid.clone(),
                })
                .collect(),
            driver_version: prepare::runtime::driver_version(),
            nccl_version: prepare::runtime::nccl_version().map_err(Failure::runtime)?,
            buckets: report.buckets(&collectives),
        };
        let mut bytes =
            serde_json::to_vec_pretty(&qualification).expect("a qualification always serializes");
        bytes.push(b'\n');
        prepare::files::write_atomically(&report_path, &bytes)
            .with_context(|| format!("cannot write {}", report_path.display()))
            .map_err(Failure::runtime)?;
    }
    println!("qualification done");
    Ok(())
}

/// The ladder file's text as given, and the ladder it validates to; an invalid ladder gets the
/// report `prepare validate` prints.
fn read_ladder(path: &Path) -> Result<(String, Ladder), Failure> {
    let bytes = prepare::files::read_limited(path, prepare::files::LADDER)
        .map_err(|source| LadderError::Io {
            path: path.to_path_buf(),
            source,
        })
        .map_err(Failure::refused)?;
    let ladder = validate_ladder_bytes(&bytes)
        .map_err(|report| LadderError::Invalid {
            path: path.to_path_buf(),
            report,
        })
        .map_err(Failure::refused)?;
    let text = String::from_utf8(bytes).expect("a valid ladder is UTF-8");
    Ok((text, ladder))
}

/// Refusals of the output (it exists, it is not a package) are the user's to fix; the rest
/// failed at run time.
fn write_failure(error: PackageError) -> Failure {
    match error {
        PackageError::Exists { .. } => {
            Failure::refused(anyhow!("{error}; pass --force to replace it"))
        }
        // A profile whose kernel this prepare does not have (a fused one not built yet).
        PackageError::NotAPackage { .. } | PackageError::NoKernel { .. } => Failure::refused(error),
        PackageError::BadOutput { .. } => Failure::usage(error),
        _ => Failure::runtime(anyhow::Error::new(error).context("cannot write the package")),
    }
}

/// Progress bars on standard error, hidden when it is not a terminal.
#[derive(Debug)]
pub struct BarReporter {
    visible: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl BarReporter {
    /// A reporter that draws on standard error if it is a terminal.
    pub fn new() -> BarReporter {
        BarReporter {
            visible: std::io::stderr().is_terminal(),
            bar: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<ProgressBar> {
        prepare::progress::lock(&self.bar).clone()
    }
}

impl Reporter for BarReporter {
    fn start(&self, phase: &str, total: u64) {
        let target = if self.visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}",
            )
            .expect("the template is valid")
            .progress_chars("=> "),
        );
        bar.set_prefix(phase.to_string());
        if self.visible {
            // Each step can take seconds; the spinner and clock show it is still working.
            bar.enable_steady_tick(Duration::from_millis(100));
        }
        let previous = prepare::progress::lock(&self.bar).replace(bar);
        if let Some(previous) = previous {
            previous.finish_and_clear();
        }
    }

    fn advance(&self, item: &str) {
        if let Some(bar) = self.current() {
            bar.set_message(item.to_string());
            bar.inc(1);
        }
    }

    fn finish(&self) {
        let bar = prepare::progress::lock(&self.bar).take();
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }
}
