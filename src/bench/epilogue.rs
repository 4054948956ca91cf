//! What `prepare bench` reports of a package of `all_reduce_add_rms_norm`: the sizes it times
//! (tokens x hidden), what each candidate runs ([`Form`]), and per size the figures the speed
//! targets read ([`EpilogueSize`]): the fastest fused candidate against the fastest unfused
//! one (an all-reduce kernel, then `add_rms_norm`) and NCCL then `add_rms_norm`, and the fused
//! call's time over the all-reduce package's tuned choice at the same bytes, from that
//! package's `bench.json` of the same machine.

pub use super::targets::{EpilogueSize, Figure, Form};
use super::{BenchReport, DecodeRow, SizeRow};
use crate::ladder::{Collective, Ladder};

/// The hidden size the bench times at by default (a 7168-wide model, DeepSeek-V3's).
pub const DEFAULT_HIDDEN: u64 = 7168;

/// The token counts timed by default at `hidden` elements of `element_bytes` per row: 1, 2, 4,
/// ... while the message (tokens x hidden) fits the ladder's last bucket.
pub fn default_tokens(ladder: &Ladder, hidden: u64, element_bytes: u64) -> Vec<u64> {
    let last = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    let row = hidden.saturating_mul(element_bytes).max(1);
    std::iter::successors(Some(1_u64), |tokens| tokens.checked_mul(2))
        .take_while(|&tokens| tokens.saturating_mul(row) <= last)
        .collect()
}

/// The fastest timed row among `rows` that `pick` takes.
fn fastest<'a>(rows: &[&'a SizeRow], pick: impl Fn(&SizeRow) -> bool) -> Option<&'a SizeRow> {
    rows.iter()
        .copied()
        .filter(|row| pick(row) && row.median_us.is_some())
        .min_by(|a, b| {
            a.median_us
                .unwrap_or(f64::NAN)
                .total_cmp(&b.median_us.unwrap_or(f64::NAN))
        })
}

fn figure(row: Option<&SizeRow>) -> Option<Figure> {
    row.and_then(|row| {
        Some(Figure {
            profile: row.profile.clone(),
            median_us: row.median_us?,
        })
    })
}

/// Per size of `sizes` (an `all_reduce_add_rms_norm` run's rows, with their shapes and forms)
/// the figures the targets read, sizes ascending; with `all_reduce` (an all-reduce package's
/// report of the same machine) the all-reduce's tuned choice at the same bytes beside them.
pub fn summarize(sizes: &[SizeRow], all_reduce: Option<&BenchReport>) -> Vec<EpilogueSize> {
    let mut keys: Vec<(u64, u64, u64)> = sizes
        .iter()
        .filter_map(|row| row.shape.map(|shape| (row.bytes, shape.rows, shape.width)))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|(bytes, rows, hidden)| {
            let at: Vec<&SizeRow> = sizes
                .iter()
                .filter(|row| {
                    row.bytes == bytes
                        && row
                            .shape
                            .is_some_and(|shape| (shape.rows, shape.width) == (rows, hidden))
                })
                .collect();
            let form = |form: Form| move |row: &SizeRow| row.form == Some(form);
            let chosen = figure(fastest(&at, |row| row.chosen));
            let fused = figure(fastest(&at, form(Form::Fused)));
            let unfused = figure(fastest(&at, form(Form::Separate)));
            let nccl = figure(fastest(&at, form(Form::Nccl)));
            let all_reduce = all_reduce.and_then(|report| {
                figure(fastest(&report.sizes.iter().collect::<Vec<_>>(), |row| {
                    row.bytes == bytes && row.chosen
                }))
            });
            let over = |slower: &Option<Figure>| {
                Some(slower.as_ref()?.median_us / fused.as_ref()?.median_us)
            };
            EpilogueSize {
                rows,
                hidden,
                bytes,
                unfused_over_fused: over(&unfused),
                nccl_over_fused: over(&nccl),
                fused_minus_all_reduce_us: fused
                    .as_ref()
                    .zip(all_reduce.as_ref())
                    .map(|(fused, all_reduce)| fused.median_us - all_reduce.median_us),
                chosen,
                fused,
                unfused,
                nccl,
                all_reduce,
            }
        })
        .collect()
}

/// Why an all-reduce package's report cannot stand beside this run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgainstError {
    /// It is a report of another collective.
    #[error("it is a bench of {collective}, not of all_reduce")]
    NotAllReduce {
        /// Its collective.
        collective: Collective,
    },
    /// It ran on another number of ranks.
    #[error("it ran on {theirs} ranks, this run on {ours}")]
    OtherWorld {
        /// Its ranks.
        theirs: u32,
        /// This run's.
        ours: u32,
    },
    /// It ran on other GPUs.
    #[error("it ran on {theirs}, this run on {ours}")]
    OtherGpus {
        /// Its GPUs, comma-separated.
        theirs: String,
        /// This run's.
        ours: String,
    },
}

/// Checks that `report` is an all-reduce bench of `world` ranks on `gpus` (in rank order).
pub fn check_against(
    report: &BenchReport,
    world: u32,
    gpus: &[String],
) -> Result<(), AgainstError> {
    if report.collective != Collective::AllReduce {
        return Err(AgainstError::NotAllReduce {
            collective: report.collective,
        });
    }
    if report.world_size != world {
        return Err(AgainstError::OtherWorld {
            theirs: report.world_size,
            ours: world,
        });
    }
    if report.gpus != gpus {
        return Err(AgainstError::OtherGpus {
            theirs: report.gpus.join(", "),
            ours: gpus.join(", "),
        });
    }
    Ok(())
}

/// The targets table's column names.
pub fn summary_columns() -> String {
    format!(
        "{:>6} {:>6} {:>10}  {:<24} {:>9}  {:<24} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "tokens",
        "hidden",
        "bytes",
        "fused",
        "fused_us",
        "unfused",
        "unfus_us",
        "nccl_us",
        "unfus/fus",
        "nccl/fus",
        "fus-ar_us"
    )
}

/// One size's line of the targets table; `-` where a figure is missing.
pub fn summary_line(size: &EpilogueSize) -> String {
    let name = |figure: &Option<Figure>| {
        figure
            .as_ref()
            .map_or_else(|| "-".to_owned(), |figure| figure.profile.clone())
    };
    let us = |figure: &Option<Figure>| figure.as_ref().map(|figure| figure.median_us);
    let number = |value: Option<f64>, width: usize, digits: usize, suffix: &str| match value {
        Some(value) => format!("{:>w$}", format!("{value:.digits$}{suffix}"), w = width),
        None => format!("{:>width$}", "-"),
    };
    format!(
        "{:>6} {:>6} {:>10}  {:<24} {}  {:<24} {} {} {} {} {}",
        size.rows,
        size.hidden,
        size.bytes,
        name(&size.fused),
        number(us(&size.fused), 9, 2, ""),
        name(&size.unfused),
        number(us(&size.unfused), 9, 2, ""),
        number(us(&size.nccl), 9, 2, ""),
        number(size.unfused_over_fused, 10, 2, "x"),
        number(size.nccl_over_fused, 9, 2, "x"),
        number(size.fused_minus_all_reduce_us, 9, 2, ""),
    )
}

/// The decode emulation's column names with epilogues.
pub fn decode_columns() -> String {
    format!(
        "{:>6} {:>9}  {:<22} {:>11}  {:<22} {:>11} {:>11} {:>10} {:>8}",
        "batch",
        "elements",
        "tuned",
        "tuned_us",
        "unfused",
        "unfused_us",
        "nccl_us",
        "vs_unfus",
        "vs_nccl"
    )
}

/// One batch's line of the decode emulation with epilogues; `-` where no unfused candidate
/// runs.
pub fn decode_line(row: &DecodeRow) -> String {
    let unfused_us = row
        .unfused_us
        .map_or_else(|| "-".to_owned(), |us| format!("{us:.1}"));
    let versus = row
        .speedup_vs_unfused
        .map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}x"));
    format!(
        "{:>6} {:>9}  {:<22} {:>11.1}  {:<22} {unfused_us:>11} {:>11.1} {versus:>10} {:>7.2}x",
        row.batch,
        row.elements,
        row.tuned_profile,
        row.tuned_us,
        row.unfused_profile.as_deref().unwrap_or("-"),
        row.nccl_us,
        row.speedup
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{text, RowsWidth};

    fn ladder() -> Ladder {
        serde_json::from_str(include_str!(
            "../../tests/fixtures/ladders/valid/all_reduce_add_rms_norm.json"
        ))
        .expect("the fixture parses")
    }

    fn row(rows: u64, profile: &str, form: Form, median_us: Option<f64>) -> SizeRow {
        SizeRow {
            bytes: rows * 7168 * 2,
            bucket: 0,
            shape: Some(RowsWidth { rows, width: 7168 }),
            profile: profile.to_owned(),
            median_us,
            min_us: median_us,
            max_us: median_us,
            rounds: 25,
            ops_per_sample: 40,
            bus_gbps: Some(1.0),
            speedup_vs_nccl: Some(2.0),
            excluded: median_us.is_none().then(|| "dropped".to_owned()),
            chosen: false,
            form: Some(form),
            exact: median_us.map(|_| true),
        }
    }

    #[test]
    fn each_profile_has_its_form_and_the_plain_nccl_is_told_from_the_others() {
        let ladder = ladder();
        assert_eq!(Form::of(&ladder, 0, "fused_ll"), Some(Form::Fused));
        assert_eq!(Form::of(&ladder, 1, "fused_two_shot"), Some(Form::Fused));
        assert_eq!(Form::of(&ladder, 0, "one_shot_ll"), Some(Form::Separate));
        assert_eq!(Form::of(&ladder, 2, "copy_engine"), Some(Form::Separate));
        assert_eq!(Form::of(&ladder, 0, "nccl"), Some(Form::Nccl));
        assert_eq!(Form::of(&ladder, 2, "nccl_4cta"), Some(Form::NcclRankOrder));
        assert_eq!(
            Form::of(&ladder, 0, "nccl_rank_order"),
            Some(Form::NcclRankOrder)
        );
        assert_eq!(Form::of(&ladder, 0, "no_such_profile"), None);
        let all_reduce: Ladder =
            serde_json::from_str(include_str!("../../ladders/h200_nvlink_tp2.json"))
                .expect("the shipped ladder parses");
        let first = all_reduce.buckets[0].candidates[0].clone();
        assert_eq!(Form::of(&all_reduce, 0, &first), None);
    }

    #[test]
    fn the_default_tokens_are_powers_of_two_while_the_message_fits_the_ladder() {
        let mut ladder = ladder();
        // The fixture's last bucket: 4 MiB, 292 rows of 7168 bf16.
        assert_eq!(
            default_tokens(&ladder, 7168, 2),
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256]
        );
        ladder.buckets.last_mut().unwrap().max_bytes = 64 * 7168 * 2;
        assert_eq!(
            default_tokens(&ladder, 7168, 2),
            vec![1, 2, 4, 8, 16, 32, 64]
        );
        ladder.buckets.last_mut().unwrap().max_bytes = 64 * 7168 * 2 - 16;
        assert_eq!(default_tokens(&ladder, 7168, 2), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(default_tokens(&ladder, 16_777_216, 4), Vec::<u64>::new());
    }

    fn all_reduce_report(rows: &[(u64, &str, f64, bool)]) -> BenchReport {
        BenchReport {
            ladder: "h200_nvlink_tp2".to_owned(),
            collective: Collective::AllReduce,
            package: "b".repeat(64),
            world_size: 2,
            gpus: vec!["NVIDIA H200".to_owned(); 2],
            nccl_version: "2.28.9".to_owned(),
            driver_version: "580.159.04".to_owned(),
            rounds: 25,
            sizes: rows
                .iter()
                .map(|&(bytes, profile, median, chosen)| SizeRow {
                    bytes,
                    shape: None,
                    form: None,
                    exact: None,
                    chosen,
                    ..row(1, profile, Form::Fused, Some(median))
                })
                .collect(),
            decode_shape: None,
            decode: Vec::new(),
            serving: Vec::new(),
            epilogue: Vec::new(),
        }
    }

    /// Per size: the fastest of each form, the ratios over the fastest fused candidate, and
    /// the fused call over the all-reduce package's tuned choice at the same bytes.
    #[test]
    fn each_size_gives_the_fastest_of_each_form_and_the_ratios_over_fused() {
        let mut rows = vec![
            row(1, "fused_ll", Form::Fused, Some(4.0)),
            row(1, "fused_simple", Form::Fused, Some(5.0)),
            row(1, "one_shot_ll", Form::Separate, Some(6.0)),
            row(1, "one_shot_pull", Form::Separate, Some(5.5)),
            row(1, "nccl", Form::Nccl, Some(12.0)),
            // Faster, but not the plain NCCL.
            row(1, "nccl_rank_order", Form::NcclRankOrder, Some(11.0)),
            row(4, "fused_ll", Form::Fused, None),
            row(4, "one_shot_ll", Form::Separate, Some(6.5)),
        ];
        rows[0].chosen = true;
        rows[7].chosen = true;
        let against = all_reduce_report(&[
            (14_336, "one_shot_ll_64", 3.6, true),
            (14_336, "nccl", 7.0, false),
            (57_344, "nccl", 7.2, true),
        ]);
        let summary = summarize(&rows, Some(&against));
        assert_eq!(summary.len(), 2);
        let one = &summary[0];
        assert_eq!((one.rows, one.hidden, one.bytes), (1, 7168, 14_336));
        let figure = |profile: &str, median_us: f64| {
            Some(Figure {
                profile: profile.to_owned(),
                median_us,
            })
        };
        assert_eq!(one.chosen, figure("fused_ll", 4.0));
        assert_eq!(one.fused, figure("fused_ll", 4.0));
        assert_eq!(one.unfused, figure("one_shot_pull", 5.5));
        assert_eq!(one.nccl, figure("nccl", 12.0));
        assert_eq!(one.all_reduce, figure("one_shot_ll_64", 3.6));
        assert!((one.unfused_over_fused.unwrap() - 1.375).abs() < 1e-12);
        assert!((one.nccl_over_fused.unwrap() - 3.0).abs() < 1e-12);
        assert!((one.fused_minus_all_reduce_us.unwrap() - 0.4).abs() < 1e-12);
        // No fused figure at 4 tokens: no ratio, no difference; the choice is still named.
        let four = &summary[1];
        assert_eq!(four.fused, None);
        assert_eq!(four.chosen, figure("one_shot_ll", 6.5));
        assert_eq!(four.all_reduce, figure("nccl", 7.2));
        assert_eq!(
            (four.unfused_over_fused, four.fused_minus_all_reduce_us),
            (None, None)
        );
        // Without the all-reduce's report there is no difference.
        let alone = summarize(&rows, None);
        assert_eq!(alone[0].all_reduce, None);
        assert_eq!(alone[0].fused_minus_all_reduce_us, None);
        assert_eq!(alone[0].unfused_over_fused, one.unfused_over_fused);
    }

    #[test]
    fn an_all_reduce_report_of_another_run_is_refused_by_what_differs() {
        let report = all_reduce_report(&[]);
        let gpus = vec!["NVIDIA H200".to_owned(); 2];
        assert_eq!(check_against(&report, 2, &gpus), Ok(()));
        assert_eq!(
            check_against(&report, 4, &gpus).unwrap_err().to_string(),
            "it ran on 2 ranks, this run on 4"
        );
        let other = vec!["NVIDIA H100".to_owned(), "NVIDIA H100".to_owned()];
        assert_eq!(
            check_against(&report, 2, &other).unwrap_err().to_string(),
            "it ran on NVIDIA H200, NVIDIA H200, this run on NVIDIA H100, NVIDIA H100"
        );
        let fused = BenchReport {
            collective: Collective::AllReduceAddRmsNorm,
            ..report
        };
        assert_eq!(
            check_against(&fused, 2, &gpus).unwrap_err().to_string(),
            "it is a bench of all_reduce_add_rms_norm, not of all_reduce"
        );
    }

    /// The table gives each candidate's rows x hidden, form and check; the targets table and
    /// the decode lines write `-` for what is missing.
    #[test]
    fn the_lines_give_the_shape_the_form_the_check_and_the_ratios() {
        let collective = Collective::AllReduceAddRmsNorm;
        assert_eq!(
            text::size_columns(collective),
            "     bytes rows x hidden bucket  candidate              median_us    min_us    max_us    busbw  vs_nccl form            exact"
        );
        let mut fused = row(2, "fused_ll", Form::Fused, Some(4.25));
        fused.chosen = true;
        assert_eq!(
            text::size_line(collective, &fused),
            "     28672        2x7168      0 *fused_ll                    4.25      4.25      4.25      1.0    2.00x fused             yes"
        );
        let mut wrong = row(2, "nccl_rank_order", Form::NcclRankOrder, Some(9.0));
        wrong.exact = Some(false);
        assert!(
            text::size_line(collective, &wrong).ends_with(" nccl_rank_order    NO"),
            "{}",
            text::size_line(collective, &wrong)
        );
        assert_eq!(
            text::size_line(collective, &row(2, "one_shot_ll", Form::Separate, None)),
            "     28672        2x7168      0  one_shot_ll            excluded: dropped"
        );
        assert_eq!(
            text::above_ladder_line(collective, 1 << 30),
            "1073741824: above the last bucket: the bench does not time a all_reduce_add_rms_norm \
             in pieces; skipped"
        );
        let rows = [
            row(1, "fused_ll", Form::Fused, Some(4.0)),
            row(1, "one_shot_ll", Form::Separate, Some(5.5)),
        ];
        let summary = summarize(&rows, None);
        assert_eq!(
            summary_line(&summary[0]),
            "     1   7168      14336  fused_ll                      4.00  one_shot_ll                   5.50         -      1.38x         -         -"
        );
        assert_eq!(
            summary_columns(),
            "tokens hidden      bytes  fused                     fused_us  unfused                   unfus_us   nccl_us  unfus/fus  nccl/fus fus-ar_us"
        );
        let decode = DecodeRow {
            batch: 1,
            elements: 7168,
            tuned_profile: "fused_ll".to_owned(),
            tuned_us: 500.0,
            nccl_us: 1600.0,
            speedup: 3.2,
            unfused_profile: Some("one_shot_ll".to_owned()),
            unfused_us: Some(700.0),
            speedup_vs_unfused: Some(1.4),
        };
        assert_eq!(
            decode_line(&decode),
            "     1      7168  fused_ll                     500.0  one_shot_ll                  700.0      1600.0      1.40x    3.20x"
        );
        let alone = DecodeRow {
            unfused_profile: None,
            unfused_us: None,
            speedup_vs_unfused: None,
            ..decode
        };
        assert!(
            decode_line(&alone).contains("  -                      "),
            "{}",
            decode_line(&alone)
        );
    }

    /// An epilogue's report carries each row's form and check, the decode's unfused figures and
    /// the summary; an all-reduce's has none of those keys, and reads back the same.
    #[test]
    fn the_report_carries_the_forms_checks_and_summary_only_where_they_exist() {
        let rows = vec![
            row(1, "fused_ll", Form::Fused, Some(4.0)),
            row(1, "nccl_rank_order", Form::NcclRankOrder, Some(9.0)),
        ];
        let mut report = all_reduce_report(&[]);
        report.collective = Collective::AllReduceAddRmsNorm;
        report.epilogue = summarize(&rows, None);
        report.sizes = rows;
        let json = serde_json::to_value(&report).expect("a report serializes");
        assert_eq!(json["sizes"][0]["form"], "fused");
        assert_eq!(json["sizes"][1]["form"], "nccl_rank_order");
        assert_eq!(json["sizes"][0]["exact"], true);
        assert_eq!(json["epilogue"][0]["fused"]["profile"], "fused_ll");
        assert_eq!(json["epilogue"][0]["nccl"], serde_json::Value::Null);
        assert!(json["epilogue"][0].get("all_reduce").is_none(), "{json}");
        let read: BenchReport = serde_json::from_value(json).expect("it reads back");
        assert_eq!(read, report);
        let plain = all_reduce_report(&[(8192, "one_shot_ll_64", 4.3, true)]);
        let json = serde_json::to_value(&plain).expect("a report serializes");
        for key in ["form", "exact"] {
            assert!(json["sizes"][0].get(key).is_none(), "{json}");
        }
        assert!(json.get("epilogue").is_none(), "{json}");
    }
}
