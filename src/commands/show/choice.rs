//! The choice `prepare show --choice` prints after its package: its header, each bucket's
//! decision, and every candidate's timings.

use std::fmt::Write as _;
use std::path::Path;

use prepare::decimal::trimmed;
use prepare::tune::choice::{BucketChoice, Choice, Tuning};
use prepare::tune::{CandidateOutcome, DecisionReason, Policy, SizeFigures};

use super::text::{exact_size, glued, message_range, paragraph, yes_no, Align, Table};

/// Writes the choice read from `path`; `width` as the package's tables.
pub fn render_choice(out: &mut String, path: &Path, choice: &Choice, width: Option<usize>) {
    let _ = writeln!(out, "\nChoice");
    let mut header = Table::new(&[Align::Left, Align::Left]);
    header.row(["File", &path.display().to_string()]);
    header.row([
        "Ladder",
        &format!("{}, {} ranks", choice.ladder, choice.world_size),
    ]);
    header.row([
        "Tuning",
        match choice.tuning {
            Tuning::Runtime => "runtime: each bucket's candidates timed on the GPUs it was made on",
            Tuning::Static => "static: each bucket's default, nothing timed",
        },
    ]);
    header.row(["Policy", &describe_policy(&choice.policy)]);
    header.row(["Topology", &choice.topology]);
    header.row([
        "Fingerprint",
        &format!("{} (its cache key)", choice.fingerprint),
    ]);
    header.row([
        "Made by",
        &format!(
            "prepare {} (choice format {})",
            choice.tool_version, choice.format_version
        ),
    ]);
    header.render(out, width);
    let _ = writeln!(out);
    render_decisions(out, choice, width);
    let _ = writeln!(out);
    paragraph(
        out,
        &format!("Above the largest bucket: {}", choice.above_ladder.reason),
        width,
        0,
        2,
    );
    if choice.tuning == Tuning::Static {
        let _ = writeln!(
            out,
            "\nTimings: none (static tuning uses each bucket's default and times nothing)."
        );
        return;
    }
    let _ = writeln!(out);
    render_timings(out, choice, width);
}

/// Each bucket's winner, baseline and exactness, and why the winner won: in a column of its
/// own when wide (no width), else under the bucket's line.
fn render_decisions(out: &mut String, choice: &Choice, width: Option<usize>) {
    let mut decisions = Table::indexed(6);
    let head = ["#", "messages", "winner", "baseline", "bit-exact"];
    if width.is_some() {
        decisions.row(head);
    } else {
        decisions.row([head[0], head[1], head[2], head[3], head[4], "reason"]);
    }
    let mut previous_max = 0;
    for bucket in &choice.buckets {
        let decision = &bucket.decision;
        let index = decision.index.to_string();
        let messages = message_range(previous_max, bucket.max_bytes);
        let row = [
            index.as_str(),
            &messages,
            &decision.winner,
            &decision.baseline,
            yes_no(decision.bit_exact),
        ];
        let reason = describe_reason(bucket, choice);
        if width.is_some() {
            decisions.row(row);
            decisions.note(1, reason);
        } else {
            decisions.row([row[0], row[1], row[2], row[3], row[4], &reason]);
        }
        previous_max = bucket.max_bytes;
    }
    decisions.render(out, width);
}

/// Every candidate's medians per size, slowdown and rounds, bucket by bucket under a line that
/// names the sizes.
fn render_timings(out: &mut String, choice: &Choice, width: Option<usize>) {
    paragraph(
        out,
        "Timings (median microseconds per operation at each bucket's smallest and largest \
         message; per round the slowest rank counts)",
        width,
        0,
        0,
    );
    let mut table = Table::new(&[
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Right,
        Align::Left,
    ]);
    table.row([
        "#",
        "candidate",
        "median (us)",
        "slowdown",
        "vs baseline",
        "rounds",
        "exact",
    ]);
    for bucket in &choice.buckets {
        let decision = &bucket.decision;
        let baseline_slowdown = decision
            .candidates
            .iter()
            .find(|candidate| candidate.profile == decision.baseline)
            .and_then(|candidate| match candidate.outcome {
                CandidateOutcome::Timed { slowdown, .. } => Some(slowdown),
                CandidateOutcome::Excluded { .. } => None,
            });
        let sizes = decision
            .candidates
            .iter()
            .find_map(|candidate| match &candidate.outcome {
                CandidateOutcome::Timed { sizes, .. } => Some(
                    sizes
                        .iter()
                        .map(|figures| exact_size(figures.bytes))
                        .collect::<Vec<_>>()
                        .join(" and "),
                ),
                CandidateOutcome::Excluded { .. } => None,
            })
            .map_or_else(|| "nothing timed".to_owned(), |sizes| format!("at {sizes}"));
        table.row([&decision.index.to_string(), &sizes]);
        for candidate in &decision.candidates {
            let mut name = candidate.profile.clone();
            match (
                candidate.profile == decision.winner,
                candidate.profile == decision.baseline,
            ) {
                (true, true) => name.push_str(" [winner, baseline]"),
                (true, false) => name.push_str(" [winner]"),
                (false, true) => name.push_str(" [baseline]"),
                (false, false) => {}
            }
            match &candidate.outcome {
                CandidateOutcome::Timed { slowdown, sizes } => table.row([
                    "",
                    &name,
                    &sizes
                        .iter()
                        .map(|figures| format!("{:.2}", figures.median_us))
                        .collect::<Vec<_>>()
                        .join(", "),
                    &format!("{slowdown:.3}x"),
                    &baseline_slowdown.map_or_else(
                        || "-".to_string(),
                        |base| format!("{:.3}x", slowdown / base),
                    ),
                    &rounds_text(sizes),
                    yes_no(candidate.exact),
                ]),
                CandidateOutcome::Excluded { reason } => {
                    table.row(["", &name, &format!("excluded: {reason}")]);
                }
            }
        }
    }
    table.render(out, width);
    for footnote in [
        "slowdown: the largest, over the sizes, of the candidate's median over the best median \
         at that size; vs baseline: its slowdown over the baseline's, the ratio the margin \
         applies to.",
        "The baseline is the bucket's default if it was timed, else its first timed candidate; \
         each size's fastest and slowest round are in the choice file.",
    ] {
        paragraph(out, footnote, width, 0, 2);
    }
}

/// Rounds with a valid sample from every rank: one number when every size had as many.
fn rounds_text(sizes: &[SizeFigures]) -> String {
    let mut rounds: Vec<usize> = sizes.iter().map(|figures| figures.rounds).collect();
    if rounds.windows(2).all(|pair| pair[0] == pair[1]) {
        rounds.truncate(1);
    }
    rounds
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_policy(policy: &Policy) -> String {
    format!(
        "margin {}%, significance p < {} (Mann-Whitney U over rounds), {}",
        trimmed(policy.margin * 100.0, 2),
        trimmed(policy.significance, 6),
        if policy.exact_only {
            "exact only"
        } else {
            "inexact allowed"
        }
    )
}

/// Why a bucket's winner won, in words.
fn describe_reason(bucket: &BucketChoice, choice: &Choice) -> String {
    let decision = &bucket.decision;
    let baseline = &decision.baseline;
    if choice.tuning == Tuning::Static {
        return "the bucket's default (static tuning)".to_string();
    }
    match &decision.reason {
        DecisionReason::BaselineFastest => {
            let timed = decision
                .candidates
                .iter()
                .filter(|candidate| matches!(candidate.outcome, CandidateOutcome::Timed { .. }))
                .count();
            if timed == 1 {
                "the only candidate timed".to_string()
            } else {
                "baseline fastest".to_string()
            }
        }
        DecisionReason::WithinMargin { fastest, ratio } => format!(
            "within the {}% margin of {baseline} (fastest {fastest}, {ratio:.3}x)",
            trimmed(choice.policy.margin * 100.0, 2)
        ),
        DecisionReason::NotSignificant {
            fastest,
            ratio,
            tested_bytes,
            p_value,
        } => format!(
            "not significantly faster than {baseline} (fastest {fastest}, {ratio:.3}x, {} at {})",
            p_text(*p_value),
            glued(&exact_size(*tested_bytes))
        ),
        DecisionReason::Faster {
            ratio,
            tested_bytes,
            p_value,
        } => format!(
            "faster than {baseline} by {:.1}% ({} at {})",
            (1.0 - ratio) * 100.0,
            p_text(*p_value),
            glued(&exact_size(*tested_bytes))
        ),
    }
}

/// A p-value as `p=0.04`, or `p<0.0001` below what four decimals show.
fn p_text(p_value: f64) -> String {
    if p_value < 1e-4 {
        "p<0.0001".to_string()
    } else {
        format!("p={}", trimmed(p_value, 4))
    }
}

#[cfg(test)]
mod tests {
    use super::{describe_reason, p_text, rounds_text, trimmed};
    use prepare::tune::choice::{BucketChoice, Choice, Tuning, CHOICE_FORMAT_VERSION};
    use prepare::tune::{
        BucketDecision, CandidateOutcome, CandidateResult, DecisionReason, Policy, SizeFigures,
    };

    fn choice(reason: DecisionReason, timed: usize, tuning: Tuning) -> Choice {
        let candidate = |profile: &str, outcome| CandidateResult {
            profile: profile.to_owned(),
            exact: true,
            outcome,
        };
        let timed_outcome = CandidateOutcome::Timed {
            slowdown: 1.0,
            sizes: vec![
                SizeFigures {
                    bytes: 2,
                    median_us: 8.0,
                    min_us: 7.5,
                    max_us: 9.0,
                    rounds: 30,
                },
                SizeFigures {
                    bytes: 16_384,
                    median_us: 10.0,
                    min_us: 9.0,
                    max_us: 11.0,
                    rounds: 30,
                },
            ],
        };
        let excluded = CandidateOutcome::Excluded {
            reason: "capture failed: out of memory".to_owned(),
        };
        Choice {
            format_version: CHOICE_FORMAT_VERSION,
            tool_version: prepare::TOOL_VERSION.to_owned(),
            package: "ab".repeat(32),
            ladder: "ladder".to_owned(),
            world_size: 2,
            fingerprint: "cd".repeat(32),
            topology: "peer_kernels".to_owned(),
            tuning,
            policy: Policy {
                margin: 0.025,
                ..Policy::default()
            },
            buckets: vec![BucketChoice {
                min_bytes: 2,
                max_bytes: 16_384,
                decision: BucketDecision {
                    index: 0,
                    winner: "nccl".to_owned(),
                    baseline: "nccl".to_owned(),
                    reason,
                    bit_exact: true,
                    candidates: vec![
                        candidate("nccl", timed_outcome.clone()),
                        candidate(
                            "one_shot_pull",
                            if timed > 1 { timed_outcome } else { excluded },
                        ),
                    ],
                },
            }],
            above_ladder: prepare::pieces::nccl_untimed(
                "the largest bucket chose nccl, NCCL, so pieces would be NCCL too",
            ),
        }
    }

    fn reason_words(reason: DecisionReason, timed: usize, tuning: Tuning) -> String {
        let choice = choice(reason, timed, tuning);
        super::super::text::plain(&describe_reason(&choice.buckets[0], &choice))
    }

    #[test]
    fn every_reason_reads_as_words() {
        let cases = [
            (DecisionReason::BaselineFastest, 2, "baseline fastest"),
            (
                DecisionReason::BaselineFastest,
                1,
                "the only candidate timed",
            ),
            (
                DecisionReason::WithinMargin {
                    fastest: "one_shot_pull".to_owned(),
                    ratio: 0.985,
                },
                2,
                "within the 2.5% margin of nccl (fastest one_shot_pull, 0.985x)",
            ),
            (
                DecisionReason::NotSignificant {
                    fastest: "one_shot_pull".to_owned(),
                    ratio: 0.95,
                    tested_bytes: 2,
                    p_value: 0.04,
                },
                2,
                "not significantly faster than nccl (fastest one_shot_pull, 0.950x, p=0.04 at 2 B)",
            ),
            (
                DecisionReason::Faster {
                    ratio: 0.818,
                    tested_bytes: 16_384,
                    p_value: 0.0001,
                },
                2,
                "faster than nccl by 18.2% (p=0.0001 at 16 KiB)",
            ),
        ];
        for (reason, timed, expected) in cases {
            assert_eq!(reason_words(reason, timed, Tuning::Runtime), expected);
        }
        assert_eq!(
            reason_words(DecisionReason::BaselineFastest, 2, Tuning::Static),
            "the bucket's default (static tuning)"
        );
    }

    #[test]
    fn p_values_and_percentages_drop_trailing_zeros() {
        assert_eq!(p_text(0.04), "p=0.04");
        assert_eq!(p_text(0.012_345), "p=0.0123");
        assert_eq!(p_text(1.0), "p=1");
        assert_eq!(p_text(0.000_099), "p<0.0001");
        assert_eq!(p_text(1e-12), "p<0.0001");
        assert_eq!(trimmed(0.03 * 100.0, 2), "3");
    }

    #[test]
    fn rounds_are_one_number_when_every_size_had_as_many() {
        let figures = |rounds| SizeFigures {
            bytes: 2,
            median_us: 1.0,
            min_us: 1.0,
            max_us: 1.0,
            rounds,
        };
        assert_eq!(rounds_text(&[figures(25), figures(25)]), "25");
        assert_eq!(rounds_text(&[figures(25), figures(24)]), "25, 24");
        assert_eq!(rounds_text(&[figures(7)]), "7");
    }
}
