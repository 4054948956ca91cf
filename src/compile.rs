//! Compilation of the custom kernels with NVRTC into one cubin per kernel and architecture,
//! with the resource usage ptxas reports (registers, shared memory, spills, stack).
//!
//! Options are fixed so that the same sources and NVRTC give the same bytes, and so that no
//! flag can change the reference sum's arithmetic (no fast math, no flush to zero).
//!
//! Fault-injection tests compile kernels with some sources replaced ([`SourceOverrides`]), to
//! prove that the exactness checks catch planted bugs; production code never replaces any.

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::gpu::nvrtc::{Nvrtc, NvrtcError};
use crate::kernels::{self, KernelSpec};
use crate::ladder::{Arch, Dtype, Ladder};
use crate::progress::Reporter;

/// One compiled kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledKernel {
    /// Kernel name and entry symbol.
    pub name: String,
    /// Source file it came from.
    pub source: String,
    /// Whether it is a cluster kernel.
    pub cluster: bool,
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// The cubin.
    pub cubin: Vec<u8>,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Bytes spilled to local memory by stores.
    pub spill_store_bytes: u32,
    /// Bytes read back from spills.
    pub spill_load_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_bytes: u32,
}

/// Everything a compilation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compilation {
    /// NVRTC's version (major, minor).
    pub nvrtc_version: (u32, u32),
    /// Options every kernel was compiled with; each kernel adds the definitions that
    /// instantiate it for its dtype and world size ([`KernelSpec::defines`]) and
    /// `--ptxas-options=--entry=<its name>` so its cubin holds that entry alone (with its
    /// start and end barriers, for a copy-engine kernel).
    pub options: Vec<String>,
    /// One entry per distinct kernel, sorted by name.
    pub kernels: Vec<CompiledKernel>,
}

/// Why compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// NVRTC could not be found or loaded; the message says how to get it.
    #[error(transparent)]
    Library(NvrtcError),
    /// This NVRTC does not compile for the architecture.
    #[error("NVRTC {}.{} does not compile for {arch} (it supports {supported}); install `nvidia-cuda-nvrtc==13.0.*` or a CUDA 13 toolkit", .version.0, .version.1)]
    UnsupportedArch {
        /// The architecture asked for.
        arch: Arch,
        /// NVRTC's version.
        version: (u32, u32),
        /// The architectures it supports, as `sm_XX` names.
        supported: String,
    },
    /// A kernel did not compile; NVRTC's log and the options say why.
    #[error("compiling kernel {kernel} ({source_file}) for {arch} failed with options `{}`:\n{log}", .options.join(" "))]
    Compile {
        /// The kernel.
        kernel: String,
        /// Its source file.
        source_file: String,
        /// The architecture.
        arch: Arch,
        /// The options it was compiled with.
        options: Vec<String>,
        /// NVRTC's log.
        log: String,
    },
    /// NVRTC failed outside compilation proper (creating the program, reading the log).
    #[error("NVRTC failed on kernel {kernel} for {arch}: {error}")]
    Nvrtc {
        /// The kernel.
        kernel: String,
        /// The architecture.
        arch: Arch,
        /// What NVRTC said.
        error: NvrtcError,
    },
    /// The compiled kernel's cubin could not be retrieved.
    #[error("retrieving the cubin of kernel {kernel} for {arch}: {error}")]
    Cubin {
        /// The kernel.
        kernel: String,
        /// The architecture.
        arch: Arch,
        /// What NVRTC said.
        error: NvrtcError,
    },
    /// NVRTC answered from the CUDA compute cache, so ptxas never reported the resources.
    #[error(
        "NVRTC compiled kernel {kernel} for {arch} without ptxas's resource report: it answered \
         from the CUDA compute cache (~/.nv/ComputeCache); run with CUDA_CACHE_DISABLE=1 (the \
         prepare command sets it for itself)"
    )]
    EmptyLog {
        /// The kernel.
        kernel: String,
        /// The architecture.
        arch: Arch,
    },
    /// A source override names a file the kernels do not have.
    #[error("`{file}` is not a kernel source or header of this crate (they are {known})")]
    UnknownSourceFile {
        /// The file name given.
        file: String,
        /// The sources and headers there are.
        known: String,
    },
    /// The resource usage could not be read from the log.
    #[error("reading the resource usage of kernel {kernel} for {arch} from NVRTC's log: {problem}\nlog:\n{log}")]
    LogParse {
        /// The kernel.
        kernel: String,
        /// The architecture.
        arch: Arch,
        /// What is missing.
        problem: LogParseError,
        /// The log.
        log: String,
    },
}

/// What the ptxas log lacked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogParseError {
    /// No `Compiling entry function '<entry>'` line.
    #[error("no `Compiling entry function '{entry}'` line")]
    NoEntry {
        /// The entry symbol.
        entry: String,
    },
    /// The entry's section lacks a line.
    #[error("the section of `{entry}` has no `{expected}` line")]
    MissingLine {
        /// The entry symbol.
        entry: String,
        /// The words the line should have.
        expected: &'static str,
    },
    /// A number on a line did not parse.
    #[error("cannot read the number before `{unit}` in `{line}`")]
    BadNumber {
        /// The line.
        line: String,
        /// The words after the number.
        unit: &'static str,
    },
}

/// Resource usage of one entry, as ptxas reports it with `-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceUsage {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Bytes spilled to local memory by stores.
    pub spill_store_bytes: u32,
    /// Bytes read back from spills.
    pub spill_load_bytes: u32,
    /// Stack frame per thread, bytes.
    pub stack_bytes: u32,
}

/// Kernel sources and headers to compile in place of the embedded ones, by file name.
///
/// For fault-injection tests, which plant bugs in the kernels to prove that the exactness checks
/// catch them. A package compiled from replaced sources stays honest: its manifest records each
/// kernel's source file and the hash of the cubin actually compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceOverrides {
    files: BTreeMap<String, String>,
}

impl SourceOverrides {
    /// No file replaced: the embedded sources as they are.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compiles `text` in place of `file`, a kernel source (`all_reduce_one_shot.cu`) or header
    /// (`prepare_bf16.cuh`). A name the kernels do not have is refused, so a misspelt one cannot
    /// leave the embedded text in place unnoticed.
    pub fn replace(&mut self, file: &str, text: impl Into<String>) -> Result<(), CompileError> {
        let known = known_source_files();
        if !known.contains(&file) {
            return Err(CompileError::UnknownSourceFile {
                file: file.to_owned(),
                known: known.join(", "),
            });
        }
        self.files.insert(file.to_owned(), text.into());
        Ok(())
    }

    /// The replaced file names, sorted.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Whether no file is replaced.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The text to compile for `spec`'s source file.
    fn source<'a>(&'a self, spec: &KernelSpec) -> &'a str {
        self.files
            .get(spec.source)
            .map_or_else(|| kernels::source(spec), String::as_str)
    }

    /// Every header, replaced or embedded, as (include name, text).
    fn headers(&self) -> Vec<(&str, &str)> {
        kernels::headers()
            .iter()
            .map(|&(name, text)| (name, self.files.get(name).map_or(text, String::as_str)))
            .collect()
    }
}

/// Every kernel source and header file name, sorted.
fn known_source_files() -> Vec<&'static str> {
    let mut files: Vec<&'static str> = kernels::all_kernels(Dtype::Bf16, 2)
        .iter()
        .map(|spec| spec.source)
        .chain(kernels::headers().iter().map(|(name, _)| *name))
        .collect();
    files.sort_unstable();
    files.dedup();
    files
}

/// The options every kernel is compiled with for `arch`.
pub fn compile_options(arch: Arch) -> Vec<String> {
    [
        &format!("--gpu-architecture={}", arch.name()),
        "--std=c++17",
        "-default-device",
        // The reference sum's arithmetic: IEEE adds, subnormals kept, nothing fused.
        "--ftz=false",
        "--prec-div=true",
        "--prec-sqrt=true",
        "--fmad=false",
        // Registers, shared memory, spills and stack into the log.
        "--ptxas-options=-v",
    ]
    .iter()
    .map(|option| (*option).to_owned())
    .collect()
}

/// Compiles every custom kernel the ladder's profiles need for `arch`, with NVRTC found by
/// [`Nvrtc::load`].
pub fn compile_ladder(
    ladder: &Ladder,
    arch: Arch,
    reporter: &dyn Reporter,
) -> Result<Compilation, CompileError> {
    compile_kernels(&kernels::kernels_for_ladder(ladder), arch, reporter)
}

/// Compiles `kernels` for `arch` (each distinct kernel once, in parallel), with NVRTC found by
/// [`Nvrtc::load`]. Progress: phase "compile", one step per kernel.
pub fn compile_kernels(
    kernels: &[KernelSpec],
    arch: Arch,
    reporter: &dyn Reporter,
) -> Result<Compilation, CompileError> {
    let nvrtc = Nvrtc::load().map_err(CompileError::Library)?;
    compile_kernels_with(nvrtc, kernels, arch, reporter)
}

/// [`compile_kernels`] with a given NVRTC.
pub fn compile_kernels_with(
    nvrtc: &Nvrtc,
    kernels: &[KernelSpec],
    arch: Arch,
    reporter: &dyn Reporter,
) -> Result<Compilation, CompileError> {
    compile_kernels_with_sources(nvrtc, kernels, arch, &SourceOverrides::new(), reporter)
}

/// [`compile_kernels_with`], compiling the files `sources` replaces from its text instead of
/// the embedded one (for fault-injection tests).
pub fn compile_kernels_with_sources(
    nvrtc: &Nvrtc,
    kernels: &[KernelSpec],
    arch: Arch,
    sources: &SourceOverrides,
    reporter: &dyn Reporter,
) -> Result<Compilation, CompileError> {
    let supported = nvrtc
        .supported_architectures()
        .map_err(CompileError::Library)?;
    let wanted = arch
        .name()
        .strip_prefix("sm_")
        .and_then(|number| number.parse::<u32>().ok());
    if !wanted.is_some_and(|number| supported.contains(&number)) {
        return Err(CompileError::UnsupportedArch {
            arch,
            version: nvrtc.version(),
            supported: supported
                .iter()
                .map(|number| format!("sm_{number}"))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut distinct = kernels.to_vec();
    distinct.sort();
    distinct.dedup();
    let options = compile_options(arch);
    reporter.start("compile", distinct.len() as u64);
    let compiled = distinct
        .par_iter()
        .map(|spec| {
            let kernel = compile_kernel(nvrtc, spec, arch, &options, sources)?;
            reporter.advance(&spec.name);
            Ok(kernel)
        })
        .collect::<Result<Vec<_>, CompileError>>();
    reporter.finish();
    Ok(Compilation {
        nvrtc_version: nvrtc.version(),
        options,
        kernels: compiled?,
    })
}

fn compile_kernel(
    nvrtc: &Nvrtc,
    spec: &KernelSpec,
    arch: Arch,
    options: &[String],
    sources: &SourceOverrides,
) -> Result<CompiledKernel, CompileError> {
    let nvrtc_error = |error| CompileError::Nvrtc {
        kernel: spec.name.clone(),
        arch,
        error,
    };
    let mut program = nvrtc
        .program(spec.source, sources.source(spec), &sources.headers())
        .map_err(nvrtc_error)?;
    let mut kernel_options = options.to_vec();
    // The templates instantiated for the kernel's element type and world size.
    kernel_options.extend(spec.defines());
    // A copy-engine kernel's barriers are entries of the same module.
    let mut entries = vec![spec.name.clone()];
    if let Some(barriers) = spec.copy_engine_barriers() {
        entries.extend(barriers);
    }
    kernel_options.push(format!("--ptxas-options=--entry={}", entries.join(",")));
    let log = compile_once(spec, arch, &mut program, &kernel_options)?;
    if log.trim().is_empty() {
        return Err(CompileError::EmptyLog {
            kernel: spec.name.clone(),
            arch,
        });
    }
    let cubin = program.cubin().map_err(|error| CompileError::Cubin {
        kernel: spec.name.clone(),
        arch,
        error,
    })?;
    let usage =
        parse_resource_usage(&log, &spec.name).map_err(|problem| CompileError::LogParse {
            kernel: spec.name.clone(),
            arch,
            problem,
            log: log.clone(),
        })?;
    Ok(CompiledKernel {
        name: spec.name.clone(),
        source: spec.source.to_owned(),
        cluster: spec.cluster,
        arch,
        cubin,
        registers: usage.registers,
        shared_bytes: usage.shared_bytes,
        spill_store_bytes: usage.spill_store_bytes,
        spill_load_bytes: usage.spill_load_bytes,
        stack_bytes: usage.stack_bytes,
    })
}

fn compile_once(
    spec: &KernelSpec,
    arch: Arch,
    program: &mut crate::gpu::nvrtc::Program<'_>,
    kernel_options: &[String],
) -> Result<String, CompileError> {
    let nvrtc_error = |error| CompileError::Nvrtc {
        kernel: spec.name.clone(),
        arch,
        error,
    };
    match program.compile(kernel_options) {
        Ok(log) => Ok(log),
        Err(NvrtcError::Compilation { log, .. }) => Err(CompileError::Compile {
            kernel: spec.name.clone(),
            source_file: spec.source.to_owned(),
            arch,
            options: kernel_options.to_vec(),
            log,
        }),
        Err(error) => Err(nvrtc_error(error)),
    }
}

/// Reads `entry`'s resource usage from a ptxas `-v` log:
///
/// ```text
/// ptxas info    : Compiling entry function 'all_reduce_one_shot_pull_bf16' for 'sm_90'
/// ptxas info    : Function properties for all_reduce_one_shot_pull_bf16
/// ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 42 registers, used 1 barriers, 24 bytes smem
/// ```
///
/// Shared memory is absent from the last line when the entry uses none.
pub fn parse_resource_usage(log: &str, entry: &str) -> Result<ResourceUsage, LogParseError> {
    const ENTRY_LINE: &str = "Compiling entry function '";
    let header = format!("{ENTRY_LINE}{entry}'");
    let mut lines = log.lines().skip_while(|line| !line.contains(&header));
    if lines.next().is_none() {
        return Err(LogParseError::NoEntry {
            entry: entry.to_owned(),
        });
    }
    let section: Vec<&str> = lines
        .take_while(|line| !line.contains(ENTRY_LINE))
        .collect();
    let missing = |expected| LogParseError::MissingLine {
        entry: entry.to_owned(),
        expected,
    };
    let frame = section
        .iter()
        .find(|line| line.contains("bytes stack frame"))
        .ok_or_else(|| missing("bytes stack frame"))?;
    let used = section
        .iter()
        .find(|line| line.contains("Used ") && line.contains(" registers"))
        .ok_or_else(|| missing("Used N registers"))?;
    let registers_text = used
        .split("Used ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default();
    let registers = registers_text
        .parse()
        .map_err(|_| LogParseError::BadNumber {
            line: (*used).to_owned(),
            unit: "registers",
        })?;
    Ok(ResourceUsage {
        registers,
        shared_bytes: number_before(used, "bytes smem")?.unwrap_or(0),
        stack_bytes: number_before(frame, "bytes stack frame")?
            .ok_or_else(|| missing("bytes stack frame"))?,
        spill_store_bytes: number_before(frame, "bytes spill stores")?
            .ok_or_else(|| missing("bytes spill stores"))?,
        spill_load_bytes: number_before(frame, "bytes spill loads")?
            .ok_or_else(|| missing("bytes spill loads"))?,
    })
}

/// The number just before `unit` in `line`, or `None` when `unit` is absent.
fn number_before(line: &str, unit: &'static str) -> Result<Option<u32>, LogParseError> {
    let Some(position) = line.find(unit) else {
        return Ok(None);
    };
    line[..position]
        .split([' ', ',', '.', ':'])
        .rfind(|word| !word.is_empty())
        .and_then(|word| word.parse().ok())
        .map(Some)
        .ok_or_else(|| LogParseError::BadNumber {
            line: line.to_owned(),
            unit,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two entries in one log as NVRTC 13.0 writes it: the first with shared memory, the
    /// second without, with spills and a stack frame.
    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'all_reduce_rsag_phased_bf16' for 'sm_90'
ptxas info    : Function properties for all_reduce_rsag_phased_bf16
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 56 registers, used 1 barriers, 32 bytes smem
ptxas info    : Compile time = 426.065 ms
ptxas info    : Compiling entry function 'all_reduce_one_shot_pull_bf16' for 'sm_90'
ptxas info    : Function properties for all_reduce_one_shot_pull_bf16
ptxas         .     48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 384 bytes cmem[0]
ptxas info    : Compile time = 135.894 ms
";

    #[test]
    fn reads_each_entry_from_its_own_section() {
        assert_eq!(
            parse_resource_usage(LOG, "all_reduce_rsag_phased_bf16"),
            Ok(ResourceUsage {
                registers: 56,
                shared_bytes: 32,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                stack_bytes: 0,
            })
        );
        assert_eq!(
            parse_resource_usage(LOG, "all_reduce_one_shot_pull_bf16"),
            Ok(ResourceUsage {
                registers: 255,
                shared_bytes: 0,
                spill_store_bytes: 40,
                spill_load_bytes: 36,
                stack_bytes: 48,
            })
        );
    }

    #[test]
    fn a_missing_entry_or_line_is_an_error_naming_it() {
        insta::assert_snapshot!(
            parse_resource_usage(LOG, "all_reduce_rsag").unwrap_err(),
            @"no `Compiling entry function 'all_reduce_rsag'` line"
        );
        let without_registers = LOG.replace("Used 56 registers, ", "");
        insta::assert_snapshot!(
            parse_resource_usage(&without_registers, "all_reduce_rsag_phased_bf16").unwrap_err(),
            @"the section of `all_reduce_rsag_phased_bf16` has no `Used N registers` line"
        );
        // The next entry's frame line must not stand in for a missing one.
        let without_frame = LOG.replace(
            "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n",
            "",
        );
        insta::assert_snapshot!(
            parse_resource_usage(&without_frame, "all_reduce_rsag_phased_bf16").unwrap_err(),
            @"the section of `all_reduce_rsag_phased_bf16` has no `bytes stack frame` line"
        );
        let garbled = LOG.replace("Used 56 registers", "Used many registers");
        insta::assert_snapshot!(
            parse_resource_usage(&garbled, "all_reduce_rsag_phased_bf16").unwrap_err(),
            @"cannot read the number before `registers` in `ptxas info    : Used many registers, used 1 barriers, 32 bytes smem`"
        );
    }

    #[test]
    fn source_overrides_replace_only_the_files_they_name() {
        let mut sources = SourceOverrides::new();
        assert!(sources.is_empty());
        sources
            .replace("prepare_element.cuh", "// replaced header")
            .unwrap();
        sources
            .replace("all_reduce_rsag.cu", "// replaced source")
            .unwrap();
        assert_eq!(
            sources.files().collect::<Vec<_>>(),
            ["all_reduce_rsag.cu", "prepare_element.cuh"]
        );
        for spec in kernels::all_kernels(Dtype::Fp16, 4) {
            let expected = if spec.source == "all_reduce_rsag.cu" {
                "// replaced source"
            } else {
                kernels::source(&spec)
            };
            assert_eq!(sources.source(&spec), expected, "{}", spec.name);
        }
        let headers = sources.headers();
        assert_eq!(headers.len(), kernels::headers().len());
        for ((name, text), (embedded_name, embedded_text)) in headers.iter().zip(kernels::headers())
        {
            assert_eq!(name, embedded_name);
            let expected = if *name == "prepare_element.cuh" {
                "// replaced header"
            } else {
                embedded_text
            };
            assert_eq!(text, &expected, "{name}");
        }
    }

    #[test]
    fn a_source_override_of_a_file_the_kernels_do_not_have_is_refused() {
        let mut sources = SourceOverrides::new();
        insta::assert_snapshot!(
            sources.replace("prepare_bf16.h", "").unwrap_err(),
            @"`prepare_bf16.h` is not a kernel source or header of this crate (they are add_rms_norm.cu, all_gather.cu, all_gather_double_buffered.cu, all_reduce_add_rms_norm_one_shot.cu, all_reduce_add_rms_norm_two_shot.cu, all_reduce_full_phased.cu, all_reduce_one_shot.cu, all_reduce_one_shot_copy_engine.cu, all_reduce_one_shot_double_buffered.cu, all_reduce_rsag.cu, all_reduce_rsag_double_buffered.cu, all_reduce_rsag_phased.cu, nccl_rank_order_sum.cu, prepare_abi.cuh, prepare_cluster.cuh, prepare_copy_engine.cuh, prepare_double_buffer.cuh, prepare_element.cuh, prepare_entry.cuh, prepare_layout.cuh, prepare_norm.cuh, prepare_phases.cuh, prepare_phases_simple.cuh, prepare_sync.cuh, reduce_scatter.cu, reduce_scatter_double_buffered.cu)"
        );
        assert!(sources.is_empty());
    }

    #[test]
    fn options_keep_exact_arithmetic_and_never_ask_for_o3() {
        insta::assert_snapshot!(compile_options(Arch::Sm121).join(" "), @"--gpu-architecture=sm_121 --std=c++17 -default-device --ftz=false --prec-div=true --prec-sqrt=true --fmad=false --ptxas-options=-v");
    }
}
