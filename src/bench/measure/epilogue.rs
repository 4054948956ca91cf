//! The measurements of a package of `all_reduce_add_rms_norm`, at rows x hidden: every
//! candidate of a size's bucket checked once against the reference, then timed against the
//! others, each launch on real operands (x in the registered buffer, the residual, the weight,
//! eps, `normed` in the out-of-place output); the chosen candidate through the serving paths;
//! the decode emulation with the choice, the fastest unfused candidate and NCCL.

use super::{slowest_median, Bench, BenchError, ServingSpans};
use crate::bench::epilogue::Form;
use crate::bench::{DecodeRow, DecodeShape, RowsWidth, ServingRow, SizeRow};
use crate::collective::{EntryId, EpilogueMessage, STARTUP_EPS};
use crate::gpu::driver::{CallerMemory, DeviceBuffer, Stream};
use crate::reference::{element, random_rank_inputs, reference_epilogue, EpilogueInputs};
use crate::runtime::RuntimeError;
use crate::shape::Shape;
use crate::timing::Timed;

/// Seeds of the bench's operands: every rank's x, the residual and the weight every rank
/// shares.
const X_SEED: u64 = 0x4550_4942_454e_4348;
const RESIDUAL_SEED: u64 = 0x5245_5349_4455_414c;
const WEIGHT_SEED: u64 = 0x5745_4947_4854_0000;

/// The epilogue's operands beside the registered buffer and the out-of-place output: the
/// residual and the weight, and a server's own memory for x and `normed` (the serving rows).
#[derive(Debug)]
pub struct EpilogueBuffers {
    hidden: u64,
    residual: DeviceBuffer,
    weight: DeviceBuffer,
    input: DeviceBuffer,
    output: DeviceBuffer,
}

impl EpilogueBuffers {
    /// Elements per row.
    pub fn hidden(&self) -> u64 {
        self.hidden
    }
}

impl Bench<'_> {
    fn driver(&self) -> impl Fn(crate::gpu::driver::DriverError) -> RuntimeError {
        let rank = self.runtime.rank();
        move |source| RuntimeError::Driver { rank, source }
    }

    /// The message of `rows` x hidden at `bytes`, `bucket` covering it.
    fn epilogue_message_bytes(&self, rows: u64, hidden: u64) -> Result<(Shape, u64), BenchError> {
        let shape = Shape::new(rows, hidden).map_err(|source| RuntimeError::Operands {
            rank: self.runtime.rank(),
            source: source.into(),
        })?;
        Ok((shape, shape.elements() * self.ladder.dtype.size_bytes()))
    }

    /// Buffers for messages of up to `max_rows` rows of `hidden` elements, the weight random
    /// (the same on every rank).
    pub fn epilogue_buffers(
        &self,
        max_rows: u64,
        hidden: u64,
    ) -> Result<EpilogueBuffers, BenchError> {
        let size = self.ladder.dtype.size_bytes();
        let bytes = (max_rows.max(1) * hidden * size).max(16) as usize;
        let device = self.runtime.device();
        let allocate = |bytes: usize| device.allocate(bytes.max(16)).map_err(self.driver());
        let buffers = EpilogueBuffers {
            hidden,
            residual: allocate(bytes)?,
            weight: allocate((hidden * size) as usize)?,
            input: allocate(bytes)?,
            output: allocate(bytes)?,
        };
        let weight = random_rank_inputs(self.ladder.dtype, WEIGHT_SEED, 1, hidden as usize);
        let stream = device.new_stream().map_err(self.driver())?;
        stream
            .write(&buffers.weight, 0, &weight[0])
            .map_err(self.driver())?;
        Ok(buffers)
    }

    /// The call of `shape` with x at `x` and `normed` at `normed` (each at least the message),
    /// the buffers' residual and weight, start-up's eps.
    fn epilogue_call(
        &self,
        buffers: &EpilogueBuffers,
        shape: Shape,
        x: CallerMemory,
        normed: CallerMemory,
    ) -> EpilogueMessage {
        let size = self.ladder.dtype.size_bytes();
        let bytes = shape.elements() * size;
        EpilogueMessage {
            x: CallerMemory::prefix(&x, bytes),
            residual: Some(CallerMemory::prefix(&buffers.residual, bytes)),
            weight: CallerMemory::prefix(&buffers.weight, shape.width() * size),
            normed: CallerMemory::prefix(&normed, bytes),
            shape,
            eps: STARTUP_EPS,
        }
    }

    /// The call the candidates are timed with: x in the registered buffer, `normed` in the
    /// out-of-place output.
    fn own_epilogue_call(
        &self,
        buffers: &EpilogueBuffers,
        shape: Shape,
    ) -> Result<EpilogueMessage, BenchError> {
        let output = CallerMemory::whole(self.collectives.output()?);
        let input = CallerMemory::whole(self.collectives.input());
        Ok(self.epilogue_call(buffers, shape, input, output))
    }

    /// Writes this rank's random x of `shape` into the registered buffer; returns the
    /// residual to write and the reference's outputs for this rank.
    fn epilogue_data(&self, stream: &Stream, shape: Shape) -> Result<CheckData, BenchError> {
        let (dtype, rank) = (self.ladder.dtype, self.runtime.rank());
        let count = shape.elements() as usize;
        let seed = X_SEED ^ shape.rows().wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let x = random_rank_inputs(dtype, seed, self.runtime.world() as usize, count);
        let residual = random_rank_inputs(dtype, seed ^ RESIDUAL_SEED, 1, count).remove(0);
        let weight = random_rank_inputs(dtype, WEIGHT_SEED, 1, shape.width() as usize).remove(0);
        let views: Vec<&[u8]> = x.iter().map(Vec::as_slice).collect();
        let inputs = EpilogueInputs {
            residual: Some(&residual),
            weight: &weight,
            eps: STARTUP_EPS,
        };
        let expected = reference_epilogue(dtype, shape, &views, &inputs)
            .map_err(|error| RuntimeError::Setup {
                rank,
                message: format!(
                    "the epilogue's reference at {}: {error}",
                    RowsWidth::from(shape)
                ),
            })?
            .swap_remove(rank as usize);
        stream
            .write(self.collectives.input(), 0, &x[rank as usize])
            .map_err(self.driver())?;
        Ok(CheckData {
            residual,
            normed: expected.normed,
            residual_out: expected.residual_out,
        })
    }

    /// Whether entry `id` gives the reference's bits at `shape` on every rank: one run on
    /// fresh operands, both outputs read back. Collective.
    fn check_epilogue_entry(
        &self,
        stream: &mut Stream,
        buffers: &EpilogueBuffers,
        id: EntryId,
        shape: Shape,
    ) -> Result<bool, BenchError> {
        let dtype = self.ladder.dtype;
        let CheckData {
            residual,
            normed,
            residual_out,
        } = self.epilogue_data(stream, shape)?;
        stream
            .write(&buffers.residual, 0, &residual)
            .map_err(self.driver())?;
        let call = self.own_epilogue_call(buffers, shape)?;
        let collectives = self.collectives;
        let graph = collectives.capture_with(stream, 1, |stream| {
            collectives.enqueue_epilogue(self.runtime, stream, id, &call)
        })?;
        collectives.run_bounded(self.runtime, stream, id, "the bench's check", || {
            graph.launch().map_err(self.driver())
        })?;
        let mut got = vec![0_u8; normed.len()];
        stream
            .read(self.collectives.output()?, 0, &mut got)
            .map_err(self.driver())?;
        let mut differing = differing_elements(dtype, &got, &normed);
        stream
            .read(&buffers.residual, 0, &mut got)
            .map_err(self.driver())?;
        differing += differing_elements(dtype, &got, &residual_out);
        let flags = self
            .runtime
            .all_gather_pieces(&[u8::from(differing == 0)], "the bench's check")?;
        Ok(flags.iter().all(|flag| flag.first() == Some(&1)))
    }

    /// Every candidate of the bucket covering `rows` x hidden checked once against the
    /// reference, then timed against the others, in the bucket's order; `None` above the last
    /// bucket (the epilogue is not built in pieces).
    pub fn time_epilogue(
        &mut self,
        rows: u64,
        buffers: &EpilogueBuffers,
    ) -> Result<Option<Vec<SizeRow>>, BenchError> {
        let (shape, bytes) = self.epilogue_message_bytes(rows, buffers.hidden)?;
        let Some(bucket) = self.ladder.bucket_for(bytes) else {
            return Ok(None);
        };
        let mut stream = self.runtime.device().new_stream().map_err(self.driver())?;
        let live: Vec<EntryId> = self
            .collectives
            .bucket_entries(bucket)
            .filter(|(_, entry)| entry.dropped.is_none())
            .map(|(id, _)| id)
            .collect();
        let mut exact = Vec::with_capacity(live.len());
        for &id in &live {
            exact.push(self.check_epilogue_entry(&mut stream, buffers, id, shape)?);
        }
        let call = self.own_epilogue_call(buffers, shape)?;
        let timed: Vec<Timed> = live
            .iter()
            .map(|&id| Timed {
                epilogue: Some(call),
                ..Timed::from((id, shape.elements() as usize))
            })
            .collect();
        let mut rows = self.time_bucket(bucket, bytes, &timed)?;
        for row in &mut rows {
            row.shape = Some(RowsWidth::from(shape));
            row.form = Form::of(self.ladder, bucket, &row.profile);
            row.exact = live
                .iter()
                .position(|&id| self.collectives.entries()[id].profile == row.profile)
                .map(|index| exact[index]);
        }
        Ok(Some(rows))
    }

    /// The chosen candidate at `rows` x hidden through the serving paths, in one interleaved
    /// group: x in the registered buffer (`normed` apart, or over x), and x in a server's own
    /// memory (`normed` apart, or over x); `None` above the last bucket.
    pub fn time_epilogue_serving(
        &mut self,
        rows: u64,
        buffers: &EpilogueBuffers,
    ) -> Result<Option<ServingRow>, BenchError> {
        let (shape, bytes) = self.epilogue_message_bytes(rows, buffers.hidden)?;
        let Some(bucket) = self.ladder.bucket_for(bytes) else {
            return Ok(None);
        };
        let Some(id) = self.collectives.find(bucket, &self.chosen[bucket]) else {
            return Ok(None);
        };
        let spans = ServingSpans::of(bytes, None);
        let part = |memory: CallerMemory, span: &std::ops::Range<u64>| {
            CallerMemory::prefix(&memory.offset(span.start), span.end - span.start)
        };
        let timed = |x: CallerMemory, normed: CallerMemory| Timed {
            epilogue: Some(self.epilogue_call(buffers, shape, x, normed)),
            ..Timed::from((id, shape.elements() as usize))
        };
        let (input, output) = (
            CallerMemory::whole(&buffers.input),
            CallerMemory::whole(&buffers.output),
        );
        let in_place = |memory: CallerMemory| {
            timed(
                part(memory, &spans.in_place.0),
                part(memory, &spans.in_place.1),
            )
        };
        let own = self.own_epilogue_call(buffers, shape)?;
        let mut entries = vec![
            Timed {
                epilogue: Some(own),
                ..Timed::from((id, shape.elements() as usize))
            },
            timed(part(input, &spans.apart.0), part(output, &spans.apart.1)),
            in_place(output),
        ];
        if let Some(region) = self.collectives.input_region() {
            entries.push(in_place(region));
        }
        let group =
            self.timer
                .time_operands(self.runtime, self.collectives, &entries, self.timing)?;
        let medians: Vec<f64> = group.samples.iter().map(|s| slowest_median(s)).collect();
        Ok(Some(ServingRow {
            bytes,
            bucket,
            profile: self.chosen[bucket].clone(),
            zero_copy_us: medians[0],
            any_tensor_us: medians[1],
            any_tensor_in_place_us: medians[2],
            zero_copy_in_place_us: medians.get(3).copied(),
        }))
    }

    /// One batch of the decode emulation with epilogues: the layers' calls of `batch` x
    /// hidden in one graph, with the choice, every live unfused candidate (an all-reduce
    /// kernel, then `add_rms_norm`; the fastest is reported) and NCCL then `add_rms_norm`, in
    /// the same rounds; `None` above the last bucket or where the bucket has no NCCL.
    pub fn time_epilogue_decode(
        &mut self,
        batch: usize,
        shape: &DecodeShape,
        buffers: &EpilogueBuffers,
    ) -> Result<Option<DecodeRow>, BenchError> {
        let (ladder, collectives) = (self.ladder, self.collectives);
        let (message, bytes) = self.epilogue_message_bytes(batch as u64, shape.hidden as u64)?;
        let Some(bucket) = ladder.bucket_for(bytes) else {
            return Ok(None);
        };
        let Some(nccl) = super::nccl_profile(ladder, bucket)
            .and_then(|profile| collectives.find_live(bucket, &profile))
        else {
            return Ok(None);
        };
        let tuned = collectives
            .find_live(bucket, &self.chosen[bucket])
            .unwrap_or(nccl);
        let unfused: Vec<EntryId> = collectives
            .bucket_entries(bucket)
            .filter(|(_, entry)| entry.dropped.is_none())
            .filter(|(_, entry)| Form::of(ladder, bucket, &entry.profile) == Some(Form::Separate))
            .map(|(id, _)| id)
            .collect();
        let mut ids = vec![tuned, nccl];
        ids.extend(unfused.iter().filter(|&&id| id != tuned));
        ids.dedup();
        let call = self.own_epilogue_call(buffers, message)?;
        let entries: Vec<Timed> = ids
            .iter()
            .map(|&id| Timed {
                epilogue: Some(call),
                ..Timed::from((id, message.elements() as usize))
            })
            .collect();
        let ops = (shape.layers * shape.all_reduces_per_layer) as u32;
        let group =
            self.timer
                .time_with_ops(self.runtime, collectives, &entries, ops, self.timing)?;
        let steps: Vec<f64> = group
            .samples
            .iter()
            .map(|samples| slowest_median(samples) * f64::from(ops))
            .collect();
        let step_of = |id: EntryId| {
            ids.iter()
                .position(|&other| other == id)
                .map(|at| steps[at])
        };
        let tuned_us = steps[0];
        let nccl_us = step_of(nccl).unwrap_or(tuned_us);
        let fastest_unfused = unfused
            .iter()
            .filter_map(|&id| Some((id, step_of(id)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        Ok(Some(DecodeRow {
            batch,
            elements: message.elements() as usize,
            tuned_profile: self.chosen[bucket].clone(),
            tuned_us,
            nccl_us,
            speedup: nccl_us / tuned_us,
            unfused_profile: fastest_unfused
                .map(|(id, _)| collectives.entries()[id].profile.clone()),
            unfused_us: fastest_unfused.map(|(_, us)| us),
            speedup_vs_unfused: fastest_unfused.map(|(_, us)| us / tuned_us),
        }))
    }
}

/// The residual a check writes and the reference's outputs it expects, bytes of the dtype.
struct CheckData {
    residual: Vec<u8>,
    normed: Vec<u8>,
    residual_out: Vec<u8>,
}

/// How many elements of `dtype` differ between `got` and `expected` (bit for bit).
fn differing_elements(dtype: crate::ladder::Dtype, got: &[u8], expected: &[u8]) -> usize {
    let count = expected.len() / dtype.size_bytes() as usize;
    (0..count)
        .filter(|&index| element(dtype, got, index) != element(dtype, expected, index))
        .count()
}
