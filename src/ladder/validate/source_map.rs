//! Where each value of a JSON document sits in its text, keyed by JSON pointer, so that every
//! diagnostic can name a line and column, and a position reported by serde can name a path.
//! Also finds duplicate object keys, which `serde_json` silently collapses to the last one.

use std::collections::HashMap;

/// The place of one value: `anchor` is where a person looks for it (the key of an object
/// member, else the value itself); `start..end` is the value's own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub anchor: usize,
    pub start: usize,
    pub end: usize,
}

/// A key that appears twice in one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DuplicateKey {
    /// Pointer of the member, the same for both occurrences.
    pub pointer: String,
    /// Byte offset of the second occurrence's key.
    pub offset: usize,
    /// Byte offset of the first occurrence's key.
    pub first_offset: usize,
}

/// Positions of every value in a JSON text.
#[derive(Debug)]
pub(super) struct SourceMap<'text> {
    text: &'text str,
    spans: HashMap<String, Span>,
    line_starts: Vec<usize>,
    duplicates: Vec<DuplicateKey>,
}

impl<'text> SourceMap<'text> {
    /// Maps a text that `serde_json` already parsed; on text it did not accept the map is
    /// partial, never wrong about what it did record.
    pub fn new(text: &'text str) -> SourceMap<'text> {
        let mut scanner = Scanner {
            bytes: text.as_bytes(),
            text,
            position: 0,
            depth: 0,
            spans: HashMap::new(),
            duplicates: Vec::new(),
        };
        scanner.skip_whitespace();
        let start = scanner.position;
        let mut pointer = String::new();
        scanner.value(&mut pointer, start);
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(index, _)| index + 1))
            .collect();
        SourceMap {
            text,
            spans: scanner.spans,
            line_starts,
            duplicates: scanner.duplicates,
        }
    }

    /// Keys that appear twice in one object, in document order.
    pub fn duplicates(&self) -> &[DuplicateKey] {
        &self.duplicates
    }

    /// The 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&start| start <= offset) - 1;
        let line_start = self.line_starts[line];
        let column = self
            .text
            .get(line_start..offset)
            .map_or(offset - line_start, |prefix| prefix.chars().count());
        (line + 1, column + 1)
    }

    /// The line and column of the value at `pointer`, or of its nearest ancestor that exists
    /// (a missing field is looked for in its object).
    pub fn locate(&self, pointer: &str) -> Option<(usize, usize)> {
        let mut pointer = pointer;
        loop {
            if let Some(span) = self.spans.get(pointer) {
                return Some(self.line_column(span.anchor));
            }
            let parent = pointer.rfind('/')?;
            pointer = &pointer[..parent];
        }
    }

    /// The pointer of the innermost value whose text contains the byte offset, or ends just
    /// before it (serde reports a bad value at its end).
    pub fn pointer_at(&self, offset: usize) -> String {
        self.spans
            .iter()
            .filter(|(_, span)| span.start <= offset && offset <= span.end)
            .min_by_key(|(pointer, span)| (span.end - span.start, pointer.as_str()))
            .map(|(pointer, _)| pointer.clone())
            .unwrap_or_default()
    }

    /// The byte offset of a position as `serde_json` reports it: a 1-based line and the
    /// number of bytes read on that line.
    pub fn offset_of_serde_position(&self, line: usize, column: usize) -> usize {
        let Some(&line_start) = self.line_starts.get(line.saturating_sub(1)) else {
            return self.text.len();
        };
        let mut offset = (line_start + column.saturating_sub(1)).min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        offset
    }
}

/// Appends one reference token to a JSON pointer, escaping `~` and `/` (RFC 6901).
pub(super) fn push_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    for character in token.chars() {
        match character {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            other => pointer.push(other),
        }
    }
}

/// A recursive-descent walk over JSON text that records spans; it stops quietly at anything
/// that is not JSON, since syntax is reported by `serde_json`.
struct Scanner<'text> {
    bytes: &'text [u8],
    text: &'text str,
    position: usize,
    depth: usize,
    spans: HashMap<String, Span>,
    duplicates: Vec<DuplicateKey>,
}

/// Deeper documents are refused by `serde_json` (its recursion limit); the scanner stops there
/// too rather than overflow the stack on text that was never JSON.
const MAX_DEPTH: usize = 128;

impl Scanner<'_> {
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.position) {
            self.position += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.position).copied()
    }

    /// Scans the value at the current position and records it under `pointer`.
    fn value(&mut self, pointer: &mut String, anchor: usize) -> bool {
        let start = self.position;
        if self.depth >= MAX_DEPTH {
            return false;
        }
        self.depth += 1;
        let complete = match self.peek() {
            Some(b'{') => self.object(pointer),
            Some(b'[') => self.array(pointer),
            Some(b'"') => self.string().is_some(),
            Some(_) => self.scalar(),
            None => false,
        };
        self.depth -= 1;
        self.spans.insert(
            pointer.clone(),
            Span {
                anchor,
                start,
                end: self.position,
            },
        );
        complete
    }

    fn object(&mut self, pointer: &mut String) -> bool {
        self.position += 1;
        let mut first_offsets: HashMap<String, usize> = HashMap::new();
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(b'}') => {
                    self.position += 1;
                    return true;
                }
                Some(b',') => {
                    self.position += 1;
                    continue;
                }
                Some(b'"') => {}
                _ => return false,
            }
            let key_offset = self.position;
            let Some(key) = self.string() else {
                return false;
            };
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return false;
            }
            self.position += 1;
            self.skip_whitespace();
            let length = pointer.len();
            push_token(pointer, &key);
            if let Some(&first_offset) = first_offsets.get(&key) {
                self.duplicates.push(DuplicateKey {
                    pointer: pointer.clone(),
                    offset: key_offset,
                    first_offset,
                });
            } else {
                first_offsets.insert(key, key_offset);
            }
            let complete = self.value(pointer, key_offset);
            pointer.truncate(length);
            if !complete {
                return false;
            }
        }
    }

    fn array(&mut self, pointer: &mut String) -> bool {
        self.position += 1;
        let mut index = 0usize;
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(b']') => {
                    self.position += 1;
                    return true;
                }
                Some(b',') => {
                    self.position += 1;
                    continue;
                }
                None => return false,
                Some(_) => {}
            }
            let length = pointer.len();
            push_token(pointer, &index.to_string());
            let start = self.position;
            let complete = self.value(pointer, start);
            pointer.truncate(length);
            if !complete {
                return false;
            }
            index += 1;
        }
    }

    /// Scans a string and returns its decoded value.
    fn string(&mut self) -> Option<String> {
        let start = self.position;
        self.position += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.position += 1;
                    return serde_json::from_str(&self.text[start..self.position]).ok();
                }
                b'\\' => self.position += 2,
                _ => self.position += 1,
            }
        }
    }

    fn scalar(&mut self) -> bool {
        let start = self.position;
        while let Some(byte) = self.peek() {
            if matches!(byte, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.position += 1;
        }
        self.position > start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_members_at_their_keys_and_elements_at_their_values() {
        let text = "{\n  \"a\": [1,\n    {\"b/c\": true}],\n  \"é\": \"x\"\n}";
        let map = SourceMap::new(text);
        assert_eq!(map.locate(""), Some((1, 1)));
        assert_eq!(map.locate("/a"), Some((2, 3)));
        assert_eq!(map.locate("/a/0"), Some((2, 9)));
        assert_eq!(map.locate("/a/1/b~1c"), Some((3, 6)));
        assert_eq!(map.locate("/é"), Some((4, 3)));
        // A missing member is looked for in its object.
        assert_eq!(map.locate("/a/1/missing"), Some((3, 5)));
        assert!(map.duplicates().is_empty());
    }

    #[test]
    fn finds_the_innermost_value_at_an_offset() {
        let text = r#"{"a": {"b": 2.0, "c": [3]}}"#;
        let map = SourceMap::new(text);
        let after_two = text.find("2.0").unwrap() + 3;
        assert_eq!(map.pointer_at(after_two), "/a/b");
        let in_three = text.find('3').unwrap();
        assert_eq!(map.pointer_at(in_three), "/a/c/0");
        assert_eq!(map.pointer_at(0), "");
    }

    #[test]
    fn finds_duplicate_keys_with_both_offsets() {
        let text = r#"{"a": 1, "b": {"x": 1, "x": 2}, "a": 3}"#;
        let map = SourceMap::new(text);
        let duplicates = map.duplicates();
        assert_eq!(duplicates.len(), 2);
        assert_eq!(duplicates[0].pointer, "/b/x");
        assert_eq!(duplicates[1].pointer, "/a");
        assert_eq!(duplicates[1].first_offset, 1);
        assert_eq!(duplicates[1].offset, text.rfind("\"a\"").unwrap());
    }

    #[test]
    fn converts_between_offsets_and_lines() {
        let text = "ab\nçd\n";
        let map = SourceMap::new(text);
        assert_eq!(map.line_column(3), (2, 1));
        assert_eq!(map.line_column(5), (2, 2));
        // serde counts bytes: the fourth byte of line 2 is `d`.
        assert_eq!(map.offset_of_serde_position(2, 3), 5);
        assert_eq!(map.offset_of_serde_position(9, 1), text.len());
    }
}
