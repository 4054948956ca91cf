//! The readers of files other people may have edited never panic: a package's manifest, a
//! choice file and a cache entry, each corrupted at random (bytes changed, text cut, numbers
//! replaced by any value and the manifest resealed), are refused or, for a cache entry, missed;
//! only an unchanged document is accepted.

use std::fs;
use std::path::Path;

use prepare::ladder::Arch;
use prepare::package::{open_package, Manifest};
use prepare::select::cached_choice;
use prepare::tune::choice::{Choice, Tuning};
use prepare::tune::Policy;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use crate::support::fixtures;
use crate::support::fixtures::{opened_fixture, scratch, write_fixture};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Every leaf of a value, by pointer.
fn leaves(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                leaves(member, format!("{pointer}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                leaves(item, format!("{pointer}/{index}"), out);
            }
        }
        _ => out.push(pointer),
    }
}

/// Any JSON leaf a hostile editor might write.
fn any_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(
            |number| serde_json::Number::from_f64(number).map_or(Value::Null, Value::Number)
        ),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        "[a-z_0-9/.\u{1b}]{0,12}".prop_map(Value::from),
    ]
}

/// A corruption of a document's bytes: a byte changed, or the text cut.
#[derive(Debug, Clone)]
enum Corruption {
    Byte(Index, u8),
    Cut(Index),
}

fn corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Corruption::Byte(at, byte)),
        any::<Index>().prop_map(Corruption::Cut),
    ]
}

fn corrupt(bytes: &[u8], corruption: &Corruption) -> Vec<u8> {
    let mut bytes = bytes.to_vec();
    match corruption {
        Corruption::Byte(at, byte) => {
            let at = at.index(bytes.len());
            bytes[at] = *byte;
        }
        Corruption::Cut(at) => bytes.truncate(at.index(bytes.len())),
    }
    bytes
}

/// Replaces the leaf at `pick` of a JSON document with `leaf`.
fn replace_leaf(bytes: &[u8], pick: Index, leaf: Value) -> Value {
    let mut changed: Value = serde_json::from_slice(bytes).unwrap();
    let mut pointers = Vec::new();
    leaves(&changed, String::new(), &mut pointers);
    let pointer = &pointers[pick.index(pointers.len())];
    *changed.pointer_mut(pointer).unwrap() = leaf;
    changed
}

/// What an editor does to a document: corrupts its bytes, or replaces one leaf (at the pick)
/// with any value, keeping it JSON.
#[derive(Debug, Clone)]
enum Change {
    Corrupt(Corruption),
    Leaf(Index, Value),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        corruption().prop_map(Change::Corrupt),
        (any::<Index>(), any_leaf()).prop_map(|(pick, leaf)| Change::Leaf(pick, leaf)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_corrupted_or_resealed_manifest_never_panics_and_opens_only_if_it_holds_true(
        change in change(),
    ) {
        let (_scratch, out) = scratch();
        write_fixture(&out, Arch::Sm120);
        let path = out.join("manifest.json");
        let bytes = fs::read(&path).unwrap();
        let original: Manifest = serde_json::from_slice(&bytes).unwrap();
        match change {
            Change::Leaf(pick, leaf) => {
                let changed = replace_leaf(&bytes, pick, leaf);
                let Ok(mut manifest) = serde_json::from_value::<Manifest>(changed) else {
                    return Ok(());
                };
                manifest.seal();
                fs::write(&path, manifest.to_bytes()).unwrap();
                // A resealed change may still describe the package truly (the tool version, a
                // kernel's register count): it opens only if every file and the ladder agree.
                if let Ok(package) = open_package(&out) {
                    let opened = package.manifest();
                    prop_assert_eq!(&opened.kernels.len(), &original.kernels.len());
                    prop_assert_eq!(&opened.buckets, &original.buckets);
                    prop_assert_eq!(&opened.peer_memory, &original.peer_memory);
                    prop_assert_eq!(&opened.ladder, &original.ladder);
                }
            }
            Change::Corrupt(corruption) => {
                fs::write(&path, corrupt(&bytes, &corruption)).unwrap();
                // Without a new checksum only a change of layout (white space) still opens.
                if let Ok(package) = open_package(&out) {
                    prop_assert_eq!(package.manifest(), &original);
                }
            }
        }
    }

    #[test]
    fn a_corrupted_choice_file_never_panics(corruption in corruption()) {
        let (scratch, package) = opened_fixture();
        let bytes = fixtures::defaults_choice(&package, Tuning::Runtime, Policy::default(), "peer kernels").to_bytes();
        let corrupted = corrupt(&bytes, &corruption);
        let path = scratch.path().join("choice.json");
        fs::write(&path, &corrupted).unwrap();
        if let Ok(read) = Choice::read(Path::new(&path)) {
            let _ = read.check_package(&path, package.id());
        }
    }

    #[test]
    fn a_changed_cache_entry_is_a_miss_unless_it_still_fits(change in change()) {
        let (_scratch, package) = opened_fixture();
        let good = fixtures::defaults_choice(&package, Tuning::Runtime, Policy::default(), "peer kernels");
        let policy = Policy::default();
        let bytes = good.to_bytes();
        let changed = match change {
            Change::Leaf(pick, leaf) => {
                serde_json::to_vec(&replace_leaf(&bytes, pick, leaf)).unwrap()
            }
            Change::Corrupt(corruption) => corrupt(&bytes, &corruption),
        };
        if let Some(hit) = cached_choice(&changed, &package, fixtures::CHOICE_KEY, &policy) {
            // Whatever was changed left every rule standing: the winners are still the
            // bucket's timed candidates under this package, key and policy.
            prop_assert_eq!(&hit.package, package.identity());
            prop_assert_eq!(&hit.fingerprint, fixtures::CHOICE_KEY);
            for (bucket, ladder_bucket) in hit.buckets.iter().zip(&package.ladder().buckets) {
                prop_assert!(ladder_bucket.candidates.contains(&bucket.decision.winner));
            }
        }
    }
}
