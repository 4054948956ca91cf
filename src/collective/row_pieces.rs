//! A reduce-scatter or all-gather above the largest bucket in pieces, on one rank: what each
//! piece copies and where its kernel reads and writes, as a pure plan over the shape rule's cut
//! ([`crate::shape::pieces`]), so what is enqueued is what the tests check.
//!
//! A piece takes the same rows of every rank's run, so each rank's rows of it stay one
//! contiguous run of the caller's memory: the reduce-scatter's output of a piece and the
//! all-gather's input are read or written where they are. The other side is the piece as a
//! message of its own, its ranks' runs back to back, which the caller's memory does not hold
//! in one run: a staging buffer of one piece holds it, the reduce-scatter's input gathered
//! into it before the piece's kernel (one copy per rank that owns rows of the piece), the
//! all-gather's output scattered from it after.

use super::rows::RowMessage;
use crate::ladder::{Collective, Dtype};
use crate::shape::{piece_plan, PiecePlan, ShapeError};

/// One copy of a piece: `bytes` from offset `from` to offset `to`. For a reduce-scatter, from
/// the caller's input into the staging buffer; for an all-gather, from the staging buffer into
/// the caller's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceCopy {
    /// Byte offset in the source.
    pub from: u64,
    /// Byte offset in the destination.
    pub to: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// One piece of a row collective on this rank, in the order pieces are enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPieceStep {
    /// The piece as a message of its own: this rank's part of it.
    pub message: RowMessage,
    /// Where this rank's rows of the piece lie in the caller's memory, bytes from its start:
    /// the reduce-scatter's output and the all-gather's input. The other operand is the
    /// staging buffer from byte 0.
    pub own_offset: u64,
    /// The reduce-scatter's copies into the staging buffer before the kernel, the all-gather's
    /// out of it after: every rank's rows of the piece, in rank order.
    pub copies: Vec<PieceCopy>,
}

/// The pieces of `message` (this rank's part of a reduce-scatter or all-gather) in pieces of at
/// most `piece_elements` elements of the full message (the largest bucket's message); refused
/// when one row on every rank is more than a piece.
pub fn row_piece_steps(
    message: &RowMessage,
    piece_elements: u64,
    dtype: Dtype,
) -> Result<Vec<RowPieceStep>, ShapeError> {
    let collective = message.collective();
    let (world, rank) = (message.world(), message.rank());
    let shape = message.shape();
    let PiecePlan::Rows(pieces) = piece_plan(collective, shape, world, piece_elements)? else {
        return Err(ShapeError::NotRowCollective { collective });
    };
    let row_bytes = shape.width() * message.element_bytes();
    let mut steps = Vec::new();
    for piece in pieces {
        let own = piece.shape();
        let mut copies = Vec::new();
        for peer in 0..world {
            let rows = piece.rank_rows(peer)?;
            let bytes = (rows.end - rows.start) * row_bytes;
            if bytes == 0 {
                continue;
            }
            let in_piece = own.owned_elements(world, peer)?.start * message.element_bytes();
            let in_message = rows.start * row_bytes;
            copies.push(match collective {
                Collective::ReduceScatter => PieceCopy {
                    from: in_message,
                    to: in_piece,
                    bytes,
                },
                _ => PieceCopy {
                    from: in_piece,
                    to: in_message,
                    bytes,
                },
            });
        }
        steps.push(RowPieceStep {
            message: RowMessage::new(collective, own, world, rank, dtype)?,
            own_offset: piece.rank_run(rank)?.start * row_bytes,
            copies,
        });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{random_rank_inputs, reference_outputs};
    use crate::shape::Shape;

    fn message(collective: Collective, shape: Shape, world: u32, rank: u32) -> RowMessage {
        RowMessage::new(collective, shape, world, rank, Dtype::Bf16).expect("a row collective")
    }

    /// Every rank's output of `collective` of `shape` done piece by piece through the plan, the
    /// pieces' own outputs given by the reference (what an exact kernel writes).
    fn through_pieces(
        collective: Collective,
        shape: Shape,
        world: u32,
        piece: u64,
        inputs: &[Vec<u8>],
    ) -> Vec<Vec<u8>> {
        let plans: Vec<Vec<RowPieceStep>> = (0..world)
            .map(|rank| {
                let message = message(collective, shape, world, rank);
                row_piece_steps(&message, piece, Dtype::Bf16).expect("a plan")
            })
            .collect();
        let mut outputs: Vec<Vec<u8>> = (0..world)
            .map(|rank| vec![0xEE; message(collective, shape, world, rank).output_bytes() as usize])
            .collect();
        let by_piece = (0..plans[0].len())
            .map(|index| plans.iter().map(|plan| &plan[index]).collect::<Vec<_>>());
        for steps in by_piece {
            let step = |rank: usize| steps[rank];
            let piece = step(0).message.shape();
            // Each rank's input of the piece: gathered into its staging (reduce-scatter), or
            // its own rows where they are (all-gather).
            let piece_inputs: Vec<Vec<u8>> = (0..world as usize)
                .map(|rank| {
                    let own = step(rank).message.input_bytes() as usize;
                    if collective == Collective::ReduceScatter {
                        let mut staging = vec![0xAB; own];
                        for copy in &step(rank).copies {
                            let (from, to, bytes) =
                                (copy.from as usize, copy.to as usize, copy.bytes as usize);
                            staging[to..to + bytes]
                                .copy_from_slice(&inputs[rank][from..from + bytes]);
                        }
                        staging
                    } else {
                        let at = step(rank).own_offset as usize;
                        inputs[rank][at..at + own].to_vec()
                    }
                })
                .collect();
            let views: Vec<&[u8]> = piece_inputs.iter().map(Vec::as_slice).collect();
            let piece_outputs =
                reference_outputs(collective, Dtype::Bf16, piece, &views).expect("a reference");
            for rank in 0..world as usize {
                let written = &piece_outputs[rank];
                if collective == Collective::ReduceScatter {
                    let at = step(rank).own_offset as usize;
                    outputs[rank][at..at + written.len()].copy_from_slice(written);
                } else {
                    for copy in &step(rank).copies {
                        let (from, to, bytes) =
                            (copy.from as usize, copy.to as usize, copy.bytes as usize);
                        outputs[rank][to..to + bytes].copy_from_slice(&written[from..from + bytes]);
                    }
                }
            }
        }
        outputs
    }

    /// Inputs of `collective` of `shape`: every rank's whole message (reduce-scatter) or its
    /// own rows of one (all-gather).
    fn inputs(collective: Collective, shape: Shape, world: u32, seed: u64) -> Vec<Vec<u8>> {
        let element = Dtype::Bf16.size_bytes() as usize;
        let whole =
            random_rank_inputs(Dtype::Bf16, seed, world as usize, shape.elements() as usize);
        match collective {
            Collective::ReduceScatter => whole,
            _ => whole
                .iter()
                .enumerate()
                .map(|(rank, input)| {
                    let own = shape.owned_elements(world, rank as u32).expect("a rank");
                    input[own.start as usize * element..own.end as usize * element].to_vec()
                })
                .collect(),
        }
    }

    #[test]
    fn a_reduce_scatter_gathers_every_rank_s_rows_of_a_piece_and_writes_its_own_in_place() {
        // 10 rows of width 4 on 4 ranks (runs of 3, 3, 2, 2), bf16 (8 bytes a row), in pieces
        // of 39 elements: 2 rows of every run, then the longer runs' third row.
        let shape = Shape::new(10, 4).expect("a shape");
        let steps = row_piece_steps(
            &message(Collective::ReduceScatter, shape, 4, 1),
            39,
            Dtype::Bf16,
        )
        .expect("a plan");
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].message.shape(), Shape::new(8, 4).expect("a shape"));
        assert_eq!(steps[0].own_offset, 0);
        let copy = |from, to, bytes| PieceCopy { from, to, bytes };
        assert_eq!(
            steps[0].copies,
            [
                copy(0, 0, 16),
                copy(24, 16, 16),
                copy(48, 32, 16),
                copy(64, 48, 16)
            ]
        );
        // The last piece: rows 2, 5 of the first two runs; ranks 2 and 3 own none of it.
        assert_eq!(steps[1].message.shape(), Shape::new(2, 4).expect("a shape"));
        assert_eq!(steps[1].own_offset, 16);
        assert_eq!(steps[1].copies, [copy(16, 0, 8), copy(40, 8, 8)]);
        assert_eq!(steps[1].message.output_bytes(), 8);
        let none = row_piece_steps(
            &message(Collective::ReduceScatter, shape, 4, 3),
            39,
            Dtype::Bf16,
        )
        .expect("a plan");
        assert_eq!(
            (none[1].message.output_bytes(), none[1].own_offset),
            (0, 16)
        );
    }

    #[test]
    fn an_all_gather_scatters_a_piece_s_runs_to_their_place_in_the_output() {
        let shape = Shape::new(10, 4).expect("a shape");
        let steps = row_piece_steps(
            &message(Collective::AllGather, shape, 4, 2),
            39,
            Dtype::Bf16,
        )
        .expect("a plan");
        let copy = |from, to, bytes| PieceCopy { from, to, bytes };
        assert_eq!(
            steps[0].copies,
            [
                copy(0, 0, 16),
                copy(16, 24, 16),
                copy(32, 48, 16),
                copy(48, 64, 16)
            ]
        );
        assert_eq!(steps[1].copies, [copy(0, 16, 8), copy(8, 40, 8)]);
        // Rank 2's rows of the pieces: the first two of its run, then none.
        assert_eq!(
            (steps[0].own_offset, steps[0].message.input_bytes()),
            (0, 16)
        );
        assert_eq!(
            (steps[1].own_offset, steps[1].message.input_bytes()),
            (16, 0)
        );
    }

    #[test]
    fn one_row_on_every_rank_above_a_piece_is_refused() {
        let shape = Shape::new(64, 1000).expect("a shape");
        let refused = row_piece_steps(
            &message(Collective::AllGather, shape, 4, 0),
            3999,
            Dtype::Bf16,
        );
        assert!(matches!(
            refused,
            Err(ShapeError::RowsLargerThanPiece { .. })
        ));
    }

    proptest::proptest! {
        /// Done piece by piece through the plan, with exact pieces, every rank's output is the
        /// whole message's reference, bit for bit; every piece is within the largest bucket,
        /// and each rank's pieces of its own rows, concatenated, are its owned rows (the
        /// reduce-scatter's outputs, the all-gather's inputs), whether the rows divide or not
        /// and with ranks that own none.
        #[test]
        fn pieces_through_the_plan_give_the_whole_message_s_reference(
            gather in proptest::bool::ANY,
            rows in 0u64..200,
            width in 1u64..24,
            world in 2u32..=8,
            piece_rows in 1u64..6,
            extra in 0u64..16,
            seed in 0u64..1000,
        ) {
            let collective = if gather { Collective::AllGather } else { Collective::ReduceScatter };
            let shape = Shape::new(rows, width).expect("a shape");
            let piece = piece_rows * width * u64::from(world) + extra;
            for rank in 0..world {
                let whole = message(collective, shape, world, rank);
                let steps = row_piece_steps(&whole, piece, Dtype::Bf16).expect("a plan");
                let mut next = 0;
                for step in &steps {
                    proptest::prop_assert!(step.message.shape().elements() <= piece);
                    proptest::prop_assert_eq!(step.own_offset, next);
                    next += step.message.own_bytes();
                    // The copies cover the piece's message once, in rank order.
                    let mut covered = 0;
                    for copy in &step.copies {
                        let in_piece = if gather { copy.from } else { copy.to };
                        proptest::prop_assert_eq!(in_piece, covered);
                        covered += copy.bytes;
                    }
                    proptest::prop_assert_eq!(covered, step.message.message_bytes());
                }
                proptest::prop_assert_eq!(next, whole.own_bytes());
                proptest::prop_assert_eq!(whole.owned_bytes(rank).end - whole.owned_bytes(rank).start, next);
            }
            let inputs = inputs(collective, shape, world, seed);
            let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let expected = reference_outputs(collective, Dtype::Bf16, shape, &views).expect("a reference");
            proptest::prop_assert_eq!(through_pieces(collective, shape, world, piece, &inputs), expected);
        }
    }
}
