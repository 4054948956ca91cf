//! Where each value of a JSON document sits in its text, keyed by JSON pointer, so that every
//! diagnostic can name a line and column, and a position reported by serde can name a path.
//! Also finds duplicate object keys, which `serde_json` silently collapses to the last one.
//!
//! Values are kept as a tree (each node knows its parent and its key's place in the text) and
//! pointers are built only when asked for, so memory grows with the number of values, never
//! with the length of keys times the depth of nesting.

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

/// Duplicate keys reported at most: each names its whole pointer, which a hostile document can
/// make long.
const MAX_DUPLICATES: usize = 100;

/// How a value hangs from its parent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    /// A member of an object, by its decoded key.
    Key(Box<str>),
    /// An element of an array.
    Index(usize),
}

#[derive(Debug)]
struct Node {
    /// The parent's index; the root is its own parent.
    parent: usize,
    /// The key's text (quotes included) for an object member, empty for the root and elements.
    key: (usize, usize),
    /// The element's index for an array element.
    index: usize,
    span: Span,
}

/// Positions of every value in a JSON text.
#[derive(Debug)]
pub(super) struct SourceMap<'text> {
    text: &'text str,
    nodes: Vec<Node>,
    /// (parent, step) to the child; a duplicated key maps to its last occurrence, as serde
    /// reads it.
    children: HashMap<(usize, Step), usize>,
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
            nodes: Vec::new(),
            children: HashMap::new(),
            duplicates: Vec::new(),
        };
        scanner.skip_whitespace();
        let start = scanner.position;
        scanner.value(None, start);
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(index, _)| index + 1))
            .collect();
        let mut map = SourceMap {
            text,
            nodes: scanner.nodes,
            children: scanner.children,
            line_starts,
            duplicates: Vec::new(),
        };
        map.duplicates = scanner
            .duplicates
            .into_iter()
            .map(|(node, offset, first_offset)| DuplicateKey {
                pointer: map.pointer_of(node),
                offset,
                first_offset,
            })
            .collect();
        map
    }

    /// Keys that appear twice in one object, in document order (the first hundred).
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
        if self.nodes.is_empty() {
            return None;
        }
        let mut node = 0;
        if !pointer.is_empty() {
            let tokens = pointer.strip_prefix('/')?;
            for token in tokens.split('/') {
                let token = token.replace("~1", "/").replace("~0", "~");
                let by_key = self.children.get(&(node, Step::Key(token.clone().into())));
                let by_index = token
                    .parse::<usize>()
                    .ok()
                    .and_then(|index| self.children.get(&(node, Step::Index(index))));
                match by_key.or(by_index) {
                    Some(&child) => node = child,
                    None => break,
                }
            }
        }
        Some(self.line_column(self.nodes[node].span.anchor))
    }

    /// The pointer of the innermost value whose text contains the byte offset, or ends just
    /// before it (serde reports a bad value at its end).
    pub fn pointer_at(&self, offset: usize) -> String {
        let containing = |node: &&Node| node.span.start <= offset && offset <= node.span.end;
        let Some(narrowest) = self
            .nodes
            .iter()
            .filter(containing)
            .map(|node| node.span.end - node.span.start)
            .min()
        else {
            return String::new();
        };
        // Ties (rare: values of one width around one offset) go to the smallest pointer.
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| containing(node) && node.span.end - node.span.start == narrowest)
            .map(|(index, _)| self.pointer_of(index))
            .min()
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

    /// The JSON pointer of a node, built from its ancestors' keys.
    fn pointer_of(&self, node: usize) -> String {
        let mut path = Vec::new();
        let mut current = node;
        while current != 0 {
            path.push(current);
            current = self.nodes[current].parent;
        }
        let mut pointer = String::new();
        for &index in path.iter().rev() {
            let node = &self.nodes[index];
            if node.key.1 > node.key.0 {
                let key: String =
                    serde_json::from_str(&self.text[node.key.0..node.key.1]).unwrap_or_default();
                push_token(&mut pointer, &key);
            } else {
                push_token(&mut pointer, &node.index.to_string());
            }
        }
        pointer
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
    nodes: Vec<Node>,
    children: HashMap<(usize, Step), usize>,
    /// (node, offset of the second key, offset of the first).
    duplicates: Vec<(usize, usize, usize)>,
}

/// Deeper documents are refused by `serde_json` (its recursion limit); the scanner stops there
/// too rather than overflow the stack on text that was never JSON.
const MAX_DEPTH: usize = 128;

/// Where a value hangs: its parent, the step from it, and the key's text for a member.
struct Place {
    parent: usize,
    step: Step,
    key: (usize, usize),
    index: usize,
}

impl Scanner<'_> {
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.position) {
            self.position += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.position).copied()
    }

    /// Scans the value at the current position and records it at `place` (the root without
    /// one) as the next node; returns whether it was complete.
    fn value(&mut self, place: Option<Place>, anchor: usize) -> bool {
        let start = self.position;
        if self.depth >= MAX_DEPTH {
            return false;
        }
        let node = self.nodes.len();
        let (parent, key, index) = match &place {
            Some(place) => (place.parent, place.key, place.index),
            None => (0, (0, 0), 0),
        };
        self.nodes.push(Node {
            parent,
            key,
            index,
            span: Span {
                anchor,
                start,
                end: start,
            },
        });
        if let Some(place) = place {
            self.children.insert((place.parent, place.step), node);
        }
        self.depth += 1;
        let complete = match self.peek() {
            Some(b'{') => self.object(node),
            Some(b'[') => self.array(node),
            Some(b'"') => self.string().is_some(),
            Some(_) => self.scalar(),
            None => false,
        };
        self.depth -= 1;
        self.nodes[node].span.end = self.position;
        complete
    }

    /// Scans the object or array that opens here up to its `close` byte, calling `entry` at each
    /// member or element (white space and commas between them are passed over); returns whether
    /// it was complete.
    fn entries(&mut self, close: u8, mut entry: impl FnMut(&mut Self) -> bool) -> bool {
        self.position += 1;
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(byte) if byte == close => {
                    self.position += 1;
                    return true;
                }
                Some(b',') => self.position += 1,
                Some(_) => {
                    if !entry(self) {
                        return false;
                    }
                }
                None => return false,
            }
        }
    }

    fn object(&mut self, node: usize) -> bool {
        let mut first_offsets: HashMap<Box<str>, usize> = HashMap::new();
        self.entries(b'}', |scanner| {
            if scanner.peek() != Some(b'"') {
                return false;
            }
            let key_offset = scanner.position;
            let Some(key) = scanner.string() else {
                return false;
            };
            let key_end = scanner.position;
            scanner.skip_whitespace();
            if scanner.peek() != Some(b':') {
                return false;
            }
            scanner.position += 1;
            scanner.skip_whitespace();
            let key: Box<str> = key.into();
            let first = first_offsets.get(&key).copied();
            if first.is_none() {
                first_offsets.insert(key.clone(), key_offset);
            }
            let place = Place {
                parent: node,
                step: Step::Key(key),
                key: (key_offset, key_end),
                index: 0,
            };
            // The member becomes the next node, unless it is too deep to be recorded.
            if let Some(first_offset) = first {
                if scanner.duplicates.len() < MAX_DUPLICATES && scanner.depth < MAX_DEPTH {
                    scanner
                        .duplicates
                        .push((scanner.nodes.len(), key_offset, first_offset));
                }
            }
            scanner.value(Some(place), key_offset)
        })
    }

    fn array(&mut self, node: usize) -> bool {
        let mut index = 0usize;
        self.entries(b']', |scanner| {
            let start = scanner.position;
            let place = Place {
                parent: node,
                step: Step::Index(index),
                key: (0, 0),
                index,
            };
            index += 1;
            scanner.value(Some(place), start)
        })
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
