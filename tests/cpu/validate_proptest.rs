//! Validation never panics and always points at a place: valid ladders are mutated at random
//! (fields dropped, types changed, buckets shuffled, huge and negative numbers, unicode
//! strings, deep nesting, cut or corrupted text) and every report is checked.

use std::sync::OnceLock;

use prepare::ladder::{validate_ladder, validate_ladder_text, Stage};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

use crate::support::repository::{read_json, valid_ladders};

/// Every valid ladder, read once.
fn seeds() -> &'static [Value] {
    static SEEDS: OnceLock<Vec<Value>> = OnceLock::new();
    SEEDS.get_or_init(|| valid_ladders().iter().map(|file| read_json(file)).collect())
}

/// Every pointer in a value, the root included.
fn pointers(value: &Value) -> Vec<String> {
    fn walk(value: &Value, pointer: &mut String, out: &mut Vec<String>) {
        out.push(pointer.clone());
        let length = pointer.len();
        match value {
            Value::Object(members) => {
                for (key, member) in members {
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    walk(member, pointer, out);
                    pointer.truncate(length);
                }
            }
            Value::Array(elements) => {
                for (index, element) in elements.iter().enumerate() {
                    pointer.push('/');
                    pointer.push_str(&index.to_string());
                    walk(element, pointer, out);
                    pointer.truncate(length);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut String::new(), &mut out);
    out
}

#[derive(Debug, Clone)]
enum Mutation {
    Drop(Index),
    Retype(Index, u8),
    ShuffleBuckets(Vec<Index>),
    Number(Index, u8),
    Unicode(Index, String),
    Nest(Index, usize),
}

#[derive(Debug, Clone)]
enum TextMutation {
    None,
    Cut(Index),
    Insert(Index, char),
    Remove(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Drop),
        (any::<Index>(), any::<u8>()).prop_map(|(index, kind)| Mutation::Retype(index, kind)),
        prop::collection::vec(any::<Index>(), 1..8).prop_map(Mutation::ShuffleBuckets),
        (any::<Index>(), any::<u8>()).prop_map(|(index, kind)| Mutation::Number(index, kind)),
        (any::<Index>(), "\\PC{0,12}").prop_map(|(index, text)| Mutation::Unicode(index, text)),
        (any::<Index>(), 1usize..300).prop_map(|(index, depth)| Mutation::Nest(index, depth)),
    ]
}

fn text_mutation() -> impl Strategy<Value = TextMutation> {
    prop_oneof![
        4 => Just(TextMutation::None),
        1 => any::<Index>().prop_map(TextMutation::Cut),
        1 => (any::<Index>(), any::<char>()).prop_map(|(index, character)| TextMutation::Insert(index, character)),
        1 => any::<Index>().prop_map(TextMutation::Remove),
    ]
}

fn apply(value: &mut Value, mutation: &Mutation) {
    let all = pointers(value);
    let target = |index: &Index| all[index.index(all.len())].clone();
    match mutation {
        Mutation::Drop(index) => {
            let pointer = target(index);
            let Some((parent, key)) = pointer.rsplit_once('/') else {
                return;
            };
            match value.pointer_mut(parent) {
                Some(Value::Object(members)) => {
                    let key = key.replace("~1", "/").replace("~0", "~");
                    members.shift_remove(&key);
                }
                Some(Value::Array(elements)) => {
                    if let Ok(position) = key.parse::<usize>() {
                        if position < elements.len() {
                            elements.remove(position);
                        }
                    }
                }
                _ => {}
            }
        }
        Mutation::Retype(index, kind) => {
            if let Some(slot) = value.pointer_mut(&target(index)) {
                *slot = match kind % 7 {
                    0 => Value::Null,
                    1 => json!(true),
                    2 => json!("512"),
                    3 => json!(1.5),
                    4 => json!([]),
                    5 => json!({}),
                    _ => json!(-1),
                };
            }
        }
        Mutation::ShuffleBuckets(swaps) => {
            if let Some(Value::Array(buckets)) = value.get_mut("buckets") {
                if buckets.is_empty() {
                    return;
                }
                for (step, swap) in swaps.iter().enumerate() {
                    let length = buckets.len();
                    buckets.swap(step % length, swap.index(length));
                }
            }
        }
        Mutation::Number(index, kind) => {
            if let Some(slot) = value.pointer_mut(&target(index)) {
                *slot = match kind % 9 {
                    0 => json!(u64::MAX),
                    1 => json!(i64::MIN),
                    2 => json!(1e300),
                    3 => json!(-1),
                    4 => json!(0),
                    5 => json!(u64::from(u32::MAX) + 1),
                    6 => json!(2.0),
                    7 => json!(u64::MAX - 15),
                    _ => json!(-0.0),
                };
            }
        }
        Mutation::Unicode(index, text) => {
            if let Some(slot) = value.pointer_mut(&target(index)) {
                *slot = Value::String(text.clone());
            }
        }
        Mutation::Nest(index, depth) => {
            if let Some(slot) = value.pointer_mut(&target(index)) {
                let mut nested = slot.take();
                for level in 0..*depth {
                    nested = if level % 2 == 0 {
                        json!([nested])
                    } else {
                        json!({ "x": nested })
                    };
                }
                *slot = nested;
            }
        }
    }
}

fn apply_text(text: &mut String, mutation: &TextMutation) {
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(offset, _)| offset)
        .chain(std::iter::once(text.len()))
        .collect();
    match mutation {
        TextMutation::None => {}
        TextMutation::Cut(index) => text.truncate(boundaries[index.index(boundaries.len())]),
        TextMutation::Insert(index, character) => {
            text.insert(boundaries[index.index(boundaries.len())], *character);
        }
        TextMutation::Remove(index) => {
            let at = boundaries[index.index(boundaries.len())];
            if at < text.len() {
                text.remove(at);
            }
        }
    }
}

/// A pointer whose value exists, or whose parent does (where a missing field belongs).
fn points_into(value: &Value, pointer: &str) -> bool {
    value.pointer(pointer).is_some()
        || pointer
            .rsplit_once('/')
            .is_some_and(|(parent, _)| value.pointer(parent).is_some())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn validation_never_panics_and_every_problem_has_a_place(
        seed in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 0..4),
        text_mutation in text_mutation(),
        pretty in any::<bool>(),
    ) {
        let seeds = seeds();
        let mut value = seeds[seed.index(seeds.len())].clone();
        for mutation in &mutations {
            apply(&mut value, mutation);
        }
        let mut text = if pretty {
            serde_json::to_string_pretty(&value).expect("serializes")
        } else {
            value.to_string()
        };
        apply_text(&mut text, &text_mutation);

        match validate_ladder_text(&text) {
            Ok(ladder) => {
                prop_assert_eq!(validate_ladder(&ladder), Ok(()));
            }
            Err(report) => {
                prop_assert!(!report.diagnostics.is_empty());
                let parsed: Option<Value> = serde_json::from_str(&text).ok();
                for diagnostic in &report.diagnostics {
                    prop_assert_eq!(diagnostic.rule.stage(), report.stage);
                    prop_assert!(
                        diagnostic.path.is_empty() || diagnostic.path.starts_with('/'),
                        "{}", diagnostic
                    );
                    prop_assert!(diagnostic.line.is_some() && diagnostic.column.is_some(), "{}", diagnostic);
                    prop_assert!(!diagnostic.found.is_empty() && !diagnostic.expected.is_empty());
                    if report.stage != Stage::Syntax {
                        let parsed = parsed.as_ref().expect("past the syntax stage the text is JSON");
                        prop_assert!(
                            points_into(parsed, &diagnostic.path),
                            "{} does not point into the document", diagnostic
                        );
                    }
                }
            }
        }
    }
}
