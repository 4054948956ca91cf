//! `prepare check` of an `all_reduce_add_rms_norm` package above the ladder: a message of whole
//! rows in pieces ([`Collectives::enqueue_epilogue_in_pieces`]) through every custom candidate
//! of the largest bucket that qualified, `normed` apart from `x` and over it, each rank's
//! `normed` and overwritten residual against [`reference_epilogue`] on fresh random data.

use super::error::CheckError;
use crate::collective::{epilogue_startup_shape, Collectives, EntryId, EpilogueMessage};
use crate::gpu::driver::CallerMemory;
use crate::ladder::Collective;
use crate::qualify::mismatch;
use crate::reference::{random_rank_inputs, reference_epilogue, EpilogueInputs};
use crate::runtime::{Runtime, RuntimeError};
use crate::shape::Shape;

/// The eps of the check: not start-up's, so a kernel that ignored it would show.
const EPS: f32 = 1e-5;

/// Two pieces of whole rows and three rows more, so the last piece is short: rows of the
/// start-up shape's hidden size at the largest bucket's message.
pub(super) fn check_epilogue_pieces(
    runtime: &Runtime,
    collectives: &Collectives,
    live: &[EntryId],
    seed: u64,
    log: &dyn Fn(String),
) -> Result<(), CheckError> {
    let (rank, world) = (runtime.rank(), runtime.world() as usize);
    let driver = move |source| CheckError::Runtime(RuntimeError::Driver { rank, source });
    let dtype = collectives.dtype();
    let size = dtype.size_bytes();
    let piece = collectives.piece_elements() as u64;
    let hidden = epilogue_startup_shape(piece).width();
    let shape = Shape::new(2 * (piece / hidden) + 3, hidden).map_err(|source| {
        CheckError::Runtime(RuntimeError::Operands {
            rank,
            source: source.into(),
        })
    })?;
    let (elements, bytes) = (shape.elements() as usize, shape.elements() * size);
    let x = random_rank_inputs(dtype, seed, world, elements);
    let residual = random_rank_inputs(dtype, seed ^ 0x5245_5349, 1, elements).remove(0);
    let weight = random_rank_inputs(dtype, seed ^ 0x5745_4947, 1, hidden as usize).remove(0);
    let views: Vec<&[u8]> = x.iter().map(Vec::as_slice).collect();
    let inputs = EpilogueInputs {
        residual: Some(&residual),
        weight: &weight,
        eps: EPS,
    };
    let expected = reference_epilogue(dtype, shape, &views, &inputs)
        .map_err(|error| CheckError::NotExact {
            rank,
            what: "the reference of a message in pieces".to_owned(),
            message: error.to_string(),
        })?
        .swap_remove(rank as usize);
    let device = runtime.device();
    let allocate = |bytes: u64| device.allocate(bytes as usize).map_err(driver);
    let (x_buffer, residual_buffer) = (allocate(bytes)?, allocate(bytes)?);
    let (normed_buffer, weight_buffer) = (allocate(bytes)?, allocate(hidden * size)?);
    let stream = runtime.stream();
    stream.write(&weight_buffer, 0, &weight).map_err(driver)?;
    let mut got = vec![0_u8; bytes as usize];
    for &id in live {
        let profile = &collectives.entries()[id].profile;
        for over_x in [false, true] {
            stream
                .write(&x_buffer, 0, &x[rank as usize])
                .map_err(driver)?;
            stream
                .write(&residual_buffer, 0, &residual)
                .map_err(driver)?;
            let x_memory = CallerMemory::whole(&x_buffer);
            let message = EpilogueMessage {
                x: x_memory,
                residual: Some(CallerMemory::whole(&residual_buffer)),
                weight: CallerMemory::whole(&weight_buffer),
                normed: if over_x {
                    x_memory
                } else {
                    CallerMemory::whole(&normed_buffer)
                },
                shape,
                eps: EPS,
            };
            let step = format!("{profile} in pieces");
            collectives.run_bounded(runtime, stream, id, &step, || {
                collectives.enqueue_epilogue_in_pieces(runtime, stream, &message, id)
            })?;
            let not_exact = |what: &str, message: String| CheckError::NotExact {
                rank,
                what: format!(
                    "{profile} in pieces ({what}, {})",
                    if over_x {
                        "normed over x"
                    } else {
                        "normed apart"
                    }
                ),
                message,
            };
            let normed = if over_x { &x_buffer } else { &normed_buffer };
            stream.read(normed, 0, &mut got).map_err(driver)?;
            if let Some(found) = mismatch(
                rank,
                dtype,
                &got,
                &expected.normed,
                Collective::AllReduceAddRmsNorm.reference(),
            ) {
                return Err(not_exact("normed", found));
            }
            stream.read(&residual_buffer, 0, &mut got).map_err(driver)?;
            if let Some(found) = mismatch(
                rank,
                dtype,
                &got,
                &expected.residual_out,
                Collective::AllReduceAddRmsNorm.reference(),
            ) {
                return Err(not_exact("the residual", found));
            }
            if !over_x {
                stream.read(&x_buffer, 0, &mut got).map_err(driver)?;
                if got != x[rank as usize] {
                    return Err(not_exact("x", "changed".to_owned()));
                }
            }
        }
        log(format!(
            "{profile} in pieces, {} x {hidden} all_reduce_add_rms_norm, normed apart and over \
             x: equals the epilogue's reference",
            shape.rows()
        ));
    }
    Ok(())
}
