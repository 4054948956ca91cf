//! How a message above the largest bucket is cut into pieces that each fit it, per collective:
//! a pure plan, so what the serving handle enqueues is what the tests check.
//!
//! The all-reduce's message is contiguous bytes, cut into consecutive runs of the piece's
//! elements, the last one shorter. A reduce-scatter's or all-gather's rank owns a run of whole
//! rows ([`super::owned_rows`]); a piece takes the same sub-range of every rank's run (clipped
//! to the run's length, since the first ranks own one row more), so each rank's rows of a piece
//! stay one contiguous run and the piece is itself a message of the shape rule. The fused
//! all-reduce + residual add + RMSNorm is cut into consecutive runs of whole rows, every rank
//! the same, since its norm is per row.

use std::ops::Range;

use super::{owned_rows, Shape, ShapeError};
use crate::ladder::Collective;

/// The pieces of one message, in the order they are enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PiecePlan {
    /// The all-reduce: consecutive runs of elements of the message.
    Elements(ElementPieces),
    /// The reduce-scatter and the all-gather: the same rows of every rank's run.
    Rows(RowPieces),
    /// The all-reduce + residual add + RMSNorm: consecutive runs of whole rows
    /// ([`epilogue_pieces`]).
    WholeRows(Vec<Range<u64>>),
}

/// The pieces of a `collective` of `shape` on `world` ranks, each at most `piece` elements
/// of the full message (the largest bucket's largest message); `piece` 0 (no bucket) is one
/// piece of everything. The all-reduce's cut does not depend on the world or the width.
pub fn piece_plan(
    collective: Collective,
    shape: Shape,
    world: u32,
    piece: u64,
) -> Result<PiecePlan, ShapeError> {
    match collective {
        Collective::AllReduce => Ok(PiecePlan::Elements(ElementPieces::new(
            shape.elements(),
            piece,
        ))),
        Collective::ReduceScatter | Collective::AllGather => {
            RowPieces::new(collective, shape, world, piece).map(PiecePlan::Rows)
        }
        Collective::AllReduceAddRmsNorm => epilogue_pieces(shape, piece)
            .map(PiecePlan::WholeRows)
            .ok_or(ShapeError::RowLargerThanPiece {
                width: shape.width(),
                piece,
            }),
    }
}

/// The pieces of an `all_reduce_add_rms_norm` of `shape` (rows x hidden, the same on every
/// rank) above the largest bucket, in pieces of at most `piece` elements: consecutive runs of
/// `piece / hidden` whole rows, the last one shorter, each a message of its own whose every
/// operand but the weight starts that many rows in. The norm is per row, so the pieces give the
/// whole message's bits. `None` when one row is more than a piece (or `piece` is 0): NCCL then
/// takes the message whole.
pub fn epilogue_pieces(shape: Shape, piece: u64) -> Option<Vec<Range<u64>>> {
    let per_piece = piece / shape.width();
    if per_piece == 0 {
        return None;
    }
    Some(
        (0..shape.rows())
            .step_by(usize::try_from(per_piece).unwrap_or(usize::MAX))
            .map(|start| start..(start + per_piece).min(shape.rows()))
            .collect(),
    )
}

/// Consecutive element ranges of a message of `elements`, each `piece` long but the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementPieces {
    next: u64,
    elements: u64,
    piece: u64,
}

impl ElementPieces {
    /// The pieces of `elements` in pieces of at most `piece`; one piece of everything when
    /// `piece` is 0, none when `elements` is.
    pub fn new(elements: u64, piece: u64) -> ElementPieces {
        let piece = if piece == 0 { elements.max(1) } else { piece };
        ElementPieces {
            next: 0,
            elements,
            piece,
        }
    }
}

impl Iterator for ElementPieces {
    type Item = Range<u64>;

    fn next(&mut self) -> Option<Range<u64>> {
        if self.next >= self.elements {
            return None;
        }
        let start = self.next;
        self.next += self.piece.min(self.elements - start);
        Some(start..self.next)
    }
}

/// The pieces of a reduce-scatter or all-gather: each takes the same rows of every rank's run,
/// `rows_per_run` of them (the last piece fewer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPieces {
    shape: Shape,
    world: u32,
    rows_per_run: u64,
    /// The first rank's run, the longest.
    longest: u64,
    next: u64,
}

impl RowPieces {
    fn new(
        collective: Collective,
        shape: Shape,
        world: u32,
        piece: u64,
    ) -> Result<RowPieces, ShapeError> {
        let longest = owned_rows(shape.rows(), world, 0)?.end;
        let rows_per_run = if piece == 0 || shape.elements() <= piece {
            longest.max(1)
        } else {
            let per_run = piece / shape.width() / u64::from(world);
            if per_run == 0 {
                return Err(ShapeError::RowsLargerThanPiece {
                    collective,
                    width: shape.width(),
                    world,
                    piece,
                });
            }
            per_run
        };
        Ok(RowPieces {
            shape,
            world,
            rows_per_run,
            longest,
            next: 0,
        })
    }

    /// Rows of every rank's run each piece but the last takes.
    pub fn rows_per_run(&self) -> u64 {
        self.rows_per_run
    }
}

impl Iterator for RowPieces {
    type Item = RowPiece;

    fn next(&mut self) -> Option<RowPiece> {
        if self.next >= self.longest {
            return None;
        }
        let start = self.next;
        self.next += self.rows_per_run.min(self.longest - start);
        Some(RowPiece {
            run: start..self.next,
            shape: self.shape,
            world: self.world,
        })
    }
}

/// One piece of a reduce-scatter or all-gather.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPiece {
    run: Range<u64>,
    shape: Shape,
    world: u32,
}

impl RowPiece {
    /// The rows the piece takes, counted from the start of a rank's run: the same for every
    /// rank, before clipping to a shorter run ([`RowPiece::rank_run`]).
    pub fn run(&self) -> Range<u64> {
        self.run.clone()
    }

    /// The rows of rank `rank`'s run the piece takes, counted from the run's start; empty
    /// where the run is shorter than the piece's start (a rank that owns none of its rows
    /// still enqueues its part).
    pub fn rank_run(&self, rank: u32) -> Result<Range<u64>, ShapeError> {
        let owned = owned_rows(self.shape.rows(), self.world, rank)?;
        let len = owned.end - owned.start;
        Ok(self.run.start.min(len)..self.run.end.min(len))
    }

    /// The rows of the full message the piece covers on rank `rank`: [`RowPiece::rank_run`]
    /// inside that rank's owned run.
    pub fn rank_rows(&self, rank: u32) -> Result<Range<u64>, ShapeError> {
        let start = owned_rows(self.shape.rows(), self.world, rank)?.start;
        let run = self.rank_run(rank)?;
        Ok(start + run.start..start + run.end)
    }

    /// The piece as a message of its own: every rank's rows of it, of the full message's
    /// width. Its shape rule gives each rank exactly its [`RowPiece::rank_run`].
    pub fn shape(&self) -> Shape {
        let rows = (0..self.world)
            .map(|rank| {
                let run = self.rank_run(rank).expect("a rank of the world");
                run.end - run.start
            })
            .sum();
        Shape::new(rows, self.shape.width()).expect("a piece is no larger than its message")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element_pieces(elements: u64, piece: u64) -> Vec<Range<u64>> {
        match piece_plan(Collective::AllReduce, Shape::flat(elements), 8, piece) {
            Ok(PiecePlan::Elements(pieces)) => pieces.collect(),
            other => panic!("an all-reduce is cut in elements: {other:?}"),
        }
    }

    fn row_pieces(
        collective: Collective,
        rows: u64,
        width: u64,
        world: u32,
        piece: u64,
    ) -> Vec<RowPiece> {
        let shape = Shape::new(rows, width).expect("a valid shape");
        match piece_plan(collective, shape, world, piece) {
            Ok(PiecePlan::Rows(pieces)) => pieces.collect(),
            other => panic!("a {collective} is cut in rows: {other:?}"),
        }
    }

    /// Per piece, each rank's rows of the full message.
    fn rows_by_piece(pieces: &[RowPiece], world: u32) -> Vec<Vec<Range<u64>>> {
        pieces
            .iter()
            .map(|piece| {
                (0..world)
                    .map(|rank| piece.rank_rows(rank).expect("a rank"))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_all_reduce_is_cut_into_consecutive_elements_the_last_shorter() {
        assert_eq!(
            element_pieces(2 * 1024 + 3, 1024),
            [0..1024, 1024..2048, 2048..2051]
        );
        assert_eq!(element_pieces(2048, 1024), [0..1024, 1024..2048]);
        assert_eq!(element_pieces(5, 0), vec![0..5_u64]);
        assert_eq!(element_pieces(0, 1024), Vec::<Range<u64>>::new());
        assert_eq!(element_pieces(0, 0), Vec::<Range<u64>>::new());
        // The width and the world do not move the all-reduce's cut.
        let wide = piece_plan(
            Collective::AllReduce,
            Shape::new(3, 1000).expect("a valid shape"),
            3,
            1024,
        );
        assert_eq!(
            wide,
            Ok(PiecePlan::Elements(ElementPieces::new(3000, 1024)))
        );
    }

    #[test]
    fn a_piece_takes_the_same_rows_of_every_rank_s_run() {
        // 10 rows of width 4 on 4 ranks: runs of 3, 3, 2, 2 rows; in pieces of 39 elements, 2
        // rows of every run per piece (8 rows, 32 elements).
        for collective in [Collective::ReduceScatter, Collective::AllGather] {
            let pieces = row_pieces(collective, 10, 4, 4, 39);
            assert_eq!(
                pieces.iter().map(RowPiece::run).collect::<Vec<_>>(),
                [0..2, 2..3]
            );
            assert_eq!(
                rows_by_piece(&pieces, 4),
                [
                    vec![0..2, 3..5, 6..8, 8..10],
                    // The last piece: the two longer runs' third row; the others own none.
                    vec![2..3, 5..6, 8..8, 10..10],
                ]
            );
            assert_eq!(pieces[1].rank_run(3), Ok(2..2));
            assert_eq!(pieces[0].shape(), Shape::new(8, 4).expect("a shape"));
            assert_eq!(pieces[1].shape(), Shape::new(2, 4).expect("a shape"));
        }
    }

    #[test]
    fn fewer_rows_than_ranks_leave_the_last_ranks_none() {
        // 3 rows of width 5 on 8 ranks: ranks 3 to 7 own no rows, in one piece of 15 elements.
        let pieces = row_pieces(Collective::ReduceScatter, 3, 5, 8, 16);
        assert_eq!(pieces.len(), 1);
        let mut expected = vec![0..1, 1..2, 2..3];
        expected.extend(std::iter::repeat_n(3..3, 5));
        assert_eq!(rows_by_piece(&pieces, 8), [expected]);
        // Without a bucket, one piece of everything too.
        assert_eq!(row_pieces(Collective::AllGather, 3, 5, 8, 0).len(), 1);
        assert!(row_pieces(Collective::AllGather, 0, 5, 8, 16).is_empty());
    }

    #[test]
    fn a_row_larger_than_a_piece_is_refused() {
        let shape = Shape::new(64, 1000).expect("a valid shape");
        let refused = piece_plan(Collective::ReduceScatter, shape, 4, 3999).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "reduce_scatter of width 1000 on 4 ranks cannot go in pieces of 3999 elements: \
             one row on every rank is 4 x 1000 elements"
        );
        assert!(piece_plan(Collective::AllGather, shape, 4, 4000).is_ok());
        assert_eq!(
            piece_plan(Collective::AllReduceAddRmsNorm, shape, 4, 999),
            Err(ShapeError::RowLargerThanPiece {
                width: 1000,
                piece: 999
            })
        );
        assert_eq!(
            piece_plan(Collective::AllReduceAddRmsNorm, shape, 4, 4000),
            Ok(PiecePlan::WholeRows(vec![
                0..4,
                4..8,
                8..12,
                12..16,
                16..20,
                20..24,
                24..28,
                28..32,
                32..36,
                36..40,
                40..44,
                44..48,
                48..52,
                52..56,
                56..60,
                60..64
            ]))
        );
        assert_eq!(
            piece_plan(Collective::AllGather, shape, 0, 4000),
            Err(ShapeError::RankOutsideWorld { rank: 0, world: 0 })
        );
    }

    proptest::proptest! {
        /// The all-reduce's pieces cover every element once, in order, each a piece long but
        /// the last.
        #[test]
        fn all_reduce_pieces_cover_the_message_in_order(
            elements in 0u64..10_000,
            piece in 0u64..3_000,
        ) {
            let all = element_pieces(elements, piece);
            let mut next = 0;
            for (index, range) in all.iter().enumerate() {
                proptest::prop_assert_eq!(range.start, next);
                proptest::prop_assert!(range.end > range.start);
                if piece > 0 {
                    proptest::prop_assert!(range.end - range.start <= piece);
                    if index + 1 < all.len() {
                        proptest::prop_assert_eq!(range.end - range.start, piece);
                    }
                }
                next = range.end;
            }
            proptest::prop_assert_eq!(next, elements);
        }

        /// Every rank's pieces tile its owned run in order, one contiguous run each; every
        /// piece takes the same sub-range of every run (clipped), is at most a piece of the
        /// full message, and is a message of the shape rule whose runs are those rows.
        #[test]
        fn row_pieces_tile_every_rank_s_run_and_follow_the_shape_rule(
            rows in 0u64..2_000,
            width in 1u64..64,
            world in 1u32..=9,
            piece_rows in 0u64..40,
            extra in 0u64..64,
        ) {
            let shape = Shape::new(rows, width).expect("a valid shape");
            let piece = piece_rows * width * u64::from(world) + extra;
            let Ok(PiecePlan::Rows(plan)) =
                piece_plan(Collective::ReduceScatter, shape, world, piece)
            else {
                // Refused only when one row on every rank is more than a piece.
                proptest::prop_assert!(piece > 0 && piece < width * u64::from(world));
                proptest::prop_assert!(shape.elements() > piece);
                return Ok(());
            };
            let per_run = plan.rows_per_run();
            let pieces: Vec<RowPiece> = plan.collect();
            for rank in 0..world {
                let owned = shape.owned_rows(world, rank).expect("a rank");
                let mut next = owned.start;
                for each in &pieces {
                    let covered = each.rank_rows(rank).expect("a rank");
                    let run = each.rank_run(rank).expect("a rank");
                    proptest::prop_assert_eq!(covered.start, next);
                    proptest::prop_assert_eq!(covered.start - owned.start, run.start);
                    proptest::prop_assert_eq!(run.start, each.run().start.min(owned.end - owned.start));
                    next = covered.end;
                }
                proptest::prop_assert_eq!(next, owned.end);
            }
            for (index, each) in pieces.iter().enumerate() {
                let run = each.run();
                proptest::prop_assert!(run.end > run.start);
                if index + 1 < pieces.len() {
                    proptest::prop_assert_eq!(run.end - run.start, per_run);
                }
                let own = each.shape();
                proptest::prop_assert!(piece == 0 || own.elements() <= piece);
                for rank in 0..world {
                    let by_rule = own.owned_rows(world, rank).expect("a rank");
                    let taken = each.rank_run(rank).expect("a rank");
                    proptest::prop_assert_eq!(by_rule.end - by_rule.start, taken.end - taken.start);
                }
            }
            // The all-gather is cut the same way.
            let gather = piece_plan(Collective::AllGather, shape, world, piece);
            let Ok(PiecePlan::Rows(gather)) = gather else {
                return Err(proptest::test_runner::TestCaseError::fail("an all-gather plan"));
            };
            proptest::prop_assert_eq!(gather.collect::<Vec<_>>(), pieces);
        }
    }
}
