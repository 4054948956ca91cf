//! NCCL, found and opened by [`library()`] and called with cudarc's `nccl::sys` types: a
//! nonblocking communicator for the bounded bootstrap, blocking communicators split from it for
//! the collectives (a nonblocking communicator's collectives are slower), and a watchdog that
//! aborts a communicator when a deadline passes, since no NCCL call can time out by itself.

mod comm_id;
mod communicator;
pub mod environment;
mod error;
mod library;
mod window;

use std::path::PathBuf;

use cudarc::nccl::sys;

use library::{api, check};

pub use communicator::{Communicator, InitEnvironment, Transfer, Watchdog};
pub use error::{NcclError, OVERRIDE_VARIABLE};
pub use library::{Found, LibraryInfo};
pub use window::{symmetric_windows, NcclMemory};

/// The NCCL this process uses, found and opened on first use: one already loaded in the process,
/// then `PREPARE_NCCL`, a Python environment's `nvidia-nccl-cu*` wheel, the loader's search.
pub fn library() -> Result<LibraryInfo, NcclError> {
    Ok(library::load()?.info.clone())
}

/// The file of the NCCL this process uses, if one can be loaded.
pub fn library_path() -> Option<PathBuf> {
    library::load().ok().map(|nccl| nccl.info.path.clone())
}

/// Whether NCCL can be loaded.
pub fn is_available() -> bool {
    library::load().is_ok()
}

/// NCCL's version as (major, minor, patch).
pub fn version() -> Result<(u32, u32, u32), NcclError> {
    Ok(library::load()?.info.version)
}

/// The element types NCCL sums here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclDataType {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
}

impl NcclDataType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            NcclDataType::Bf16 | NcclDataType::F16 => 2,
            NcclDataType::F32 => 4,
        }
    }

    fn raw(self) -> sys::ncclDataType_t {
        match self {
            NcclDataType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
            NcclDataType::F16 => sys::ncclDataType_t::ncclFloat16,
            NcclDataType::F32 => sys::ncclDataType_t::ncclFloat32,
        }
    }
}

/// The 128-byte identity every rank of a communicator starts from.
#[derive(Clone, Copy)]
pub struct UniqueId(sys::ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// A new id. When `NCCL_COMM_ID` (host:port) is set in the environment, NCCL derives it
    /// from that address, as [`UniqueId::from_address`] does without the environment.
    pub fn new() -> Result<UniqueId, NcclError> {
        let api = api()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: ncclGetUniqueId fills the 128-byte struct it is given.
        let result = unsafe { (api.get_unique_id)(&raw mut id) };
        check(api, "ncclGetUniqueId", 0, result, std::ptr::null_mut())?;
        Ok(UniqueId(id))
    }

    /// The id every rank of a rendezvous at `address` (`host:port`, `[ipv6]:port`, NCCL_COMM_ID's
    /// form) starts from: the bytes `ncclGetUniqueId` makes when `NCCL_COMM_ID` holds that
    /// address, built without setting it. Rank 0 serves the rendezvous there when it joins with
    /// `NCCL_COMM_ID` set for the call ([`InitEnvironment`]). A host name is resolved here.
    pub fn from_address(address: &str) -> Result<UniqueId, NcclError> {
        let bytes = comm_id::handle_bytes(address).map_err(|message| NcclError::Address {
            address: address.to_owned(),
            message,
        })?;
        Ok(UniqueId::from_bytes(bytes))
    }

    /// The id's bytes, to hand to other ranks (`--id-file`).
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|byte| byte as u8)
    }

    /// An id from bytes written by [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(sys::ncclUniqueId {
            internal: bytes.map(|byte| byte as std::ffi::c_char),
        })
    }
}

/// Communicator settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommConfig {
    /// Calls return at once with `ncclInProgress` and are polled.
    pub nonblocking: bool,
    /// Share the parent's resources when splitting.
    pub split_share: bool,
    /// `maxCTAs`.
    pub max_ctas: Option<u32>,
    /// `minCTAs`.
    pub min_ctas: Option<u32>,
}

/// The first version whose `ncclConfig_t` layout cudarc's bindings describe.
const CONFIG_VERSION: u32 = 22_800;

const CONFIG_MAGIC: u32 = 0xcafe_beef;

const UNDEFINED_INT: i32 = i32::MIN;

impl CommConfig {
    /// The raw config, filled as `NCCL_CONFIG_INITIALIZER` does, then set.
    fn raw(&self) -> sys::ncclConfig_t {
        let undefined = |value: Option<u32>| value.map_or(UNDEFINED_INT, |value| value as i32);
        sys::ncclConfig_t {
            size: std::mem::size_of::<sys::ncclConfig_t>(),
            magic: CONFIG_MAGIC,
            version: CONFIG_VERSION,
            blocking: i32::from(!self.nonblocking),
            cgaClusterSize: UNDEFINED_INT,
            minCTAs: undefined(self.min_ctas),
            maxCTAs: undefined(self.max_ctas),
            netName: std::ptr::null(),
            splitShare: i32::from(self.split_share),
            trafficClass: UNDEFINED_INT,
            commName: std::ptr::null(),
            collnetEnable: UNDEFINED_INT,
            CTAPolicy: UNDEFINED_INT,
            shrinkShare: UNDEFINED_INT,
            nvlsCTAs: UNDEFINED_INT,
            nChannelsPerNetPeer: UNDEFINED_INT,
            nvlinkCentricSched: UNDEFINED_INT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_have_their_sizes_and_nccl_codes() {
        let types = [NcclDataType::Bf16, NcclDataType::F16, NcclDataType::F32];
        let sizes: Vec<usize> = types.iter().map(|dtype| dtype.size_bytes()).collect();
        assert_eq!(sizes, [2, 2, 4]);
        let codes: Vec<u32> = types.iter().map(|dtype| dtype.raw() as u32).collect();
        // nccl.h: ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9.
        assert_eq!(codes, [9, 6, 7]);
    }

    #[test]
    #[ignore = "needs NCCL (not a GPU): PREPARE_NCCL or a Python environment's nvidia-nccl wheel"]
    fn the_bytes_are_those_ncclgetuniqueid_makes_from_nccl_comm_id() {
        // NCCL picks its bootstrap interface from the first address it sees: the loopback.
        for address in [
            "127.0.0.1:29501",
            "localhost:40000",
            "10.11.12.13:1",
            "[::1]:40000",
            "[fe80::1:2]:65535",
        ] {
            let variables = [("NCCL_COMM_ID".to_owned(), address.to_owned())];
            let scope = environment::Scoped::set_where_unset(&variables);
            assert_eq!(
                scope.names().len(),
                1,
                "NCCL_COMM_ID must be unset to run this"
            );
            let nccl = UniqueId::new().unwrap().to_bytes();
            drop(scope);
            assert_eq!(comm_id::handle_bytes(address).unwrap(), nccl, "{address}");
        }
    }
}
