//! Plain text for `prepare show`: tables and paragraphs that fit a width, and numbers and
//! sizes in words.

use std::fmt::Write as _;

use prepare::decimal::trimmed;

/// What `prepare show` fits its lines to, unless `--wide`.
pub const WIDTH: usize = 100;

/// A space that never breaks a line: a phrase written with it (`[cluster kernel]`) stays on
/// one line. The output prints it as a plain space ([`plain`]).
const GLUE: char = '\u{a0}';

/// The text with its spaces glued: it wraps as one word.
pub fn glued(text: &str) -> String {
    text.replace(' ', &GLUE.to_string())
}

/// The output as printed: glued spaces are plain again.
pub fn plain(text: &str) -> String {
    text.replace(GLUE, " ")
}

/// `text` broken at spaces into lines of at most `first` characters for the first line and
/// `rest` for the others (a word longer than that stays whole on its own line).
pub fn wrap(text: &str, first: usize, rest: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|word| !word.is_empty()) {
        let length = line.chars().count();
        let width = if lines.is_empty() { first } else { rest };
        if length > 0 && length + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// Writes `text` from column `indent`, wrapped to `width` when one is given, its later lines
/// indented by `hang` more.
pub fn paragraph(out: &mut String, text: &str, width: Option<usize>, indent: usize, hang: usize) {
    let lines = match width {
        Some(width) => wrap(
            text,
            width.saturating_sub(indent).max(1),
            width.saturating_sub(indent + hang).max(1),
        ),
        None => vec![text.to_owned()],
    };
    for (index, line) in lines.iter().enumerate() {
        let pad = if index == 0 { indent } else { indent + hang };
        out.push_str(&" ".repeat(pad));
        out.push_str(line);
        out.push('\n');
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// One line of a table.
#[derive(Debug)]
enum Line {
    /// Cells, one per column from the first; fewer than the columns make the last one span the
    /// rest, unpadded.
    Cells(Vec<String>),
    /// Text of its own under the rows before it, starting at column `column`.
    Note { column: usize, text: String },
}

/// A plain text table: two spaces between columns, the last cell of a line not padded (unless
/// right-aligned). Given a width, a last cell that runs past it wraps under itself, and notes
/// wrap with their later lines indented by two more.
#[derive(Debug)]
pub struct Table {
    align: Vec<Align>,
    lines: Vec<Line>,
}

/// The narrowest room a last cell wraps into; with less it runs past the width.
const NARROWEST: usize = 24;

impl Table {
    pub fn new(align: &[Align]) -> Table {
        Table {
            align: align.to_vec(),
            lines: Vec::new(),
        }
    }

    /// A table of `columns` columns whose first holds an index (right-aligned) and the others
    /// text.
    pub fn indexed(columns: usize) -> Table {
        let mut align = vec![Align::Left; columns];
        align[0] = Align::Right;
        Table {
            align,
            lines: Vec::new(),
        }
    }

    /// A line of cells; fewer than the columns make the last one span the rest.
    pub fn row<const N: usize>(&mut self, cells: [&str; N]) {
        debug_assert!((1..=self.align.len()).contains(&N));
        self.lines.push(Line::Cells(
            cells.iter().map(|cell| (*cell).to_string()).collect(),
        ));
    }

    /// A line of text starting where column `column` starts.
    pub fn note(&mut self, column: usize, text: impl Into<String>) {
        self.lines.push(Line::Note {
            column,
            text: text.into(),
        });
    }

    pub fn render(&self, out: &mut String, width: Option<usize>) {
        let mut widths = vec![0; self.align.len()];
        for line in &self.lines {
            let Line::Cells(cells) = line else {
                continue;
            };
            // A spanning cell sets no column's width.
            let counted = if cells.len() < widths.len() {
                cells.len() - 1
            } else {
                cells.len()
            };
            for (column, cell) in cells.iter().take(counted).enumerate() {
                widths[column] = widths[column].max(cell.chars().count());
            }
        }
        let start =
            |column: usize| -> usize { widths[..column].iter().map(|width| width + 2).sum() };
        for line in &self.lines {
            match line {
                Line::Cells(cells) => {
                    let mut text = String::new();
                    for (column, cell) in cells.iter().enumerate() {
                        let last = column + 1 == cells.len();
                        if column > 0 {
                            text.push_str("  ");
                        }
                        match (self.align[column], last) {
                            (Align::Left, true) => {
                                let at = start(column);
                                let lines = match width.map(|width| width.saturating_sub(at)) {
                                    Some(room) if room >= NARROWEST => wrap(cell, room, room),
                                    _ => vec![cell.clone()],
                                };
                                text.push_str(&lines.join(&format!("\n{}", " ".repeat(at))));
                            }
                            (Align::Left, false) => {
                                let _ = write!(text, "{cell:<width$}", width = widths[column]);
                            }
                            (Align::Right, _) => {
                                let _ = write!(text, "{cell:>width$}", width = widths[column]);
                            }
                        }
                    }
                    for line in text.lines() {
                        out.push_str(line.trim_end());
                        out.push('\n');
                    }
                }
                Line::Note { column, text } => paragraph(out, text, width, start(*column), 2),
            }
        }
    }
}

pub fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

/// A bucket's messages: `(16 KiB, 96 KiB]`, from the previous bucket's largest.
pub fn message_range(previous_max: u64, max_bytes: u64) -> String {
    let low = if previous_max == 0 {
        "0".to_string()
    } else {
        human_bytes(previous_max)
    };
    format!("({low}, {}]", human_bytes(max_bytes))
}

/// Bytes in binary units: exact values as integers (`16 KiB`), others to one decimal.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale = 1_u64;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        scale *= 1024;
        unit += 1;
    }
    if bytes % scale == 0 {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

/// A message size exactly: a round size and the bytes above it (`2 B`, `16 KiB`, `256 KiB+2`,
/// `1.5 MiB+2`, `1408 KiB`). The round part is in the largest unit that gives it to two
/// decimals.
pub fn exact_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    let rest = bytes % 1024;
    let round = bytes - rest;
    let Some((unit, scale)) = UNITS
        .iter()
        .find(|(_, scale)| round >= *scale && (u128::from(round) * 100) % u128::from(*scale) == 0)
    else {
        return format!("{bytes} B");
    };
    let text = format!("{} {unit}", trimmed(round as f64 / *scale as f64, 2));
    if rest == 0 {
        text
    } else {
        format!("{text}+{rest}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_wraps_at_spaces_and_never_inside_a_glued_phrase() {
        assert_eq!(wrap("a bb ccc dddd", 6, 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("a bb ccc dddd", 4, 8), ["a bb", "ccc dddd"]);
        assert_eq!(wrap("unbreakable-word x", 4, 4), ["unbreakable-word", "x"]);
        assert_eq!(wrap("", 10, 10), [""]);
        let tagged = format!("a, {}, b", glued("c [cluster kernel]"));
        let lines = wrap(&tagged, 12, 12);
        assert_eq!(plain(&lines.join("|")), "a,|c [cluster kernel],|b");
    }

    #[test]
    fn a_table_wraps_its_last_cells_and_notes_to_the_width() {
        let mut table = Table::new(&[Align::Right, Align::Left, Align::Left]);
        table.row(["#", "name", "what"]);
        table.row([
            "1",
            "first",
            "one two three four five six seven eight nine ten",
        ]);
        table.row(["22", "spans the last two columns"]);
        table.note(
            1,
            "alpha beta gamma delta epsilon zeta eta theta iota kappa",
        );
        let mut out = String::new();
        table.render(&mut out, Some(40));
        let expected = [
            " #  name   what",
            " 1  first  one two three four five six",
            "           seven eight nine ten",
            "22  spans the last two columns",
            "    alpha beta gamma delta epsilon zeta",
            "      eta theta iota kappa",
        ];
        assert_eq!(out.lines().collect::<Vec<_>>(), expected);
        let mut wide = String::new();
        table.render(&mut wide, None);
        assert_eq!(wide.lines().count(), 4, "{wide}");
    }

    #[test]
    fn exact_sizes_name_every_byte() {
        let cases = [
            (2, "2 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (16_384, "16 KiB"),
            (16_386, "16 KiB+2"),
            (262_146, "256 KiB+2"),
            (393_216, "384 KiB"),
            (1_048_578, "1 MiB+2"),
            (1_310_720, "1.25 MiB"),
            (1_441_792, "1408 KiB"),
            (1_572_866, "1.5 MiB+2"),
            (2_098_175, "2 MiB+1023"),
            (64 << 20, "64 MiB"),
            ((4 << 30) + 2, "4 GiB+2"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(exact_size(bytes), expected, "{bytes} bytes");
        }
    }

    #[test]
    fn human_bytes_is_exact_where_it_can_be() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (16_384, "16 KiB"),
            (16_386, "16.0 KiB"),
            (98_304, "96 KiB"),
            (1_572_864, "1.5 MiB"),
            (64 << 20, "64 MiB"),
            (3 << 40, "3 TiB"),
            (5 << 50, "5120 TiB"),
        ];
        for (bytes, expected) in cases {
            assert_eq!(human_bytes(bytes), expected, "{bytes} bytes");
        }
    }
}
