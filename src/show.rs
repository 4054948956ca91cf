//! The document `prepare show --json` prints: a package's identity and manifest, with a choice
//! made for it. It names both the package and the choice, so it sits above them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::package::{Manifest, Package};
use crate::tune::choice::Choice;

/// The contract of `prepare show --json`'s document.
pub const DESCRIPTION_FORMAT_VERSION: u32 = 1;

/// What `prepare show --json` prints: a package's identity and manifest, and a choice for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "prepare show document")]
pub struct Description {
    /// The contract of this document; 1 so far.
    pub format_version: u32,
    /// The package directory as named on the command line.
    pub package: String,
    /// The package's identity: sha256 of its `manifest.json`.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub identity: String,
    /// The package's manifest, verified.
    pub manifest: Manifest,
    /// Bytes of NCCL symmetric windows each GPU allocates, one per symmetric NCCL profile (the
    /// largest message of the buckets naming it, in 2 MiB pages); NCCL maps them for every
    /// peer, so the peer memory per GPU is this plus `manifest.peer_memory`.
    pub symmetric_window_bytes: u64,
    /// The choice named by `--choice`, as read (made for this package); null without one.
    pub choice: Option<Choice>,
}

impl Description {
    /// The document for `package`, with the choice shown beside it.
    pub fn new(package: &Package, choice: Option<&Choice>) -> Description {
        Description {
            format_version: DESCRIPTION_FORMAT_VERSION,
            package: package.dir().display().to_string(),
            identity: package.identity().to_owned(),
            manifest: package.manifest().clone(),
            symmetric_window_bytes: package.ladder().symmetric_windows_bytes(),
            choice: choice.cloned(),
        }
    }
}
