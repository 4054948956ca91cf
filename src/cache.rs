//! The choice cache: a choice is stored under a fingerprint of everything that could change
//! it, so a changed machine, driver, NCCL, setting or package is a miss, never a stale hit.
//! Entries are written to a temporary file and renamed into place, so a reader never sees a
//! torn file, however many writers race.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Everything a choice depends on. Field order is the serialised order, and maps are sorted,
/// so equal fingerprints hash equally.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fingerprint {
    /// The package identity (sha256 of its manifest, which records the collective and dtype).
    pub package: String,
    /// The tool's version.
    pub tool_version: String,
    /// Every rank's GPU name, in rank order.
    pub gpu_names: Vec<String>,
    /// Every rank's GPU UUID, in rank order.
    pub gpu_uuids: Vec<String>,
    /// The kernel module's driver version (`580.159.04`), not only the CUDA API level.
    pub driver_version: String,
    /// NCCL's version.
    pub nccl_version: String,
    /// Ranks.
    pub world_size: u32,
    /// The agreed topology, as text (peer kernels, or NCCL only and why).
    pub topology: String,
    /// Every `NCCL_*` variable in the environment.
    pub nccl_settings: BTreeMap<String, String>,
    /// The decision margin.
    pub margin: f64,
    /// Whether non-exact candidates are kept out.
    pub exact_only: bool,
}

impl Fingerprint {
    /// The cache key: sha256 of the fingerprint's JSON, in hex.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("a fingerprint always serialises");
        crate::hash::sha256_hex(&json)
    }
}

/// `NCCL_*` variables that say where the ranks meet, not how NCCL runs: they differ between
/// runs of the same job (a fresh port each time) and cannot change a timing.
const RENDEZVOUS_SETTINGS: [&str; 1] = ["NCCL_COMM_ID"];

/// Every `NCCL_*` variable among `vars` but the rendezvous, sorted.
pub fn nccl_settings(vars: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(name, _)| {
            name.starts_with("NCCL_") && !RENDEZVOUS_SETTINGS.contains(&name.as_str())
        })
        .collect()
}

/// Why the cache could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file operation failed.
    #[error("cache {path}", path = path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A cache directory the caller named cannot be written on a rank: every rank refuses to
    /// start, before anything is timed.
    #[error(
        "the cache directory {dir} given to rank {rank} cannot be written ({message}); give \
         one every rank can write, or no cache"
    )]
    Unwritable {
        /// The rank that cannot write it.
        rank: u32,
        /// The directory.
        dir: String,
        /// What the OS said.
        message: String,
    },
    /// A rank's cache check could not be read from the all-gather.
    #[error("rank {rank}'s cache check is not readable")]
    Unreadable {
        /// The rank whose record it is.
        rank: u32,
    },
}

/// The default cache directory: `$XDG_CACHE_HOME/prepare`, else `~/.cache/prepare`.
pub fn default_dir(lookup: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(base) = lookup("XDG_CACHE_HOME").filter(|base| !base.is_empty()) {
        return Some(PathBuf::from(base).join("prepare"));
    }
    lookup("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(".cache").join("prepare"))
}

/// A directory of cache entries, one file per key.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// A cache in `dir` (created by [`Cache::check_writable`] or the first store).
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks that entries can be stored now: creates the directory (as the first store would)
    /// and makes and removes a temporary file in it.
    pub fn check_writable(&self) -> Result<(), CacheError> {
        let io = |source| CacheError::Io {
            path: self.dir.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        // Removed when dropped.
        tempfile::NamedTempFile::new_in(&self.dir).map_err(io)?;
        Ok(())
    }

    /// Where the entry for `key` lives.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The entry's bytes, or `None` on a miss.
    pub fn load(&self, key: &str) -> Result<Option<Vec<u8>>, CacheError> {
        let path = self.path(key);
        match crate::files::read_limited(&path, crate::files::CACHE_ENTRY) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CacheError::Io { path, source }),
        }
    }

    /// Stores the entry atomically: a temporary file in the same directory, synced, then
    /// renamed over any previous entry.
    pub fn store(&self, key: &str, bytes: &[u8]) -> Result<PathBuf, CacheError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CacheError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let path = self.path(key);
        crate::files::write_atomically(&path, bytes).map_err(io(&path))?;
        Ok(path)
    }
}

/// Bytes of one rank's [`Probe`] in the start-up all-gather.
pub const PROBE_BYTES: usize = 1024;

/// The longest directory and message a probe carries, bytes (longer ones are shortened).
const PROBE_TEXT_BYTES: usize = 500;

/// What one rank found of its cache at start-up, before anything is timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// This rank keeps no cache (none given, or nothing is timed).
    Unused,
    /// Entries can be written.
    Writable,
    /// The directory cannot be written.
    Unwritable {
        /// Whether the caller named it; else it is the default location.
        named: bool,
        /// The directory.
        dir: String,
        /// What the OS said.
        message: String,
    },
}

/// `text` cut to at most `limit` bytes at a character boundary.
fn shortened(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Probe {
    /// This rank's probe of `dir` (`None`: no cache); `default` is the default location.
    pub fn of(dir: Option<&Path>, default: Option<&Path>) -> Probe {
        let Some(dir) = dir else {
            return Probe::Unused;
        };
        match Cache::new(dir).check_writable() {
            Ok(()) => Probe::Writable,
            Err(error) => Probe::Unwritable {
                named: Some(dir) != default,
                dir: dir.display().to_string(),
                message: match error {
                    CacheError::Io { source, .. } => source.to_string(),
                    other => other.to_string(),
                },
            },
        }
    }

    /// The probe as one fixed-size slot: a tag, then the directory and the message, each
    /// with its length.
    pub fn encode(&self) -> [u8; PROBE_BYTES] {
        let mut bytes = [0_u8; PROBE_BYTES];
        let (tag, texts) = match self {
            Probe::Unused => (0, None),
            Probe::Writable => (1, None),
            Probe::Unwritable {
                named,
                dir,
                message,
            } => (2 + u8::from(*named), Some((dir, message))),
        };
        bytes[0] = tag;
        if let Some((dir, message)) = texts {
            let mut at = 1;
            for text in [dir, message] {
                let text = shortened(text, PROBE_TEXT_BYTES).as_bytes();
                bytes[at..at + 2].copy_from_slice(&(text.len() as u16).to_le_bytes());
                bytes[at + 2..at + 2 + text.len()].copy_from_slice(text);
                at += 2 + text.len();
            }
        }
        bytes
    }

    /// A probe [`Probe::encode`] wrote, or `None`.
    pub fn decode(bytes: &[u8]) -> Option<Probe> {
        let text = |at: usize| -> Option<(String, usize)> {
            let length = u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?) as usize;
            let text = std::str::from_utf8(bytes.get(at + 2..at + 2 + length)?).ok()?;
            Some((text.to_owned(), at + 2 + length))
        };
        match *bytes.first()? {
            0 => Some(Probe::Unused),
            1 => Some(Probe::Writable),
            tag @ (2 | 3) => {
                let (dir, next) = text(1)?;
                let (message, _) = text(next)?;
                Some(Probe::Unwritable {
                    named: tag == 3,
                    dir,
                    message,
                })
            }
            _ => None,
        }
    }
}

/// What every rank does with its cache, decided alike on every rank from every rank's probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every rank that keeps a cache uses it.
    Use,
    /// The default location cannot be written on `rank` (the first such rank): every rank
    /// serves without a cache.
    WithoutCache {
        /// The rank.
        rank: u32,
        /// Its directory.
        dir: String,
        /// What the OS said.
        message: String,
    },
    /// A directory the caller named cannot be written on `rank` (the first such rank): every
    /// rank fails ([`Verdict::error`]).
    Fail {
        /// The rank.
        rank: u32,
        /// Its directory.
        dir: String,
        /// What the OS said.
        message: String,
    },
}

impl Verdict {
    /// What `WithoutCache` says, once.
    pub fn note(&self) -> Option<String> {
        match self {
            Verdict::WithoutCache { rank, dir, message } => Some(format!(
                "rank {rank} cannot write the default cache directory {dir} ({message}); every \
                 rank serves without a cache (name a writable one to keep choices)"
            )),
            _ => None,
        }
    }

    /// What `Fail` fails with.
    pub fn error(&self) -> Option<CacheError> {
        match self {
            Verdict::Fail { rank, dir, message } => Some(CacheError::Unwritable {
                rank: *rank,
                dir: dir.clone(),
                message: message.clone(),
            }),
            _ => None,
        }
    }
}

/// The verdict from every rank's probe, in rank order: a named directory that cannot be
/// written fails every rank; else a default one that cannot be written means no cache.
pub fn decide(probes: &[Probe]) -> Verdict {
    let unwritable = |want_named: bool| {
        probes
            .iter()
            .enumerate()
            .find_map(|(rank, probe)| match probe {
                Probe::Unwritable {
                    named,
                    dir,
                    message,
                } if *named == want_named => Some((rank as u32, dir.clone(), message.clone())),
                _ => None,
            })
    };
    if let Some((rank, dir, message)) = unwritable(true) {
        return Verdict::Fail { rank, dir, message };
    }
    match unwritable(false) {
        Some((rank, dir, message)) => Verdict::WithoutCache { rank, dir, message },
        None => Verdict::Use,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unwritable(named: bool, dir: &str) -> Probe {
        Probe::Unwritable {
            named,
            dir: dir.to_owned(),
            message: "Read-only file system (os error 30)".to_owned(),
        }
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_found_before_anything_is_timed() {
        let scratch = tempfile::tempdir().unwrap();
        // Root writes anywhere it may; nobody makes a directory under a regular file.
        let file = scratch.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let blocked = file.join("sub");
        let probe = Probe::of(Some(&blocked), None);
        let Probe::Unwritable {
            named,
            dir,
            message,
        } = &probe
        else {
            panic!("{probe:?}");
        };
        assert!(named, "not the default location");
        assert_eq!(dir, &blocked.display().to_string());
        assert!(message.contains("Not a directory"), "{message}");
        // The same directory as the default location.
        assert!(matches!(
            Probe::of(Some(&blocked), Some(&blocked)),
            Probe::Unwritable { named: false, .. }
        ));

        let writable = scratch.path().join("cache").join("prepare");
        assert_eq!(Probe::of(Some(&writable), None), Probe::Writable);
        let left: Vec<_> = std::fs::read_dir(&writable).unwrap().collect();
        assert!(left.is_empty(), "the check leaves nothing behind: {left:?}");
        assert_eq!(Probe::of(None, Some(&writable)), Probe::Unused);
    }

    #[test]
    fn a_probe_travels_in_its_slot_shortened_at_a_character() {
        let long = "é".repeat(400);
        for probe in [
            Probe::Unused,
            Probe::Writable,
            unwritable(true, "/var/cache/prepare"),
            unwritable(false, "/home/u/.cache/prepare"),
        ] {
            assert_eq!(Probe::decode(&probe.encode()), Some(probe));
        }
        let decoded = Probe::decode(&unwritable(true, &long).encode()).unwrap();
        let Probe::Unwritable { dir, .. } = decoded else {
            panic!("{decoded:?}");
        };
        assert_eq!(dir, "é".repeat(PROBE_TEXT_BYTES / 2));
        assert_eq!(Probe::decode(&[7; PROBE_BYTES]), None);
        assert_eq!(Probe::decode(&[2, 0xff, 0xff]), None);
    }

    #[test]
    fn a_named_directory_one_rank_cannot_write_fails_every_rank_naming_it() {
        let probes = [
            Probe::Writable,
            unwritable(false, "/home/a/.cache/prepare"),
            unwritable(true, "/shared/cache"),
            unwritable(true, "/other"),
        ];
        let verdict = decide(&probes);
        assert!(
            matches!(verdict, Verdict::Fail { rank: 2, .. }),
            "{verdict:?}"
        );
        assert_eq!(
            verdict.error().unwrap().to_string(),
            "the cache directory /shared/cache given to rank 2 cannot be written (Read-only \
             file system (os error 30)); give one every rank can write, or no cache"
        );
        assert_eq!(verdict.note(), None);
        assert!(decide(&probes[..2]).error().is_none());
    }

    #[test]
    fn the_default_location_one_rank_cannot_write_means_no_cache_on_every_rank() {
        let probes = [Probe::Writable, unwritable(false, "/home/b/.cache/prepare")];
        let verdict = decide(&probes);
        assert_eq!(
            verdict,
            Verdict::WithoutCache {
                rank: 1,
                dir: "/home/b/.cache/prepare".to_owned(),
                message: "Read-only file system (os error 30)".to_owned(),
            }
        );
        assert_eq!(
            verdict.note().unwrap(),
            "rank 1 cannot write the default cache directory /home/b/.cache/prepare (Read-only \
             file system (os error 30)); every rank serves without a cache (name a writable one \
             to keep choices)"
        );
        assert_eq!(decide(&[Probe::Writable, Probe::Unused]), Verdict::Use);
        assert_eq!(decide(&[]), Verdict::Use);
    }
}
