//! The lines `prepare bench` prints, by collective: the run's heading, the table of sizes (with
//! the rows x width a reduce-scatter or all-gather was timed at, the rows x hidden of the fused
//! all-reduce + RMSNorm with each candidate's form and check), and the decode emulation's
//! heading.

use super::{bus_formula, operations, DecodeShape, ServingRow, SizeRow};
use crate::ladder::{Collective, Dtype};

/// Whether the table of sizes has a shape column: the collectives with rows.
fn has_rows(collective: Collective) -> bool {
    matches!(
        collective,
        Collective::ReduceScatter | Collective::AllGather
    )
}

/// The shape column's name, where the table has one.
fn shape_column(collective: Collective) -> Option<&'static str> {
    match collective {
        Collective::ReduceScatter | Collective::AllGather => Some("rows x width"),
        Collective::AllReduceAddRmsNorm => Some("rows x hidden"),
        Collective::AllReduce => None,
    }
}

/// Whether the table gives each candidate's form and check (the fused all-reduce + RMSNorm).
fn has_forms(collective: Collective) -> bool {
    collective == Collective::AllReduceAddRmsNorm
}

/// A form as the table writes it.
fn form_text(form: Option<super::targets::Form>) -> &'static str {
    use super::targets::Form;
    match form {
        Some(Form::Fused) => "fused",
        Some(Form::Separate) => "separate",
        Some(Form::Nccl) => "nccl",
        Some(Form::NcclRankOrder) => "nccl_rank_order",
        None => "-",
    }
}

/// The run's first line: what is timed, on how many ranks, and the bus bandwidth's formula.
pub fn heading(collective: Collective, dtype: Dtype, world: u32, ladder: &str) -> String {
    format!(
        "{collective} {dtype} on {world} ranks ({ladder}); busbw: {}, GB/s",
        bus_formula(collective)
    )
}

/// The table of sizes' column names.
pub fn size_columns(collective: Collective) -> String {
    let shape = shape_column(collective).map_or_else(String::new, |name| format!(" {name}"));
    let forms = if has_forms(collective) {
        format!(" {:<15} {:>5}", "form", "exact")
    } else {
        String::new()
    };
    format!(
        "{:>10}{shape} {:>6}  {:<22} {:>9} {:>9} {:>9} {:>8} {:>8}{forms}",
        "bytes", "bucket", "candidate", "median_us", "min_us", "max_us", "busbw", "vs_nccl"
    )
}

/// One contender's line at one size (`*` marks the tuned choice).
pub fn size_line(collective: Collective, row: &SizeRow) -> String {
    let (bytes, bucket) = (row.bytes, row.bucket);
    let marker = if row.chosen { "*" } else { " " };
    let width = shape_column(collective).map_or(0, str::len);
    let shape = match (shape_column(collective), row.shape) {
        (Some(_), Some(shape)) => format!(" {:>width$}", shape.to_string()),
        (Some(_), None) => format!(" {:>width$}", "-"),
        (None, _) => String::new(),
    };
    let forms = if has_forms(collective) {
        let exact = match row.exact {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        format!(" {:<15} {exact:>5}", form_text(row.form))
    } else {
        String::new()
    };
    match (row.median_us, &row.excluded) {
        (Some(median), _) => format!(
            "{bytes:>10}{shape} {bucket:>6} {marker}{:<22} {median:>9.2} {:>9.2} {:>9.2} {:>8.1} {:>7.2}x{forms}",
            row.profile,
            row.min_us.unwrap_or(f64::NAN),
            row.max_us.unwrap_or(f64::NAN),
            row.bus_gbps.unwrap_or(f64::NAN),
            row.speedup_vs_nccl.unwrap_or(f64::NAN),
        ),
        (None, reason) => format!(
            "{bytes:>10}{shape} {bucket:>6} {marker}{:<22} excluded: {}",
            row.profile,
            reason.as_deref().unwrap_or("")
        ),
    }
}

/// The line for a size above the last bucket that was not timed.
pub fn above_ladder_line(collective: Collective, bytes: u64) -> String {
    if has_rows(collective) || has_forms(collective) {
        format!(
            "{bytes:>10}: above the last bucket: the bench does not time a {collective} in \
             pieces; skipped"
        )
    } else {
        format!(
            "{bytes:>10}: above the last bucket, whose winner is NCCL (or has none that runs \
             here): NCCL takes it whole; skipped"
        )
    }
}

/// The decode emulation's heading: how many operations of which shape one graph holds.
pub fn decode_heading(collective: Collective, dtype: Dtype, shape: &DecodeShape) -> String {
    let what = if has_rows(collective) {
        format!("batch rows x {}", shape.hidden)
    } else {
        format!("batch x {}", shape.hidden)
    };
    format!(
        "decode emulation: {} layers x {} {} of {what} {dtype} in one graph",
        shape.layers,
        shape.all_reduces_per_layer,
        operations(collective)
    )
}

/// The heading of the serving paths' table.
pub fn serving_heading() -> String {
    format!(
        "serving path of the chosen candidate (us): zero copy, zero copy in place, any tensor, \
         any tensor in place\n{:>10} {:>6}  {:<22} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "bytes", "bucket", "chosen", "zero_cp", "zc_inpl", "any", "any_inpl", "extra"
    )
}

/// One size's line of the serving paths' table; `extra` is any tensor minus zero copy.
pub fn serving_line(row: &ServingRow) -> String {
    format!(
        "{:>10} {:>6}  {:<22} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>+9.2}",
        row.bytes,
        row.bucket,
        row.profile,
        row.zero_copy_us,
        row.zero_copy_in_place_us.unwrap_or(f64::NAN),
        row.any_tensor_us,
        row.any_tensor_in_place_us,
        row.any_tensor_us - row.zero_copy_us,
    )
}
