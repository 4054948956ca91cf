//! The bench plots: every file is written, holds what a reader looks for (contenders, the tuned
//! choice, human sizes, the titles), gives every series a style of its own, is the same bytes
//! for the same report, and a failure names the file it was writing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use prepare::bench::plot::{
    contender_style, write_plots, PlotError, SeriesStyle, CHOICE_STYLE, DISTINCT_STYLES, NCCL_STYLE,
};
use prepare::bench::{BenchReport, DecodeRow, DecodeShape, SizeRow};
use prepare::ladder::Collective;

const PROFILES: [&str; 6] = [
    "nccl",
    "one_shot_bf16",
    "two_shot_bf16",
    "rsag_phased_bf16",
    "ring_pipelined_bf16",
    "tree_bf16",
];

const KIB: u64 = 1024;

/// A bench of six contenders over 8 KiB..64 MiB on 8 ranks: latency grows with size at a rate
/// each contender has its own, one-shot is excluded above 1 MiB and the tree never runs, and the
/// fastest timed contender at each size is the choice.
fn report() -> BenchReport {
    let world_size = 8;
    let mut sizes = Vec::new();
    let mut bytes = 8 * KIB;
    while bytes <= 64 * KIB * KIB {
        let megabytes = bytes as f64 / 1e6;
        let rows: Vec<SizeRow> = PROFILES
            .iter()
            .enumerate()
            .map(|(index, profile)| {
                let (base_us, us_per_megabyte) = [
                    (18.0, 2.9),
                    (6.0, 9.0),
                    (9.0, 3.4),
                    (11.0, 2.8),
                    (14.0, 2.7),
                    (0.0, 0.0),
                ][index];
                let excluded = match *profile {
                    "one_shot_bf16" if bytes > KIB * KIB => Some("above its largest size".into()),
                    "tree_bf16" => Some("needs a power-of-two tree over NVLink".into()),
                    _ => None,
                };
                let median_us = excluded
                    .is_none()
                    .then_some(base_us + us_per_megabyte * megabytes);
                let bus_gbps = median_us.map(|median| {
                    bytes as f64 * 2.0 * f64::from(world_size - 1)
                        / f64::from(world_size)
                        / (median * 1e3)
                });
                SizeRow {
                    bytes,
                    bucket: bytes.trailing_zeros() as usize,
                    shape: None,
                    profile: (*profile).to_owned(),
                    median_us,
                    min_us: median_us.map(|median| median * 0.97),
                    max_us: median_us.map(|median| median * 1.05),
                    rounds: if median_us.is_some() { 20 } else { 0 },
                    ops_per_sample: 16,
                    bus_gbps,
                    speedup_vs_nccl: None,
                    excluded,
                    chosen: false,
                    form: None,
                    exact: None,
                }
            })
            .collect();
        let nccl = rows[0].median_us.expect("NCCL is always timed");
        let fastest = rows
            .iter()
            .enumerate()
            .filter_map(|(index, row)| Some((index, row.median_us?)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(index, _)| index)
            .expect("NCCL is timed");
        sizes.extend(rows.into_iter().enumerate().map(|(index, mut row)| {
            row.speedup_vs_nccl = row.median_us.map(|median| nccl / median);
            row.chosen = index == fastest;
            row
        }));
        bytes *= 2;
    }
    let shape = DecodeShape::default();
    let decode = (0..7)
        .map(|exponent| {
            let batch = 1usize << exponent;
            let tuned_us = 610.0 + 14.0 * batch as f64;
            let nccl_us = 2300.0 + 16.0 * batch as f64;
            DecodeRow {
                batch,
                elements: batch * shape.hidden,
                tuned_profile: "one_shot_bf16".to_owned(),
                tuned_us,
                nccl_us,
                speedup: nccl_us / tuned_us,
                unfused_profile: None,
                unfused_us: None,
                speedup_vs_unfused: None,
            }
        })
        .collect();
    BenchReport {
        ladder: "h200_nvlink".to_owned(),
        collective: Collective::AllReduce,
        package: "a".repeat(64),
        world_size,
        gpus: vec!["NVIDIA H200".to_owned(); world_size as usize],
        nccl_version: "2.28.9".to_owned(),
        driver_version: "580.159.04".to_owned(),
        rounds: 20,
        sizes,
        decode_shape: Some(shape),
        decode,
        serving: Vec::new(),
        epilogue: Vec::new(),
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn names(paths: &[PathBuf]) -> Vec<&str> {
    paths
        .iter()
        .map(|path| path.file_name().unwrap().to_str().unwrap())
        .collect()
}

/// A document plotters closed: one root element, every `<text>` closed.
fn assert_well_formed(svg: &str, file: &str) {
    assert!(svg.starts_with("<svg"), "{file} does not open with <svg");
    assert!(svg.trim_end().ends_with("</svg>"), "{file} is not closed");
    assert_eq!(svg.matches("<svg").count(), 1, "{file}");
    assert_eq!(
        svg.matches("<text").count(),
        svg.matches("</text>").count(),
        "{file} has an unclosed <text>"
    );
}

/// The text of every `<text>` element, trimmed.
fn texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|element| {
            let body = &element[element.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim())
        })
        .collect()
}

#[test]
fn every_plot_is_written_with_its_contenders_and_the_choice() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_plots(&report(), dir.path()).unwrap();
    assert_eq!(
        names(&written),
        ["latency.svg", "bus_bandwidth.svg", "decode.svg"]
    );
    for path in &written {
        assert_eq!(path.parent(), Some(dir.path()));
    }
    let mut present: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    present.sort();
    // No temporary file is left beside the plots.
    assert_eq!(present, ["bus_bandwidth.svg", "decode.svg", "latency.svg"]);

    for file in ["latency.svg", "bus_bandwidth.svg"] {
        let svg = read(&dir.path().join(file));
        assert_well_formed(&svg, file);
        let texts = texts(&svg);
        // The tree never ran, so it has no line and no legend entry.
        for profile in &PROFILES[..5] {
            assert!(
                texts.contains(profile),
                "{file} has no legend for {profile}"
            );
        }
        assert!(
            !texts.contains(&"tree_bf16"),
            "{file} draws an untimed contender"
        );
        assert!(texts.contains(&"tuned choice"), "{file}: {texts:?}");
        assert!(texts.contains(&"message size"), "{file}: {texts:?}");
        for label in ["16 KiB", "1 MiB", "64 MiB"] {
            assert!(
                texts.contains(&label),
                "{file} has no {label} tick: {texts:?}"
            );
        }
        assert!(
            texts
                .iter()
                .any(|text| text.starts_with("h200_nvlink") && text.ends_with("8 x NVIDIA H200")),
            "{file} has no title naming the ladder and machine: {texts:?}"
        );
        // NCCL in black, the choice in rings.
        assert!(svg.contains(r##"stroke="#000000""##), "{file}");
        assert!(
            svg.contains("<circle") && svg.contains(r#"r="8""#),
            "{file}"
        );
    }

    let decode = read(&dir.path().join("decode.svg"));
    assert_well_formed(&decode, "decode.svg");
    let texts = texts(&decode);
    for expected in ["tuned choice", "NCCL alone", "batch rows", "1", "8", "64"] {
        assert!(
            texts.contains(&expected),
            "decode.svg has no {expected}: {texts:?}"
        );
    }
    let title = texts
        .iter()
        .find(|text| text.starts_with("h200_nvlink"))
        .expect("decode.svg has a title");
    for part in [
        "61 layers",
        "2 all-reduces",
        "hidden 7168",
        "8 x NVIDIA H200",
    ] {
        assert!(
            title.contains(part),
            "decode title {title:?} lacks {part:?}"
        );
    }
}

#[test]
fn the_same_report_gives_the_same_bytes() {
    let report = report();
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let written = write_plots(&report, first.path()).unwrap();
    write_plots(&report, second.path()).unwrap();
    for path in &written {
        let name = path.file_name().unwrap();
        assert_eq!(
            std::fs::read(path).unwrap(),
            std::fs::read(second.path().join(name)).unwrap(),
            "{name:?} differs between two writes"
        );
    }
    // Writing over the same files keeps them as they were.
    let before: Vec<Vec<u8>> = written.iter().map(|p| std::fs::read(p).unwrap()).collect();
    write_plots(&report, first.path()).unwrap();
    let after: Vec<Vec<u8>> = written.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(before, after);
}

/// The size plots name the collective's operation in their titles and the latency axis.
#[test]
fn the_size_plots_name_the_collective() {
    for (collective, operation) in [
        (Collective::AllReduce, "all-reduce"),
        (Collective::ReduceScatter, "reduce-scatter"),
        (Collective::AllGather, "all-gather"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut report = report();
        report.collective = collective;
        write_plots(&report, dir.path()).unwrap();
        for (file, quantity) in [
            ("latency.svg", "median latency"),
            ("bus_bandwidth.svg", "bus bandwidth"),
        ] {
            let svg = read(&dir.path().join(file));
            let texts = texts(&svg);
            let title = format!("h200_nvlink: {quantity} per {operation}, 8 x NVIDIA H200");
            assert!(texts.contains(&title.as_str()), "{file}: {texts:?}");
        }
        let latency = read(&dir.path().join("latency.svg"));
        let axis = format!("median microseconds per {operation}");
        assert!(texts(&latency).contains(&axis.as_str()), "{axis}");
    }
}

/// The decode plot's title names the package's collective.
#[test]
fn the_decode_plot_names_the_collective() {
    for (collective, operations) in [
        (Collective::AllReduce, "2 all-reduces"),
        (Collective::ReduceScatter, "2 reduce-scatters"),
        (Collective::AllGather, "2 all-gathers"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut report = report();
        report.collective = collective;
        write_plots(&report, dir.path()).unwrap();
        let svg = read(&dir.path().join("decode.svg"));
        let title = format!(
            "h200_nvlink: decode step (61 layers x {operations}, hidden 7168), 8 x NVIDIA H200"
        );
        assert!(texts(&svg).contains(&title.as_str()), "{:?}", texts(&svg));
    }
}

#[test]
fn without_decode_rows_there_is_no_decode_plot() {
    let dir = tempfile::tempdir().unwrap();
    write_plots(&report(), dir.path()).unwrap();
    assert!(dir.path().join("decode.svg").exists());

    let mut report = report();
    report.decode.clear();
    report.decode_shape = None;
    let written = write_plots(&report, dir.path()).unwrap();
    assert_eq!(names(&written), ["latency.svg", "bus_bandwidth.svg"]);
    // A decode plot of an earlier report is not left beside this one's.
    assert!(!dir.path().join("decode.svg").exists());
}

#[test]
fn a_directory_that_cannot_be_written_names_the_file() {
    // A regular file where the directory should be: unwritable even for root.
    let dir = tempfile::tempdir().unwrap();
    let not_a_directory = dir.path().join("plots");
    std::fs::write(&not_a_directory, b"").unwrap();
    let error = write_plots(&report(), &not_a_directory).unwrap_err();
    let PlotError::Io { path, .. } = &error else {
        panic!("expected an I/O error, got {error:?}");
    };
    assert_eq!(path, &not_a_directory.join("latency.svg"));
    assert!(error.to_string().contains("latency.svg"), "{error}");
}

#[test]
fn a_report_with_nothing_timed_names_the_plot_it_cannot_draw() {
    let mut report = report();
    for row in &mut report.sizes {
        row.median_us = None;
        row.bus_gbps = None;
    }
    let dir = tempfile::tempdir().unwrap();
    let error = write_plots(&report, dir.path()).unwrap_err();
    assert!(
        matches!(&error, PlotError::Empty { path, .. } if path.ends_with("latency.svg")),
        "{error:?}"
    );
    assert!(error.to_string().contains("latency.svg"), "{error}");
    assert!(!dir.path().join("latency.svg").exists());
}

/// A bench of `count` contenders and NCCL over 8 KiB..8 MiB, each a little slower than the one
/// before; the fastest at each size is the choice.
fn wide_report(count: usize) -> BenchReport {
    let mut report = report();
    report.sizes.clear();
    let mut bytes = 8 * KIB;
    while bytes <= 8 * KIB * KIB {
        let megabytes = bytes as f64 / 1e6;
        for index in 0..=count {
            let profile = if index == count {
                "nccl".to_owned()
            } else {
                format!("profile_{index:02}")
            };
            let median = 5.0 + index as f64 + (30.0 - index as f64) * megabytes;
            report.sizes.push(SizeRow {
                bytes,
                bucket: 0,
                shape: None,
                profile,
                median_us: Some(median),
                min_us: Some(median),
                max_us: Some(median),
                rounds: 20,
                ops_per_sample: 16,
                bus_gbps: Some(bytes as f64 / (median * 1e3)),
                speedup_vs_nccl: None,
                excluded: None,
                chosen: index == if bytes < KIB * KIB { 0 } else { count - 1 },
                form: None,
                exact: None,
            });
        }
        bytes *= 4;
    }
    report
}

/// The `(stroke, stroke-width, opacity)` of every polyline at least 2 pixels wide: the series'
/// lines and their legend strokes (the axes and the grid are thinner).
fn series_strokes(svg: &str) -> HashSet<(String, String, String)> {
    let attribute = |element: &str, name: &str| {
        let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(element[start..start + element[start..].find('"')?].to_owned())
    };
    svg.split("<polyline")
        .skip(1)
        .filter_map(|element| {
            let element = &element[..element.find("/>")?];
            let width = attribute(element, "stroke-width")?;
            (width.parse::<u32>().ok()? >= 2).then(|| {
                let stroke = attribute(element, "stroke")?;
                Some((stroke, width, attribute(element, "opacity")?))
            })?
        })
        .collect()
}

#[test]
fn every_contender_style_is_its_own() {
    // At least two dozen, however many the palette gives.
    let styles: Vec<SeriesStyle> = (0..DISTINCT_STYLES.max(24)).map(contender_style).collect();
    let colors: HashSet<(u8, u8, u8)> = styles
        .iter()
        .map(|style| (style.color.0, style.color.1, style.color.2))
        .collect();
    assert_eq!(colors.len(), styles.len(), "two contenders share a colour");
    for special in [NCCL_STYLE, CHOICE_STYLE] {
        let color = (special.color.0, special.color.1, special.color.2);
        assert!(!colors.contains(&color), "{special:?}");
        assert!(!styles.contains(&special));
    }
    for pair in styles.windows(2) {
        assert_ne!(pair[0].marker, pair[1].marker, "{pair:?}");
    }
    // Contenders after the first hues are dashed in turn, so the shade is not all that differs.
    assert!(styles[..9].iter().all(|style| !style.dashed));
    assert!(styles[9..18].iter().all(|style| style.dashed));
    // The tuned choice is the widest line.
    assert!(styles
        .iter()
        .chain([&NCCL_STYLE])
        .all(|style| style.width < CHOICE_STYLE.width));
    assert_eq!(contender_style(DISTINCT_STYLES), contender_style(0));
}

#[test]
fn with_two_dozen_contenders_every_series_has_a_stroke_of_its_own() {
    let count = 24;
    let dir = tempfile::tempdir().unwrap();
    write_plots(&wide_report(count), dir.path()).unwrap();
    for file in ["latency.svg", "bus_bandwidth.svg"] {
        let svg = read(&dir.path().join(file));
        assert_well_formed(&svg, file);
        // Every contender, NCCL and the tuned choice.
        let strokes = series_strokes(&svg);
        assert_eq!(strokes.len(), count + 2, "{file}: {strokes:?}");
        let texts = texts(&svg);
        for index in 0..count {
            let profile = format!("profile_{index:02}");
            assert!(texts.contains(&profile.as_str()), "{file}: {profile}");
        }
        assert!(texts.contains(&"tuned choice"), "{file}");
        // The choice's line is drawn after (over) every contender's, NCCL's last among them.
        let choice = svg.find(r##"stroke="#D62728" stroke-width="6""##).unwrap();
        let nccl = svg.find(r##"stroke="#000000" stroke-width="3""##).unwrap();
        assert!(nccl < choice, "{file}");
    }
}
