//! The check of one run of an `all_reduce_add_rms_norm` candidate: fresh random `x` on every
//! rank, a residual and a weight every rank shares, and both outputs (`normed`, and the
//! residual overwritten) against [`reference_epilogue`] on every rank; the input kept.

use super::{equal, mismatch, poison_bits, run_seed, Checker, PAST_END_ELEMENTS, POISON};
use crate::collective::{epilogue_startup_shape, EntryId, STARTUP_EPS};
use crate::gpu::driver::{DeviceMemory as _, Graph, Stream};
use crate::ladder::Collective;
use crate::reference::{element, random_rank_inputs, reference_epilogue, EpilogueInputs};
use crate::runtime::RuntimeError;

/// Seeds of the residual and the weight, apart from every rank's `x`.
const RESIDUAL_STREAM: u64 = 0x5245_5349_4455_414c;
const WEIGHT_STREAM: u64 = 0x5745_4947_4854_0000;

impl Checker<'_> {
    /// [`Checker::run`] of the fused collective: entry `id` at `elements`, in the start-up
    /// shape. `Ok(Some(problem))` when an output is wrong or the input changed.
    pub(super) fn run_epilogue(
        &mut self,
        stream: &Stream,
        id: EntryId,
        graph: &Graph,
        elements: usize,
        step: &str,
    ) -> Result<Option<String>, RuntimeError> {
        let rank = self.runtime.rank();
        let driver = |source| RuntimeError::Driver { rank, source };
        self.counter += 1;
        let dtype = self.dtype;
        let size = dtype.size_bytes() as usize;
        let collectives = self.collectives;
        let world = self.runtime.world() as usize;
        let shape = epilogue_startup_shape(elements as u64);
        let count = shape.elements() as usize;
        let bytes = count * size;
        let seed = run_seed(self.seed, self.counter);
        let x = random_rank_inputs(dtype, seed, world, count);
        let residual = random_rank_inputs(dtype, seed ^ RESIDUAL_STREAM, 1, count).remove(0);
        let weight =
            random_rank_inputs(dtype, seed ^ WEIGHT_STREAM, 1, shape.width() as usize).remove(0);
        let views: Vec<&[u8]> = x.iter().map(Vec::as_slice).collect();
        let inputs = EpilogueInputs {
            residual: Some(&residual),
            weight: &weight,
            eps: STARTUP_EPS,
        };
        let expected = reference_epilogue(dtype, shape, &views, &inputs)
            .map_err(|error| RuntimeError::Setup {
                rank,
                message: format!("the epilogue's reference: {error}"),
            })?
            .swap_remove(rank as usize);
        let (residual_buffer, weight_buffer) =
            collectives
                .epilogue_buffers()
                .ok_or_else(|| RuntimeError::Setup {
                    rank,
                    message: "the package holds no add_rms_norm kernel".to_owned(),
                })?;
        stream
            .write(collectives.input(), 0, &x[rank as usize])
            .map_err(driver)?;
        stream
            .write(residual_buffer, 0, &residual)
            .map_err(driver)?;
        stream.write(weight_buffer, 0, &weight).map_err(driver)?;
        let output = collectives.output()?;
        let poisoned = (count + PAST_END_ELEMENTS).min(output.len_bytes() / size);
        stream
            .fill_u16(output, 0..poisoned * size, POISON)
            .map_err(driver)?;
        collectives.run_bounded(self.runtime, stream, id, step, || {
            graph.launch().map_err(driver)
        })?;
        let mut read_back = vec![0_u8; (poisoned * size).max(bytes)];
        stream.read(output, 0, &mut read_back).map_err(driver)?;
        if let Some(past) =
            (count..poisoned).find(|&index| element(dtype, &read_back, index) != poison_bits(dtype))
        {
            return Ok(Some(format!(
                "rank {rank}, {elements} elements: wrote element {past} of normed, past the end \
                 of the message"
            )));
        }
        if let Some(message) = mismatch(
            rank,
            dtype,
            &read_back[..bytes],
            &expected.normed,
            Collective::AllReduceAddRmsNorm.reference(),
        ) {
            return Ok(Some(format!("normed: {message}")));
        }
        stream
            .read(residual_buffer, 0, &mut read_back[..bytes])
            .map_err(driver)?;
        if let Some(message) = mismatch(
            rank,
            dtype,
            &read_back[..bytes],
            &expected.residual_out,
            Collective::AllReduceAddRmsNorm.reference(),
        ) {
            return Ok(Some(format!("the residual: {message}")));
        }
        stream
            .read(collectives.input(), 0, &mut read_back[..bytes])
            .map_err(driver)?;
        if !equal(&read_back[..bytes], &x[rank as usize]) {
            return Ok(Some(format!(
                "rank {rank}, {elements} elements: changed its input"
            )));
        }
        Ok(None)
    }
}
