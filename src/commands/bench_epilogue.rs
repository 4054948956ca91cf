//! `prepare bench` on a package of `all_reduce_add_rms_norm`: every candidate at tokens x
//! hidden, checked once and timed against the others; the chosen one through the serving
//! paths; the decode emulation with epilogues; then per size the figures the speed targets read.

use prepare::bench::{
    epilogue, largest_choice_gap, text, Bench, BenchReport, DecodeRow, DecodeShape, ServingRow,
    SizeRow,
};
use prepare::ladder::Ladder;

use super::Failure;

/// What the run measured.
pub struct Measured {
    pub sizes: Vec<SizeRow>,
    pub serving: Vec<ServingRow>,
    pub decode: Vec<DecodeRow>,
    pub summary: Vec<epilogue::EpilogueSize>,
}

/// The most rows any size or batch of `tokens` and `batches` takes inside the ladder.
fn most_rows(ladder: &Ladder, hidden: u64, tokens: &[u64], batches: &[usize]) -> u64 {
    let row = hidden * ladder.dtype.size_bytes();
    tokens
        .iter()
        .copied()
        .chain(batches.iter().map(|&batch| batch as u64))
        .filter(|&rows| ladder.bucket_for(rows * row).is_some())
        .max()
        .unwrap_or(1)
}

/// Runs the sizes, the serving rows and the decode emulation, a line each.
pub fn run(
    bench: &mut Bench,
    ladder: &Ladder,
    tokens: &[u64],
    shape: &DecodeShape,
    batches: &[usize],
    all_reduce: Option<&BenchReport>,
    log: &dyn Fn(String),
) -> Result<Measured, Failure> {
    let collective = ladder.collective;
    let hidden = shape.hidden as u64;
    let buffers = bench
        .epilogue_buffers(most_rows(ladder, hidden, tokens, batches), hidden)
        .map_err(Failure::bench)?;
    let mut sizes = Vec::new();
    log(text::size_columns(collective));
    for &rows in tokens {
        let bytes = rows * hidden * ladder.dtype.size_bytes();
        let Some(timed) = bench
            .time_epilogue(rows, &buffers)
            .map_err(Failure::bench)?
        else {
            log(text::above_ladder_line(collective, bytes));
            continue;
        };
        for row in timed {
            log(text::size_line(collective, &row));
            sizes.push(row);
        }
    }
    log(
        "* the tuned choice at that size; vs_nccl: NCCL's median over the candidate's; exact: \
         both outputs equal to the reference on every rank, checked once at that size"
            .to_owned(),
    );
    if let Some(gap) = largest_choice_gap(&sizes) {
        log(format!(
            "the tuned choice is at most {:.1}% behind the fastest contender at any size: at \
             {} bytes, {} {:.2} us against {} {:.2} us",
            100.0 * gap.behind(),
            gap.bytes,
            gap.chosen.0,
            gap.chosen.1,
            gap.best.0,
            gap.best.1
        ));
    }
    let mut serving = Vec::new();
    log(text::serving_heading());
    for &rows in tokens {
        let Some(row) = bench
            .time_epilogue_serving(rows, &buffers)
            .map_err(Failure::bench)?
        else {
            continue;
        };
        log(text::serving_line(&row));
        serving.push(row);
    }
    log("extra: any tensor minus zero copy; in place: normed over x".to_owned());
    let mut decode = Vec::new();
    let batches: Vec<usize> = batches.iter().copied().filter(|&batch| batch > 0).collect();
    if !batches.is_empty() {
        log(text::decode_heading(collective, ladder.dtype, shape));
        log(epilogue::decode_columns());
    }
    for batch in batches {
        let Some(row) = bench
            .time_epilogue_decode(batch, shape, &buffers)
            .map_err(Failure::bench)?
        else {
            log(format!("{batch:>6}: above the last bucket; skipped"));
            continue;
        };
        log(epilogue::decode_line(&row));
        decode.push(row);
    }
    let summary = epilogue::summarize(&sizes, all_reduce);
    log(
        "per size: the fastest fused candidate, the fastest unfused one (an all-reduce kernel, \
         then add_rms_norm) and NCCL then add_rms_norm; fus-ar_us: the fused call minus the \
         all-reduce package's tuned choice at the same bytes (--all-reduce-bench)"
            .to_owned(),
    );
    log(epilogue::summary_columns());
    for size in &summary {
        log(epilogue::summary_line(size));
    }
    Ok(Measured {
        sizes,
        serving,
        decode,
        summary,
    })
}
