//! What the ranks-on-one-GPU harness checks with and how it reports: the checking kernels,
//! the kernels compiled once per run, how a run ended, the sizes a bucket is checked at, and
//! the hardware queues the harness needs.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{Mutex, OnceLock};

use prepare::abi::PARAMS_BYTES;
use prepare::compile::{compile_kernels_with_sources, CompiledKernel, SourceOverrides};
use prepare::gpu::driver::{Device, LoadedKernel, Module, ModuleImage};
use prepare::gpu::nvrtc::Nvrtc;
use prepare::kernels::KernelSpec;
use prepare::ladder::{Arch, Dtype, Ladder};
use prepare::progress::Silent;

/// The checking kernels: a comparison of a rank's output (and its guard) or input region with
/// the expected bytes, and a wait that makes one rank late.
pub(super) const HELPERS: &str = r#"
struct CompareParams {
    const unsigned char* found;
    const unsigned char* expected;
    unsigned long long elements;
    unsigned long long element_bytes;
    unsigned long long guard_bytes;
    unsigned long long* result;
};

// result: [elements that differ, the first that differs, guard bytes not poison]
extern "C" __global__ void one_gpu_compare(CompareParams p) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long i = first; i < p.elements; i += stride) {
        bool differ;
        if (p.element_bytes == 4) {
            differ = ((const unsigned int*)p.found)[i] != ((const unsigned int*)p.expected)[i];
        } else {
            differ = ((const unsigned short*)p.found)[i] != ((const unsigned short*)p.expected)[i];
        }
        if (differ) {
            atomicAdd(&p.result[0], 1ull);
            atomicMin(&p.result[1], i);
        }
    }
    const unsigned char* guard = p.found + p.elements * p.element_bytes;
    for (unsigned long long i = first; i < p.guard_bytes; i += stride) {
        if (guard[i] != 0xFF) {
            atomicAdd(&p.result[2], 1ull);
        }
    }
}

struct SleepParams {
    unsigned long long nanoseconds;
};

extern "C" __global__ void one_gpu_sleep(SleepParams p) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < p.nanoseconds) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
}
"#;

/// Bytes of `CompareParams`.
pub(super) const COMPARE_PARAMS_BYTES: usize = 48;
/// Words of one comparison's result.
pub(super) const RESULT_WORDS: usize = 3;

/// One GPU's lock: the tests of this module share the GPU, and a second world running at the
/// same time would take the blocks the first one's residency was computed for.
pub fn gpu_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `spec`'s kernel from `compiled` (what [`compile`] gave for it), loaded on `device`, with the
/// module that holds it.
pub fn load_compiled(
    device: &Device,
    compiled: &[CompiledKernel],
    spec: &KernelSpec,
) -> (Module, LoadedKernel) {
    let cubin = &compiled
        .iter()
        .find(|kernel| kernel.name == spec.name)
        .expect("every kernel compiled")
        .cubin;
    let module = device.load_module(ModuleImage::Cubin(cubin)).unwrap();
    let kernel = module.load(&spec.name, spec.cluster, PARAMS_BYTES).unwrap();
    (module, kernel)
}

/// The kernels of `specs` for sm_90 from `sources` (the embedded ones, or with a planted bug
/// named `key`), each compiled once per test run for each world size and source set: ladders
/// of one dtype and world share them.
pub fn compile(
    specs: &[KernelSpec],
    world: u32,
    sources: &SourceOverrides,
    key: &str,
) -> Result<Vec<CompiledKernel>, String> {
    type Cache = Mutex<HashMap<(String, u32, String), CompiledKernel>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    let entry = |spec: &KernelSpec| (spec.name.clone(), world, key.to_owned());
    let mut missing: Vec<KernelSpec> = {
        let cached = cache.lock().unwrap();
        specs
            .iter()
            .filter(|spec| !cached.contains_key(&entry(spec)))
            .cloned()
            .collect()
    };
    missing.sort_by(|a, b| a.name.cmp(&b.name));
    missing.dedup_by(|a, b| a.name == b.name);
    if !missing.is_empty() {
        let nvrtc = Nvrtc::load().map_err(|error| error.to_string())?;
        let compiled = compile_kernels_with_sources(nvrtc, &missing, Arch::Sm90, sources, &Silent)
            .map_err(|error| format!("{error:#}"))?;
        let mut cached = cache.lock().unwrap();
        for kernel in compiled.kernels {
            cached.insert((kernel.name.clone(), world, key.to_owned()), kernel);
        }
    }
    let cached = cache.lock().unwrap();
    Ok(specs
        .iter()
        .map(|spec| cached[&entry(spec)].clone())
        .collect())
}

/// How one run of one candidate on every rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Mismatch {
        rank: usize,
        index: u64,
        wrong: u64,
        found: String,
        expected: String,
    },
    Overrun {
        rank: usize,
        bytes: u64,
    },
    InputChanged {
        rank: usize,
        index: u64,
    },
    Aborted {
        rank: usize,
        abort: String,
    },
    NotCoScheduled {
        never: Vec<(usize, usize)>,
        late: Vec<(usize, usize)>,
    },
    Failed(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Pass)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Pass => formatter.write_str("exact"),
            Outcome::Mismatch {
                rank,
                index,
                wrong,
                found,
                expected,
            } => write!(
                formatter,
                "rank {rank}: element {index} is {found}, the reference {expected} ({wrong} \
                 elements differ)"
            ),
            Outcome::Overrun { rank, bytes } => write!(
                formatter,
                "rank {rank}: {bytes} bytes past the message's end were written"
            ),
            Outcome::InputChanged { rank, index } => {
                write!(formatter, "rank {rank}: input element {index} changed")
            }
            Outcome::Aborted { rank, abort } => write!(formatter, "rank {rank} aborted: {abort}"),
            Outcome::NotCoScheduled { never, late } => write!(
                formatter,
                "not co-scheduled: {} block(s) never began and {} began after the first one's \
                 deadline (first (rank, block): {:?})",
                never.len(),
                late.len(),
                never.first().or(late.first())
            ),
            Outcome::Failed(message) => formatter.write_str(message),
        }
    }
}

/// The variable that sets how many hardware queues the driver gives a process's streams (8 by
/// default): streams beyond that share one, and a rank's kernel queued behind a peer's spinning
/// kernel on the same queue starts only after the peer gave up. It must be set before the
/// driver starts, so the harness asks for it instead of setting it.
pub const CONNECTIONS_VARIABLE: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Panics unless [`CONNECTIONS_VARIABLE`] gives every rank's stream, the capture stream and the
/// copies a queue of its own.
pub(super) fn check_connections(world: usize) {
    let needed = world + 4;
    let set = std::env::var(CONNECTIONS_VARIABLE)
        .ok()
        .and_then(|value| value.parse::<usize>().ok());
    assert!(
        set.is_some_and(|connections| connections >= needed),
        "{CONNECTIONS_VARIABLE} is {set:?}: set it to at least {needed} (32 is the most) before \
         the process starts, so that {world} ranks' streams do not share hardware queues"
    );
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .rev()
        .fold(String::from("0x"), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// The element counts a bucket's candidates are checked at: its smallest and largest
/// messages, tails that are not whole 16-byte vectors next to both, and an odd size between.
pub fn bucket_sizes(ladder: &Ladder, bucket: usize) -> Vec<usize> {
    let element = ladder.dtype.size_bytes();
    let largest = (ladder.buckets[bucket].max_bytes / element) as usize;
    let smallest = (ladder.bucket_min_bytes(bucket) / element).max(1) as usize;
    let middle = (smallest + (largest - smallest) / 2) | 1;
    let mut sizes = vec![
        smallest,
        (smallest + 3).min(largest),
        middle.min(largest),
        largest.saturating_sub(5).max(smallest),
        largest,
    ];
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// A ladder's dtype for reports.
pub fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "bf16",
        Dtype::Fp16 => "fp16",
        Dtype::Fp32 => "fp32",
    }
}
