//! The shape rule of the reduce-scatter and the all-gather, written once: a message is rows x
//! width elements (width at least 1, any rows at least 0, fewer than the world allowed); rank r
//! owns a contiguous run of whole rows in rank order, the first `rows % world` ranks one row
//! more, so a rank may own none. Where the world divides the rows this is the layout of
//! PyTorch's `reduce_scatter_tensor` and `all_gather_into_tensor`, and of NCCL's. Also how a
//! message above the ladder is cut into pieces, per collective ([`pieces`]), and the
//! per-rank row counts a caller may give instead of the rule ([`RankRows`]).
//!
//! A leaf beside the ladder: pure functions over integers, named by the reference, the pieces
//! and the bench.

pub mod pieces;
mod rank_rows;

use std::ops::Range;

pub use pieces::{epilogue_pieces, piece_plan, ElementPieces, PiecePlan, RowPiece, RowPieces};
pub use rank_rows::RankRows;

use crate::ladder::Collective;

/// Why a shape, a rank or a cut is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A width of 0: a row must hold at least one element.
    #[error("a message of {rows} rows of width 0: the width must be at least 1")]
    ZeroWidth {
        /// The rows asked for.
        rows: u64,
    },
    /// More elements than a 64-bit count holds.
    #[error("a message of {rows} rows of width {width} holds more than 2^64 - 1 elements")]
    TooManyElements {
        /// The rows asked for.
        rows: u64,
        /// The width asked for.
        width: u64,
    },
    /// More bytes than a 64-bit count holds, in elements of `element_bytes`.
    #[error(
        "a message of {rows} rows of width {width} in {element_bytes}-byte elements holds more \
         than 2^64 - 1 bytes"
    )]
    TooManyBytes {
        /// The rows asked for.
        rows: u64,
        /// The width asked for.
        width: u64,
        /// Bytes of one element.
        element_bytes: u64,
    },
    /// A rank outside the world (every rank of a world of 0 is).
    #[error("rank {rank} is not below the world size {world}")]
    RankOutsideWorld {
        /// The rank asked for.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// A reduce-scatter or all-gather above the ladder whose rows on every rank, one each, are
    /// already more than a piece: no cut keeps every rank's rows whole.
    #[error(
        "{collective} of width {width} on {world} ranks cannot go in pieces of {piece} \
         elements: one row on every rank is {world} x {width} elements"
    )]
    RowsLargerThanPiece {
        /// The collective.
        collective: Collective,
        /// The message's width.
        width: u64,
        /// The world size.
        world: u32,
        /// Elements of the largest piece.
        piece: u64,
    },
    /// An all-reduce + residual add + RMSNorm above the ladder whose one row is already more
    /// than a piece: it cannot go in pieces of whole rows.
    #[error(
        "all_reduce_add_rms_norm of hidden {width} cannot go in pieces of {piece} elements: one \
         row is more than a piece"
    )]
    RowLargerThanPiece {
        /// The message's width (hidden).
        width: u64,
        /// Elements of the largest piece.
        piece: u64,
    },
    /// Per-rank row counts that are not one count per rank.
    #[error(
        "rows_per_rank has {given} counts for a world of {world} ranks: give one count per rank"
    )]
    RowsPerRankLength {
        /// Counts given.
        given: usize,
        /// The world size.
        world: u32,
    },
    /// Per-rank row counts whose sum a u64 does not hold.
    #[error("rows_per_rank's counts on {world} ranks sum to more than 2^64 - 1 rows")]
    RowsPerRankOverflow {
        /// The world size.
        world: u32,
    },
    /// A collective asked for as a reduce-scatter or all-gather that is neither: the
    /// all-reduce and the fused all-reduce + residual add + RMSNorm have no owned rows.
    #[error("{collective} is not a rows x width collective (reduce_scatter or all_gather)")]
    NotRowCollective {
        /// The collective.
        collective: Collective,
    },
}

/// A message of `rows` x `width` elements, `width` at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    rows: u64,
    width: u64,
}

impl Shape {
    /// `rows` x `width`; refused when the width is 0 or the elements overflow a u64.
    pub fn new(rows: u64, width: u64) -> Result<Shape, ShapeError> {
        if width == 0 {
            return Err(ShapeError::ZeroWidth { rows });
        }
        if rows.checked_mul(width).is_none() {
            return Err(ShapeError::TooManyElements { rows, width });
        }
        Ok(Shape { rows, width })
    }

    /// `elements` rows of width 1: the all-reduce's message, which has no rows of its own.
    pub fn flat(elements: u64) -> Shape {
        Shape {
            rows: elements,
            width: 1,
        }
    }

    /// Rows of the full message.
    pub fn rows(self) -> u64 {
        self.rows
    }

    /// Elements per row.
    pub fn width(self) -> u64 {
        self.width
    }

    /// Elements of the full message.
    pub fn elements(self) -> u64 {
        self.rows * self.width
    }

    /// Bytes of the full message in elements of `element_bytes`; refused when a u64 does not
    /// count them.
    pub fn bytes(self, element_bytes: u64) -> Result<u64, ShapeError> {
        self.elements()
            .checked_mul(element_bytes)
            .ok_or(ShapeError::TooManyBytes {
                rows: self.rows,
                width: self.width,
                element_bytes,
            })
    }

    /// The rows rank `rank` of `world` owns ([`owned_rows`]).
    pub fn owned_rows(self, world: u32, rank: u32) -> Result<Range<u64>, ShapeError> {
        owned_rows(self.rows, world, rank)
    }

    /// The elements of the full message rank `rank` of `world` owns: its rows' elements, one
    /// contiguous run.
    pub fn owned_elements(self, world: u32, rank: u32) -> Result<Range<u64>, ShapeError> {
        let rows = self.owned_rows(world, rank)?;
        Ok(rows.start * self.width..rows.end * self.width)
    }
}

/// The rows of a message of `rows` that rank `rank` of `world` owns: a contiguous run in rank
/// order, `rows / world` long, one more for the first `rows % world` ranks; empty for the
/// ranks past the rows when there are fewer rows than ranks.
pub fn owned_rows(rows: u64, world: u32, rank: u32) -> Result<Range<u64>, ShapeError> {
    if rank >= world {
        return Err(ShapeError::RankOutsideWorld { rank, world });
    }
    let (world, rank) = (u64::from(world), u64::from(rank));
    let (each, longer) = (rows / world, rows % world);
    let start = rank * each + rank.min(longer);
    let len = each + u64::from(rank < longer);
    Ok(start..start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_owned(rows: u64, world: u32) -> Vec<Range<u64>> {
        (0..world)
            .map(|rank| owned_rows(rows, world, rank).expect("a rank of the world"))
            .collect()
    }

    proptest::proptest! {
        /// The runs tile [0, rows) in rank order, differ by at most one row, and the longer
        /// ones come first, `rows % world` of them.
        #[test]
        fn the_runs_tile_the_rows_in_rank_order(rows in 0u64..100_000, world in 1u32..=64) {
            let runs = all_owned(rows, world);
            let mut next = 0;
            for run in &runs {
                proptest::prop_assert_eq!(run.start, next);
                next = run.end;
            }
            proptest::prop_assert_eq!(next, rows);
            let lengths: Vec<u64> = runs.iter().map(|run| run.end - run.start).collect();
            let (shortest, longest) = (
                *lengths.iter().min().expect("a rank"),
                *lengths.iter().max().expect("a rank"),
            );
            proptest::prop_assert!(longest - shortest <= 1);
            let longer = lengths.iter().filter(|&&len| len > rows / u64::from(world)).count();
            proptest::prop_assert_eq!(longer as u64, rows % u64::from(world));
            proptest::prop_assert!(lengths.windows(2).all(|pair| pair[0] >= pair[1]));
        }

        /// Where the world divides the rows, rank r's run is the r-th of `world` equal chunks,
        /// as PyTorch's `reduce_scatter_tensor` gives rank r `input.chunk(world)[r]`.
        #[test]
        fn even_rows_are_pytorch_s_reduce_scatter_layout(
            each in 0u64..10_000,
            world in 1u32..=64,
            width in 1u64..5_000,
        ) {
            let shape = Shape::new(each * u64::from(world), width).expect("a valid shape");
            for rank in 0..world {
                let rank64 = u64::from(rank);
                proptest::prop_assert_eq!(
                    shape.owned_rows(world, rank).expect("a rank"),
                    rank64 * each..(rank64 + 1) * each
                );
                let chunk = each * width;
                proptest::prop_assert_eq!(
                    shape.owned_elements(world, rank).expect("a rank"),
                    rank64 * chunk..(rank64 + 1) * chunk
                );
            }
        }
    }

    #[test]
    fn uneven_rows_go_one_more_to_the_first_ranks() {
        assert_eq!(all_owned(10, 4), [0..3, 3..6, 6..8, 8..10]);
        assert_eq!(all_owned(2, 4), [0..1, 1..2, 2..2, 2..2]);
        assert_eq!(all_owned(0, 3), [0..0, 0..0, 0..0]);
        assert_eq!(all_owned(7, 1), vec![0..7_u64]);
        let shape = Shape::new(5, 7).expect("a valid shape");
        assert_eq!(shape.owned_elements(2, 0), Ok(0..21));
        assert_eq!(shape.owned_elements(2, 1), Ok(21..35));
        assert_eq!(shape.elements(), 35);
    }

    #[test]
    fn a_zero_width_an_overflow_or_a_rank_outside_the_world_is_refused() {
        assert_eq!(Shape::new(3, 0), Err(ShapeError::ZeroWidth { rows: 3 }));
        assert_eq!(
            Shape::new(3, 0).unwrap_err().to_string(),
            "a message of 3 rows of width 0: the width must be at least 1"
        );
        assert_eq!(
            Shape::new(1 << 33, 1 << 31),
            Err(ShapeError::TooManyElements {
                rows: 1 << 33,
                width: 1 << 31
            })
        );
        assert!(Shape::new(0, 1).is_ok() && Shape::new(1 << 32, 1 << 31).is_ok());
        assert_eq!(
            owned_rows(4, 2, 2).unwrap_err().to_string(),
            "rank 2 is not below the world size 2"
        );
        assert_eq!(
            owned_rows(4, 0, 0),
            Err(ShapeError::RankOutsideWorld { rank: 0, world: 0 })
        );
    }

    #[test]
    fn a_collective_without_rows_is_named_as_not_a_row_collective() {
        let refused = |collective| ShapeError::NotRowCollective { collective }.to_string();
        assert_eq!(
            refused(Collective::AllReduce),
            "all_reduce is not a rows x width collective (reduce_scatter or all_gather)"
        );
        assert_eq!(
            refused(Collective::AllReduceAddRmsNorm),
            "all_reduce_add_rms_norm is not a rows x width collective (reduce_scatter or \
             all_gather)"
        );
    }
}
