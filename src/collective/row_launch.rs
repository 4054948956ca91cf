//! Enqueueing a reduce-scatter or all-gather through an entry: the operands checked against
//! the shape, then the entry's NCCL path ([`super::nccl_rows`]) or its custom kernel with the
//! copies [`plan_rows`] asks for around it.

use super::row_pieces::row_piece_steps;
use super::rows::{plan_rows, RowMessage, RowPlan};
use super::{check_entry, moves, Collectives, EntryId, Input, Launch, Operands};
use crate::gpu::driver::{CallerMemory, DeviceMemory, Graph, Stream};
use crate::kernels::InputAccess;
use crate::ladder::Collective;
use crate::runtime::{OperandError, PeerMemory, Runtime, RuntimeError};
use crate::shape::Shape;

/// The shape start-up checks and times a row collective of `elements` at, on `world` ranks:
/// one row per rank where that gives every rank whole 16-byte vectors of `per_vector`
/// elements (the bucket edges, multiples of 16 bytes x the world), else rows of one element,
/// uneven across the ranks and off every vector boundary (the odd size the check adds).
pub fn startup_shape(elements: u64, world: u32, per_vector: u64) -> Shape {
    let world = u64::from(world);
    if elements > 0 && elements % (world * per_vector) == 0 {
        Shape::new(world, elements / world).expect("a width of at least one")
    } else {
        Shape::flat(elements)
    }
}

impl Collectives {
    /// The collective the package serves.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// Whether the package's collective has rows (a reduce-scatter or an all-gather).
    pub fn has_rows(&self) -> bool {
        matches!(
            self.collective,
            Collective::ReduceScatter | Collective::AllGather
        )
    }

    /// This rank's part of the package's row collective of `shape`.
    pub fn row_message(&self, world: u32, shape: Shape) -> Result<RowMessage, RuntimeError> {
        RowMessage::new(self.collective, shape, world, self.rank, self.dtype)
            .map_err(|source| (self.operand_error())(OperandError::Shape(source)))
    }

    /// This rank's part of a row collective of `elements` in the start-up shape
    /// ([`startup_shape`]).
    pub fn startup_message(&self, world: u32, elements: usize) -> Result<RowMessage, RuntimeError> {
        let shape = startup_shape(elements as u64, world, self.dtype.per_vector());
        self.row_message(world, shape)
    }

    /// Enqueues entry `id` for `message` from `operands.input` into `operands.output` (each at
    /// least as long as this rank's part; in place is this rank's rows of the other operand,
    /// any other overlap refused), on `stream`. A rank owning no rows still enqueues its part.
    pub fn enqueue_rows(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        message: &RowMessage,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let entry = &self.entries[id];
        let elements = message.shape().elements() as usize;
        check_entry(entry, elements, self.bucket_capacity[entry.bucket])
            .and_then(|()| check_holds(message, &operands))
            .map_err(self.operand_error())?;
        let layout = message
            .layout(operands.input.address(), operands.output.address())
            .map_err(self.operand_error())?;
        match &entry.launch {
            None => unreachable!("check_entry refuses an entry without a launch"),
            Some(Launch::Nccl { .. }) => self.enqueue_nccl_rows(
                self.communicator(runtime, id),
                stream,
                message,
                layout,
                operands,
            ),
            Some(Launch::NcclRankOrder) if message.collective() == Collective::ReduceScatter => {
                self.enqueue_exact_scatter(runtime.communicator(), stream, message, operands)
            }
            Some(Launch::NcclRankOrder) => {
                self.enqueue_nccl_rows(runtime.communicator(), stream, message, layout, operands)
            }
            Some(Launch::NcclSymmetric { .. }) => Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "{} in bucket {} has no {} path",
                    entry.profile,
                    entry.bucket,
                    message.collective()
                ),
            }),
            Some(Launch::Custom { .. } | Launch::CopyEngine(_)) if !message.follows_rule() => {
                Err(RuntimeError::Setup {
                    rank: self.rank,
                    message: format!(
                        "{} in bucket {} takes only the shape rule's rows; a {} of other \
                         per-rank rows goes through NCCL's grouped transfers",
                        entry.profile,
                        entry.bucket,
                        message.collective()
                    ),
                })
            }
            Some(Launch::Custom {
                kernel,
                geometry,
                scratch_offset,
                input,
            }) => self.enqueue_row_kernel(stream, message, operands, *input, |plan, peer| {
                let mut params =
                    peer.params(plan.input, plan.output, 0, *scratch_offset, self.timeout);
                message.set_params(&mut params);
                stream
                    .launch_loaded(kernel, *geometry, &params.to_bytes())
                    .map_err(RuntimeError::driver(self.rank))
            }),
            Some(Launch::CopyEngine(kernels)) => {
                let access = InputAccess::Peers {
                    output_may_alias: false,
                };
                self.enqueue_row_kernel(stream, message, operands, access, |plan, peer| {
                    // The own-rows copy skips rows already in place: give it the caller's
                    // input when that is this rank's rows of the output it writes.
                    let input = operands.input.address();
                    let own = if message.in_place_partner(input, plan.output) {
                        input
                    } else {
                        plan.input
                    };
                    let mut params = peer.params(own, plan.output, 0, 0, self.timeout);
                    message.set_params(&mut params);
                    let output =
                        self.locate(peer, &operands, plan.output, message.output_bytes())?;
                    self.copy_engine
                        .as_ref()
                        .expect("a copy-engine entry comes with the copy engine's stream")
                        .enqueue_gather(stream, peer, kernels, message, &params, output)
                })
            }
        }
    }

    /// Enqueues a custom row kernel's launch for `message`, which reads its input as `access`
    /// says: the input staged into the registered buffer where the plan asks, `launch` given
    /// the plan, the output bounced from where the kernel wrote it where the plan asks.
    fn enqueue_row_kernel(
        &self,
        stream: &Stream,
        message: &RowMessage,
        operands: Operands,
        access: InputAccess,
        launch: impl FnOnce(&RowPlan, &PeerMemory) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let Input::Peer(peer) = &self.input else {
            unreachable!("custom entries exist only with peer memory")
        };
        let buffers = self.layout(peer);
        let plan = plan_rows(
            access,
            message,
            operands.input.address(),
            operands.output.address(),
            &buffers,
        )
        .map_err(self.operand_error())?;
        if plan.staged {
            let copies = moves(
                plan.input,
                operands.input.address(),
                message.input_bytes(),
                &buffers.private_output,
            );
            self.copy(stream, peer, &operands, &copies)?;
        }
        launch(&plan, peer)?;
        if plan.bounce {
            let copies = moves(
                operands.output.address(),
                plan.output,
                message.output_bytes(),
                &buffers.private_output,
            );
            self.copy(stream, peer, &operands, &copies)?;
        }
        Ok(())
    }

    /// Captures `ops` back-to-back launches of entry `id` for `message` into a graph, on
    /// `operands`, or without, from the registered buffer into the out-of-place output
    /// (each holds any message of the package's buckets).
    pub fn capture_rows(
        &self,
        runtime: &Runtime,
        stream: &mut Stream,
        id: EntryId,
        message: &RowMessage,
        operands: Option<Operands>,
        ops: u32,
    ) -> Result<Graph, RuntimeError> {
        let operands = match operands {
            Some(operands) => operands,
            None => self.own_operands()?,
        };
        self.capture_with(stream, ops, |stream| {
            self.enqueue_rows(runtime, stream, id, message, operands)
        })
    }

    /// Enqueues a row collective of any size on NCCL (above the ladder, or a plain NCCL winner
    /// that must be exact): see `enqueue_nccl_rows_fallback`. Checks the operands first.
    pub fn enqueue_nccl_rows_whole(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &RowMessage,
        operands: Operands,
        exact_only: bool,
    ) -> Result<(), RuntimeError> {
        check_holds(message, &operands).map_err(self.operand_error())?;
        let layout = message
            .layout(operands.input.address(), operands.output.address())
            .map_err(self.operand_error())?;
        self.enqueue_nccl_rows_fallback(runtime, stream, message, layout, operands, exact_only)
    }
}

impl Collectives {
    /// Enqueues `message`, of any size, in pieces of the largest bucket's message
    /// ([`super::row_piece_steps`]), each through the entry `entry_for` gives for its full
    /// bytes, in order on `stream`: a reduce-scatter's piece gathered from `operands.input`
    /// into `staging` and written to its rows of `operands.output`, an all-gather's read from
    /// its rows of `operands.input`, written to `staging` and scattered into `operands.output`.
    /// `staging` holds one piece and lies apart from both operands. In place is taken as
    /// whole: a piece writes only rows that no later piece reads. Everything is checked before
    /// the first piece is enqueued (a refusal after some would leave the peers waiting).
    pub fn enqueue_rows_in_pieces(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &RowMessage,
        operands: Operands,
        staging: CallerMemory,
        entry_for: impl Fn(u64) -> EntryId,
    ) -> Result<(), RuntimeError> {
        if !message.follows_rule() {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "a {} of other per-rank rows than the shape rule's does not go in pieces",
                    message.collective()
                ),
            });
        }
        let piece = self.piece_elements() as u64;
        let steps = row_piece_steps(message, piece, self.dtype)
            .map_err(|source| (self.operand_error())(OperandError::Shape(source)))?;
        check_holds(message, &operands).map_err(self.operand_error())?;
        message
            .layout(operands.input.address(), operands.output.address())
            .map_err(self.operand_error())?;
        let staged = piece * self.element_bytes;
        let apart = [&operands.input, &operands.output]
            .into_iter()
            .all(|memory| {
                !super::operands::overlaps(
                    &super::operands::span(staging.address(), staged),
                    &super::operands::span(memory.address(), memory.len_bytes() as u64),
                )
            });
        if (staging.len_bytes() as u64) < staged || !apart {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "the staging buffer of a {} in pieces must hold {staged} bytes apart from                      the operands",
                    message.collective()
                ),
            });
        }
        let scatter = message.collective() == Collective::ReduceScatter;
        let rank = self.rank;
        let copy = |to: &dyn DeviceMemory, from: &dyn DeviceMemory, each: &super::PieceCopy| {
            stream
                .copy_device(
                    to,
                    each.to as usize,
                    from,
                    each.from as usize,
                    each.bytes as usize,
                )
                .map_err(RuntimeError::driver(rank))
        };
        for step in steps {
            let own = CallerMemory::prefix(
                &if scatter {
                    operands.output
                } else {
                    operands.input
                }
                .offset(step.own_offset),
                step.message.own_bytes(),
            );
            let piece_operands = if scatter {
                for each in &step.copies {
                    copy(&staging, &operands.input, each)?;
                }
                Operands {
                    input: CallerMemory::prefix(&staging, step.message.input_bytes()),
                    output: own,
                }
            } else {
                Operands {
                    input: own,
                    output: CallerMemory::prefix(&staging, step.message.output_bytes()),
                }
            };
            let id = entry_for(step.message.message_bytes());
            self.enqueue_rows(runtime, stream, id, &step.message, piece_operands)?;
            if !scatter {
                for each in &step.copies {
                    copy(&operands.output, &staging, each)?;
                }
            }
        }
        Ok(())
    }
}

/// Refuses operands shorter than this rank's part of `message`.
fn check_holds(message: &RowMessage, operands: &Operands) -> Result<(), OperandError> {
    for (operand, memory, bytes) in [
        ("input", &operands.input, message.input_bytes()),
        ("output", &operands.output, message.output_bytes()),
    ] {
        if (memory.len_bytes() as u64) < bytes {
            return Err(OperandError::TooShort {
                operand,
                holds: memory.len_bytes(),
                bytes,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::startup_shape;
    use crate::shape::Shape;

    #[test]
    fn start_up_takes_a_row_per_rank_at_the_edges_and_single_elements_otherwise() {
        // 4 ranks of bf16 (8 a vector): 4096 elements are a row of 1024 per rank.
        assert_eq!(startup_shape(4096, 4, 8), Shape::new(4, 1024).unwrap());
        // The odd size: rows of one element, uneven over the ranks.
        assert_eq!(startup_shape(4093, 4, 8), Shape::flat(4093));
        assert_eq!(startup_shape(4093, 4, 8).width(), 1);
        // Not whole vectors per rank: single elements too.
        assert_eq!(startup_shape(4 * 12, 4, 8), Shape::flat(48));
        assert_eq!(startup_shape(0, 4, 8), Shape::flat(0));
    }
}
