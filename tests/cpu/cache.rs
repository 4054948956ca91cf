//! The choice cache: the fingerprint changes with every field, settings are filtered, and
//! concurrent writers in several processes never leave a torn entry.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prepare::cache::{default_dir, nccl_settings, Cache, Fingerprint};

use crate::support::process::rerun;
use crate::test_name;

fn fingerprint() -> Fingerprint {
    Fingerprint {
        package: "a".repeat(64),
        tool_version: "0.1.0".to_owned(),
        gpu_names: vec!["NVIDIA H200".to_owned(); 2],
        gpu_uuids: vec!["GPU-0".to_owned(), "GPU-1".to_owned()],
        driver_version: "580.159.04".to_owned(),
        nccl_version: "2.28.9".to_owned(),
        world_size: 2,
        topology: "peer_kernels".to_owned(),
        nccl_settings: BTreeMap::from([("NCCL_NVLS_ENABLE".to_owned(), "0".to_owned())]),
        margin: 0.03,
        exact_only: false,
    }
}

#[test]
fn the_key_is_stable_and_hex() {
    let key = fingerprint().key();
    assert_eq!(key, fingerprint().key());
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|byte| byte.is_ascii_hexdigit()));
}

#[test]
fn every_field_changes_the_key() {
    let base = fingerprint().key();
    let changes: Vec<(&str, Change)> = vec![
        ("package", Box::new(|f| f.package = "b".repeat(64))),
        (
            "tool_version",
            Box::new(|f| f.tool_version = "0.2.0".to_owned()),
        ),
        (
            "gpu_names",
            Box::new(|f| f.gpu_names[1] = "NVIDIA H100".to_owned()),
        ),
        ("gpu_uuids", Box::new(|f| f.gpu_uuids.swap(0, 1))),
        (
            "driver_version",
            Box::new(|f| f.driver_version = "580.159.05".to_owned()),
        ),
        (
            "nccl_version",
            Box::new(|f| f.nccl_version = "2.29.0".to_owned()),
        ),
        ("world_size", Box::new(|f| f.world_size = 4)),
        (
            "topology",
            Box::new(|f| f.topology = "nccl_only".to_owned()),
        ),
        (
            "nccl_settings changed",
            Box::new(|f| {
                f.nccl_settings
                    .insert("NCCL_NVLS_ENABLE".to_owned(), "1".to_owned());
            }),
        ),
        (
            "nccl_settings added",
            Box::new(|f| {
                f.nccl_settings
                    .insert("NCCL_ALGO".to_owned(), "Ring".to_owned());
            }),
        ),
        ("margin", Box::new(|f| f.margin = 0.05)),
        ("exact_only", Box::new(|f| f.exact_only = true)),
    ];
    for (field, change) in changes {
        let mut changed = fingerprint();
        change(&mut changed);
        assert_ne!(changed.key(), base, "changing {field} kept the key");
    }
}

#[test]
fn only_nccl_settings_are_kept_sorted_without_the_rendezvous() {
    let settings = nccl_settings([
        ("PATH".to_owned(), "/bin".to_owned()),
        // A fresh port every run: keeping it would make every start a miss.
        ("NCCL_COMM_ID".to_owned(), "127.0.0.1:29501".to_owned()),
        ("NCCL_PROTO".to_owned(), "LL".to_owned()),
        ("NCCL_ALGO".to_owned(), "Ring".to_owned()),
        ("MY_NCCL_X".to_owned(), "1".to_owned()),
    ]);
    assert_eq!(
        settings.into_iter().collect::<Vec<_>>(),
        vec![
            ("NCCL_ALGO".to_owned(), "Ring".to_owned()),
            ("NCCL_PROTO".to_owned(), "LL".to_owned())
        ]
    );
}

#[test]
fn default_dir_follows_xdg_then_home() {
    let lookup = |xdg: Option<&str>, home: Option<&str>| {
        let (xdg, home) = (xdg.map(str::to_owned), home.map(str::to_owned));
        move |name: &str| match name {
            "XDG_CACHE_HOME" => xdg.clone(),
            "HOME" => home.clone(),
            _ => None,
        }
    };
    assert_eq!(
        default_dir(lookup(Some("/x"), Some("/h"))).unwrap(),
        std::path::Path::new("/x/prepare")
    );
    assert_eq!(
        default_dir(lookup(None, Some("/h"))).unwrap(),
        std::path::Path::new("/h/.cache/prepare")
    );
    assert_eq!(default_dir(lookup(None, None)), None);
}

#[test]
fn store_then_load_and_miss() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().join("nested"));
    assert_eq!(cache.load("k").unwrap(), None);
    let path = cache.store("k", b"entry").unwrap();
    assert_eq!(path, dir.path().join("nested").join("k.json"));
    assert_eq!(cache.load("k").unwrap().as_deref(), Some(&b"entry"[..]));
    // Nothing but the entry is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("nested"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("k.json")]);
}

type Change = Box<dyn Fn(&mut Fingerprint)>;

const WRITER_ENV: &str = "PREPARE_TEST_CACHE_WRITER";
const ENTRY_BYTES: usize = 256 * 1024;

/// An entry whose every byte is the writer's id: a torn file would mix ids or be short.
fn entry(writer: u8) -> Vec<u8> {
    vec![b'a' + writer; ENTRY_BYTES]
}

/// Several processes store the same key over and over while this one reads it: every read is
/// one writer's whole entry. The test binary re-runs itself as each writer.
#[test]
fn concurrent_writers_never_leave_a_torn_entry() {
    if let Ok(spec) = std::env::var(WRITER_ENV) {
        let (dir, writer) = spec.split_once('|').unwrap();
        let cache = Cache::new(dir);
        let writer: u8 = writer.parse().unwrap();
        for _ in 0..60 {
            cache.store("shared", &entry(writer)).unwrap();
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path());
    let name = test_name!(concurrent_writers_never_leave_a_torn_entry);
    let mut writers: Vec<_> = (0..4_u8)
        .map(|writer| {
            rerun(&name)
                .env(WRITER_ENV, format!("{}|{writer}", dir.path().display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let mut reads = 0;
    while writers
        .iter_mut()
        .any(|child| child.try_wait().unwrap().is_none())
    {
        if let Some(bytes) = cache.load("shared").unwrap() {
            assert_eq!(bytes.len(), ENTRY_BYTES, "a short entry was read");
            assert!(
                bytes.iter().all(|&byte| byte == bytes[0]),
                "an entry mixing writers was read"
            );
            reads += 1;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "writers hung");
    }
    for mut child in writers {
        assert!(child.wait().unwrap().success());
    }
    assert!(reads > 0, "the reader never saw an entry");
    // No temporary file survives the writers.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["shared.json".to_owned()]);
}
