//! The bench's summaries over its rows, and the bus bandwidth of each collective.

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

/// nccl-tests' factors: 2(n-1)/n for the all-reduce and the fused one, (n-1)/n for the
/// reduce-scatter and the all-gather, 0 on one rank.
#[test]
fn each_collective_has_its_own_bus_bandwidth_factor() {
    for (world, all_reduce, half) in [
        (1, 0.0, 0.0),
        (2, 1.0, 0.5),
        (4, 1.5, 0.75),
        (8, 1.75, 0.875),
    ] {
        for (collective, factor) in [
            (Collective::AllReduce, all_reduce),
            (Collective::AllReduceAddRmsNorm, all_reduce),
            (Collective::ReduceScatter, half),
            (Collective::AllGather, half),
        ] {
            assert_eq!(
                bus_factor(collective, world).to_bits(),
                f64::to_bits(factor),
                "{collective} on {world} ranks"
            );
        }
    }
    // 64 MiB in 200 us on 8 ranks: 335.5 GB/s of algorithm bandwidth.
    let bytes = 64 << 20;
    let algorithm = bytes as f64 / (200.0 * 1e3);
    for (collective, factor) in [
        (Collective::AllReduce, 1.75),
        (Collective::ReduceScatter, 0.875),
        (Collective::AllGather, 0.875),
    ] {
        let gbps = bus_gbps(collective, 8, bytes, 200.0);
        assert!(
            (gbps / (algorithm * factor) - 1.0).abs() < 1e-12,
            "{collective}: {gbps}"
        );
    }
    assert_eq!(
        bus_formula(Collective::AllReduce),
        "bytes x 2(n-1)/n / time"
    );
    assert_eq!(bus_formula(Collective::AllGather), "bytes x (n-1)/n / time");
}

/// The all-reduce's bus bandwidth is the same number, bit for bit, as the bench has always
/// written.
#[test]
fn the_all_reduce_s_bus_bandwidth_is_unchanged() {
    for world in 2..=8_u32 {
        for (bytes, median_us) in [
            (2_u64, 3.73),
            (8 << 10, 4.29),
            (64 << 20, 210.6),
            (393_216, 9.43),
        ] {
            let factor = 2.0 * f64::from(world - 1) / f64::from(world);
            let before = bytes as f64 * factor / (median_us * 1e3);
            assert_eq!(
                bus_gbps(Collective::AllReduce, world, bytes, median_us).to_bits(),
                before.to_bits(),
                "{bytes} bytes on {world} ranks"
            );
        }
    }
}

/// A report names its collective; one written before it did reads as an all-reduce.
#[test]
fn a_report_names_its_collective_and_an_older_one_is_an_all_reduce() {
    let report = BenchReport {
        ladder: "tp2".to_owned(),
        collective: Collective::ReduceScatter,
        package: "a".repeat(64),
        world_size: 2,
        gpus: vec!["NVIDIA H200".to_owned(); 2],
        nccl_version: "2.28.9".to_owned(),
        driver_version: "580.159.04".to_owned(),
        rounds: 25,
        sizes: vec![row(16, "nccl", Some(6.0), true)],
        decode_shape: None,
        decode: Vec::new(),
        serving: Vec::new(),
    };
    let mut json = serde_json::to_value(&report).expect("a report serializes");
    assert_eq!(json["collective"], "reduce_scatter");
    let read: BenchReport = serde_json::from_value(json.clone()).expect("a report reads back");
    assert_eq!(read, report);
    json.as_object_mut()
        .expect("an object")
        .remove("collective");
    let older: BenchReport = serde_json::from_value(json).expect("an older report reads");
    assert_eq!(older.collective, Collective::AllReduce);
}
