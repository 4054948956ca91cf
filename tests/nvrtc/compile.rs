//! Compiling every kernel with NVRTC (no GPU needed). Skips when NVRTC is missing unless
//! `PREPARE_REQUIRE_NVRTC=1`, which CI sets so that a missing library fails instead.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use prepare::compile::{compile_kernels_with, Compilation, CompileError};
use prepare::gpu::nvrtc::NvrtcError;
use prepare::kernels::{all_kernels, KernelSpec};
use prepare::ladder::{Arch, Dtype};
use prepare::progress::Reporter;

use super::support::{every_kernel, require_nvrtc, ARCHES};

/// Records what the compiler reports, to check the progress protocol.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<String>>);

impl Reporter for Recorder {
    fn start(&self, phase: &str, total: u64) {
        self.0
            .lock()
            .unwrap()
            .push(format!("start {phase} {total}"));
    }
    fn advance(&self, item: &str) {
        self.0.lock().unwrap().push(format!("advance {item}"));
    }
    fn finish(&self) {
        self.0.lock().unwrap().push("finish".to_owned());
    }
}

/// The compilation as a table, without what changes with every kernel edit (register counts,
/// cubin bytes): those are checked by value below instead.
fn summary(compilation: &Compilation) -> String {
    let mut text = format!(
        "nvrtc {}.{}\noptions: {}\n",
        compilation.nvrtc_version.0,
        compilation.nvrtc_version.1,
        compilation.options.join(" ")
    );
    for kernel in &compilation.kernels {
        writeln!(
            text,
            "{} {} {} cluster={} smem={} spill_stores={} spill_loads={} stack={}",
            kernel.arch,
            kernel.name,
            kernel.source,
            kernel.cluster,
            kernel.shared_bytes,
            kernel.spill_store_bytes,
            kernel.spill_load_bytes,
            kernel.stack_bytes
        )
        .unwrap();
    }
    text
}

#[test]
fn every_kernel_compiles_for_every_cluster_architecture_deterministically() {
    let nvrtc = require_nvrtc!();
    let kernels = all_kernels(Dtype::Bf16, 2);
    let mut summaries = String::new();
    for arch in ARCHES {
        let recorder = Recorder::default();
        let started = Instant::now();
        let first = compile_kernels_with(nvrtc, &kernels, arch, &recorder).unwrap();
        let elapsed = started.elapsed();
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "compiled {} kernels for {arch} in {:.2} s",
                kernels.len(),
                elapsed.as_secs_f64()
            );
        }
        // The compile the other tests share is a second one, made apart from this one.
        assert_eq!(
            &first,
            every_kernel(nvrtc, arch),
            "two compiles for {arch} differ"
        );
        // A copy-engine kernel's cubin also holds its barrier entries, which the host loads
        // from the same module; every other cubin holds its own entry alone.
        for (spec, compiled) in kernels.iter().zip(&first.kernels) {
            let barriers: Vec<String> =
                spec.copy_engine_barriers().map_or_else(Vec::new, Vec::from);
            for entry in &barriers {
                let symbol = format!(".text.{entry}\0");
                assert!(
                    compiled
                        .cubin
                        .windows(symbol.len())
                        .any(|window| window == symbol.as_bytes()),
                    "{arch}: {} lacks the entry {entry}",
                    spec.name
                );
            }
            let others = kernels
                .iter()
                .filter(|other| other.name != spec.name && !barriers.contains(&other.name))
                .map(|other| format!(".text.{}\0", other.name));
            for symbol in others {
                assert!(
                    !compiled
                        .cubin
                        .windows(symbol.len())
                        .any(|window| window == symbol.as_bytes()),
                    "{arch}: {} holds {symbol}",
                    spec.name
                );
            }
        }

        let events = recorder.0.into_inner().unwrap();
        assert_eq!(
            events.first().unwrap(),
            &format!("start compile {}", kernels.len())
        );
        assert_eq!(events.last().unwrap(), "finish");
        let mut advanced: Vec<&str> = events
            .iter()
            .filter_map(|event| event.strip_prefix("advance "))
            .collect();
        advanced.sort_unstable();
        let names: Vec<&str> = kernels.iter().map(|kernel| kernel.name.as_str()).collect();
        assert_eq!(advanced, names);

        for kernel in &first.kernels {
            assert_eq!(
                &kernel.cubin[..4],
                b"\x7fELF",
                "{} is not an ELF cubin",
                kernel.name
            );
            // __launch_bounds__(1024): a 1024-thread block fits the 64K-register file.
            assert!(
                (16..=64).contains(&kernel.registers),
                "{}: {} registers",
                kernel.name,
                kernel.registers
            );
            // One entry per cubin: no other kernel's symbol is in it.
            for other in &kernels {
                let found = kernel.cubin.windows(other.name.len() + 1).any(|window| {
                    window[..other.name.len()] == *other.name.as_bytes()
                        && window[other.name.len()] == 0
                });
                assert_eq!(
                    found,
                    other.name == kernel.name,
                    "{} in {}",
                    other.name,
                    kernel.name
                );
            }
        }
        summaries.push_str(&summary(&first));
    }
    insta::assert_snapshot!(summaries);
}

#[test]
fn identical_kernels_compile_once() {
    let nvrtc = require_nvrtc!();
    let one = all_kernels(Dtype::Fp16, 3).remove(1);
    let recorder = Recorder::default();
    let compilation =
        compile_kernels_with(nvrtc, &[one.clone(), one.clone()], Arch::Sm90, &recorder).unwrap();
    assert_eq!(compilation.kernels.len(), 1);
    assert_eq!(
        recorder.0.into_inner().unwrap(),
        [
            "start compile 1".to_owned(),
            format!("advance {}", one.name),
            "finish".to_owned()
        ]
    );
}

#[test]
fn a_failed_compile_keeps_the_log_and_the_options() {
    let nvrtc = require_nvrtc!();
    let missing = KernelSpec {
        name: "all_reduce_missing_bf16".to_owned(),
        source: "all_reduce_one_shot.cu",
        cluster: false,
        dtype: Dtype::Bf16,
        world: 2,
    };
    let error = compile_kernels_with(nvrtc, &[missing], Arch::Sm90, &prepare::progress::Silent)
        .unwrap_err();
    let CompileError::Compile {
        kernel,
        options,
        log,
        ..
    } = &error
    else {
        panic!("expected a compile error, got {error}");
    };
    assert_eq!(kernel, "all_reduce_missing_bf16");
    assert_eq!(
        options.last().unwrap(),
        "--ptxas-options=--entry=all_reduce_missing_bf16"
    );
    assert!(!log.is_empty());
    assert!(error.to_string().contains(log.as_str()));

    let mut program = nvrtc
        .program(
            "broken.cu",
            "extern \"C\" __global__ void broken() { undeclared(); }",
            &[],
        )
        .unwrap();
    let error = program
        .compile(&["--gpu-architecture=sm_90".to_owned()])
        .unwrap_err();
    let NvrtcError::Compilation { program, log } = &error else {
        panic!("expected a compilation error, got {error}");
    };
    assert_eq!(program, "broken.cu");
    assert!(log.contains("undeclared"), "{log}");
}

#[test]
fn kernel_logs_have_no_warnings() {
    let nvrtc = require_nvrtc!();
    for spec in Dtype::ALL
        .into_iter()
        .flat_map(|dtype| all_kernels(dtype, 4))
    {
        let mut program = nvrtc
            .program(
                spec.source,
                prepare::kernels::source(&spec),
                prepare::kernels::headers(),
            )
            .unwrap();
        let mut options = prepare::compile::compile_options(Arch::Sm90);
        options.extend(spec.defines());
        options.push(format!("--ptxas-options=--entry={}", spec.name));
        let log = program.compile(&options).unwrap();
        assert!(!log.contains("warning"), "{}:\n{log}", spec.name);
    }
}
