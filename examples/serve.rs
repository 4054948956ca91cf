//! What a tensor-parallel server does with `prepare` from Rust, one process per GPU (start it
//! like torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
//!
//! ```text
//! serve PACKAGE [CACHE_DIR]
//! ```
//!
//! It starts serving from the environment ([`prepare::serve::Server`]: the cache, or exactness
//! check and timing), then, as a server
//! capturing its decode step at several batch sizes would, captures the all-reduce of its own
//! buffers in graphs of its own on its own stream, at 1, 8, 16 and 32 rows of a 7168-wide
//! bf16 hidden state, an odd size, and a size above the ladder's largest bucket, each in four
//! ways: in place in the handle's zero-copy region, from one of its buffers into another, in
//! place in its own buffer, and at addresses not 16-byte aligned. It replays them alternately
//! on fresh random data and checks every output against the reference sum and every input
//! that must be kept. It prints one line per size. It exits as the `prepare` command does: 2
//! for wrong arguments or variables, 1 for a package refused, 3 for a runtime failure or any
//! difference.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use prepare::collective::Operands;
use prepare::gpu::driver::{CallerMemory, DeviceBuffer, DeviceMemory as _, Graph};
use prepare::ladder::{Collective, Dtype};
use prepare::package::Package;
use prepare::reference::{random_inputs, reference_sum_bf16};
use prepare::serve::{Handle, Options, Server};

const HIDDEN: usize = 7168;

/// How a captured all-reduce finds its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// In place in the handle's zero-copy region.
    ZeroCopy,
    /// From the server's input buffer into its output buffer; the input is kept.
    OutOfPlace,
    /// In place in the server's output buffer.
    InPlace,
    /// From 2 bytes into the input buffer to 2 bytes into the output buffer.
    Misaligned,
}

const MODES: [Mode; 4] = [
    Mode::ZeroCopy,
    Mode::OutOfPlace,
    Mode::InPlace,
    Mode::Misaligned,
];

const USAGE: &str = "usage: serve PACKAGE [CACHE_DIR]";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(package_dir), cache_dir, None) = (args.next(), args.next(), args.next()) else {
        return fail(2, &anyhow::anyhow!(USAGE));
    };
    let options = Options {
        timeout: Duration::from_secs(30),
        cache_dir: cache_dir.map(PathBuf::from),
        ..Options::default()
    };
    let server = match Server::from_env(options) {
        Ok(server) => server,
        Err(error) => return fail(2, &error.into()),
    };
    let package = match prepare::package::open_package_retrying(package_dir.as_ref()) {
        Ok(package) => package,
        Err(error) => return fail(1, &error.into()),
    };
    let handle = match server.start(std::slice::from_ref(&package)) {
        Ok(handle) => handle,
        Err(error) => return fail(if error.is_refusal() { 1 } else { 3 }, &error.into()),
    };
    match serve(&handle, &package) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(3, &error),
    }
}

/// Prints the error with its causes and ends with `code`.
fn fail(code: u8, error: &anyhow::Error) -> ExitCode {
    eprintln!("error: {error:#}");
    ExitCode::from(code)
}

fn serve(handle: &Handle, package: &Package) -> anyhow::Result<()> {
    let largest = package
        .ladder()
        .buckets
        .last()
        .map_or(0, |bucket| bucket.max_bytes) as usize
        / 2;
    let rank = handle.rank();
    let world = handle.world() as usize;
    let selection = handle.selection(Collective::AllReduce, Dtype::Bf16)?;
    println!(
        "selected: cache hit {}, {:.1} ms of selection work, choice sha256 {}",
        selection.cache_hit,
        selection.times.selection.as_secs_f64() * 1e3,
        prepare::hash::hex(&handle.choice(Collective::AllReduce, Dtype::Bf16)?.digest())
    );

    // The server's own stream, buffers and graphs.
    let device = handle.runtime().device();
    let mut stream = device.new_stream()?;
    let mut sizes: Vec<usize> = [1, 8, 16, 32].iter().map(|rows| rows * HIDDEN).collect();
    sizes.retain(|&elements| elements <= largest);
    sizes.push(3 * HIDDEN + 5);
    sizes.push(largest + 8 * 1024 + 3);
    let most = sizes.iter().copied().max().unwrap_or(0);
    // Two bytes of room for the misaligned mode.
    let input = device.allocate(most * 2 + 16)?;
    let output = device.allocate(most * 2 + 16)?;
    let zero_copy = handle.zero_copy_region(Collective::AllReduce, Dtype::Bf16)?;
    let operands = |mode: Mode, elements: usize| -> Option<Operands> {
        let bytes = elements as u64 * 2;
        let at = |buffer: &DeviceBuffer, offset: u64| {
            CallerMemory::prefix(buffer, offset + bytes).offset(offset)
        };
        Some(match mode {
            Mode::ZeroCopy => {
                let region = zero_copy.filter(|region| region.len_bytes() as u64 >= bytes)?;
                Operands {
                    input: region,
                    output: region,
                }
            }
            Mode::OutOfPlace => Operands {
                input: at(&input, 0),
                output: at(&output, 0),
            },
            Mode::InPlace => Operands {
                input: at(&output, 0),
                output: at(&output, 0),
            },
            Mode::Misaligned => Operands {
                input: at(&input, 2),
                output: at(&output, 2),
            },
        })
    };
    let mut graphs: Vec<(usize, Mode, Operands, Graph)> = Vec::new();
    for &elements in &sizes {
        for mode in MODES {
            let Some(operands) = operands(mode, elements) else {
                continue;
            };
            let graph = stream.capture(|stream| {
                handle
                    .all_reduce_on(stream, operands, elements, Dtype::Bf16)
                    .map_err(anyhow::Error::from)
            })?;
            graphs.push((elements, mode, operands, graph));
        }
    }
    let mut checked = 0;
    for replay in 0..2 * graphs.len() {
        let (elements, mode, operands, graph) = &graphs[replay % graphs.len()];
        let elements = *elements;
        // Every rank draws every rank's data from the same seed, so each can compute the sum.
        let inputs = random_inputs(0x5EED_0000 + replay as u64, world, elements);
        let mine = &inputs[rank as usize];
        stream.write(&operands.input, 0, mine)?;
        if operands.output != operands.input {
            stream.fill_u16(&operands.output, 0..elements * 2, 0x7FA5)?;
        }
        graph.launch()?;
        stream.synchronize_within(Duration::from_secs(60))?;
        handle.check()?;
        let mut got = vec![0_u16; elements];
        stream.read(&operands.output, 0, &mut got)?;
        let route = handle.route(Collective::AllReduce, Dtype::Bf16, elements as u64 * 2)?;
        let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
        let expected = reference_sum_bf16(&views);
        // NCCL sums in rank order only at two ranks.
        let compared = world == 2 || !matches!(route, prepare::serve::Route::AboveLadder);
        if compared && got != expected {
            let first = got
                .iter()
                .zip(&expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            anyhow::bail!(
                "rank {rank}: {route} at {elements} elements ({mode:?}) differs from the \
                 reference sum at element {first}"
            );
        }
        if operands.output != operands.input {
            let mut kept = vec![0_u16; elements];
            stream.read(&operands.input, 0, &mut kept)?;
            anyhow::ensure!(
                &kept == mine,
                "rank {rank}: {route} at {elements} elements ({mode:?}) changed its input"
            );
        }
        checked += 1;
    }
    for &elements in &sizes {
        println!(
            "{elements} elements: {} in the server's graphs, exact",
            handle.route(Collective::AllReduce, Dtype::Bf16, elements as u64 * 2)?
        );
    }
    println!("served {checked} graph replays, every one exact");
    Ok(())
}
