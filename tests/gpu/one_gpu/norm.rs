//! prepare's unfused residual add + RMSNorm (kernels/add_rms_norm.cu) on one real GPU against
//! the host reference ([`reference_add_rms_norm`]): every type, hidden sizes 8 to 16,384 and a
//! few other multiples of 8, messages of 0, 1, 3 and 64 rows, with a residual and without,
//! `normed` over the input or apart, several grids; ordinary rows, rows of zeros and rows of
//! any bits (NaN, infinities, signed zeros, subnormals); a row the same bytes alone as among 64;
//! an invalid launch refused with its code.

use std::time::Duration;

use prepare::abi::{ABORT_FLAG, ABORT_INVALID_LAUNCH, PARAMS_BYTES, STATE_WORDS};
use prepare::gpu::driver::{DeviceMemory, Geometry, LoadedKernel, ModuleImage, Stream};
use prepare::kernels::{all_kernels, LaunchParams};
use prepare::ladder::Dtype;
use prepare::reference::{
    from_f32, random_elements, reference_add_rms_norm, EpilogueInputs, EpilogueOutputs, SplitMix64,
};
use prepare::shape::Shape;

use super::super::support::{arch_of, require_gpus};
use super::gpu_lock;

const WAIT: Duration = Duration::from_secs(30);
/// Written over every output first: a NaN pattern no output of these inputs has.
const POISON: u8 = 0xFF;

fn bytes_of(dtype: Dtype, bits: impl Iterator<Item = u32>) -> Vec<u8> {
    let size = dtype.size_bytes() as usize;
    bits.flat_map(|bits| bits.to_le_bytes()[..size].to_vec())
        .collect()
}

/// Row `row` of one operand: ordinary values whose squares span 2^24 at a scale that changes
/// from row to row, or (every fourth row) zeros, or (every fourth, from the third) any bits.
pub(super) fn row_data(dtype: Dtype, seed: u64, row: u64, hidden: usize) -> Vec<u8> {
    let mut draws = SplitMix64::new(seed ^ row.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    match row % 4 {
        2 => vec![0; hidden * dtype.size_bytes() as usize],
        3 => random_elements(dtype, seed ^ row, hidden),
        _ => {
            let scale = 2.0_f32.powi((row % 11) as i32 - 8);
            bytes_of(
                dtype,
                (0..hidden).map(|_| {
                    let unit = (draws.next_u64() >> 40) as f32 / (1_u64 << 24) as f32;
                    let exponent = (draws.next_u64() % 13) as i32 - 6;
                    from_f32(dtype, (2.0 * unit - 1.0) * scale * 2.0_f32.powi(exponent))
                }),
            )
        }
    }
}

/// One launch of the kernel on `rows` (row ids) of `hidden`: its outputs.
#[allow(clippy::too_many_arguments)]
fn launch(
    stream: &Stream,
    device: &prepare::gpu::driver::Device,
    kernel: &LoadedKernel,
    dtype: Dtype,
    (hidden, rows): (usize, &[u64]),
    residual: bool,
    over_x: bool,
    geometry: Geometry,
    seed: u64,
) -> (EpilogueOutputs, EpilogueOutputs) {
    let x: Vec<u8> = rows
        .iter()
        .flat_map(|&row| row_data(dtype, seed, row, hidden))
        .collect();
    let added: Vec<u8> = rows
        .iter()
        .flat_map(|&row| row_data(dtype, seed + 1, row, hidden))
        .collect();
    let mut draws = SplitMix64::new(seed + 2);
    let weight = bytes_of(
        dtype,
        (0..hidden).map(|_| {
            let unit = (draws.next_u64() >> 40) as f32 / (1_u64 << 24) as f32;
            from_f32(dtype, 0.5 + unit)
        }),
    );
    let eps = [1e-5, 1e-6, 0.0][(seed % 3) as usize];
    let bytes = x.len();
    let buffer = |data: &[u8]| {
        let memory = device.allocate(data.len().max(16)).unwrap();
        stream.write(&memory, 0, data).unwrap();
        memory
    };
    let x_memory = buffer(&x);
    let residual_memory = buffer(&added);
    let weight_memory = buffer(&weight);
    let normed_memory = device.allocate(bytes.max(16)).unwrap();
    stream
        .fill_u8(&normed_memory, 0..bytes.max(16), POISON)
        .unwrap();
    let state = device.allocate(STATE_WORDS * 8).unwrap();
    stream.fill_u8(&state, 0..STATE_WORDS * 8, 0).unwrap();
    let params = LaunchParams {
        state: state.address(),
        input: x_memory.address(),
        rows: rows.len() as u64,
        width: hidden as u64,
        residual: if residual {
            residual_memory.address()
        } else {
            0
        },
        weight: weight_memory.address(),
        normed: if over_x {
            x_memory.address()
        } else {
            normed_memory.address()
        },
        eps,
        world: 2,
        ..LaunchParams::all_reduce(0)
    };
    stream
        .launch_loaded(kernel, geometry, &params.to_bytes())
        .unwrap();
    stream.synchronize_within(WAIT).unwrap();
    let mut abort = [0_u64];
    stream.read(&state, 0, &mut abort).unwrap();
    assert_eq!(abort[0], 0, "the launch aborted");
    let read = |memory: &prepare::gpu::driver::DeviceBuffer| {
        let mut out = vec![0_u8; bytes];
        stream.read(memory, 0, &mut out).unwrap();
        out
    };
    let got = EpilogueOutputs {
        normed: read(if over_x { &x_memory } else { &normed_memory }),
        residual_out: if residual {
            read(&residual_memory)
        } else if over_x {
            x.clone()
        } else {
            read(&x_memory)
        },
    };
    let shape = Shape::new(rows.len() as u64, hidden as u64).unwrap();
    let epilogue = EpilogueInputs {
        residual: residual.then_some(added.as_slice()),
        weight: &weight,
        eps,
    };
    let expected = reference_add_rms_norm(dtype, shape, &x, &epilogue).unwrap();
    (got, expected)
}

/// The index of the first element where `got` and `expected` differ.
fn first_difference(dtype: Dtype, got: &[u8], expected: &[u8]) -> Option<usize> {
    let size = dtype.size_bytes() as usize;
    got.chunks(size)
        .zip(expected.chunks(size))
        .position(|(a, b)| a != b)
}

#[test]
#[ignore = "needs a GPU"]
fn the_epilogue_kernel_gives_the_reference_on_one_gpu() {
    let _lock = gpu_lock();
    let (driver, [device]) = require_gpus!(1);
    let arch = arch_of(driver, 0);
    let stream = device.new_stream().unwrap();
    let mut checked = 0;
    for dtype in Dtype::ALL {
        let spec = all_kernels(dtype, 2)
            .into_iter()
            .find(|spec| spec.name == format!("add_rms_norm_{}", dtype.name()))
            .expect("the table has the epilogue kernel");
        let compiled = prepare::compile::compile_kernels(
            std::slice::from_ref(&spec),
            arch,
            &prepare::progress::Silent,
        )
        .unwrap();
        let module = device
            .load_module(ModuleImage::Cubin(&compiled.kernels[0].cubin))
            .unwrap();
        let kernel = module.load(&spec.name, false, PARAMS_BYTES).unwrap();
        let mut variant = 0_u64;
        for hidden in [8, 16, 24, 392, 2048, 2056, 4104, 7168, 8192, 12_344, 16_384] {
            for rows in [0_u64, 1, 3, 64] {
                for residual in [true, false] {
                    variant += 1;
                    let geometry = match variant % 4 {
                        0 => Geometry::new(rows.max(1) as u32, 256),
                        1 => Geometry::new(4, 128),
                        2 => Geometry::new(1, 1024),
                        _ => Geometry::new(3, 96),
                    }
                    .unwrap();
                    let ids: Vec<u64> = (0..rows).map(|row| row + variant).collect();
                    let over_x = variant % 3 == 0;
                    let (got, expected) = launch(
                        &stream,
                        &device,
                        &kernel,
                        dtype,
                        (hidden, &ids),
                        residual,
                        over_x,
                        geometry,
                        variant,
                    );
                    let what = format!(
                        "{}: {rows} x {hidden}, residual {residual}, normed over x {over_x}, \
                         {geometry:?}",
                        spec.name
                    );
                    for (name, got, expected) in [
                        ("normed", &got.normed, &expected.normed),
                        ("residual_out", &got.residual_out, &expected.residual_out),
                    ] {
                        assert_eq!(
                            first_difference(dtype, got, expected),
                            None,
                            "{what}: {name} differs from the reference"
                        );
                    }
                    checked += 1;
                }
            }
            // Batch invariance: row 40 alone gives its bytes among 64 rows.
            let ids: Vec<u64> = (0..64).collect();
            let geometry = Geometry::new(8, 256).unwrap();
            let all = (hidden, ids.as_slice());
            let (many, _) = launch(
                &stream, &device, &kernel, dtype, all, true, false, geometry, 7,
            );
            let alone = (hidden, &ids[40..41]);
            let geometry = Geometry::new(1, 64).unwrap();
            let (one, _) = launch(
                &stream, &device, &kernel, dtype, alone, true, false, geometry, 7,
            );
            let row = hidden * dtype.size_bytes() as usize;
            assert!(
                one.normed == many.normed[40 * row..41 * row]
                    && one.residual_out == many.residual_out[40 * row..41 * row],
                "{}: hidden {hidden}, a row alone differs from itself among 64",
                spec.name
            );
        }
        invalid_launch_is_refused(&stream, &device, &kernel, dtype);
    }
    eprintln!("{checked} epilogue launches, each the reference's bytes");
}

/// A hidden size that is not a multiple of 8 records the invalid-launch code and writes nothing.
fn invalid_launch_is_refused(
    stream: &Stream,
    device: &prepare::gpu::driver::Device,
    kernel: &LoadedKernel,
    dtype: Dtype,
) {
    let memory = device.allocate(4096).unwrap();
    stream.fill_u8(&memory, 0..4096, POISON).unwrap();
    let state = device.allocate(STATE_WORDS * 8).unwrap();
    stream.fill_u8(&state, 0..STATE_WORDS * 8, 0).unwrap();
    let params = LaunchParams {
        state: state.address(),
        input: memory.address(),
        rows: 2,
        width: 12,
        weight: memory.address(),
        normed: memory.address() + 2048,
        eps: 1e-5,
        rank: 1,
        world: 2,
        ..LaunchParams::all_reduce(0)
    };
    stream
        .launch_loaded(kernel, Geometry::new(2, 64).unwrap(), &params.to_bytes())
        .unwrap();
    stream.synchronize_within(WAIT).unwrap();
    let mut abort = [0_u64];
    stream.read(&state, 0, &mut abort).unwrap();
    assert_eq!(
        abort[0],
        ABORT_FLAG | (ABORT_INVALID_LAUNCH << 32) | 1,
        "{dtype}: hidden 12"
    );
    let mut normed = vec![0_u8; 2048];
    stream.read(&memory, 2048, &mut normed).unwrap();
    assert!(normed.iter().all(|&byte| byte == POISON), "{dtype}: wrote");
}
