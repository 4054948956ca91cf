//! SVG plots of a [`super::BenchReport`] (plotters, SVG backend only), so a run can be read at
//! a glance: latency and bus bandwidth per message size for every contender with the tuned
//! choice drawn over them, and the decode emulation's step time per batch. Every contender has a
//! style of its own ([`contender_style`]), so no two lines can be mistaken for each other.
//!
//! Text is written as plain SVG `<text>` elements and laid out with plotters' built-in width
//! estimate, so no font library is loaded. The same report always gives the same bytes.

use std::error::Error;
use std::io;
use std::path::{Path, PathBuf};

use plotters::coord::cartesian::Cartesian2d;
use plotters::coord::combinators::{BindKeyPoints, LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::{ComposedElement, Drawable, PointCollection};
use plotters::prelude::{
    ChartBuilder, ChartContext, Circle, Color, Cross, DashedLineSeries, DrawingArea,
    DrawingAreaErrorKind, DrawingBackend, EmptyElement, FontFamily, IntoDrawingArea, IntoLogRange,
    LineSeries, PathElement, Polygon, RGBColor, Rectangle, SVGBackend, SeriesLabelPosition,
    ShapeStyle, TextStyle, TriangleMarker, BLACK, WHITE,
};

use super::{BenchReport, DecodeRow, SizeRow};
use crate::decimal::trimmed;

/// The latency plot's file name.
pub const LATENCY_FILE: &str = "latency.svg";
/// The bus bandwidth plot's file name.
pub const BUS_BANDWIDTH_FILE: &str = "bus_bandwidth.svg";
/// The decode plot's file name.
pub const DECODE_FILE: &str = "decode.svg";

/// The profile name NCCL's rows carry.
const NCCL_PROFILE: &str = "nccl";

/// Pixels, width by height.
const CANVAS: (u32, u32) = (1200, 720);

/// Contender hues (Tableau 10 without its red, which is the tuned choice's); NCCL is black.
const PALETTE: [RGBColor; 9] = [
    RGBColor(0x4E, 0x79, 0xA7),
    RGBColor(0xF2, 0x8E, 0x2B),
    RGBColor(0x59, 0xA1, 0x4F),
    RGBColor(0xB0, 0x7A, 0xA1),
    RGBColor(0x76, 0xB7, 0xB2),
    RGBColor(0x9C, 0x75, 0x5F),
    RGBColor(0xED, 0xC9, 0x48),
    RGBColor(0xFF, 0x9D, 0xA7),
    RGBColor(0x79, 0x70, 0x6E),
];

/// The tuned choice's colour (its line, its rings), one no contender takes.
const CHOICE_COLOR: RGBColor = RGBColor(0xD6, 0x27, 0x28);

/// The markers contenders take in turn; NCCL's square is its own.
const CONTENDER_MARKERS: [Marker; 4] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
];

/// How many contenders get a style no other contender has: every hue with each of four shades
/// (the shades after the first dashed every other time), the markers taken in turn.
pub const DISTINCT_STYLES: usize = PALETTE.len() * 4;

/// A point's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    /// NCCL's.
    Square,
    /// A filled dot.
    Circle,
    /// A wide ring around the point: the tuned choice's.
    Ring,
    /// A filled triangle.
    Triangle,
    /// A filled diamond.
    Diamond,
    /// An upright cross.
    Cross,
}

/// How one series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeriesStyle {
    /// The line's and the markers' colour.
    pub color: RGBColor,
    /// The line's width, pixels.
    pub width: u32,
    /// Whether the line is dashed.
    pub dashed: bool,
    /// The marker at each point.
    pub marker: Marker,
}

/// NCCL's style: black, wider, squares.
pub const NCCL_STYLE: SeriesStyle = SeriesStyle {
    color: BLACK,
    width: 3,
    dashed: false,
    marker: Marker::Square,
};

/// The tuned choice's style: the widest line, in a colour of its own and see-through, ringing
/// each point; drawn over every other line.
pub const CHOICE_STYLE: SeriesStyle = SeriesStyle {
    color: CHOICE_COLOR,
    width: 6,
    dashed: false,
    marker: Marker::Ring,
};

/// The style of the `index`th contender other than NCCL. The first [`DISTINCT_STYLES`] differ
/// from each other in colour (a hue and a shade of it) and from NCCL's and the choice's, and
/// contenders next to each other also differ in hue and marker; later ones repeat them.
pub fn contender_style(index: usize) -> SeriesStyle {
    let index = index % DISTINCT_STYLES;
    let hue = PALETTE[index % PALETTE.len()];
    let round = index / PALETTE.len();
    // Base, darker, lighter, darkest: each round its own colour for every hue.
    let shade = |channel: u8| -> u8 {
        let channel = u16::from(channel);
        let shaded = match round {
            0 => channel,
            1 => channel * 3 / 5,
            2 => channel + (255 - channel) * 2 / 5,
            _ => channel * 2 / 5,
        };
        u8::try_from(shaded).unwrap_or(u8::MAX)
    };
    SeriesStyle {
        color: RGBColor(shade(hue.0), shade(hue.1), shade(hue.2)),
        width: 2,
        dashed: round % 2 == 1,
        // Four markers against nine hues: the pair repeats only after 36 contenders.
        marker: CONTENDER_MARKERS[index % CONTENDER_MARKERS.len()],
    }
}

/// The most labelled ticks on a log axis.
const MAX_LOG_LABELS: i32 = 10;

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The report has nothing to draw in this plot.
    #[error("plot {path}: nothing to draw: {why}", path = path.display())]
    Empty {
        /// The plot's file.
        path: PathBuf,
        /// What is missing from the report.
        why: &'static str,
    },
    /// Plotters failed to lay out or draw the plot.
    #[error("plot {path}: drawing failed", path = path.display())]
    Draw {
        /// The plot's file.
        path: PathBuf,
        /// What plotters said.
        source: Box<dyn Error + Send + Sync>,
    },
    /// The file could not be written (or a stale one removed).
    #[error("plot {path}", path = path.display())]
    Io {
        /// The plot's file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

type DrawResult = Result<(), DrawingAreaErrorKind<io::Error>>;

/// Writes `latency.svg`, `bus_bandwidth.svg` and, when the decode emulation ran, `decode.svg`
/// into `dir` (which must exist), each atomically, and returns their paths in that order.
/// Without decode rows a `decode.svg` left from an earlier report is removed, so the
/// directory never shows a plot of another run.
pub fn write_plots(report: &BenchReport, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let contenders = Contender::gather(&report.sizes);
    let mut written = Vec::with_capacity(3);

    let path = dir.join(LATENCY_FILE);
    let svg = latency_svg(report, &contenders).map_err(|error| error.at(&path))?;
    write(&path, &svg)?;
    written.push(path);

    let path = dir.join(BUS_BANDWIDTH_FILE);
    let svg = bus_bandwidth_svg(report, &contenders).map_err(|error| error.at(&path))?;
    write(&path, &svg)?;
    written.push(path);

    let path = dir.join(DECODE_FILE);
    if report.decode.is_empty() {
        match std::fs::remove_file(&path) {
            Err(source) if source.kind() != io::ErrorKind::NotFound => {
                return Err(PlotError::Io { path, source });
            }
            _ => {}
        }
    } else {
        let svg = decode_svg(report).map_err(|error| error.at(&path))?;
        write(&path, &svg)?;
        written.push(path);
    }
    Ok(written)
}

fn write(path: &Path, svg: &str) -> Result<(), PlotError> {
    crate::files::write_atomically(path, svg.as_bytes()).map_err(|source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A plot's failure before it has a path.
enum Failure {
    Empty(&'static str),
    Draw(DrawingAreaErrorKind<io::Error>),
}

impl Failure {
    fn at(self, path: &Path) -> PlotError {
        let path = path.to_path_buf();
        match self {
            Failure::Empty(why) => PlotError::Empty { path, why },
            Failure::Draw(source) => PlotError::Draw {
                path,
                source: Box::new(source),
            },
        }
    }
}

impl From<DrawingAreaErrorKind<io::Error>> for Failure {
    fn from(error: DrawingAreaErrorKind<io::Error>) -> Failure {
        Failure::Draw(error)
    }
}

/// One line of the size plots: a profile with a median at some size.
struct Contender<'a> {
    profile: &'a str,
    style: SeriesStyle,
    rows: Vec<&'a SizeRow>,
}

impl<'a> Contender<'a> {
    /// Every profile with a median somewhere, in the report's order with NCCL last (drawn on
    /// top); rows ascending by size.
    fn gather(sizes: &'a [SizeRow]) -> Vec<Contender<'a>> {
        let mut contenders: Vec<Contender<'a>> = Vec::new();
        for row in sizes.iter().filter(|row| median(row).is_some()) {
            match contenders.iter_mut().find(|c| c.profile == row.profile) {
                Some(contender) => contender.rows.push(row),
                None => contenders.push(Contender {
                    profile: &row.profile,
                    style: NCCL_STYLE,
                    rows: vec![row],
                }),
            }
        }
        contenders.sort_by_key(Contender::is_nccl);
        let others = contenders.iter_mut().filter(|c| !c.is_nccl());
        for (index, contender) in others.enumerate() {
            contender.style = contender_style(index);
        }
        for contender in &mut contenders {
            contender.rows.sort_by_key(|row| row.bytes);
        }
        contenders
    }

    fn is_nccl(&self) -> bool {
        self.profile == NCCL_PROFILE
    }

    /// The points `value` gives, skipping rows it has no usable figure for.
    fn points(&self, value: impl Fn(&SizeRow) -> Option<f64>) -> Vec<(f64, f64)> {
        self.rows
            .iter()
            .filter_map(|row| Some((row.bytes as f64, usable(value(row))?)))
            .collect()
    }
}

/// A figure a plot can place: finite and not negative.
fn usable(value: Option<f64>) -> Option<f64> {
    value.filter(|value| value.is_finite() && *value >= 0.0)
}

/// The tuned choice's points: the chosen row at each size, where it has the figure.
fn chosen_points(sizes: &[SizeRow], value: impl Fn(&SizeRow) -> Option<f64>) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .filter(|row| row.chosen)
        .filter_map(|row| Some((row.bytes as f64, usable(value(row))?)))
        .collect()
}

fn median(row: &SizeRow) -> Option<f64> {
    row.median_us.filter(|median| *median > 0.0)
}

fn bus_gbps(row: &SizeRow) -> Option<f64> {
    row.bus_gbps
}

/// "8 x NVIDIA H200", or every distinct name when the ranks differ.
fn machine(report: &BenchReport) -> String {
    let mut names: Vec<&str> = Vec::new();
    for gpu in &report.gpus {
        if !names.contains(&gpu.as_str()) {
            names.push(gpu);
        }
    }
    let names = if names.is_empty() {
        "unknown GPU".to_owned()
    } else {
        names.join(" + ")
    };
    format!("{} x {names}", report.world_size)
}

/// What a plot over message sizes shows: each row's value, the y axis around the values, and
/// its words.
struct SizePlot<Y> {
    value: fn(&SizeRow) -> Option<f64>,
    y_axis: fn((f64, f64)) -> Y,
    /// What the title says is plotted ("median latency").
    quantity: &'static str,
    y_description: String,
    /// The failure when no contender has a value.
    none: &'static str,
}

fn latency_svg(report: &BenchReport, contenders: &[Contender]) -> Result<String, Failure> {
    let plot = SizePlot {
        value: median,
        y_axis: |values| log_axis(values, decade_ticks),
        quantity: "median latency",
        y_description: format!(
            "median microseconds per {}",
            super::operation(report.collective)
        ),
        none: "no contender has a median at any size",
    };
    size_svg(report, contenders, &plot)
}

fn bus_bandwidth_svg(report: &BenchReport, contenders: &[Contender]) -> Result<String, Failure> {
    let plot = SizePlot {
        value: bus_gbps,
        y_axis: |(_, hi)| linear_from_zero(hi),
        quantity: "bus bandwidth",
        y_description: "bus bandwidth, GB/s".to_owned(),
        none: "no contender has a bus bandwidth at any size",
    };
    size_svg(report, contenders, &plot)
}

/// Every contender's line over message sizes on a log axis of bytes, the tuned choice ringed.
fn size_svg<Y>(
    report: &BenchReport,
    contenders: &[Contender],
    plot: &SizePlot<Y>,
) -> Result<String, Failure>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut lines: Vec<Line> = contenders
        .iter()
        .map(|contender| Line {
            label: contender.profile.to_owned(),
            style: contender.style,
            points: contender.points(plot.value),
        })
        .collect();
    // Last, so that it is drawn over every contender.
    lines.push(Line {
        label: "tuned choice".to_owned(),
        style: CHOICE_STYLE,
        points: chosen_points(&report.sizes, plot.value),
    });
    let (x, y) =
        bounds(lines.iter().flat_map(|line| &line.points)).ok_or(Failure::Empty(plot.none))?;
    let x_axis = log_axis(x, power_of_two_ticks);
    let y_axis = (plot.y_axis)(y);
    let title = format!(
        "{}: {} per {}, {}",
        report.ladder,
        plot.quantity,
        super::operation(report.collective),
        machine(report)
    );
    render(|root| {
        let mut chart = chart(root, &title)
            .build_cartesian_2d(x_axis, y_axis)
            .map_err(Failure::from)?;
        mesh(&mut chart, "message size", human_bytes, &plot.y_description)?;
        draw_lines(&mut chart, &lines)?;
        Ok(())
    })
}

fn decode_svg(report: &BenchReport) -> Result<String, Failure> {
    let rows: Vec<&DecodeRow> = report.decode.iter().filter(|row| row.batch > 0).collect();
    let points = |value: fn(&DecodeRow) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|row| Some((row.batch as f64, usable(Some(value(row)))?)))
            .collect()
    };
    let tuned = points(|row| row.tuned_us);
    let nccl = points(|row| row.nccl_us);
    let (x, y) =
        bounds(tuned.iter().chain(&nccl)).ok_or(Failure::Empty("no decode row has a step time"))?;
    let batches: Vec<f64> = tuned.iter().chain(&nccl).map(|point| point.0).collect();
    let x_axis = log_batch_axis(x, &batches);
    let shape = report.decode_shape.map_or(String::new(), |shape| {
        format!(
            " ({} layers x {} {}, hidden {})",
            shape.layers,
            shape.all_reduces_per_layer,
            super::operations(report.collective),
            shape.hidden
        )
    });
    let title = format!("{}: decode step{shape}, {}", report.ladder, machine(report));
    let lines = [
        Line {
            label: "NCCL alone".to_owned(),
            style: NCCL_STYLE,
            points: nccl,
        },
        Line {
            label: "tuned choice".to_owned(),
            style: CHOICE_STYLE,
            points: tuned,
        },
    ];
    render(|root| {
        let mut chart = chart(root, &title)
            .build_cartesian_2d(x_axis, linear_from_zero(y.1))
            .map_err(Failure::from)?;
        mesh(
            &mut chart,
            "batch rows",
            format_number,
            "microseconds per token step",
        )?;
        draw_lines(&mut chart, &lines)?;
        Ok(())
    })
}

/// One series as drawn: a line with a marker at each point.
struct Line {
    label: String,
    style: SeriesStyle,
    points: Vec<(f64, f64)>,
}

/// An SVG document drawn by `draw` on a white canvas.
fn render(
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), Failure>,
) -> Result<String, Failure> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, CANVAS).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
    }
    Ok(svg)
}

fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FontFamily::SansSerif, size))
}

fn chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, font(24.0))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(80);
    builder
}

fn mesh<X, Y>(
    chart: &mut ChartContext<SVGBackend, Cartesian2d<X, Y>>,
    x_description: &str,
    x_label: fn(f64) -> String,
    y_description: &str,
) -> DrawResult
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_description)
        .y_desc(y_description)
        .axis_desc_style(font(18.0))
        .label_style(font(15.0))
        .x_label_formatter(&|value| x_label(*value))
        .y_label_formatter(&|value| format_number(*value))
        .bold_line_style(BLACK.mix(0.15))
        .light_line_style(BLACK.mix(0.05))
        .draw()
}

/// Every line with its markers, in order (each over the ones before), and the legend.
fn draw_lines<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    lines: &[Line],
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for line in lines.iter().filter(|line| !line.points.is_empty()) {
        let style = line.style;
        let stroke = stroke_of(style);
        let points = line.points.iter().copied();
        if style.dashed {
            chart.draw_series(DashedLineSeries::new(points, 8, 5, stroke))?;
        } else {
            chart.draw_series(LineSeries::new(points, stroke))?;
        }
        let color = style.color;
        match style.marker {
            Marker::Square => draw_marks(chart, line, move || {
                Rectangle::new([(-4, -4), (4, 4)], color.filled())
            }),
            Marker::Circle => {
                draw_marks(chart, line, move || Circle::new((0, 0), 4, color.filled()))
            }
            Marker::Ring => draw_marks(chart, line, move || {
                Circle::new((0, 0), 8, color.stroke_width(2))
            }),
            Marker::Triangle => draw_marks(chart, line, move || {
                TriangleMarker::new((0, 0), 5, color.filled())
            }),
            Marker::Diamond => draw_marks(chart, line, move || {
                Polygon::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0)], color.filled())
            }),
            Marker::Cross => draw_marks(chart, line, move || {
                Cross::new((0, 0), 4, color.stroke_width(2))
            }),
        }?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(font(15.0))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .margin(12)
        .draw()
}

/// The marker `mark` makes (relative to its point) at each of `line`'s points, and the line's
/// legend entry: its stroke, dashed as the line is, with the marker.
fn draw_marks<'a, X, Y, M>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    line: &Line,
    mark: impl Fn() -> M + Copy + 'a,
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
    M: Drawable<SVGBackend<'a>> + 'static,
    for<'b> &'b M: PointCollection<'b, (i32, i32)>,
{
    let style = line.style;
    chart
        .draw_series(
            line.points
                .iter()
                .map(|point| EmptyElement::at(*point) + mark()),
        )?
        .label(line.label.as_str())
        .legend(move |at| legend_stroke(at, style) + mark());
    Ok(())
}

/// A legend entry's line: two halves of a stroke.
type LegendStroke<DB> =
    ComposedElement<(i32, i32), DB, PathElement<(i32, i32)>, PathElement<(i32, i32)>>;

/// A legend entry's line at `at`, in two halves: they meet for a solid line and leave a gap for
/// a dashed one.
fn legend_stroke<DB: DrawingBackend>(at: (i32, i32), style: SeriesStyle) -> LegendStroke<DB> {
    let stroke = stroke_of(style);
    let gap = if style.dashed { 3 } else { 0 };
    EmptyElement::at(at)
        + PathElement::new([(-12, 0), (-gap, 0)], stroke)
        + PathElement::new([(gap, 0), (12, 0)], stroke)
}

/// A series' line: the tuned choice's is see-through, so the contender under it shows.
fn stroke_of(style: SeriesStyle) -> ShapeStyle {
    let color = if style == CHOICE_STYLE {
        style.color.mix(0.45)
    } else {
        style.color.mix(1.0)
    };
    color.stroke_width(style.width)
}

/// The smallest and largest x and y among `points`, if any.
fn bounds<'a>(
    points: impl IntoIterator<Item = &'a (f64, f64)>,
) -> Option<((f64, f64), (f64, f64))> {
    points.into_iter().fold(None, |bounds, &(x, y)| {
        Some(match bounds {
            None => ((x, x), (y, y)),
            Some(((x0, x1), (y0, y1))) => ((x0.min(x), x1.max(x)), (y0.min(y), y1.max(y))),
        })
    })
}

/// A log range around `lo..hi` with a little room on each side.
fn padded_log((lo, hi): (f64, f64)) -> (f64, f64) {
    (lo / 1.5, hi * 1.5)
}

/// A linear axis from zero to a little above `hi`.
fn linear_from_zero(hi: f64) -> RangedCoordf64 {
    let top = if hi > 0.0 { hi * 1.1 } else { 1.0 };
    (0.0..top).into()
}

type LogAxis = WithKeyPoints<LogCoord<f64>>;

/// An axis's bold (labelled) and light ticks.
type Ticks = (Vec<f64>, Vec<f64>);

fn log_axis_with(range: (f64, f64), bold: Vec<f64>, light: Vec<f64>) -> LogAxis {
    (range.0..range.1)
        .log_scale()
        .with_key_points(bold)
        .with_light_points(light)
}

/// A log axis around `values`, with the bold and light ticks `ticks` picks in its range.
fn log_axis(values: (f64, f64), ticks: fn((f64, f64)) -> Ticks) -> LogAxis {
    let range = padded_log(values);
    let (bold, light) = ticks(range);
    log_axis_with(range, bold, light)
}

/// Ticks for bytes: powers of two in `lo..=hi`: at most [`MAX_LOG_LABELS`] labelled, aligned to a multiple
/// of the stride, and the rest as light lines.
fn power_of_two_ticks((lo, hi): (f64, f64)) -> Ticks {
    let first = lo.log2().ceil() as i32;
    let last = hi.log2().floor() as i32;
    if last < first {
        return (Vec::new(), Vec::new());
    }
    let stride = (last - first + MAX_LOG_LABELS) / MAX_LOG_LABELS;
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    for exponent in first..=last {
        let value = 2f64.powi(exponent);
        if exponent.rem_euclid(stride) == 0 {
            bold.push(value);
        } else {
            light.push(value);
        }
    }
    (bold, light)
}

/// Batch sizes on a log axis, labelled at the batches measured.
fn log_batch_axis(batches: (f64, f64), measured: &[f64]) -> LogAxis {
    let mut ticks = measured.to_vec();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    let stride = ticks.len().div_ceil(MAX_LOG_LABELS as usize).max(1);
    let (bold, light) = ticks
        .iter()
        .enumerate()
        .partition::<Vec<_>, _>(|(index, _)| index % stride == 0);
    let values = |ticks: Vec<(usize, &f64)>| ticks.into_iter().map(|(_, v)| *v).collect();
    log_axis_with(padded_log(batches), values(bold), values(light))
}

/// Ticks in `lo..=hi` at 1, 2 and 5 times powers of ten (every digit when that gives fewer
/// than two), the other digits light.
fn decade_ticks((lo, hi): (f64, f64)) -> Ticks {
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let every: Vec<(u8, f64)> = (first..=last)
        .flat_map(|exponent| {
            (1..=9u8).map(move |digit| (digit, f64::from(digit) * 10f64.powi(exponent)))
        })
        .filter(|(_, value)| (lo..=hi).contains(value))
        .collect();
    let values = |ticks: &[(u8, f64)]| ticks.iter().map(|(_, value)| *value).collect();
    let (bold, light): (Vec<_>, Vec<_>) = every
        .iter()
        .partition(|(digit, _)| matches!(digit, 1 | 2 | 5));
    if bold.len() >= 2 {
        (values(&bold), values(&light))
    } else {
        (values(&every), Vec::new())
    }
}

/// "512 B", "8 KiB", "1.5 MiB".
fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", format_number(value), UNITS[unit])
}

/// A tick label: three significant figures at most, no trailing zeros.
fn format_number(value: f64) -> String {
    let magnitude = value.abs();
    let decimals = if magnitude >= 100.0 || magnitude == 0.0 {
        0
    } else if magnitude >= 10.0 {
        1
    } else if magnitude >= 1.0 {
        2
    } else {
        3
    };
    trimmed(value, decimals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_as_binary_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(8192.0), "8 KiB");
        assert_eq!(human_bytes(1024.0 * 1024.0), "1 MiB");
        assert_eq!(human_bytes(1.5 * 1024.0 * 1024.0), "1.5 MiB");
        assert_eq!(human_bytes(64.0 * 1024.0 * 1024.0), "64 MiB");
        assert_eq!(human_bytes(2.0 * 1024f64.powi(3)), "2 GiB");
    }

    #[test]
    fn numbers_lose_trailing_zeros() {
        assert_eq!(format_number(0.0), "0");
        assert_eq!(format_number(0.5), "0.5");
        assert_eq!(format_number(2.0), "2");
        assert_eq!(format_number(12.5), "12.5");
        assert_eq!(format_number(1000.0), "1000");
        assert_eq!(format_number(0.02), "0.02");
    }

    #[test]
    fn power_of_two_ticks_are_at_most_ten_and_aligned() {
        let (bold, light) = power_of_two_ticks((8192.0 / 1.5, 64.0 * 1_048_576.0 * 1.5));
        assert!(bold.len() <= MAX_LOG_LABELS as usize, "{bold:?}");
        assert!(bold.contains(&16384.0) && bold.contains(&(64.0 * 1_048_576.0)));
        assert_eq!(bold.len() + light.len(), 14);
        let (bold, light) = power_of_two_ticks((3.0, 3.5));
        assert!(bold.is_empty() && light.is_empty());
    }

    #[test]
    fn decade_ticks_take_one_two_five() {
        let (bold, light) = decade_ticks((3.0, 600.0));
        assert_eq!(bold, vec![5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]);
        assert!(light.contains(&3.0) && light.contains(&600.0) && !light.contains(&5.0));
        let (bold, light) = decade_ticks((31.0, 45.0));
        assert_eq!(bold, vec![40.0]);
        assert!(light.is_empty());
    }
}
