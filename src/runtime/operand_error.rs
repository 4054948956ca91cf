//! The caller's mistakes in a collective asked of a rank's collectives, refused before
//! anything is enqueued ([`RuntimeError::Operands`](super::RuntimeError::Operands)).

/// An all-reduce asked of an entry that it cannot take: the caller's mistake, refused before
/// anything is enqueued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperandError {
    /// The input or the output holds fewer bytes than the message.
    #[error("the {operand} holds {holds} bytes, the message {bytes}")]
    TooShort {
        /// `input` or `output`.
        operand: &'static str,
        /// The bytes it holds.
        holds: usize,
        /// The message's bytes.
        bytes: u64,
    },
    /// No element, or more than the bucket's scratch holds (NCCL takes any number).
    #[error(
        "{profile} in bucket {bucket}: a message of {elements} elements is outside the bucket's \
         1..={largest}"
    )]
    OutsideBucket {
        /// The entry's profile.
        profile: String,
        /// Its bucket.
        bucket: usize,
        /// The elements asked for.
        elements: usize,
        /// The most the bucket takes.
        largest: usize,
    },
    /// The entry does not run on this machine.
    #[error(
        "{} in bucket {bucket} was dropped: {reason}",
        crate::files::shorten(profile)
    )]
    Dropped {
        /// The entry's profile.
        profile: String,
        /// Its bucket.
        bucket: usize,
        /// Why it was dropped.
        reason: String,
    },
    /// A message in pieces whose output partly overlaps its input: one piece would overwrite
    /// a later piece's input.
    #[error(
        "{what} needs its output to be its input or to lie apart from it; they partly overlap"
    )]
    PartlyOverlapping {
        /// The message.
        what: String,
    },
    /// A reduce-scatter's or all-gather's operand of another length than the shape gives
    /// this rank.
    #[error(
        "rank {rank}: the {collective} of {rows} x {width} takes an {operand} of {bytes} bytes \
         on this rank; it holds {holds}"
    )]
    WrongLength {
        /// The collective.
        collective: crate::ladder::Collective,
        /// `input` or `output`.
        operand: &'static str,
        /// The bytes it holds.
        holds: u64,
        /// The bytes the shape gives it on this rank.
        bytes: u64,
        /// The message's rows.
        rows: u64,
        /// Its width.
        width: u64,
        /// This rank.
        rank: u32,
    },
    /// A reduce-scatter's or all-gather's output overlapping its input other than in place.
    #[error(
        "rank {rank}: the {collective}'s output overlaps its input, and not in place (in \
         place, {in_place})"
    )]
    RowsOverlap {
        /// The collective.
        collective: crate::ladder::Collective,
        /// This rank.
        rank: u32,
        /// The in-place layout of the collective.
        in_place: &'static str,
    },
    /// A reduce-scatter's or all-gather's output that the kernel cannot write where it is
    /// and that no buffer of this rank holds.
    #[error(
        "rank {rank}: no buffer of this rank holds the {collective}'s output of {bytes} bytes, \
         which the kernel cannot write where it is"
    )]
    NoRoomForOutput {
        /// The collective.
        collective: crate::ladder::Collective,
        /// This rank.
        rank: u32,
        /// The output's bytes.
        bytes: u64,
    },
    /// An all-reduce + RMSNorm whose hidden size no kernel takes.
    #[error(
        "a hidden size of {hidden} elements is not taken: RMSNorm's kernels take a multiple of \
         8 from 8 to {largest}"
    )]
    HiddenNotTaken {
        /// The hidden size (the message's width).
        hidden: u64,
        /// The largest hidden size taken.
        largest: u64,
    },
    /// An all-reduce + RMSNorm above the ladder whose one row is more than a piece.
    #[error(
        "a row of {hidden} elements is more than a piece of {piece} elements (the largest \
         bucket's message), so the message cannot go in pieces of whole rows"
    )]
    RowLargerThanPiece {
        /// The hidden size (the message's width).
        hidden: u64,
        /// Elements of a piece.
        piece: u64,
    },
    /// An all-reduce + RMSNorm operand of another length than its shape gives it.
    #[error(
        "the {operand} holds {holds} bytes, but {what} of a message of {rows} x {hidden} takes \
         {bytes}"
    )]
    EpilogueLength {
        /// `x`, `residual`, `weight` or `normed`.
        operand: &'static str,
        /// What the shape gives it (`the whole message`, `one row`).
        what: &'static str,
        /// The bytes it holds.
        holds: u64,
        /// The bytes it must hold.
        bytes: u64,
        /// The message's rows.
        rows: u64,
        /// The hidden size.
        hidden: u64,
    },
    /// An all-reduce + RMSNorm with a negative or NaN eps.
    #[error("eps is {}; it must be 0 or more (not negative, not NaN)", f32::from_bits(*eps_bits))]
    Eps {
        /// The eps given, as its bits (so that the error compares as equal to itself).
        eps_bits: u32,
    },
    /// An all-reduce + RMSNorm operand the norm cannot read or write where it is.
    #[error("the {operand} at {address:#x} is not 16-byte aligned, as the norm's kernels need")]
    EpilogueMisaligned {
        /// `residual`, `weight` or `normed`.
        operand: &'static str,
        /// Its address.
        address: u64,
    },
    /// An all-reduce + RMSNorm whose `normed` overlaps its residual: the residual's new value
    /// would be lost.
    #[error("normed overlaps the residual; the residual's new value would be lost")]
    NormedOverlapsResidual,
    /// A width of 0, a rank outside the world: a shape the rule refuses.
    #[error(transparent)]
    Shape(#[from] crate::shape::ShapeError),
}
