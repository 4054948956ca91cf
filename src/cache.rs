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
    /// The package identity (sha256 of its manifest).
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
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
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
