//! The shape `prepare bench` times a reduce-scatter or an all-gather of a size at: rows of a
//! fixed width, as a server's tokens x hidden, with every rank owning a row where the size
//! allows, inside the bucket covering the size.

use serde::{Deserialize, Serialize};

use crate::shape::Shape;

/// Elements per row of the bench's reduce-scatters and all-gathers (where the message holds a
/// row of that width per rank).
pub const BENCH_WIDTH: u64 = 4096;

/// The rows x width a size was timed at, as the report writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowsWidth {
    /// Rows of the full message.
    pub rows: u64,
    /// Elements per row.
    pub width: u64,
}

impl From<Shape> for RowsWidth {
    fn from(shape: Shape) -> RowsWidth {
        RowsWidth {
            rows: shape.rows(),
            width: shape.width(),
        }
    }
}

impl std::fmt::Display for RowsWidth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.width)
    }
}

/// The shape a row collective of `bytes` (the full message's) in elements of `element_bytes`
/// on `world` ranks is timed at, where `bucket` (the smallest and largest bytes of the bucket
/// covering it, when one does) must hold the shape's message:
///
/// - `elements` = the bytes over the element size, rounded up, at least one;
/// - the width is [`BENCH_WIDTH`], or `elements / world` rounded up where that is less (so
///   that a small message still gives every rank a row);
/// - the rows are `elements / width` rounded up, or rounded down where that leaves the bucket;
/// - where both leave it (a bucket narrower than a row), rows of one element: `elements` x 1.
pub fn bench_shape(
    bytes: u64,
    element_bytes: u64,
    world: u32,
    bucket: Option<(u64, u64)>,
) -> Shape {
    let elements = bytes.div_ceil(element_bytes.max(1)).max(1);
    let width = BENCH_WIDTH.min(elements.div_ceil(u64::from(world.max(1))).max(1));
    let fits = |rows: u64| {
        rows > 0
            && bucket.is_none_or(|(min, max)| {
                rows.checked_mul(width * element_bytes)
                    .is_some_and(|bytes| (min..=max).contains(&bytes))
            })
    };
    [elements.div_ceil(width), elements / width]
        .into_iter()
        .find(|&rows| fits(rows))
        .and_then(|rows| Shape::new(rows, width).ok())
        .unwrap_or_else(|| Shape::flat(elements))
}
