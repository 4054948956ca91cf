//! The semantic rules: what the types and the schema cannot say about a ladder. Every rule
//! runs (none stops at the first failure); a rule that depends on another field skips what that
//! field's own rule refuses (no alignment check without a valid world size), and nothing here
//! can panic on a ladder the types accept.

use std::collections::HashMap;

use super::collective_rules::{
    bucket_refusal, has_all_reduce_forms, is_refused_form, profile_refusals,
};
use super::diagnostic::{closest, json_string, Diagnostic, Rule};
use super::epilogue_rules::epilogue_refusals;
use crate::ladder::{
    is_exact, Algorithm, Arch, Bucket, Ladder, Profile, Protocol, Schedule, Transfer,
    CLUSTER_BLOCKS, CLUSTER_SIZE, CLUSTER_THREADS, VECTOR_BYTES,
};

/// Ranks a ladder may have: peer kernels run within one host.
const WORLD_SIZES: std::ops::RangeInclusive<u32> = 2..=8;
/// Blocks a launch may have (the kernels' per-block flag arrays hold this many).
const MAX_BLOCKS: u32 = crate::abi::MAX_BLOCKS as u32;
/// Threads a block may have, and the warp size they come in.
const MAX_THREADS: u32 = 1024;
const WARP: u32 = 32;
/// NCCL's channel limit for `maxCTAs` and `minCTAs`.
const MAX_CTAS: u32 = 64;
/// The largest message a bucket may cover: every GPU holds peer buffers of the largest
/// custom bucket, and sizes stay far from overflow in every computation derived from them.
const MAX_BUCKET_BYTES: u64 = 1 << 32;

/// Every semantic rule the ladder breaks: ladder fields, then profiles, then buckets.
pub(super) fn check_rules(ladder: &Ladder) -> Vec<Diagnostic> {
    let mut checker = Checker {
        ladder,
        diagnostics: Vec::new(),
    };
    checker.ladder_fields();
    for (index, profile) in ladder.profiles.iter().enumerate() {
        checker.profile(index, profile);
    }
    checker.bucket_order();
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        checker.bucket(index, bucket);
    }
    checker.diagnostics
}

struct Checker<'ladder> {
    ladder: &'ladder Ladder,
    diagnostics: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn report(
        &mut self,
        rule: Rule,
        path: String,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) {
        self.diagnostics
            .push(Diagnostic::new(rule, path, found, expected));
    }

    fn ladder_fields(&mut self) {
        let ladder = self.ladder;
        if ladder.name.trim().is_empty() {
            self.report(
                Rule::EmptyName,
                "/name".into(),
                json_string(&ladder.name),
                "a name that identifies the catalog, such as \"h200_nvlink_tp2\"",
            );
        }
        if let Some(ordinary) = &ladder.ordinary_ladder {
            if ordinary.trim().is_empty() {
                self.report(
                    Rule::EmptyOrdinaryLadder,
                    "/ordinary_ladder".into(),
                    json_string(ordinary),
                    "the name of a ladder without clustered buckets, or no ordinary_ladder field",
                );
            }
        }
        if !WORLD_SIZES.contains(&ladder.world_size) {
            self.report(
                Rule::WorldSizeOutOfRange,
                "/world_size".into(),
                ladder.world_size.to_string(),
                format!(
                    "{} to {} ranks (peer kernels run within one host)",
                    WORLD_SIZES.start(),
                    WORLD_SIZES.end()
                ),
            );
        }
        if ladder.targets.is_empty() {
            self.report(
                Rule::EmptyTargets,
                "/targets".into(),
                "[]",
                "at least one architecture, such as \"sm_90\"",
            );
        }
        let mut seen: HashMap<Arch, usize> = HashMap::new();
        for (index, &arch) in ladder.targets.iter().enumerate() {
            if let Some(&first) = seen.get(&arch) {
                self.report(
                    Rule::DuplicateTarget,
                    format!("/targets/{index}"),
                    json_string(arch.name()),
                    format!("each architecture once (already at /targets/{first})"),
                );
            } else {
                seen.insert(arch, index);
            }
        }
        // A collective without clustered buckets refuses each of them by its own rule.
        let clustered = ladder
            .buckets
            .iter()
            .position(Bucket::is_clustered)
            .filter(|_| has_all_reduce_forms(ladder.collective));
        if let Some(clustered) = clustered {
            let capable: Vec<&str> = Arch::ALL
                .iter()
                .filter(|arch| arch.supports_clusters())
                .map(|arch| arch.name())
                .collect();
            for (index, &arch) in ladder.targets.iter().enumerate() {
                if !arch.supports_clusters() {
                    self.report(
                        Rule::ClustersUnsupportedByTarget,
                        format!("/targets/{index}"),
                        json_string(arch.name()),
                        format!(
                            "an architecture that launches thread-block clusters ({}), since \
                             /buckets/{clustered} is clustered",
                            capable.join(", ")
                        ),
                    );
                }
            }
        }
    }

    fn profile(&mut self, index: usize, profile: &Profile) {
        let at = |field: &str| format!("/profiles/{index}/{field}");
        if profile.id.trim().is_empty() {
            self.report(
                Rule::EmptyProfileId,
                at("id"),
                json_string(&profile.id),
                "an id that buckets name as a candidate, such as \"rsag_pull\"",
            );
        } else if let Some(first) = self.ladder.profiles[..index]
            .iter()
            .position(|earlier| earlier.id == profile.id)
        {
            self.report(
                Rule::DuplicateProfileId,
                at("id"),
                json_string(&profile.id),
                format!("an id not used by another profile (/profiles/{first} has it)"),
            );
        }

        let collective = self.ladder.collective;
        self.diagnostics
            .extend(profile_refusals(collective, index, profile));
        self.diagnostics
            .extend(epilogue_refusals(collective, index, profile));
        if is_refused_form(collective, profile) {
            return;
        }
        let all_reduce_forms = has_all_reduce_forms(collective);

        let algorithm = profile.algorithm;
        let phased = profile.schedule == Some(Schedule::Phased);
        if let Some(transfer) = profile.transfer {
            let ordinary = matches!(algorithm, Algorithm::OneShot | Algorithm::Rsag);
            if !ordinary || phased {
                let why = if phased {
                    "phased profiles write to one peer per phase".to_owned()
                } else {
                    format!("{} profiles have no direction", algorithm.name())
                };
                self.report(
                    Rule::TransferNotApplicable,
                    at("transfer"),
                    json_string(transfer.name()),
                    format!(
                        "no transfer field: only one_shot and rsag profiles without a schedule \
                         choose pull or push ({why})"
                    ),
                );
            } else if transfer == Transfer::CopyEngine && algorithm != Algorithm::OneShot {
                self.report(
                    Rule::CopyEngineNotOneShot,
                    at("transfer"),
                    json_string(transfer.name()),
                    "\"pull\" or \"push\": only one_shot profiles have a copy-engine form",
                );
            }
        }
        // A collective without the simple protocol refuses it by its own rule.
        let judged = |protocol: &Protocol| all_reduce_forms || *protocol != Protocol::Simple;
        if let Some(protocol) = profile.protocol.filter(judged) {
            let double_buffered = protocol != Protocol::Barrier;
            let push = profile.transfer == Some(Transfer::Push);
            let applies = !phased
                && match algorithm {
                    Algorithm::OneShot => push || !double_buffered,
                    Algorithm::Rsag => push && protocol == Protocol::Simple,
                    Algorithm::Full | Algorithm::Nccl => false,
                };
            if !applies {
                self.report(
                    Rule::ProtocolNotApplicable,
                    at("protocol"),
                    json_string(protocol.name()),
                    "no protocol field, a one_shot profile with \"transfer\": \"push\" and no \
                     schedule, or \"simple\" on an rsag one (one-shot push has the ll and simple \
                     protocols, RSAG push only simple)",
                );
            }
        }
        if phased && matches!(algorithm, Algorithm::OneShot | Algorithm::Nccl) {
            self.report(
                Rule::ScheduleNotApplicable,
                at("schedule"),
                json_string("phased"),
                format!(
                    "no schedule field on a {} profile (phased applies to rsag and full)",
                    algorithm.name()
                ),
            );
        }
        if algorithm == Algorithm::Full && !phased {
            self.report(
                Rule::FullWithoutPhased,
                at("schedule"),
                "nothing",
                "\"phased\": full all-reduce exists only as a phased cluster kernel",
            );
        }

        // A full profile is a cluster kernel even while its schedule is missing.
        let cluster_kernel = phased || algorithm == Algorithm::Full;
        match (profile.active_clusters, cluster_kernel) {
            (None, true) => self.report(
                Rule::MissingActiveClusters,
                at("active_clusters"),
                "nothing",
                "1: a phased profile states that one cluster does the work",
            ),
            (Some(count), true) if count != 1 => self.report(
                Rule::ActiveClustersNot1,
                at("active_clusters"),
                count.to_string(),
                "1 (cluster 0 does the work; the other clusters return at once)",
            ),
            (Some(count), false) => self.report(
                Rule::ActiveClustersWithoutPhased,
                at("active_clusters"),
                count.to_string(),
                "no active_clusters field: only phased profiles run in clusters",
            ),
            _ => {}
        }

        // Fields that configure NCCL, refused on every other profile.
        let communicator = "it configures NCCL's communicator";
        let nccl_only = [
            (
                "max_ctas",
                profile.max_ctas.map(|v| v.to_string()),
                Rule::CtasWithoutNccl,
                communicator,
            ),
            (
                "min_ctas",
                profile.min_ctas.map(|v| v.to_string()),
                Rule::CtasWithoutNccl,
                communicator,
            ),
            (
                "window",
                profile.window.map(|window| json_string(window.name())),
                Rule::WindowWithoutNccl,
                "it names the memory NCCL sums in",
            ),
            (
                "order",
                profile.order.map(|order| json_string(order.name())),
                Rule::OrderWithoutNccl,
                "it names the order NCCL's exact all-reduce sums in",
            ),
        ];
        for (field, found, rule, what) in nccl_only {
            if let (Some(found), false) = (found, algorithm == Algorithm::Nccl) {
                self.report(
                    rule,
                    at(field),
                    found,
                    format!("no {field} field: {what}, used only by nccl profiles"),
                );
            }
        }
        if profile.is_nccl_rank_order() {
            // The rank-order path runs on the runtime's communicator, in the caller's memory.
            let settings = [
                (
                    "window",
                    profile.window.map(|window| json_string(window.name())),
                ),
                ("max_ctas", profile.max_ctas.map(|value| value.to_string())),
                ("min_ctas", profile.min_ctas.map(|value| value.to_string())),
            ];
            for (field, found) in settings {
                if let Some(found) = found {
                    self.report(
                        Rule::OrderWithCommunicatorSettings,
                        at(field),
                        found,
                        format!(
                            "no {field} field on a profile with \"order\": \"rank\" (the exact \
                             NCCL path runs on the shared communicator), or a profile without order"
                        ),
                    );
                }
            }
        }
        let in_range = |value| (1..=MAX_CTAS).contains(&value);
        for (field, value) in [
            ("max_ctas", profile.max_ctas),
            ("min_ctas", profile.min_ctas),
        ] {
            if let Some(value) =
                value.filter(|&value| algorithm == Algorithm::Nccl && !in_range(value))
            {
                self.report(
                    Rule::CtasOutOfRange,
                    at(field),
                    value.to_string(),
                    format!("1 to {MAX_CTAS} (NCCL's channel limit)"),
                );
            }
        }
        if let (Some(max), Some(min)) = (profile.max_ctas, profile.min_ctas) {
            if algorithm == Algorithm::Nccl && in_range(max) && in_range(min) && min > max {
                self.report(
                    Rule::MinCtasAboveMaxCtas,
                    at("min_ctas"),
                    min.to_string(),
                    format!("at most max_ctas ({max})"),
                );
            }
        }

        if let Some(blocks) = profile.blocks {
            if algorithm == Algorithm::Nccl || cluster_kernel {
                let why = if algorithm == Algorithm::Nccl {
                    "NCCL chooses its own"
                } else {
                    "a phased profile launches the clustered bucket's 64 blocks"
                };
                self.report(
                    Rule::BlocksNotApplicable,
                    at("blocks"),
                    blocks.to_string(),
                    format!("no blocks field ({why})"),
                );
            } else if !(1..=MAX_BLOCKS).contains(&blocks) {
                self.report(
                    Rule::ProfileBlocksOutOfRange,
                    at("blocks"),
                    blocks.to_string(),
                    format!("1 to {MAX_BLOCKS}"),
                );
            }
        }
    }

    fn bucket_order(&mut self) {
        let ladder = self.ladder;
        if ladder.buckets.is_empty() {
            self.report(
                Rule::EmptyBuckets,
                "/buckets".into(),
                "[]",
                "at least one bucket (messages above the last bucket use NCCL)",
            );
        }
        for (index, pair) in ladder.buckets.windows(2).enumerate() {
            let (previous, bucket) = (&pair[0], &pair[1]);
            if bucket.max_bytes <= previous.max_bytes {
                self.report(
                    Rule::BucketsNotIncreasing,
                    format!("/buckets/{}/max_bytes", index + 1),
                    bucket.max_bytes.to_string(),
                    format!(
                        "more than {}, the max_bytes of /buckets/{index} (buckets go from small \
                         to large messages)",
                        previous.max_bytes
                    ),
                );
            }
        }
    }

    fn bucket(&mut self, index: usize, bucket: &Bucket) {
        let ladder = self.ladder;
        let at = |field: &str| format!("/buckets/{index}/{field}");

        if let Some(refusal) = bucket_refusal(ladder.collective, index, bucket) {
            self.diagnostics.push(refusal);
        }
        if bucket.max_bytes > MAX_BUCKET_BYTES {
            self.report(
                Rule::MaxBytesTooLarge,
                at("max_bytes"),
                bucket.max_bytes.to_string(),
                format!("at most {MAX_BUCKET_BYTES} (4 GiB); larger messages use NCCL"),
            );
        }
        // The alignment unit depends on world_size, which has its own rule when out of range.
        if WORLD_SIZES.contains(&ladder.world_size) {
            let unit = VECTOR_BYTES * u64::from(ladder.world_size);
            if bucket.max_bytes == 0 || bucket.max_bytes % unit != 0 {
                let below = bucket.max_bytes / unit * unit;
                let neighbours = match (below, below.checked_add(unit)) {
                    (0, Some(above)) => format!("such as {above}"),
                    (below, Some(above)) => format!("such as {below} or {above}"),
                    (below, None) => format!("such as {below}"),
                };
                self.report(
                    Rule::MaxBytesNotAligned,
                    at("max_bytes"),
                    bucket.max_bytes.to_string(),
                    format!(
                        "a positive multiple of {unit} (16-byte vectors x {} ranks), {neighbours}",
                        ladder.world_size
                    ),
                );
            }
        }

        if bucket.threads == 0 || bucket.threads > MAX_THREADS || bucket.threads % WARP != 0 {
            self.report(
                Rule::ThreadsOutOfRange,
                at("threads"),
                bucket.threads.to_string(),
                format!("a multiple of {WARP} from {WARP} to {MAX_THREADS}"),
            );
        }
        if !(1..=MAX_BLOCKS).contains(&bucket.blocks) {
            self.report(
                Rule::BlocksOutOfRange,
                at("blocks"),
                bucket.blocks.to_string(),
                format!("1 to {MAX_BLOCKS}"),
            );
        }
        // A clustered bucket has one shape: each field with its rule, value, required value
        // and what the report expects.
        if let Some(cluster_size) = bucket
            .cluster_size
            .filter(|_| has_all_reduce_forms(ladder.collective))
        {
            let shape = [
                (
                    Rule::ClusterSizeNot8,
                    "cluster_size",
                    cluster_size,
                    CLUSTER_SIZE,
                    format!("{CLUSTER_SIZE}, the only cluster size, or no cluster_size field"),
                ),
                (
                    Rule::ClusterSizeWithout512Threads,
                    "threads",
                    bucket.threads,
                    CLUSTER_THREADS,
                    format!("{CLUSTER_THREADS} in a clustered bucket, or no cluster_size field"),
                ),
                (
                    Rule::ClusterSizeWithout64Blocks,
                    "blocks",
                    bucket.blocks,
                    CLUSTER_BLOCKS,
                    format!(
                        "{CLUSTER_BLOCKS} ({} clusters of {CLUSTER_SIZE}) in a clustered bucket, \
                         or no cluster_size field",
                        CLUSTER_BLOCKS / CLUSTER_SIZE
                    ),
                ),
            ];
            for (rule, field, found, required, expected) in shape {
                if found != required {
                    self.report(rule, at(field), found.to_string(), expected);
                }
            }
        }

        self.candidates(index, bucket);
    }

    fn candidates(&mut self, index: usize, bucket: &Bucket) {
        let ladder = self.ladder;
        let mut ids: Vec<&str> = Vec::new();
        for profile in &ladder.profiles {
            if !ids.contains(&profile.id.as_str()) {
                ids.push(&profile.id);
            }
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (position, candidate) in bucket.candidates.iter().enumerate() {
            let path = format!("/buckets/{index}/candidates/{position}");
            if let Some(&first) = seen.get(candidate.as_str()) {
                self.report(
                    Rule::DuplicateCandidate,
                    path,
                    json_string(candidate),
                    format!("each profile once (already at /buckets/{index}/candidates/{first})"),
                );
                continue;
            }
            seen.insert(candidate, position);
            let Some(profile) = ladder.profile(candidate) else {
                self.report(
                    Rule::UnknownCandidate,
                    path,
                    json_string(candidate),
                    one_of_ids(candidate, &ids),
                );
                continue;
            };
            // The profile's own rule refuses it, and a clustered bucket has its own.
            if is_refused_form(ladder.collective, profile)
                || !has_all_reduce_forms(ladder.collective)
            {
                continue;
            }
            // A full profile is a cluster kernel even while its schedule is missing.
            let cluster_kernel =
                profile.is_cluster_kernel() || profile.algorithm == Algorithm::Full;
            if cluster_kernel && !bucket.is_clustered() {
                self.report(
                    Rule::PhasedProfileInUnclusteredBucket,
                    path,
                    json_string(candidate),
                    format!(
                        "a profile without a schedule, or \"cluster_size\": {CLUSTER_SIZE} on this \
                         bucket (phased profiles are cluster kernels)"
                    ),
                );
            } else if bucket.is_clustered() && has_applicable_blocks(profile) {
                self.report(
                    Rule::BlocksOverrideInClusteredBucket,
                    path,
                    json_string(candidate),
                    format!(
                        "a profile without its own blocks (a clustered bucket always launches \
                         {CLUSTER_BLOCKS} blocks)"
                    ),
                );
            }
        }

        if !bucket.candidates.contains(&bucket.default) {
            let listed: Vec<String> = bucket
                .candidates
                .iter()
                .map(|candidate| json_string(candidate))
                .collect();
            let expected = if listed.is_empty() {
                "one of the bucket's candidates, and the bucket has none".to_owned()
            } else {
                format!("one of the bucket's candidates: {}", listed.join(", "))
            };
            self.report(
                Rule::DefaultNotCandidate,
                format!("/buckets/{index}/default"),
                json_string(&bucket.default),
                expected,
            );
        }

        // Where plain NCCL's sum is not the reference's (an all-reduce or reduce-scatter beyond
        // two ranks), static tuning and every fallback to the default would change the output.
        // A default that is no candidate has its own rule.
        let exact = |profile: &Profile| is_exact(ladder.collective, profile, ladder.world_size);
        let inexact_default = ladder
            .profile(&bucket.default)
            .filter(|_| bucket.candidates.contains(&bucket.default))
            .is_some_and(|profile| !exact(profile));
        if WORLD_SIZES.contains(&ladder.world_size) && inexact_default {
            let exact: Vec<String> = bucket
                .candidates
                .iter()
                .filter(|candidate| ladder.profile(candidate).is_some_and(exact))
                .map(|candidate| json_string(candidate))
                .collect();
            let expected = if exact.is_empty() {
                "a default that sums in rank order, and the bucket has none: add a custom \
                 candidate and make it the default (plain NCCL sums in its own order beyond two \
                 ranks)"
                    .to_owned()
            } else {
                format!(
                    "a default that sums in rank order, one of {} (plain NCCL sums in its own \
                     order beyond two ranks)",
                    exact.join(", ")
                )
            };
            self.report(
                Rule::PlainNcclDefault,
                format!("/buckets/{index}/default"),
                json_string(&bucket.default),
                expected,
            );
        }

        let has_nccl = bucket
            .candidates
            .iter()
            .filter_map(|candidate| ladder.profile(candidate))
            .any(Profile::is_nccl);
        if !has_nccl {
            let expected = match ladder.profiles.iter().find(|profile| profile.is_nccl()) {
                Some(nccl) => format!(
                    "an NCCL candidate such as {} (every bucket keeps NCCL to fall back on)",
                    json_string(&nccl.id)
                ),
                None => "an NCCL candidate, after adding a profile {\"id\": \"nccl\", \
                         \"algorithm\": \"nccl\"} (every bucket keeps NCCL to fall back on)"
                    .to_owned(),
            };
            self.report(
                Rule::NoNcclCandidate,
                format!("/buckets/{index}/candidates"),
                serde_json::to_string(&bucket.candidates).unwrap_or_default(),
                expected,
            );
        }
    }
}

/// Whether the profile launches its own block count; where `blocks` does not apply it has its
/// own rule, so it is not reported again per bucket.
fn has_applicable_blocks(profile: &Profile) -> bool {
    profile.blocks.is_some()
        && !profile.is_nccl()
        && !profile.is_cluster_kernel()
        && profile.algorithm != Algorithm::Full
}

fn one_of_ids(candidate: &str, ids: &[&str]) -> String {
    let listed: Vec<String> = ids.iter().map(|id| json_string(id)).collect();
    let known = if listed.is_empty() {
        "a profile id, and the ladder has no profiles".to_owned()
    } else {
        format!("a profile id: {}", listed.join(", "))
    };
    match closest(candidate, ids.iter().copied()) {
        Some(near) => format!("{known} (did you mean {}?)", json_string(near)),
        None => known,
    }
}
