//! The bench's summaries over its rows, the bus bandwidth of each collective, the shape a
//! reduce-scatter or all-gather is timed at, and the report and its lines per collective.

use super::*;

fn row(bytes: u64, profile: &str, median_us: Option<f64>, chosen: bool) -> SizeRow {
    SizeRow {
        bytes,
        bucket: 0,
        shape: None,
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
        form: None,
        exact: None,
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
        epilogue: Vec::new(),
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

/// The rules the PyTorch bench holds too, written once as data.
fn rules() -> serde_json::Value {
    serde_json::from_str(include_str!(
        "../../tests/fixtures/bench/collective_rules.json"
    ))
    .expect("the rules parse")
}

/// Every collective's bus factor is the shared table's.
#[test]
fn the_bus_factors_are_the_shared_table_s() {
    let table = rules();
    let cases = table["bus_factor"].as_array().expect("a list");
    assert_eq!(cases.len(), 20);
    for case in cases {
        let collective: Collective =
            serde_json::from_value(case["collective"].clone()).expect("a collective");
        let world = case["world"].as_u64().expect("a world") as u32;
        let factor = case["factor"].as_f64().expect("a factor");
        assert!(
            (bus_factor(collective, world) - factor).abs() < 1e-12,
            "{collective} on {world} ranks"
        );
    }
}

/// A row collective is timed at rows of 4096 elements (fewer where that gives every rank a
/// row), rounded up, down where that leaves the bucket, else rows of one element.
#[test]
fn the_shape_a_size_is_timed_at_is_the_shared_table_s() {
    let table = rules();
    let cases = table["bench_shape"].as_array().expect("a list");
    assert!(cases.len() >= 10);
    for case in cases {
        let number = |key: &str| case[key].as_u64().expect(key);
        let bucket = case["bucket"]
            .as_array()
            .map(|edges| (edges[0].as_u64().unwrap(), edges[1].as_u64().unwrap()));
        let shape = bench_shape(
            number("bytes"),
            number("element_bytes"),
            number("world") as u32,
            bucket,
        );
        assert_eq!(
            (shape.rows(), shape.width()),
            (number("rows"), number("width")),
            "{case}"
        );
        if let Some((min, max)) = bucket {
            assert!((min..=max).contains(&(shape.elements() * number("element_bytes"))));
        }
    }
}

proptest::proptest! {
    /// Whatever the size, the shape's message lies in the bucket, is at most a row away from
    /// the size, and no row is wider than the bench's width.
    #[test]
    fn the_shape_stays_in_its_bucket_and_near_the_size(
        bytes in 1u64..(1 << 28),
        fp32 in proptest::bool::ANY,
        world in 1u32..=8,
        below in 0u64..(1 << 20),
        above in 0u64..(1 << 20),
    ) {
        let element_bytes = if fp32 { 4 } else { 2 };
        let elements = bytes.div_ceil(element_bytes);
        let min = (elements.saturating_sub(below / element_bytes)).max(1) * element_bytes;
        let max = (elements + above / element_bytes) * element_bytes;
        let shape = bench_shape(bytes, element_bytes, world, Some((min, max)));
        let timed = shape.elements() * element_bytes;
        proptest::prop_assert!((min..=max).contains(&timed));
        proptest::prop_assert!(shape.width() <= BENCH_WIDTH);
        proptest::prop_assert!(shape.elements().abs_diff(elements) < shape.width().max(2));
    }
}

fn rows_report(collective: Collective) -> BenchReport {
    let mut timed = row(1 << 20, "one_shot_pull", Some(9.5), true);
    timed.shape = Some(RowsWidth {
        rows: 128,
        width: 4096,
    });
    BenchReport {
        ladder: "tp2".to_owned(),
        collective,
        package: "a".repeat(64),
        world_size: 2,
        gpus: vec!["NVIDIA H200".to_owned(); 2],
        nccl_version: "2.28.9".to_owned(),
        driver_version: "580.159.04".to_owned(),
        rounds: 25,
        sizes: vec![timed],
        decode_shape: None,
        decode: Vec::new(),
        serving: Vec::new(),
        epilogue: Vec::new(),
    }
}

/// A reduce-scatter's or all-gather's row carries its rows and width; an all-reduce's row has
/// none, and one written without reads back without.
#[test]
fn a_row_collective_s_report_carries_each_size_s_shape() {
    for collective in [Collective::ReduceScatter, Collective::AllGather] {
        let report = rows_report(collective);
        let json = serde_json::to_value(&report).expect("a report serializes");
        assert_eq!(json["collective"], serde_json::json!(collective));
        assert_eq!(
            json["sizes"][0]["shape"],
            serde_json::json!({"rows": 128, "width": 4096})
        );
        let read: BenchReport = serde_json::from_value(json).expect("it reads back");
        assert_eq!(read, report);
    }
    let mut report = rows_report(Collective::AllReduce);
    report.sizes[0].shape = None;
    let json = serde_json::to_value(&report).expect("a report serializes");
    assert!(json["sizes"][0].get("shape").is_none(), "{json}");
    let read: BenchReport = serde_json::from_value(json).expect("it reads back");
    assert_eq!(read.sizes[0].shape, None);
}

/// The all-reduce's lines are what the bench has always printed.
#[test]
fn the_all_reduce_s_lines_are_unchanged() {
    let collective = Collective::AllReduce;
    assert_eq!(
        text::heading(collective, crate::ladder::Dtype::Bf16, 2, "h200_nvlink_tp2"),
        "all_reduce bf16 on 2 ranks (h200_nvlink_tp2); busbw: bytes x 2(n-1)/n / time, GB/s"
    );
    assert_eq!(
        text::size_columns(collective),
        format!(
            "{:>10} {:>6}  {:<22} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "bytes", "bucket", "candidate", "median_us", "min_us", "max_us", "busbw", "vs_nccl"
        )
    );
    let mut timed = row(8192, "one_shot_ll_64", Some(4.29), true);
    timed.bus_gbps = Some(1.91);
    timed.speedup_vs_nccl = Some(1.64);
    assert_eq!(
        text::size_line(collective, &timed),
        "      8192      0 *one_shot_ll_64              4.29      4.29      4.29      1.9    1.64x"
    );
    assert_eq!(
        text::size_line(collective, &row(8192, "pull", None, false)),
        "      8192      0  pull                   excluded: dropped"
    );
    assert_eq!(
        text::decode_heading(
            collective,
            crate::ladder::Dtype::Bf16,
            &DecodeShape::default()
        ),
        "decode emulation: 61 layers x 2 all-reduces of batch x 7168 bf16 in one graph"
    );
    assert!(text::above_ladder_line(collective, 1 << 30).contains("whose winner is NCCL"));
}

/// A reduce-scatter's and an all-gather's lines name the collective and give each size's rows
/// x width under its own column.
#[test]
fn a_row_collective_s_lines_name_it_and_give_the_shape() {
    for (collective, name, plural) in [
        (
            Collective::ReduceScatter,
            "reduce_scatter",
            "reduce-scatters",
        ),
        (Collective::AllGather, "all_gather", "all-gathers"),
    ] {
        let heading = text::heading(collective, crate::ladder::Dtype::Fp32, 4, "tp4");
        assert_eq!(
            heading,
            format!("{name} fp32 on 4 ranks (tp4); busbw: bytes x (n-1)/n / time, GB/s")
        );
        let columns = text::size_columns(collective);
        let report = rows_report(collective);
        let line = text::size_line(collective, &report.sizes[0]);
        let at = columns.find("rows x width").expect("a shape column");
        let end = at + "rows x width".len();
        assert_eq!(
            &line[end - "128x4096".len()..end],
            "128x4096",
            "{columns}\n{line}"
        );
        assert!(line.starts_with("   1048576 "), "{line}");
        assert!(text::size_line(collective, &row(16, "nccl", None, false)).contains(" - "));
        assert_eq!(
            text::decode_heading(
                collective,
                crate::ladder::Dtype::Bf16,
                &DecodeShape::default()
            ),
            format!(
                "decode emulation: 61 layers x 2 {plural} of batch rows x 7168 bf16 in one graph"
            )
        );
        let above = text::above_ladder_line(collective, 1 << 30);
        assert!(
            above.contains(&format!("the bench does not time a {name} in pieces")),
            "{above}"
        );
    }
}

/// The serving table's line: the size, the bucket, the chosen candidate, the four paths and the
/// extra of any tensor over zero copy; a path not timed (no in-place zero copy) is NaN.
#[test]
fn a_serving_line_gives_every_path_and_the_extra() {
    let row = ServingRow {
        bytes: 4096,
        bucket: 2,
        profile: "one_shot_pull".to_owned(),
        zero_copy_us: 3.25,
        zero_copy_in_place_us: None,
        any_tensor_us: 4.0,
        any_tensor_in_place_us: 4.5,
    };
    assert_eq!(
        text::serving_line(&row),
        "      4096      2  one_shot_pull               3.25       NaN      4.00      4.50     +0.75"
    );
    assert_eq!(text::serving_heading().lines().count(), 2);
}
