//! The handle's reduce-scatter and all-gather: rows x width messages by the shape rule
//! ([`crate::shape`]), routed by the full message's bytes like the all-reduce.
//!
//! A rank's call is checked against its own operands: the shape gives each operand's length
//! on this rank, so an operand that does not fit it (through the `_on` forms, which know their
//! lengths) is refused by name. Ranks that pass different rows or widths cannot be told apart
//! on the host without an exchange per call, which costs more than the collective; such calls
//! are the caller's mistake, as ranks enqueueing different all-reduces are, caught on the host
//! only by the call check ([`super::agreement`], off by default).
//!
//! The v-forms take the per-rank rows from the caller ([`RankRows`]): a list equal to the
//! shape rule's is the ordinary call; any other goes to NCCL's grouped transfers, whose sizes
//! come from the list. Ranks passing different lists are the same mistake, caught only by the
//! call check: an exchange of the list per call costs a host round trip, and one at the first
//! call alone would miss the lists of every later step. Where the lists differ only in whether
//! they follow the rule, some ranks wait in a custom kernel (which gives up at the deadline,
//! leaving the abort word) while others wait in NCCL.

use super::call::{Call, Rows};
use super::{Handle, ServeError, Served};
use crate::collective::{EntryId, Operands, RowMessage};
use crate::gpu::driver::{CallerMemory, DeviceMemory, Stream};
use crate::ladder::{Collective, Dtype};
use crate::runtime::{OperandError, RuntimeError};
use crate::shape::{RankRows, Shape};

/// Zero bytes at `address` of GPU `ordinal`: the empty operand of a rank that owns no rows,
/// which nothing reads or writes (its address may be null).
fn empty_at(address: u64, ordinal: usize) -> CallerMemory {
    struct Empty(u64, usize);
    impl DeviceMemory for Empty {
        fn address(&self) -> u64 {
            self.0
        }
        fn len_bytes(&self) -> usize {
            0
        }
        fn ordinal(&self) -> usize {
            self.1
        }
    }
    CallerMemory::whole(&Empty(address, ordinal))
}

impl Handle {
    /// Enqueues the reduce-scatter of a message of `rows` x `width` elements of `dtype`: every
    /// rank's `input` holds the whole message, and this rank's `output` gets its own rows
    /// (`prepare::shape::owned_rows`) of the reference sum. In place when `output` is this
    /// rank's rows of `input`; any other overlap is refused. `rows` 0 enqueues nothing; a
    /// width of 0 is refused. Routed by the whole message's bytes, as [`Handle::all_reduce`].
    ///
    /// # Safety
    ///
    /// As [`Handle::all_reduce`]: `stream` must be a live stream of this rank's GPU (or 0),
    /// and both operands must stay allocated until the enqueued work has run. They are checked
    /// to be device memory of this GPU holding this rank's part.
    #[allow(unsafe_code)]
    pub unsafe fn reduce_scatter(
        &self,
        input: u64,
        output: u64,
        rows: u64,
        width: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        // SAFETY: the caller's promises are this call's.
        unsafe {
            self.rows_raw(
                Collective::ReduceScatter,
                input,
                output,
                Rows::Rule(rows),
                width,
                dtype,
                stream,
            )
        }
    }

    /// Enqueues the all-gather of a message of `rows` x `width` elements of `dtype`: this
    /// rank's `input` holds its own rows, and every rank's `output` gets the whole message,
    /// each rank's rows at their place, bytes as given. In place when `input` is this rank's
    /// rows of `output`; any other overlap is refused. `rows` 0 enqueues nothing; a width of
    /// 0 is refused.
    ///
    /// # Safety
    ///
    /// As [`Handle::reduce_scatter`].
    #[allow(unsafe_code)]
    pub unsafe fn all_gather(
        &self,
        input: u64,
        output: u64,
        rows: u64,
        width: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        // SAFETY: the caller's promises are this call's.
        unsafe {
            self.rows_raw(
                Collective::AllGather,
                input,
                output,
                Rows::Rule(rows),
                width,
                dtype,
                stream,
            )
        }
    }

    /// Like [`Handle::reduce_scatter`], on memory and a stream this crate already checked;
    /// each operand must be exactly this rank's part's length.
    pub fn reduce_scatter_on(
        &self,
        stream: &Stream,
        operands: Operands,
        rows: u64,
        width: u64,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        self.rows_on(
            Collective::ReduceScatter,
            stream,
            operands,
            Rows::Rule(rows),
            width,
            dtype,
        )
    }

    /// Like [`Handle::all_gather`], on memory and a stream this crate already checked; each
    /// operand must be exactly this rank's part's length.
    pub fn all_gather_on(
        &self,
        stream: &Stream,
        operands: Operands,
        rows: u64,
        width: u64,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        self.rows_on(
            Collective::AllGather,
            stream,
            operands,
            Rows::Rule(rows),
            width,
            dtype,
        )
    }

    /// The reduce-scatter's v-form: as [`Handle::reduce_scatter`], rank r owning
    /// `rows_per_rank[r]` rows (contiguous runs in rank order; the message's rows are their
    /// sum) instead of the shape rule's, as vLLM's `reduce_scatterv` takes them. Every rank
    /// must pass the same list. A list equal to the rule's goes exactly as
    /// [`Handle::reduce_scatter`] of its rows (the same candidates, the same bits); any other
    /// goes through the exact NCCL reduce-scatter (grouped sends of each rank's rows to its
    /// owner, then the rank-order sum), exact at every world size. Refused with nothing
    /// enqueued: a list not of one count per rank, counts whose sum overflows, a width of 0,
    /// an operand not of this rank's part.
    ///
    /// # Safety
    ///
    /// As [`Handle::reduce_scatter`].
    #[allow(unsafe_code)]
    pub unsafe fn reduce_scatter_v(
        &self,
        input: u64,
        output: u64,
        rows_per_rank: &[u64],
        width: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        // SAFETY: the caller's promises are this call's.
        unsafe {
            self.rows_raw(
                Collective::ReduceScatter,
                input,
                output,
                Rows::PerRank(rows_per_rank),
                width,
                dtype,
                stream,
            )
        }
    }

    /// The all-gather's v-form: as [`Handle::all_gather`], rank r owning `rows_per_rank[r]`
    /// rows, as vLLM's `all_gatherv` takes them. A list equal to the rule's goes exactly as
    /// [`Handle::all_gather`]; any other through NCCL's grouped sends and receives (bytes as
    /// given). Refused as [`Handle::reduce_scatter_v`] refuses.
    ///
    /// # Safety
    ///
    /// As [`Handle::reduce_scatter`].
    #[allow(unsafe_code)]
    pub unsafe fn all_gather_v(
        &self,
        input: u64,
        output: u64,
        rows_per_rank: &[u64],
        width: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        // SAFETY: the caller's promises are this call's.
        unsafe {
            self.rows_raw(
                Collective::AllGather,
                input,
                output,
                Rows::PerRank(rows_per_rank),
                width,
                dtype,
                stream,
            )
        }
    }

    /// Like [`Handle::reduce_scatter_v`], on memory and a stream this crate already checked;
    /// each operand must be exactly this rank's part's length.
    pub fn reduce_scatter_v_on(
        &self,
        stream: &Stream,
        operands: Operands,
        rows_per_rank: &[u64],
        width: u64,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        self.rows_on(
            Collective::ReduceScatter,
            stream,
            operands,
            Rows::PerRank(rows_per_rank),
            width,
            dtype,
        )
    }

    /// Like [`Handle::all_gather_v`], on memory and a stream this crate already checked; each
    /// operand must be exactly this rank's part's length.
    pub fn all_gather_v_on(
        &self,
        stream: &Stream,
        operands: Operands,
        rows_per_rank: &[u64],
        width: u64,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        self.rows_on(
            Collective::AllGather,
            stream,
            operands,
            Rows::PerRank(rows_per_rank),
            width,
            dtype,
        )
    }

    /// The served package and this rank's part of a `collective` of `rows` rows of `width`.
    fn row_message(
        &self,
        collective: Collective,
        rows: Rows<'_>,
        width: u64,
        dtype: Dtype,
    ) -> Result<(&Served, RowMessage), ServeError> {
        let (rank, world) = (self.rank(), self.world());
        let served = self.served(collective, dtype)?;
        let message = match rows {
            Rows::Rule(rows) => Shape::new(rows, width)
                .and_then(|shape| RowMessage::new(collective, shape, world, rank, dtype)),
            Rows::PerRank(counts) => RankRows::given(counts, world)
                .and_then(|layout| RowMessage::given(collective, width, &layout, rank, dtype)),
        }
        .map_err(|source| RuntimeError::Operands {
            rank,
            source: OperandError::Shape(source),
        })?;
        Ok((served, message))
    }

    #[allow(unsafe_code, clippy::too_many_arguments)]
    unsafe fn rows_raw(
        &self,
        collective: Collective,
        input: u64,
        output: u64,
        rows: Rows<'_>,
        width: u64,
        dtype: Dtype,
        stream: u64,
    ) -> Result<(), ServeError> {
        let rank = self.rank();
        let (served, message) = self.row_message(collective, rows, width, dtype)?;
        let call = Call::Rows {
            collective,
            dtype,
            rows,
            width,
        };
        if message.shape().rows() == 0 {
            // SAFETY: the caller promises the stream is live (or 0).
            return unsafe { self.agree_empty_call(stream, &call) };
        }
        let too_large = || ServeError::MessageTooLarge {
            rank,
            elements: usize::try_from(message.shape().elements()).unwrap_or(usize::MAX),
        };
        let device = self.runtime.device();
        let bad = |what: &'static str| move |source| ServeError::BadArgument { rank, what, source };
        // SAFETY: the caller promises the stream is live (or 0) for as long as it is used here.
        let stream = unsafe { device.borrow_stream(stream) }.map_err(bad("the stream"))?;
        let operand = |address: u64, bytes: u64, what: &'static str| {
            let bytes = usize::try_from(bytes).map_err(|_| too_large())?;
            if bytes == 0 {
                return Ok(empty_at(address, device.ordinal()));
            }
            // SAFETY: the caller promises it stays allocated until the queued work has run.
            unsafe { device.caller_memory(address, bytes) }.map_err(bad(what))
        };
        let operands = Operands {
            input: operand(input, message.input_bytes(), "the input")?,
            output: operand(output, message.output_bytes(), "the output")?,
        };
        self.agree_call(&stream, &call)?;
        self.enqueue_rows(served, &stream, &message, operands)
    }

    fn rows_on(
        &self,
        collective: Collective,
        stream: &Stream,
        operands: Operands,
        rows: Rows<'_>,
        width: u64,
        dtype: Dtype,
    ) -> Result<(), ServeError> {
        let (served, message) = self.row_message(collective, rows, width, dtype)?;
        message
            .check_lengths(
                operands.input.len_bytes() as u64,
                operands.output.len_bytes() as u64,
            )
            .map_err(|source| RuntimeError::Operands {
                rank: self.rank(),
                source,
            })?;
        let call = Call::Rows {
            collective,
            dtype,
            rows,
            width,
        };
        self.agree_call(stream, &call)?;
        if message.shape().rows() == 0 {
            return Ok(());
        }
        self.enqueue_rows(served, stream, &message, operands)
    }

    /// Routes `message` by its full bytes ([`row_route`]).
    fn enqueue_rows(
        &self,
        served: &Served,
        stream: &Stream,
        message: &RowMessage,
        operands: Operands,
    ) -> Result<(), ServeError> {
        let route = row_route(
            message.collective(),
            message.follows_rule(),
            served.route(message.message_bytes()),
            served.pieces.filter(|_| served.staging.is_some()),
            &served.rank_ordered,
        );
        self.watched(stream, || {
            match (route, &served.staging) {
                (RowRoute::Bucket(id), _) => {
                    served.collectives.enqueue_rows(
                        &self.runtime,
                        stream,
                        id,
                        message,
                        operands,
                    )?;
                }
                (RowRoute::Pieces(whole), Some(staging)) => {
                    served.collectives.enqueue_rows_in_pieces(
                        &self.runtime,
                        stream,
                        message,
                        operands,
                        CallerMemory::whole(staging),
                        |bytes| piece_entry(bytes, &served.routes, whole),
                    )?;
                }
                _ => served.collectives.enqueue_nccl_rows_whole(
                    &self.runtime,
                    stream,
                    message,
                    operands,
                    served.selection.choice.policy.exact_only,
                )?,
            }
            Ok(())
        })
    }
}

/// Where a reduce-scatter or all-gather goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowRoute {
    /// Its bucket's winner.
    Bucket(EntryId),
    /// Above the ladder, in pieces, each taking the same rows of every rank's run, those in
    /// the largest bucket through this entry ([`piece_entry`]).
    Pieces(EntryId),
    /// NCCL on the whole message (the exact one where the policy asks).
    Nccl,
}

/// The route of a `collective` whose bucket's winner is `bucket` (`None`: above the ladder),
/// where start-up chose `pieces` above the ladder (`None`: NCCL) and `rank_ordered` are the
/// plain NCCL entries that must sum in rank order here. A reduce-scatter goes whole to NCCL
/// instead of such an entry, and above the ladder whenever there is one (a piece could go to
/// it); an all-gather sums nothing, so those entries do not move it. Rows not owned by the
/// shape rule (`follows_rule` false: a v-form's other lists) go whole to NCCL's grouped
/// transfers, the only path that takes them (the reduce-scatter's the exact one).
fn row_route(
    collective: Collective,
    follows_rule: bool,
    bucket: Option<EntryId>,
    pieces: Option<EntryId>,
    rank_ordered: &[EntryId],
) -> RowRoute {
    if !follows_rule {
        return RowRoute::Nccl;
    }
    let sums = collective == Collective::ReduceScatter;
    match (bucket, pieces) {
        (Some(id), _) if !(sums && rank_ordered.contains(&id)) => RowRoute::Bucket(id),
        (None, Some(whole)) if !sums || rank_ordered.is_empty() => RowRoute::Pieces(whole),
        _ => RowRoute::Nccl,
    }
}

/// The entry of a piece of `bytes` (full message) among `routes` (each bucket's largest
/// message and winner, ascending): `whole`, the candidate start-up timed in pieces, for a
/// piece in the largest bucket; a shorter last piece's bucket's winner otherwise.
fn piece_entry(bytes: u64, routes: &[(u64, EntryId)], whole: EntryId) -> EntryId {
    let largest_from = routes.iter().rev().nth(1).map_or(0, |route| route.0);
    if bytes > largest_from {
        return whole;
    }
    routes
        .iter()
        .find(|(max_bytes, _)| bytes <= *max_bytes)
        .map(|(_, id)| *id)
        .expect("a piece is at most the largest bucket's message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn above_the_ladder_a_row_collective_goes_in_pieces_when_start_up_chose_them() {
        for collective in [Collective::ReduceScatter, Collective::AllGather] {
            assert_eq!(
                row_route(collective, true, Some(3), Some(7), &[]),
                RowRoute::Bucket(3)
            );
            assert_eq!(
                row_route(collective, true, None, Some(7), &[]),
                RowRoute::Pieces(7)
            );
            assert_eq!(row_route(collective, true, None, None, &[]), RowRoute::Nccl);
        }
    }

    #[test]
    fn a_reduce_scatter_that_could_meet_a_plain_nccl_winner_summing_in_rank_order_goes_whole() {
        let scatter = Collective::ReduceScatter;
        assert_eq!(
            row_route(scatter, true, Some(3), None, &[3]),
            RowRoute::Nccl
        );
        assert_eq!(
            row_route(scatter, true, Some(3), None, &[4]),
            RowRoute::Bucket(3)
        );
        assert_eq!(
            row_route(scatter, true, None, Some(7), &[4]),
            RowRoute::Nccl
        );
        // An all-gather sums nothing.
        let gather = Collective::AllGather;
        assert_eq!(
            row_route(gather, true, Some(3), None, &[3]),
            RowRoute::Bucket(3)
        );
        assert_eq!(
            row_route(gather, true, None, Some(7), &[4]),
            RowRoute::Pieces(7)
        );
    }

    #[test]
    fn rows_not_owned_by_the_rule_go_whole_to_nccl_s_grouped_transfers_in_every_bucket() {
        for collective in [Collective::ReduceScatter, Collective::AllGather] {
            assert_eq!(
                row_route(collective, false, Some(3), Some(7), &[]),
                RowRoute::Nccl
            );
            assert_eq!(
                row_route(collective, false, None, Some(7), &[]),
                RowRoute::Nccl
            );
            assert_eq!(
                row_route(collective, false, Some(3), None, &[3]),
                RowRoute::Nccl
            );
        }
    }

    #[test]
    fn a_piece_in_the_largest_bucket_takes_the_pieces_winner_and_a_shorter_one_its_bucket_s() {
        let routes = [(1024, 0), (4096, 1), (65536, 2)];
        assert_eq!(piece_entry(65536, &routes, 9), 9);
        assert_eq!(piece_entry(4097, &routes, 9), 9);
        assert_eq!(piece_entry(4096, &routes, 9), 1);
        assert_eq!(piece_entry(16, &routes, 9), 0);
        assert_eq!(piece_entry(16, &[(65536, 2)], 9), 9);
    }
}
