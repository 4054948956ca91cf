//! What a tensor-parallel server does with `prepare` at startup, one process per GPU (start it
//! like torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
//!
//! ```text
//! serve PACKAGE [CACHE_DIR]
//! ```
//!
//! It selects (cache, or exactness check and timing), then, as a server capturing its decode
//! step at several batch sizes would, captures the chosen all-reduce in graphs of its own on
//! its own stream at 1, 8, 16 and 32 rows of a 7168-wide bf16 hidden state, replays them
//! alternately on fresh random data, and checks every output against the reference sum. It
//! prints one line per size and exits non-zero on any difference.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use prepare::gpu::driver::DeviceMemory as _;
use prepare::launch::RankEnvironment;
use prepare::reference::{random_inputs, reference_sum_bf16};
use prepare::runtime::{environment_defaults, gpu_for_rank, RankSetup, Rendezvous};
use prepare::select::{Handle, SelectOptions};

const HIDDEN: usize = 7168;

fn main() -> ExitCode {
    match serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(3)
        }
    }
}

fn serve() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let package_dir = PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: serve PACKAGE [CACHE_DIR]"))?,
    );
    let cache_dir = args.next().map(PathBuf::from);
    let environment = RankEnvironment::from_lookup(|name| std::env::var(name).ok())?;
    for (name, value) in environment_defaults(|name| std::env::var(name).ok()) {
        std::env::set_var(name, value);
    }
    let package = prepare::package::open_package(&package_dir)?;
    let setup = RankSetup {
        rank: environment.rank,
        world: environment.world_size,
        gpu: gpu_for_rank(&environment, std::env::var("PREPARE_GPUS").ok().as_deref())?,
        timeout: Duration::from_secs(30),
        rendezvous: Rendezvous::CommId,
        host: prepare::agree::host_identity(|name| std::env::var(name).ok()),
    };
    let options = SelectOptions {
        cache_dir,
        ..SelectOptions::default()
    };
    let handle = Handle::start(&setup, &package, &options, &prepare::progress::Silent)?;
    let rank = handle.runtime().rank();
    let world = handle.runtime().world() as usize;
    let selection = handle.selection();
    println!(
        "selected: cache hit {}, {:.1} ms of selection work, choice sha256 {}",
        selection.cache_hit,
        selection.times.selection.as_secs_f64() * 1e3,
        prepare::cache::hex(&handle.choice().digest())
    );

    // The server's own stream and graphs.
    let device = handle.runtime().device();
    let mut stream = device.new_stream()?;
    let mut sizes: Vec<usize> = [1, 8, 16, 32].iter().map(|rows| rows * HIDDEN).collect();
    sizes.retain(|&elements| elements <= handle.capacity());
    let mut graphs = Vec::new();
    for &elements in &sizes {
        let graph = stream.capture(|capture| {
            handle
                .all_reduce(capture.stream(), elements)
                .map_err(anyhow::Error::from)
        })?;
        graphs.push((elements, graph));
    }
    let mut checked = 0;
    for replay in 0..24 {
        let (elements, graph) = &graphs[replay % graphs.len()];
        // Every rank draws every rank's data from the same seed, so each can compute the sum.
        let inputs = random_inputs(0x5EED_0000 + replay as u64, world, *elements);
        stream.write(handle.input(), 0, &inputs[rank as usize])?;
        stream.fill_u16(
            handle.output(),
            0..handle.output().len_bytes().min(elements * 2 + 64),
            0x7FA5,
        )?;
        graph.launch()?;
        stream.synchronize_within(Duration::from_secs(60))?;
        handle.check_abort(&stream)?;
        let mut got = vec![0_u16; *elements];
        stream.read(handle.output(), 0, &mut got)?;
        let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
        let expected = reference_sum_bf16(&views);
        if got != expected {
            let first = got
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            anyhow::bail!(
                "rank {rank}: {} at {elements} elements differs from the reference sum at element {first}",
                handle.route(*elements).unwrap_or("no candidate")
            );
        }
        checked += 1;
    }
    for (elements, _) in &graphs {
        println!(
            "{elements} elements: {} in the server's graph, exact",
            handle.route(*elements).unwrap_or("no candidate")
        );
    }
    println!("served {checked} graph replays, every one exact");
    Ok(())
}
