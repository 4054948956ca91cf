//! `prepare export`: validate a ladder, check the architecture, compile its kernels and write
//! a package.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prepare::ladder::{validate_ladder_bytes, Arch, Ladder, LadderError};
use prepare::package::{self, PackageError};
use prepare::progress::Reporter;

use super::Failure;

/// Flags of `prepare export`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ladder file to export.
    #[arg(long, value_name = "FILE")]
    collective_ladder: PathBuf,
    /// The package directory to write; it must not exist unless --force is given.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The GPU architecture to compile for, one of the ladder's targets (sm_90, sm_120, ...).
    #[arg(long, value_name = "ARCH", value_parser = parse_arch, conflicts_with = "gpus")]
    arch: Option<Arch>,
    /// GPUs to compile for and qualify every candidate on: comma-separated device indices.
    #[arg(long, value_name = "LIST")]
    gpus: Option<String>,
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
    let (text, ladder) = read_ladder(&args.collective_ladder)?;

    let arch = match (args.arch, &args.gpus) {
        (Some(arch), _) => arch,
        (None, Some(_)) => {
            return Err(Failure::runtime(anyhow!(
                "GPU qualification is not built yet; export for an architecture with --arch"
            )))
        }
        (None, None) => {
            let targets: Vec<&str> = ladder.targets.iter().map(|arch| arch.name()).collect();
            return Err(Failure::refused(anyhow!(
                "name the architecture to compile for with --arch (ladder `{}` targets {}); \
                 finding it from local GPUs is not built yet",
                ladder.name,
                targets.join(", ")
            )));
        }
    };
    prepare::device::check_export_target(&ladder, arch).map_err(Failure::refused)?;

    // Refused before compiling, so the answer does not wait on NVRTC.
    if !args.force && std::fs::symlink_metadata(&args.out).is_ok() {
        return Err(write_failure(PackageError::Exists {
            path: args.out.clone(),
        }));
    }

    let reporter = BarReporter::new();
    let compilation = prepare::compile::compile_ladder(&ladder, arch, &reporter)
        .with_context(|| format!("cannot compile the kernels of `{}` for {arch}", ladder.name))
        .map_err(Failure::runtime)?;
    let summary = package::write_package(&args.out, &text, &ladder, &compilation, arch, args.force)
        .map_err(write_failure)?;

    let mut out = std::io::stdout().lock();
    let replaced = if summary.replaced {
        " (replaced the previous package)"
    } else {
        ""
    };
    writeln!(
        out,
        "Exported `{}` for {} to {}{replaced}",
        ladder.name,
        summary.arch,
        summary.dir.display()
    )
    .and_then(|()| writeln!(out, "  identity  {}", summary.identity))
    .and_then(|()| writeln!(out, "  kernels   {}", summary.kernels))
    .and_then(|()| writeln!(out, "  buckets   {}", summary.buckets))
    .context("cannot write to standard output")
    .map_err(Failure::runtime)
}

/// The ladder file's text as given, and the ladder it validates to; an invalid ladder gets the
/// report `prepare validate` prints.
fn read_ladder(path: &Path) -> Result<(String, Ladder), Failure> {
    let bytes = std::fs::read(path)
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
        PackageError::NotAPackage { .. } | PackageError::BadOutput { .. } => {
            Failure::refused(error)
        }
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
        self.bar
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
        let previous = self
            .bar
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(bar);
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
        let bar = self
            .bar
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }
}
