//! NCCL's reduce-scatter and all-gather, as pure plans of which rank sends which bytes where,
//! and their enqueueing.
//!
//! `ncclReduceScatter` and `ncclAllGather` take the same count on every rank, so they run
//! only where the world divides the rows. Otherwise (and for the exact reduce-scatter,
//! `"order": "rank"`, at any rows) grouped `ncclSend` / `ncclRecv` move each rank's rows
//! instead of padding: an all-gather sends its rows to every peer and receives every peer's
//! rows at their place in the output (its own by a local copy, none in place); a
//! reduce-scatter sends owner q's rows of its input to q, receives its own rows from every
//! peer into `world` slots (its own by a local copy), and the package's rank-order sum kernel
//! sums the slots in rank order. The same transfers take the caller's per-rank rows (the
//! v-forms), whatever their counts; NCCL's own collectives take only the rule's. Padding
//! would copy the whole message twice around NCCL's collective; the grouped transfers move
//! each byte once and need no padded buffer.
//!
//! The sum kernel sums the last slice of a message (`kernels::slice_of`): a run of `L`
//! elements is the last slice of a message of `world * (L / v) * v + L % v` elements (`v` an
//! element vector's), whose slot holds `L / v + 1` vectors, so the kernel sums exactly the
//! owned elements, from byte 0 of each slot. The scratch holds `world` slots of the exact
//! all-reduce's passes; a longer run goes in passes of what a slot holds, the same passes on
//! every rank (decided by the shape and the per-rank rows), first to last.

use std::ops::Range;

use super::rows::{RowLayout, RowMessage};
use super::{Collectives, Operands};
use crate::abi::{LaunchParams, ALIGNMENT_BYTES};
use crate::gpu::driver::{CallerMemory, DeviceMemory, Geometry, Stream};
use crate::gpu::nccl::{Communicator, Transfer};
use crate::kernels::{slice_of, slot_bytes};
use crate::ladder::{Collective, Dtype};
use crate::runtime::{Runtime, RuntimeError};

/// Threads per block of the sum kernel.
const SUM_THREADS: u32 = 512;

/// One grouped transfer: `bytes` at `offset` of an operand (or the scratch), to or from `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTransfer {
    /// The other rank.
    pub peer: u32,
    /// Byte offset in the memory sent from or received into.
    pub offset: u64,
    /// How many bytes.
    pub bytes: u64,
}

/// An all-gather by grouped transfers on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherPlan {
    /// This rank's rows (all of the input) to every peer.
    pub sends: Vec<RowTransfer>,
    /// Every peer's rows into the output at their place.
    pub receives: Vec<RowTransfer>,
    /// This rank's own rows copied into the output at this offset; `None` in place or when it
    /// owns none.
    pub local: Option<u64>,
}

/// Whether `message` can go to `ncclReduceScatter` / `ncclAllGather` directly: every rank
/// owns as many rows, by the shape rule (the caller's per-rank rows of equal counts are the
/// rule's).
pub fn nccl_takes_directly(message: &RowMessage) -> bool {
    message.follows_rule() && message.shape().rows() % u64::from(message.world()) == 0
}

/// The grouped all-gather of `message` on its rank (a plain one whatever the rows).
pub fn gather_plan(message: &RowMessage, layout: RowLayout) -> GatherPlan {
    let rank = message.rank();
    let own = message.own_bytes();
    let peers = (0..message.world()).filter(|&peer| peer != rank);
    let sends = peers
        .clone()
        .map(|peer| RowTransfer {
            peer,
            offset: 0,
            bytes: own,
        })
        .collect();
    let receives = peers
        .map(|peer| {
            let theirs = message.owned_bytes(peer);
            RowTransfer {
                peer,
                offset: theirs.start,
                bytes: theirs.end - theirs.start,
            }
        })
        .collect();
    let local = (own > 0 && layout == RowLayout::Apart).then(|| message.owned_bytes(rank).start);
    GatherPlan {
        sends,
        receives,
        local,
    }
}

/// Elements of the message whose last slice is a run of `run` elements
/// ([module docs](self)): what the sum kernel is given as `input_elements`.
pub fn sum_message_elements(run: u64, dtype: Dtype, world: u32) -> u64 {
    let per = dtype.per_vector();
    u64::from(world) * (run / per) * per + run % per
}

/// Bytes of one slot of the sum kernel for a run of `run` elements.
pub fn sum_slot_bytes(run: u64, dtype: Dtype, world: u32) -> u64 {
    slot_bytes(sum_message_elements(run, dtype, world), dtype, world)
}

/// The most elements of a run one pass takes with slots of `slot` bytes: whole vectors but the
/// one a slot keeps for the tail, or a tail alone when the slot holds one vector.
pub fn pass_elements(slot: u64, dtype: Dtype) -> u64 {
    let per = dtype.per_vector();
    ((slot / ALIGNMENT_BYTES).saturating_sub(1) * per).max(per - 1)
}

/// One pass of the exact reduce-scatter on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScatterPass {
    /// Each peer's part of this pass, from this rank's input.
    pub sends: Vec<RowTransfer>,
    /// This rank's part of this pass from every peer, into its slot of the scratch.
    pub receives: Vec<RowTransfer>,
    /// This rank's own part: input bytes copied into its own slot.
    pub own: Range<u64>,
    /// Byte offset of this rank's slot `q` is `q * slot`.
    pub slot: u64,
    /// Elements the sum kernel sums (this rank's part), and its `input_elements`.
    pub sum: (u64, u64),
    /// Byte offset in the output where this rank's part of the sum goes.
    pub output_offset: u64,
}

/// The passes of the exact reduce-scatter of `message` in `dtype` with slots of at most
/// `slot_capacity` bytes, first to last: pass k takes elements `[k * S, (k + 1) * S)` of every
/// owner's run (clipped), `S` = [`pass_elements`]. Every rank makes the same passes and, in
/// each, the transfers its peers expect; none when no rank owns rows.
pub fn scatter_passes(message: &RowMessage, dtype: Dtype, slot_capacity: u64) -> Vec<ScatterPass> {
    let world = message.world();
    let rank = message.rank();
    let size = message.element_bytes();
    let per_pass = pass_elements(slot_capacity, dtype);
    let run = |owner: u32| message.owned_elements(owner);
    // The rule's rank 0 owns the most rows; the caller's per-rank rows may give any rank most.
    let longest = (0..world)
        .map(|owner| run(owner).end - run(owner).start)
        .max()
        .unwrap_or(0);
    let passes = longest.div_ceil(per_pass);
    let part = |owner: u32, pass: u64| {
        let owned = run(owner);
        let start = (owned.start + pass * per_pass).min(owned.end);
        start..(start + per_pass).min(owned.end)
    };
    let bytes = |elements: &Range<u64>| (elements.end - elements.start) * size;
    (0..passes)
        .map(|pass| {
            let mine = part(rank, pass);
            let length = mine.end - mine.start;
            let slot = sum_slot_bytes(length, dtype, world);
            let peers = (0..world).filter(|&peer| peer != rank);
            ScatterPass {
                sends: peers
                    .clone()
                    .map(|peer| {
                        let theirs = part(peer, pass);
                        RowTransfer {
                            peer,
                            offset: theirs.start * size,
                            bytes: bytes(&theirs),
                        }
                    })
                    .collect(),
                receives: peers
                    .map(|peer| RowTransfer {
                        peer,
                        offset: u64::from(peer) * slot,
                        bytes: bytes(&mine),
                    })
                    .collect(),
                own: mine.start * size..mine.end * size,
                slot,
                sum: (length, sum_message_elements(length, dtype, world)),
                output_offset: (mine.start - run(rank).start) * size,
            }
        })
        .collect()
}

/// `transfers` on `memory` as the communicator takes them.
fn on<'a>(memory: &'a dyn DeviceMemory, transfers: &[RowTransfer]) -> Vec<Transfer<'a>> {
    transfers
        .iter()
        .map(|transfer| Transfer {
            peer: transfer.peer,
            memory,
            offset: transfer.offset as usize,
            bytes: transfer.bytes as usize,
        })
        .collect()
}

impl Collectives {
    /// Enqueues a plain NCCL reduce-scatter or all-gather of `message` (checked operands):
    /// NCCL's own collective where the world divides the rows, the grouped transfers otherwise
    /// (for the reduce-scatter, the exact path's, which needs the package's sum kernel).
    pub(super) fn enqueue_nccl_rows(
        &self,
        communicator: &Communicator,
        stream: &Stream,
        message: &RowMessage,
        layout: RowLayout,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let dtype = self.dtype;
        let own_elements = (message.own_bytes() / message.element_bytes()) as usize;
        let direct = nccl_takes_directly(message);
        match message.collective() {
            Collective::ReduceScatter if direct => communicator
                .reduce_scatter(
                    stream,
                    &operands.input,
                    &operands.output,
                    own_elements,
                    super::nccl_type(dtype),
                )
                .map_err(RuntimeError::from),
            Collective::ReduceScatter => {
                self.enqueue_exact_scatter(communicator, stream, message, operands)
            }
            _ if direct => communicator
                .all_gather(
                    stream,
                    &operands.input,
                    &operands.output,
                    message.own_bytes() as usize,
                )
                .map_err(RuntimeError::from),
            _ => {
                let plan = gather_plan(message, layout);
                if let Some(offset) = plan.local {
                    stream
                        .copy_device(
                            &operands.output,
                            offset as usize,
                            &operands.input,
                            0,
                            message.own_bytes() as usize,
                        )
                        .map_err(RuntimeError::driver(self.rank))?;
                }
                communicator
                    .send_receive(
                        stream,
                        &on(&operands.input, &plan.sends),
                        &on(&operands.output, &plan.receives),
                    )
                    .map_err(RuntimeError::from)
            }
        }
    }

    /// Enqueues the exact reduce-scatter of `message` (checked operands): per pass, the
    /// grouped transfers of [`scatter_passes`] and the rank-order sum of this rank's slots.
    pub(super) fn enqueue_exact_scatter(
        &self,
        communicator: &Communicator,
        stream: &Stream,
        message: &RowMessage,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let rank = self.rank;
        let Some(rank_order) = &self.rank_order else {
            return Err(RuntimeError::Setup {
                rank,
                message: "the package holds no rank-order sum kernel, which a reduce-scatter \
                          whose rows the world does not divide, or the exact one, needs"
                    .to_owned(),
            });
        };
        let dtype = self.dtype;
        let world = message.world();
        let driver = |source| RuntimeError::Driver { rank, source };
        let scratch = CallerMemory::whole(&rank_order.scratch);
        let slot_capacity = scratch.len_bytes() as u64 / u64::from(world);
        for pass in scatter_passes(message, dtype, slot_capacity) {
            let own = (pass.own.end - pass.own.start) as usize;
            let own_slot = pass.slot * u64::from(rank);
            if own > 0 {
                stream
                    .copy_device(
                        &scratch,
                        own_slot as usize,
                        &operands.input,
                        pass.own.start as usize,
                        own,
                    )
                    .map_err(driver)?;
            }
            communicator.send_receive(
                stream,
                &on(&operands.input, &pass.sends),
                &on(&scratch, &pass.receives),
            )?;
            if own == 0 {
                continue;
            }
            let target = operands.output.offset(pass.output_offset);
            let direct = target.address() % ALIGNMENT_BYTES == 0;
            let (elements, message_elements) = pass.sum;
            let last = slice_of(world - 1, message_elements, dtype, world);
            let vectors = last.end_vector - last.begin_vector + 1;
            let blocks = vectors
                .div_ceil(u64::from(SUM_THREADS))
                .clamp(1, crate::abi::MAX_BLOCKS as u64) as u32;
            let geometry = Geometry::new(blocks, SUM_THREADS).map_err(driver)?;
            debug_assert_eq!(last.elements(dtype), elements);
            let params = LaunchParams {
                output: if direct {
                    target.address()
                } else {
                    scratch.address() + own_slot
                },
                input: scratch.address(),
                // The run is the last slice of the message the kernel is given.
                rank: world - 1,
                world,
                ..LaunchParams::all_reduce(message_elements)
            };
            stream
                .launch_loaded(&rank_order.kernel, geometry, &params.to_bytes())
                .map_err(driver)?;
            if !direct {
                stream
                    .copy_device(&target, 0, &scratch, own_slot as usize, own)
                    .map_err(driver)?;
            }
        }
        Ok(())
    }

    /// Enqueues `message` on NCCL for a row collective's fallback (above the ladder, or a
    /// plain NCCL winner that must be exact): the exact reduce-scatter where the policy asks
    /// for rank order ([`super::rank_order_applies`]) and the package holds its kernel, plain
    /// NCCL otherwise.
    pub(super) fn enqueue_nccl_rows_fallback(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        message: &RowMessage,
        layout: RowLayout,
        operands: Operands,
        exact_only: bool,
    ) -> Result<(), RuntimeError> {
        let communicator = runtime.communicator();
        if message.collective() == Collective::ReduceScatter
            && super::rank_order_applies(Collective::ReduceScatter, runtime.world(), exact_only)
            && self.has_rank_order()
        {
            return self.enqueue_exact_scatter(communicator, stream, message, operands);
        }
        self.enqueue_nccl_rows(communicator, stream, message, layout, operands)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{RankRows, Shape};

    fn message(collective: Collective, rows: u64, width: u64, world: u32, rank: u32) -> RowMessage {
        RowMessage::new(
            collective,
            Shape::new(rows, width).expect("a valid shape"),
            world,
            rank,
            Dtype::Fp32,
        )
        .expect("a row collective")
    }

    /// Every rank's plan of one message, checked against the shape rule: every send has a
    /// receive of the same bytes at its peer, in the same group, and together they and the
    /// local copies write every rank's output exactly once, from the owner's input.
    #[test]
    fn the_uneven_all_gather_moves_every_rank_s_rows_to_their_place_once() {
        let width = 3;
        for world in 2..=8 {
            for rows in 0..=2 * u64::from(world) + 1 {
                let messages: Vec<RowMessage> = (0..world)
                    .map(|rank| message(Collective::AllGather, rows, width, world, rank))
                    .collect();
                check_gather(&messages);
            }
        }
    }

    /// Rank r's part of a `collective` of rows of `width` in `dtype`, rank q owning
    /// `counts[q]` rows.
    fn given(
        collective: Collective,
        counts: &[u64],
        width: u64,
        dtype: Dtype,
        rank: u32,
    ) -> RowMessage {
        let layout = RankRows::given(counts, counts.len() as u32).expect("one count per rank");
        RowMessage::given(collective, width, &layout, rank, dtype).expect("a row collective")
    }

    proptest::proptest! {
        /// The caller's per-rank rows, any counts (a rank owning none, the longest anywhere):
        /// the grouped all-gather writes every rank's rows at their place once, and the exact
        /// reduce-scatter's passes send every owner its rows, the same passes on every rank.
        #[test]
        fn the_grouped_transfers_move_the_caller_s_per_rank_rows(
            counts in proptest::collection::vec(0u64..9, 2..=8),
            width in 1u64..12,
            capacity in proptest::sample::select(vec![16u64, 48, 64, 4096, 1 << 20]),
        ) {
            let world = counts.len() as u32;
            let gathers: Vec<RowMessage> = (0..world)
                .map(|rank| given(Collective::AllGather, &counts, width, Dtype::Fp32, rank))
                .collect();
            proptest::prop_assert!(gathers.iter().all(|message| !nccl_takes_directly(message)
                || message.follows_rule()));
            check_gather(&gathers);
            for dtype in Dtype::ALL {
                let scatters: Vec<RowMessage> = (0..world)
                    .map(|rank| given(Collective::ReduceScatter, &counts, width, dtype, rank))
                    .collect();
                check_passes_of(&scatters, dtype, capacity);
            }
        }
    }

    #[test]
    fn nccl_s_own_collectives_take_only_the_rule_s_rows() {
        // 8 rows on 2 ranks: 4 and 4 is the rule (ncclAllGather takes it), 3 and 5 is not.
        let even = given(Collective::AllGather, &[4, 4], 2, Dtype::Fp32, 0);
        assert!(nccl_takes_directly(&even));
        let uneven = given(Collective::AllGather, &[3, 5], 2, Dtype::Fp32, 0);
        assert!(!nccl_takes_directly(&uneven));
        // The longest run is rank 1's (8 elements): the passes cover it, 4 elements a pass
        // with slots of 32 bytes, though rank 0's 2 elements take one.
        let scatter = |rank| given(Collective::ReduceScatter, &[1, 4], 2, Dtype::Fp32, rank);
        assert_eq!(scatter_passes(&scatter(0), Dtype::Fp32, 32).len(), 2);
        assert_eq!(scatter_passes(&scatter(1), Dtype::Fp32, 32).len(), 2);
        check_passes_of(&[scatter(0), scatter(1)], Dtype::Fp32, 32);
    }

    fn check_gather(messages: &[RowMessage]) {
        let world = messages.len() as u32;
        let plans: Vec<GatherPlan> = messages
            .iter()
            .map(|message| gather_plan(message, RowLayout::Apart))
            .collect();
        let total = messages[0].message_bytes();
        for (rank, plan) in (0..world).zip(&plans) {
            // Which owner's bytes each output byte of this rank gets.
            let mut written = vec![None; total as usize];
            let mut put = |range: Range<u64>, owner: u32| {
                for byte in range {
                    assert_eq!(written[byte as usize], None, "written twice");
                    written[byte as usize] = Some(owner);
                }
            };
            if let Some(offset) = plan.local {
                put(offset..offset + messages[rank as usize].own_bytes(), rank);
            }
            for receive in &plan.receives {
                let sender = &plans[receive.peer as usize];
                let send = sender
                    .sends
                    .iter()
                    .find(|send| send.peer == rank)
                    .expect("the peer sends to this rank");
                assert_eq!(send.bytes, receive.bytes, "world {world}");
                assert_eq!(send.offset, 0, "a rank sends its whole input");
                put(receive.offset..receive.offset + receive.bytes, receive.peer);
            }
            for owner in 0..world {
                let place = messages[0].owned_bytes(owner);
                for byte in place {
                    assert_eq!(written[byte as usize], Some(owner), "world {world}");
                }
            }
            assert_eq!(plan.sends.len() + 1, world as usize);
        }
    }

    #[test]
    fn an_all_gather_in_place_copies_nothing_locally_and_nccl_takes_even_rows() {
        let gather = message(Collective::AllGather, 7, 2, 3, 0);
        assert_eq!(gather_plan(&gather, RowLayout::InPlace).local, None);
        assert_eq!(gather_plan(&gather, RowLayout::Apart).local, Some(0));
        assert!(!nccl_takes_directly(&gather));
        assert!(nccl_takes_directly(&message(
            Collective::AllGather,
            9,
            2,
            3,
            0
        )));
        assert!(nccl_takes_directly(&message(
            Collective::AllGather,
            0,
            2,
            3,
            0
        )));
    }

    #[test]
    fn the_sum_kernel_s_last_slice_is_exactly_the_run() {
        for dtype in Dtype::ALL {
            for world in 2..=8 {
                for run in 0..200 {
                    let elements = sum_message_elements(run, dtype, world);
                    let last = slice_of(world - 1, elements, dtype, world);
                    assert_eq!(last.elements(dtype), run, "{dtype} {world} {run}");
                    assert!(last.bytes(dtype) <= sum_slot_bytes(run, dtype, world));
                }
            }
        }
    }

    /// Every rank's passes of one message, against the shape rule: in every pass, what rank s
    /// sends rank r is what r receives from s, each rank's parts tile its run in order, and
    /// each pass's slots fit the scratch.
    #[test]
    fn the_exact_reduce_scatter_sends_every_owner_its_rows_in_passes_that_fit() {
        for dtype in Dtype::ALL {
            for world in 2..=8 {
                for rows in 0..=2 * u64::from(world) + 1 {
                    for (width, slot_capacity) in [(5, 48), (1, 16), (64, 4096), (7, 1 << 20)] {
                        check_passes(dtype, world, rows, width, slot_capacity);
                    }
                }
            }
        }
    }

    fn check_passes(dtype: Dtype, world: u32, rows: u64, width: u64, slot_capacity: u64) {
        let messages: Vec<RowMessage> = (0..world)
            .map(|rank| {
                let shape = Shape::new(rows, width).unwrap();
                RowMessage::new(Collective::ReduceScatter, shape, world, rank, dtype).unwrap()
            })
            .collect();
        check_passes_of(&messages, dtype, slot_capacity);
    }

    fn check_passes_of(messages: &[RowMessage], dtype: Dtype, slot_capacity: u64) {
        let world = messages.len() as u32;
        let size = dtype.size_bytes();
        let passes: Vec<Vec<ScatterPass>> = messages
            .iter()
            .map(|message| scatter_passes(message, dtype, slot_capacity))
            .collect();
        let count = passes[0].len();
        assert!(passes.iter().all(|each| each.len() == count), "same passes");
        for rank in 0..world as usize {
            let owned = messages[0].owned_bytes(rank as u32);
            let mut next = owned.start;
            for (index, pass) in passes[rank].iter().enumerate() {
                assert_eq!(pass.own.start, next.min(owned.end));
                assert_eq!(pass.output_offset, pass.own.start - owned.start);
                next = pass.own.end.max(next);
                let own = pass.own.end - pass.own.start;
                assert_eq!(pass.sum.0 * size, own);
                assert!(pass.slot * u64::from(world) <= slot_capacity * u64::from(world));
                assert!(
                    pass.slot <= slot_capacity,
                    "{} > {slot_capacity}",
                    pass.slot
                );
                for receive in &pass.receives {
                    assert_eq!(receive.offset, u64::from(receive.peer) * pass.slot);
                    assert_eq!(receive.bytes, own);
                    let send = passes[receive.peer as usize][index]
                        .sends
                        .iter()
                        .find(|send| send.peer as usize == rank)
                        .expect("the peer sends");
                    assert_eq!(send.bytes, receive.bytes);
                    // The peer sends this rank's part of its own input: the same element range.
                    assert_eq!(send.offset, pass.own.start);
                }
            }
            assert_eq!(next, owned.end, "the parts tile the run");
        }
    }
}
