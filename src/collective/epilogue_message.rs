//! One call of `all_reduce_add_rms_norm` on a rank ([`EpilogueMessage`]) and its checks, the
//! shape start-up runs it at, and the `add_rms_norm` kernel with start-up's own operands
//! ([`super::epilogue`] enqueues them).

use std::ops::Range;

use crate::abi::{ALIGNMENT_BYTES, PARAMS_BYTES};
use crate::gpu::driver::{
    CallerMemory, DeviceBuffer, DeviceMemory as _, LoadedKernel, ModuleImage,
};
use crate::kernels;
use crate::ladder::Dtype;
use crate::package::Package;
use crate::runtime::{OperandError, Runtime, RuntimeError};
use crate::shape::Shape;

/// The largest hidden size the norm takes: every size up to it is an exact f32
/// (`PREPARE_NORM_MAX_HIDDEN` in kernels/prepare_norm.cuh).
pub const MAX_HIDDEN: u64 = 1 << 24;
/// The norm's kernels take whole groups of 8 elements per row.
pub const HIDDEN_MULTIPLE: u64 = 8;
/// The hidden size start-up checks and times a message at, where it holds one row of it.
pub const STARTUP_HIDDEN: u64 = 8192;
/// The eps start-up's checks and timings use: a typical model's.
pub const STARTUP_EPS: f32 = 1e-6;
/// Threads per block of `add_rms_norm`, and the most blocks it launches (each takes a row at a
/// time).
pub(super) const NORM_THREADS: u32 = 256;
pub(super) const NORM_MAX_BLOCKS: u64 = 1024;

/// One call of `all_reduce_add_rms_norm` on this rank: `x` (rows x hidden), the residual
/// (rows x hidden, overwritten with the sum plus itself) or none, the weight (hidden) and
/// `normed` (rows x hidden; it may be `x`).
#[derive(Debug, Clone, Copy)]
pub struct EpilogueMessage {
    /// This rank's addend.
    pub x: CallerMemory,
    /// The residual, the same on every rank; `None` for all-reduce then RMSNorm.
    pub residual: Option<CallerMemory>,
    /// RMSNorm's weight, `hidden` elements.
    pub weight: CallerMemory,
    /// Where the normalised rows go.
    pub normed: CallerMemory,
    /// rows x hidden.
    pub shape: Shape,
    /// Added to the mean of squares: 0 or more.
    pub eps: f32,
}

impl EpilogueMessage {
    /// Rows `rows` of the message as a message of their own: `x`, the residual and `normed`
    /// each starting that many rows in, the weight as it is.
    #[must_use]
    pub fn rows(&self, rows: Range<u64>, element_bytes: u64) -> EpilogueMessage {
        let row_bytes = self.shape.width() * element_bytes;
        let (offset, bytes) = (rows.start * row_bytes, (rows.end - rows.start) * row_bytes);
        let part = |memory: CallerMemory| CallerMemory::prefix(&memory.offset(offset), bytes);
        EpilogueMessage {
            x: part(self.x),
            residual: self.residual.map(part),
            normed: part(self.normed),
            shape: Shape::new(rows.end - rows.start, self.shape.width())
                .expect("a width of at least one"),
            ..*self
        }
    }

    /// Whether the message may go in pieces of whole rows ([`crate::shape::epilogue_pieces`]):
    /// `normed` and the residual are each `x` itself or lie apart from it, so no piece writes
    /// what a later piece still reads.
    pub fn may_go_in_pieces(&self) -> bool {
        let apart =
            |other: &CallerMemory| other.address() == self.x.address() || !overlaps(other, &self.x);
        apart(&self.normed) && self.residual.as_ref().is_none_or(apart)
    }
}

/// The shape start-up checks and times a message of `elements` at: rows of
/// [`STARTUP_HIDDEN`], or one row of the largest multiple of 8 elements it holds (at least 8,
/// the smallest bucket's edge).
pub fn epilogue_startup_shape(elements: u64) -> Shape {
    let hidden = if elements >= STARTUP_HIDDEN {
        STARTUP_HIDDEN
    } else {
        (elements / HIDDEN_MULTIPLE * HIDDEN_MULTIPLE).max(HIDDEN_MULTIPLE)
    };
    Shape::new((elements / hidden).max(1), hidden).expect("a width of at least one")
}

/// Whether two byte ranges share a byte.
fn overlaps(a: &CallerMemory, b: &CallerMemory) -> bool {
    let (a_start, b_start) = (a.address(), b.address());
    let (a_end, b_end) = (
        a_start + a.len_bytes() as u64,
        b_start + b.len_bytes() as u64,
    );
    a_start < b_end && b_start < a_end && a.len_bytes() > 0 && b.len_bytes() > 0
}

/// Every refusal of `message` for a package of `dtype`, the first found: a hidden size no kernel
/// takes, an operand of the wrong length, a residual, weight or `normed` off the 16-byte
/// alignment the norm reads and writes at, a negative or NaN eps, `normed` overlapping the
/// residual.
pub fn check_epilogue(dtype: Dtype, message: &EpilogueMessage) -> Result<(), OperandError> {
    let (rows, hidden) = (message.shape.rows(), message.shape.width());
    if hidden % HIDDEN_MULTIPLE != 0 || hidden > MAX_HIDDEN {
        return Err(OperandError::HiddenNotTaken {
            hidden,
            largest: MAX_HIDDEN,
        });
    }
    let size = dtype.size_bytes();
    let message_bytes = rows.saturating_mul(hidden).saturating_mul(size);
    let mut lengths = vec![
        ("x", "the whole message", &message.x, message_bytes),
        ("weight", "one row", &message.weight, hidden * size),
        (
            "normed",
            "the whole message",
            &message.normed,
            message_bytes,
        ),
    ];
    if let Some(residual) = &message.residual {
        lengths.insert(
            1,
            ("residual", "the whole message", residual, message_bytes),
        );
    }
    for (operand, what, memory, bytes) in lengths {
        if memory.len_bytes() as u64 != bytes {
            return Err(OperandError::EpilogueLength {
                operand,
                what,
                holds: memory.len_bytes() as u64,
                bytes,
                rows,
                hidden,
            });
        }
    }
    if message.eps.is_nan() || message.eps < 0.0 {
        return Err(OperandError::Eps {
            eps_bits: message.eps.to_bits(),
        });
    }
    if let Some(residual) = &message.residual {
        if overlaps(residual, &message.normed) {
            return Err(OperandError::NormedOverlapsResidual);
        }
    }
    let aligned = [
        ("residual", message.residual.as_ref()),
        ("weight", Some(&message.weight)),
        ("normed", Some(&message.normed)),
    ];
    for (operand, memory) in aligned {
        if let Some(memory) = memory.filter(|memory| memory.address() % ALIGNMENT_BYTES != 0) {
            return Err(OperandError::EpilogueMisaligned {
                operand,
                address: memory.address(),
            });
        }
    }
    Ok(())
}

/// The epilogue's kernel and the buffers start-up checks and times it with, on this rank.
#[derive(Debug)]
pub(super) struct EpilogueParts {
    pub(super) kernel: LoadedKernel,
    // The largest message's residual, and a weight of `STARTUP_HIDDEN` elements.
    pub(super) residual: DeviceBuffer,
    pub(super) weight: DeviceBuffer,
}

impl EpilogueParts {
    /// Loads `add_rms_norm` from the package, between hosts too (it touches no peer memory);
    /// `None` for a package of another collective, which does not hold it.
    pub(super) fn load(
        runtime: &Runtime,
        package: &Package,
        capacity: usize,
    ) -> Result<Option<EpilogueParts>, RuntimeError> {
        let rank = runtime.rank();
        let ladder = package.ladder();
        let spec = kernels::add_rms_norm(ladder.dtype, ladder.world_size);
        let Some((_, cubin)) = package
            .kernels()
            .find(|(record, _)| record.name == spec.name)
        else {
            return Ok(None);
        };
        let driver = RuntimeError::driver(rank);
        let module = runtime
            .device()
            .load_module(ModuleImage::Cubin(cubin))
            .map_err(driver)?;
        let kernel = module
            .load(&spec.name, false, PARAMS_BYTES)
            .map_err(RuntimeError::driver(rank))?;
        let size = ladder.dtype.size_bytes() as usize;
        let device = runtime.device();
        let residual = device
            .allocate((capacity * size).max(16))
            .map_err(RuntimeError::driver(rank))?;
        let weight = device
            .allocate(STARTUP_HIDDEN as usize * size)
            .map_err(RuntimeError::driver(rank))?;
        Ok(Some(EpilogueParts {
            kernel,
            residual,
            weight,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::driver::DeviceMemory;

    /// Memory at a made-up address, for checks that read addresses and lengths only.
    struct Span(u64, usize);

    impl DeviceMemory for Span {
        fn address(&self) -> u64 {
            self.0
        }
        fn len_bytes(&self) -> usize {
            self.1
        }
        fn ordinal(&self) -> usize {
            0
        }
    }

    fn at(address: u64, bytes: usize) -> CallerMemory {
        CallerMemory::whole(&Span(address, bytes))
    }

    /// A bf16 message of 4 x 16 with every operand apart and aligned.
    fn message() -> EpilogueMessage {
        EpilogueMessage {
            x: at(0x1000, 128),
            residual: Some(at(0x2000, 128)),
            weight: at(0x3000, 32),
            normed: at(0x4000, 128),
            shape: Shape::new(4, 16).unwrap(),
            eps: 1e-6,
        }
    }

    #[test]
    fn a_message_of_whole_groups_with_every_operand_in_place_passes() {
        assert_eq!(check_epilogue(Dtype::Bf16, &message()), Ok(()));
        // normed may be x itself, and there may be no residual.
        let over_x = EpilogueMessage {
            normed: at(0x1000, 128),
            residual: None,
            ..message()
        };
        assert_eq!(check_epilogue(Dtype::Bf16, &over_x), Ok(()));
        let zero_eps = EpilogueMessage {
            eps: 0.0,
            ..message()
        };
        assert_eq!(check_epilogue(Dtype::Bf16, &zero_eps), Ok(()));
    }

    #[test]
    fn each_bad_operand_is_refused_by_name() {
        let refused = |message: EpilogueMessage| {
            check_epilogue(Dtype::Bf16, &message)
                .unwrap_err()
                .to_string()
        };
        let twelve = EpilogueMessage {
            x: at(0x1000, 96),
            residual: Some(at(0x2000, 96)),
            weight: at(0x3000, 24),
            normed: at(0x4000, 96),
            shape: Shape::new(4, 12).unwrap(),
            ..message()
        };
        assert_eq!(
            refused(twelve),
            "a hidden size of 12 elements is not taken: RMSNorm's kernels take a multiple of 8 \
             from 8 to 16777216"
        );
        let too_wide = EpilogueMessage {
            shape: Shape::new(1, MAX_HIDDEN + 8).unwrap(),
            ..message()
        };
        assert!(refused(too_wide).starts_with("a hidden size of 16777224 elements"));
        assert_eq!(
            refused(EpilogueMessage {
                weight: at(0x3000, 30),
                ..message()
            }),
            "the weight holds 30 bytes, but one row of a message of 4 x 16 takes 32"
        );
        assert_eq!(
            refused(EpilogueMessage {
                residual: Some(at(0x2000, 64)),
                ..message()
            }),
            "the residual holds 64 bytes, but the whole message of a message of 4 x 16 takes 128"
        );
        for eps in [-1e-6, f32::NAN] {
            let text = refused(EpilogueMessage { eps, ..message() });
            assert!(
                text.starts_with("eps is ") && text.ends_with("not NaN)"),
                "{text}"
            );
        }
        assert_eq!(
            refused(EpilogueMessage {
                normed: at(0x2040, 128),
                ..message()
            }),
            "normed overlaps the residual; the residual's new value would be lost"
        );
        assert_eq!(
            refused(EpilogueMessage {
                weight: at(0x3008, 32),
                ..message()
            }),
            "the weight at 0x3008 is not 16-byte aligned, as the norm's kernels need"
        );
    }

    #[test]
    fn a_run_of_rows_moves_every_operand_but_the_weight_by_the_same_rows() {
        // 4 x 16 bf16: 32 bytes a row; rows 1 and 2.
        let part = message().rows(1..3, 2);
        assert_eq!(part.shape, Shape::new(2, 16).unwrap());
        assert_eq!((part.x.address(), part.x.len_bytes()), (0x1020, 64));
        let residual = part.residual.expect("a residual");
        assert_eq!((residual.address(), residual.len_bytes()), (0x2020, 64));
        assert_eq!(
            (part.normed.address(), part.normed.len_bytes()),
            (0x4020, 64)
        );
        assert_eq!(
            (part.weight.address(), part.weight.len_bytes()),
            (0x3000, 32)
        );
        assert_eq!(check_epilogue(Dtype::Bf16, &part), Ok(()));
        let empty = message().rows(4..4, 2);
        assert_eq!((empty.shape.rows(), empty.x.len_bytes()), (0, 0));
    }

    #[test]
    fn pieces_need_normed_and_the_residual_over_x_or_apart_from_it() {
        assert!(message().may_go_in_pieces());
        let over_x = EpilogueMessage {
            normed: at(0x1000, 128),
            residual: Some(at(0x1000, 128)),
            ..message()
        };
        assert!(over_x.may_go_in_pieces());
        let normed_a_row_in = EpilogueMessage {
            normed: at(0x1020, 128),
            ..message()
        };
        assert!(!normed_a_row_in.may_go_in_pieces());
        let residual_a_row_before = EpilogueMessage {
            residual: Some(at(0x0FE0, 128)),
            ..message()
        };
        assert!(!residual_a_row_before.may_go_in_pieces());
        assert!(EpilogueMessage {
            residual: None,
            ..message()
        }
        .may_go_in_pieces());
    }

    #[test]
    fn start_up_runs_rows_of_8192_or_one_row_of_whole_groups() {
        let shape = |elements| {
            let shape = epilogue_startup_shape(elements);
            (shape.rows(), shape.width())
        };
        assert_eq!(shape(32_768), (4, 8192));
        assert_eq!(shape(8192), (1, 8192));
        assert_eq!(shape(40_000), (4, 8192));
        assert_eq!(shape(16), (1, 16));
        assert_eq!(shape(12), (1, 8));
        assert_eq!(shape(8), (1, 8));
    }
}
