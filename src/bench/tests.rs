//! The bench's summaries over its rows.

use super::*;

fn row(bytes: u64, profile: &str, median_us: Option<f64>, chosen: bool) -> SizeRow {
    SizeRow {
        bytes,
        bucket: 0,
        profile: profile.to_owned(),
        median_us,
        min_us: median_us,
        max_us: median_us,
        rounds: 15,
        ops_per_sample: 1,
        bus_gbps: None,
        speedup_vs_nccl: None,
        excluded: median_us.is_none().then(|| "dropped".to_owned()),
        chosen,
    }
}

/// The largest gap is the size where the choice is furthest behind that size's fastest
/// contender, NCCL included; an excluded contender never counts as the fastest.
#[test]
fn the_largest_choice_gap_is_against_each_sizes_fastest_contender() {
    let rows = [
        row(16, "ll_64", Some(3.12), true),
        row(16, "ll_128", Some(3.03), false),
        row(16, "pull", None, false),
        row(1024, "ll_64", Some(3.31), true),
        row(1024, "nccl", Some(3.20), false),
        row(4096, "simple", Some(5.0), true),
        row(4096, "nccl", Some(6.0), false),
    ];
    let gap = largest_choice_gap(&rows).expect("a timed choice");
    assert_eq!(gap.bytes, 1024);
    assert_eq!(gap.chosen, ("ll_64".to_owned(), 3.31));
    assert_eq!(gap.best, ("nccl".to_owned(), 3.20));
    assert!((gap.behind() - (3.31 / 3.20 - 1.0)).abs() < 1e-12);
}

/// Where the choice is the fastest everywhere the gap is zero, at the first size; with no
/// timed choice there is none.
#[test]
fn a_choice_that_is_fastest_everywhere_is_zero_behind() {
    let rows = [
        row(16, "ll_64", Some(3.0), true),
        row(16, "nccl", Some(6.0), false),
        row(32, "ll_64", Some(3.1), true),
    ];
    let gap = largest_choice_gap(&rows).expect("a timed choice");
    assert_eq!((gap.bytes, gap.behind()), (16, 0.0));
    assert_eq!(gap.best.0, "ll_64");
    assert!(largest_choice_gap(&[row(16, "ll_64", None, true)]).is_none());
}
