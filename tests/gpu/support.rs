//! Shared by the GPU tests: find enough GPUs or skip (failing instead when
//! `PREPARE_REQUIRE_GPU=1`, so a GPU run cannot pass by finding none), and compile test
//! kernels with NVRTC.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prepare::gpu::driver::{visible_devices, Device, Driver, DriverError};
use prepare::ladder::Arch;
use prepare::launch::{launch, LaunchError, LaunchSpec, OutputSink, Stream};

/// Whether this run must find GPUs.
pub fn gpu_required() -> bool {
    std::env::var("PREPARE_REQUIRE_GPU").is_ok_and(|value| value == "1")
}

/// The verdict on a probe of the driver: `Ok(true)` to run, `Ok(false)` to skip, `Err` to fail.
pub fn verdict(
    required: bool,
    needed: usize,
    probe: &Result<usize, DriverError>,
) -> Result<bool, String> {
    let missing = match probe {
        Ok(count) if *count >= needed => return Ok(true),
        Ok(count) => format!("the driver sees {count} GPU(s), {needed} needed"),
        Err(error) => format!("no usable driver: {error}"),
    };
    if required {
        Err(format!("PREPARE_REQUIRE_GPU=1 but {missing}"))
    } else {
        eprintln!("skipped: {missing}");
        Ok(false)
    }
}

/// Whether `needed` GPUs are visible: `false` (skip) when there are fewer and GPUs are not
/// required; a panic when they are.
pub fn enough_gpus(needed: usize) -> bool {
    verdict(gpu_required(), needed, &visible_devices())
        .unwrap_or_else(|message| panic!("{message}"))
}

/// GPUs 0 to `N - 1` opened, or `None` (skip) when there are fewer and GPUs are not required.
pub fn gpus<const N: usize>() -> Option<(Driver, [Device; N])> {
    if !enough_gpus(N) {
        return None;
    }
    let driver = Driver::open().expect("the driver opened for the probe");
    let devices =
        std::array::from_fn(|ordinal| driver.open_device(ordinal).expect("opening a visible GPU"));
    Some((driver, devices))
}

/// `needed` GPUs opened, as `(Driver, [Device; needed])`, for the calling test, which returns
/// (skips) when there are fewer, unless `PREPARE_REQUIRE_GPU=1` makes that a failure. Every GPU
/// test starts with it; a one-GPU test takes its device as `let (driver, [device]) = ...`.
macro_rules! require_gpus {
    ($needed:literal) => {
        match $crate::gpu::support::gpus::<$needed>() {
            Some(gpus) => gpus,
            None => return,
        }
    };
}
pub(crate) use require_gpus;

/// The variable that sets the world size of the GPU tests that run at any world: the fault
/// tests and the planted mutations.
pub const WORLD_VARIABLE: &str = "PREPARE_TEST_WORLD";

/// The world sizes the tests run at: those of the shipped H200 ladders.
pub const WORLDS: [usize; 3] = [2, 4, 8];

/// The world size `value` of [`WORLD_VARIABLE`] asks for: 2 when unset, else 2, 4 or 8.
pub fn parse_world(value: Option<&str>) -> Result<usize, String> {
    let Some(value) = value else {
        return Ok(2);
    };
    value
        .parse()
        .ok()
        .filter(|world| WORLDS.contains(world))
        .ok_or_else(|| format!("{WORLD_VARIABLE} must be 2, 4 or 8, not {value:?}"))
}

/// The world size [`WORLD_VARIABLE`] chose, read once; `None` when it is unset. Panics naming
/// the variable when it is set to anything but 2, 4 or 8.
pub fn chosen_world() -> Option<usize> {
    static CHOSEN: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let value = std::env::var_os(WORLD_VARIABLE)?;
        let world = parse_world(Some(&value.to_string_lossy()));
        Some(world.unwrap_or_else(|message| panic!("{message}")))
    })
}

/// The world size of the tests that run at any world ([`chosen_world`], else 2).
pub fn test_world() -> usize {
    chosen_world().unwrap_or(2)
}

/// The test world ([`test_world`]) for the calling test, which returns (skips) when fewer GPUs
/// are visible, unless `PREPARE_REQUIRE_GPU=1` makes that a failure. Its ranks run on GPUs 0 to
/// `world - 1`.
macro_rules! require_world {
    () => {{
        let world = $crate::gpu::support::test_world();
        if !$crate::gpu::support::enough_gpus(world) {
            return;
        }
        world
    }};
}
pub(crate) use require_world;

/// The shipped H200 ladder for `world` ranks: `h200_nvlink_tp<world>.json`.
pub fn h200_ladder(world: usize) -> String {
    format!("h200_nvlink_tp{world}.json")
}

/// GPUs 0 to `world - 1` as `--gpus` and `PREPARE_GPUS` take them: `0,1,2,3`.
pub fn gpu_list(world: usize) -> String {
    (0..world)
        .map(|gpu| gpu.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// GPU tests that each make one call, with their own arguments: `name => call;`, each name
/// with its doc comment if it has one.
macro_rules! gpu_tests {
    ($($(#[doc = $doc:literal])* $name:ident => $call:expr;)*) => {$(
        $(#[doc = $doc])*
        #[test]
        #[ignore = "needs GPUs"]
        fn $name() {
            $call;
        }
    )*};
}
pub(crate) use gpu_tests;

/// The architecture of GPU `ordinal`, which must be one this tool knows.
pub fn arch_of(driver: Driver, ordinal: usize) -> Arch {
    let info = driver.describe(ordinal).unwrap();
    let (major, minor) = info.compute_capability;
    Arch::from_compute_capability(major, minor).unwrap_or_else(|| {
        panic!(
            "GPU {} is {}, unknown to this tool",
            info.ordinal,
            info.arch_name()
        )
    })
}

/// Compiles CUDA source to PTX for `arch` (`sm_90`) with NVRTC, panicking with its log (cudarc
/// panics with the names it searched when `libnvrtc.so.13` is not on the loader path).
pub fn compile_ptx(source: &str, arch: &'static str) -> String {
    let options = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".to_owned()],
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(source, options) {
        Ok(ptx) => ptx.to_src(),
        Err(cudarc::nvrtc::CompileError::CompileError { log, options, .. }) => panic!(
            "NVRTC refused the test kernels with {options:?}:\n{}",
            log.to_string_lossy()
        ),
        Err(other) => panic!("NVRTC failed: {other}"),
    }
}

/// A reproducible stream of 64-bit values (splitmix64), for test inputs that are never zeros.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut value = self.0;
        value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        value ^ (value >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
}

/// The `prepare` binary: carried next to the tests on the GPU machine, else this build's.
pub fn prepare_bin() -> PathBuf {
    std::env::var_os("PREPARE_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_prepare")),
        PathBuf::from,
    )
}

/// What a finished process printed: stdout, then stderr.
pub fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `prepare check` of `package` on GPUs 0 and 1 with `--timeout SECONDS` and `flags`.
pub fn check_on_two_gpus(package: &Path, seconds: u32, flags: &[&str]) -> Output {
    check_on_gpus(2, package, seconds, flags)
}

/// `prepare check` of `package` on GPUs 0 to `world - 1` with `--timeout SECONDS` and `flags`.
pub fn check_on_gpus(world: usize, package: &Path, seconds: u32, flags: &[&str]) -> Output {
    Command::new(prepare_bin())
        .args([
            "check",
            "--gpus",
            &gpu_list(world),
            "--timeout",
            &seconds.to_string(),
            "--package",
        ])
        .arg(package)
        .args(flags)
        .output()
        .expect("prepare starts")
}

/// The shipped H200 TP2 ladders, ordinary and clustered, that the two-GPU tests run.
pub const H200_TP2_LADDERS: [&str; 2] = ["h200_nvlink_tp2.json", "h200_nvlink_tp2_clustered.json"];

/// A shipped ladder's file: from the ladders carried next to the tests on the GPU machine
/// (`PREPARE_LADDERS`), else from this checkout.
pub fn ladder(name: &str) -> PathBuf {
    let dir = std::env::var_os("PREPARE_LADDERS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ladders"),
        PathBuf::from,
    );
    dir.join(name)
}

/// Exports a shipped ladder for sm_90 into a fresh directory (NVRTC runs in its own process,
/// before any GPU work).
pub fn export(name: &str) -> (tempfile::TempDir, PathBuf) {
    export_file(&ladder(name))
}

pub fn export_file(ladder_file: &std::path::Path) -> (tempfile::TempDir, PathBuf) {
    let name = ladder_file.display();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("package");
    let output = Command::new(prepare_bin())
        .args(["export", "--arch", "sm_90", "--collective-ladder"])
        .arg(ladder_file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "export of {name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (dir, out)
}

/// `bytes` written as the ladder file `name` in a fresh directory; returns both.
pub fn written_ladder(name: &str, bytes: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, bytes).unwrap();
    (dir, file)
}

/// The shipped H200 TP2 ladders ([`H200_TP2_LADDERS`]) in turn, each exported as the loop
/// reaches it ([`export`]): `(ladder name, directory holding the package, package)`.
pub fn h200_tp2_packages() -> impl Iterator<Item = (&'static str, tempfile::TempDir, PathBuf)> {
    H200_TP2_LADDERS.into_iter().map(|name| {
        let (dir, package) = export(name);
        (name, dir, package)
    })
}

/// A port free a moment ago, with the next one (the rendezvous) free too.
pub fn free_port() -> u16 {
    prepare::launch::free_port_pair().expect("a free pair of ports")
}

/// Every line the ranks print, as `[rank R] LINE`, echoed to stderr as it comes.
struct Collect(Mutex<Vec<String>>);

impl OutputSink for Collect {
    fn line(&self, rank: u32, _stream: Stream, line: &str) {
        eprintln!("[rank {rank}] {line}");
        self.0.lock().unwrap().push(format!("[rank {rank}] {line}"));
    }
}

/// Launches `program ARGS` as two ranks on GPUs 0 and 1 (torchrun's variables set, `env`
/// added, at most 300 s): the launch's result and every line the ranks printed, as
/// `[rank R] LINE`, in the order they came.
pub fn launch_on_two_gpus(
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
) -> (Result<(), LaunchError>, Vec<String>) {
    let collect = Arc::new(Collect(Mutex::new(Vec::new())));
    let sink: Arc<dyn OutputSink> = collect.clone();
    let spec = LaunchSpec {
        program,
        args,
        gpus: vec![0, 1],
        master_addr: "127.0.0.1".to_owned(),
        master_port: free_port(),
        env,
        deadline: Some(Duration::from_secs(300)),
    };
    let launched = launch(&spec, &sink);
    let lines = collect.0.lock().unwrap().clone();
    (launched, lines)
}

/// A rank started by hand, its output lines arriving on a channel.
pub struct Rank {
    /// Its number in the world.
    pub number: u32,
    /// The process.
    pub child: Child,
    /// Its stdout and stderr lines.
    pub lines: Receiver<String>,
}

/// Starts rank `rank` of two by hand (the torchrun variables set), running `prepare COMMAND
/// ARGS` on GPU `rank`, with `host` as its host identity.
pub fn start_rank(command: &str, rank: u32, port: u16, host: &str, args: &[&str]) -> Rank {
    start_rank_of(2, command, rank, port, host, args)
}

/// Starts ranks `ranks` of a world of `world` by hand (see [`start_rank_of`]), all with one
/// host identity.
pub fn start_ranks(
    world: usize,
    command: &str,
    ranks: std::ops::Range<u32>,
    port: u16,
    args: &[&str],
) -> Vec<Rank> {
    ranks
        .map(|rank| start_rank_of(world, command, rank, port, "one", args))
        .collect()
}

/// Starts rank `rank` of `world` by hand (the torchrun variables set), running `prepare COMMAND
/// ARGS` on GPU `rank` of GPUs 0 to `world - 1`, with `host` as its host identity.
pub fn start_rank_of(
    world: usize,
    command: &str,
    rank: u32,
    port: u16,
    host: &str,
    args: &[&str],
) -> Rank {
    let mut child = Command::new(prepare_bin())
        .arg(command)
        .args(args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("PREPARE_GPUS", gpu_list(world))
        .env("PREPARE_HOST_ID", host)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prepare starts");
    let (sender, lines) = channel();
    for reader in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let sender = sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                eprintln!("[rank {rank}] {line}");
                let _ = sender.send(line);
            }
        });
    }
    Rank {
        number: rank,
        child,
        lines,
    }
}

impl Rank {
    /// Waits for a line containing `text`, returning every line seen so far.
    pub fn wait_for(&self, text: &str, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            let found = line.contains(text);
            seen.push(line);
            if found {
                return seen;
            }
        }
        panic!("no line containing {text:?} within {limit:?}; saw {seen:#?}");
    }

    /// Waits for the process to end, returning its code and every remaining line.
    pub fn finish(mut self, limit: Duration) -> (Option<i32>, Vec<String>, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let elapsed = started.elapsed();
                std::thread::sleep(Duration::from_millis(100));
                let lines = self.lines.try_iter().collect();
                return (status.code(), lines, elapsed);
            }
            if started.elapsed() > limit {
                dump_threads(self.child.id());
                let _ = self.child.kill();
                panic!("the rank did not exit within {limit:?}: it hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Prints every thread of a hung process (name and kernel wait channel, and the stacks when
/// gdb is installed), so a hang can be diagnosed from the log.
fn dump_threads(pid: u32) {
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let read = |file: &str| {
                std::fs::read_to_string(task.path().join(file))
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            };
            eprintln!(
                "thread {}: {} waiting in {}",
                task.file_name().display(),
                read("comm"),
                read("wchan")
            );
        }
    }
    if let Ok(output) = Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt 30",
        ])
        .output()
    {
        eprintln!("{}", String::from_utf8_lossy(&output.stdout));
    }
}

/// How a survivor of a fault ended: its rank, exit code, remaining lines and the time from the
/// fault to its exit.
pub struct Survivor {
    pub rank: u32,
    pub code: Option<i32>,
    pub lines: Vec<String>,
    pub elapsed: Duration,
}

/// Sends `signal` to the last of `ranks`, the victim (every rank already past the point to
/// fault), waits for each other rank, the survivors, to exit and ends the victim. The survivors
/// are awaited in turn, so each one's time is when it was seen to have exited: at most later
/// than it did.
pub fn inject_fault(mut ranks: Vec<Rank>, signal: nix::sys::signal::Signal) -> Vec<Survivor> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let mut victim = ranks.pop().expect("a victim");
    std::thread::sleep(Duration::from_millis(300));
    let pid = Pid::from_raw(i32::try_from(victim.child.id()).unwrap());
    kill(pid, signal).unwrap();
    let injected = Instant::now();
    let survivors = ranks
        .into_iter()
        .map(|survivor| {
            let rank = survivor.number;
            let (code, lines, _) = survivor.finish(Duration::from_secs(60));
            let elapsed = injected.elapsed();
            Survivor {
                rank,
                code,
                lines,
                elapsed,
            }
        })
        .collect();
    let _ = kill(pid, Signal::SIGKILL);
    let _ = victim.child.wait();
    survivors
}

/// Sends `signal` to the last of `ranks` during `what` (see [`inject_fault`]): every other rank
/// must exit with 3 naming the victim as the rank that did not arrive, within 20 s of the fault
/// ([`assert_missed`]).
pub fn survivors_name_the_victim(ranks: Vec<Rank>, signal: nix::sys::signal::Signal, what: &str) {
    let world = ranks.len();
    let victim = ranks.last().expect("a victim").number;
    for survivor in inject_fault(ranks, signal) {
        eprintln!(
            "{signal:?} to rank {victim} during {what}: rank {} exited {:?} after the fault",
            survivor.rank, survivor.elapsed
        );
        assert_missed(&survivor, victim, world);
    }
}

/// What NCCL lets a rank say when a peer of more than one did not arrive.
const NCCL_DOES_NOT_SAY: &str = "one of the other ranks did not arrive (NCCL does not say which)";

/// How a survivor of a world of `world` ended when rank `victim` did not take part: it exited
/// with 3 within 20 s, naming the victim as the rank that did not arrive and no other rank. In
/// a world of more than two, a rank whose wait was in NCCL cannot know which peer is missing
/// and says so instead; the log shows which way each survivor ended.
pub fn assert_missed(survivor: &Survivor, victim: u32, world: usize) {
    let Survivor {
        rank,
        code,
        lines,
        elapsed,
    } = survivor;
    assert_eq!(*code, Some(3), "rank {rank}: {lines:#?}");
    let says = |text: &str| lines.iter().any(|line| line.contains(text));
    let named = says(&format!("rank {victim} did not arrive"));
    let unnamed = world > 2 && says(NCCL_DOES_NOT_SAY);
    assert!(
        named || unnamed,
        "rank {rank} did not name rank {victim}: {lines:#?}"
    );
    if !named {
        eprintln!("rank {rank}: NCCL did not say which rank was missing");
    }
    for other in (0..world as u32).filter(|other| ![*rank, victim].contains(other)) {
        assert!(
            !says(&format!("rank {other} did not arrive")),
            "rank {rank} blamed rank {other}, not rank {victim}: {lines:#?}"
        );
    }
    // The timeout is 5 s; a kernel's waits and the stream's bound add at most two more.
    assert!(
        *elapsed < Duration::from_secs(20),
        "rank {rank}: {elapsed:?}"
    );
}

/// Every (bucket, candidate) of `ladder` that has a custom kernel, in ladder order: the
/// bucket's index, the bucket, the profile and its kernel. NCCL candidates have none.
pub fn custom_candidates(
    ladder: &prepare::ladder::Ladder,
) -> impl Iterator<
    Item = (
        usize,
        &prepare::ladder::Bucket,
        &prepare::ladder::Profile,
        prepare::kernels::KernelSpec,
    ),
> {
    ladder
        .buckets
        .iter()
        .enumerate()
        .flat_map(move |(index, bucket)| {
            bucket.candidates.iter().filter_map(move |id| {
                let profile = ladder
                    .profile(id)
                    .expect("a validated ladder names its profiles");
                prepare::kernels::kernel_for(
                    profile,
                    ladder.collective,
                    ladder.dtype,
                    ladder.world_size,
                )
                .map(|spec| (index, bucket, profile, spec))
            })
        })
}
