//! Startup selection, as a serving process runs it (docs/selection.md): the package
//! is loaded on this rank, the cache is consulted (used only when every rank hit the same
//! entry), otherwise every bucket's surviving candidates are checked exact at the bucket's
//! largest size and timed at its smallest and its largest message, both sizes in the same
//! interleaved rounds; every rank decides the same from the gathered matrix, the ranks compare
//! the sha256 of the serialized choice, and only then is anything written. The serving handle
//! ([`crate::serve::Handle`]) runs it for every package it serves.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use crate::agree::Topology;
use crate::cache::{self, Cache, Fingerprint};
use crate::collective::{rank_order_applies, Collectives, EntryId};
use crate::ladder::{is_exact, Ladder};
use crate::package::{Outcome, Package};
use crate::pieces;
use crate::progress::Reporter;
use crate::qualify::{qualify, Data, QualifyOptions, Sizes};
use crate::runtime::{Runtime, RuntimeError};
use crate::timing::{Timer, TimingOptions};
use crate::tune::choice::{write_choice, AboveLadder, BucketChoice, Choice, ChoiceError, Tuning};
use crate::tune::early_stop::keep_timing;
use crate::tune::{
    decide, decide_static, BucketDecision, BucketSamples, CandidateOutcome, CandidateSamples,
    DecisionError, Policy, INEXACT_EXCLUDED,
};

/// How selection runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectOptions {
    /// Time on the machine, or take each bucket's default.
    pub tuning: Tuning,
    /// A candidate replaces the bucket's default only when faster by more than this fraction
    /// (0.03 by default: 3%); see [`Policy::margin`].
    pub margin: f64,
    /// Keep candidates whose output differs from the reference sum (plain NCCL beyond two
    /// ranks) among those timed and chosen. False by default: the policy is then exact-only
    /// (`exact_only` is its negation, [`SelectOptions::policy`]).
    pub allow_inexact: bool,
    /// The cache directory; `None` keeps no cache.
    pub cache_dir: Option<PathBuf>,
    /// Time again even when the cache holds a choice.
    pub retune: bool,
    /// How candidates are timed.
    pub timing: TimingOptions,
    /// Where every rank writes its choice (`DIR/choice.rank<r>.json`); `None` writes none.
    pub out: Option<PathBuf>,
}

impl Default for SelectOptions {
    fn default() -> SelectOptions {
        SelectOptions {
            tuning: Tuning::Runtime,
            margin: Policy::default().margin,
            allow_inexact: false,
            cache_dir: cache::default_dir(|name| std::env::var(name).ok()),
            retune: false,
            timing: TimingOptions::default(),
            out: None,
        }
    }
}

impl SelectOptions {
    /// The decision policy these options give: `exact_only` unless inexact candidates are
    /// allowed.
    pub fn policy(&self) -> Policy {
        Policy {
            margin: self.margin,
            exact_only: !self.allow_inexact,
            ..Policy::default()
        }
    }
}

/// Why selection failed.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// The runtime failed (driver, NCCL, a peer missing past the timeout, naming it).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// No candidate of a bucket survived.
    #[error("rank {rank}: {source}")]
    Decision {
        /// This rank.
        rank: u32,
        /// What the decision said.
        source: DecisionError,
    },
    /// The ranks disagreed, or a choice file could not be written.
    #[error("rank {rank}: {source}")]
    Choice {
        /// This rank.
        rank: u32,
        /// What failed.
        source: ChoiceError,
    },
    /// The cache could not be written (found by [`agree_cache`] before anything is timed).
    #[error("rank {rank}: {source}")]
    Cache {
        /// This rank.
        rank: u32,
        /// What failed.
        source: cache::CacheError,
    },
}

/// Where the selection's time went, this rank's view.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SelectTimes {
    /// Loading the package's kernels, mapping peer memory and splitting communicators.
    pub load: Duration,
    /// From the loaded candidates to the agreed choice: the cache lookup and, on a miss, the
    /// exactness checks, the timing and the decision.
    pub selection: Duration,
    /// Of `selection`, the exactness checks before timing.
    pub check: Duration,
    /// Of `selection`, the timing.
    pub timing: Duration,
}

/// What selection did.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// The agreed choice.
    pub choice: Choice,
    /// Whether every rank found it in the cache (nothing was timed).
    pub cache_hit: bool,
    /// The cache entry, when a cache is kept.
    pub cache_entry: Option<PathBuf>,
    /// This rank's choice file, when `out` was given.
    pub choice_file: Option<PathBuf>,
    /// Where the time went.
    pub times: SelectTimes,
    /// Device memory the loaded package keeps on this rank's GPU for serving, bytes: free
    /// memory (cuMemGetInfo) before loading minus after selection, once what checking and
    /// timing needed only while they ran (the full-size out-of-place output, the timing's
    /// buffers and graphs) is freed: the peer buffer, the private output buffer and the
    /// kernels (and a reduce-scatter's or all-gather's staging buffer of one piece, when it
    /// goes in pieces above the ladder). Measured by whoever loads ([`Handle::select`](crate::serve::Handle::select));
    /// 0 when the caller loaded the candidates itself.
    pub load_memory_bytes: u64,
}

/// The fingerprint of everything the choice depends on, on this machine.
pub fn fingerprint(
    runtime: &Runtime,
    package: &Package,
    policy: &Policy,
) -> Result<Fingerprint, RuntimeError> {
    Ok(Fingerprint {
        package: package.identity().to_owned(),
        tool_version: crate::TOOL_VERSION.to_owned(),
        gpu_names: runtime
            .records()
            .iter()
            .map(|record| record.gpu_name.clone())
            .collect(),
        gpu_uuids: runtime
            .records()
            .iter()
            .map(|record| record.gpu_uuid.clone())
            .collect(),
        driver_version: crate::runtime::driver_version(),
        nccl_version: crate::runtime::nccl_version()?,
        world_size: runtime.world(),
        topology: topology_text(runtime.topology()),
        nccl_settings: cache::nccl_settings(std::env::vars()),
        margin: policy.margin,
        exact_only: policy.exact_only,
    })
}

fn topology_text(topology: &Topology) -> String {
    match topology {
        Topology::PeerKernels => "peer kernels: one host, full peer access".to_owned(),
        Topology::NcclOnly { reason } => format!("NCCL only: {reason}"),
    }
}

/// A cached choice that fits: it parses, is in this tool's choice format (an entry of an older
/// format is a miss, and is timed again and replaced), passes [`Choice::check_package`] (this
/// package, one entry per bucket, each winner one of its bucket's candidates), names this
/// fingerprint and policy, was timed, and each winner was timed there (not excluded), is exact
/// when the policy asks for exactness, and was not dropped by the package's qualification. An
/// entry is a file anyone may have edited, so it is checked as strictly as a choice made here.
pub fn cached_choice(
    bytes: &[u8],
    package: &Package,
    key: &str,
    policy: &Policy,
) -> Option<Choice> {
    let choice: Choice = serde_json::from_slice(bytes).ok()?;
    let ladder = package.ladder();
    let qualification = package.manifest().qualification.as_ref();
    // The package's own check first (its identity, its buckets, winners among their
    // candidates), as for a choice file; then what a cache entry must also be.
    let fits = choice.format_version == crate::tune::choice::CHOICE_FORMAT_VERSION
        && choice
            .check_package(std::path::Path::new(key), package.id())
            .is_ok()
        && choice.fingerprint == key
        && choice.tuning == Tuning::Runtime
        && choice.policy == *policy
        && choice.buckets.len() == ladder.buckets.len()
        && choice.buckets.iter().zip(&ladder.buckets).enumerate().all(
            |(index, (chosen, bucket))| {
                let decision = &chosen.decision;
                let winner = &decision.winner;
                let timed = decision
                    .candidates
                    .iter()
                    .find(|result| &result.profile == winner);
                let qualified = qualification
                    .and_then(|qualification| qualification.buckets.get(index))
                    .map_or(Some(true), |qualified| {
                        qualified
                            .candidates
                            .iter()
                            .find(|candidate| &candidate.profile == winner)
                            .map(|candidate| match candidate.outcome {
                                Outcome::Qualified { exact } => exact || !policy.exact_only,
                                Outcome::Dropped(_) => false,
                            })
                    });
                chosen.max_bytes == bucket.max_bytes
                    && timed.is_some_and(|result| {
                        matches!(result.outcome, CandidateOutcome::Timed { .. })
                            && result.exact == decision.bit_exact
                    })
                    && (decision.bit_exact || !policy.exact_only)
                    && qualified == Some(true)
            },
        );
    fits.then_some(choice)
}

/// Checks on every rank, right after the bootstrap and before anything is timed, that its
/// cache can be written, and agrees what every rank does ([`cache::decide`]): a directory the
/// caller named that a rank cannot write fails every rank, naming that rank and the directory;
/// the default location that a rank cannot write makes every rank select without a cache, said
/// once through `reporter`. A directory is the default when it is the default location
/// ([`cache::default_dir`]). Returns the options to select with. Collective.
pub fn agree_cache(
    runtime: &Runtime,
    options: &SelectOptions,
    reporter: &dyn Reporter,
) -> Result<SelectOptions, SelectError> {
    let rank = runtime.rank();
    // Only timing stores; every rank takes part in the all-gather all the same.
    let dir = options
        .cache_dir
        .as_deref()
        .filter(|_| options.tuning == Tuning::Runtime);
    let default = cache::default_dir(|name| std::env::var(name).ok());
    let probe = cache::Probe::of(dir, default.as_deref());
    let gathered = runtime.all_gather(&probe.encode(), "the cache check")?;
    let probes = gathered
        .chunks(cache::PROBE_BYTES)
        .enumerate()
        .map(|(other, bytes)| {
            cache::Probe::decode(bytes).ok_or(SelectError::Cache {
                rank,
                source: cache::CacheError::Unreadable { rank: other as u32 },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let verdict = cache::decide(&probes);
    if let Some(source) = verdict.error() {
        return Err(SelectError::Cache { rank, source });
    }
    if let Some(note) = verdict.note() {
        reporter.note(&note);
        return Ok(SelectOptions {
            cache_dir: None,
            ..options.clone()
        });
    }
    Ok(options.clone())
}

/// Runs selection on loaded candidates. Collective.
pub fn select(
    runtime: &Runtime,
    collectives: &mut Collectives,
    package: &Package,
    options: &SelectOptions,
    reporter: &dyn Reporter,
) -> Result<Selection, SelectError> {
    let rank = runtime.rank();
    let started = Instant::now();
    let mut times = SelectTimes::default();
    let policy = options.policy();
    let fingerprint = fingerprint(runtime, package, &policy)?;
    // Every rank must select with the same options, or they would take different steps.
    let options_digest = Sha256::digest(
        serde_json::to_vec(&(
            options.tuning,
            policy,
            options.retune,
            format!("{:?}", options.timing),
        ))
        .expect("options serialize"),
    );
    runtime
        .agree_on(&options_digest, "the options")
        .map_err(|error| match error {
            RuntimeError::Disagreement(disagreement) => RuntimeError::RanksDiffer {
                rank,
                other: disagreement.other,
                what: "selects with other options (tuning, policy, --retune or timing) than \
                       this rank"
                    .to_owned(),
            },
            error => error,
        })?;
    // The key covers every rank's fingerprint (each host's driver, NCCL and settings), so all
    // ranks look up and write the same key.
    let gathered =
        runtime.all_gather(fingerprint.key().as_bytes(), "the fingerprint all-gather")?;
    let key = crate::hash::sha256_hex(&gathered);
    let cache = options.cache_dir.as_ref().map(Cache::new);

    // The cache is used only when every rank found the same entry. Every rank takes part in
    // the agreement, with or without a cache of its own.
    let use_cache = options.tuning == Tuning::Runtime && !options.retune;
    let entry = cache
        .as_ref()
        .filter(|_| use_cache)
        .and_then(|cache| cache.load(&key).ok().flatten())
        .and_then(|bytes| {
            cached_choice(&bytes, package, &key, &policy).map(|choice| (bytes, choice))
        })
        // A winner that cannot run here now (the drops are agreed, so every rank sees the same)
        // makes the entry a miss.
        .filter(|(_, choice)| {
            let live =
                |bucket: usize, profile: &str| collectives.find_live(bucket, profile).is_some();
            let winners_live = choice
                .buckets
                .iter()
                .all(|bucket| live(bucket.decision.index, &bucket.decision.winner));
            // The candidate that takes every whole piece above the ladder, if any.
            let pieces_live = match (choice.above_ladder.pieces_winner(), choice.buckets.last()) {
                (Some(winner), Some(last)) => live(last.decision.index, winner),
                _ => true,
            };
            winners_live && pieces_live
        });
    let mut local = [0_u8; 33];
    if let Some((bytes, _)) = &entry {
        local[0] = 1;
        local[1..].copy_from_slice(&Sha256::digest(bytes));
    }
    let cached = match runtime.agree_on(&local, "the cache") {
        Ok(()) => entry.map(|(_, choice)| choice),
        Err(RuntimeError::Disagreement(_)) => None,
        Err(error) => return Err(error.into()),
    };
    let cache_hit = cached.is_some();
    let choice = if let Some(choice) = cached {
        choice
    } else {
        let checked = Instant::now();
        reporter.start("check", 1);
        let report = qualify(
            runtime,
            collectives,
            package.ladder(),
            QualifyOptions {
                sizes: Sizes::Largest,
                repeat: 1,
                sequence_replays: 0,
                data: Data::Shared,
            },
            &|_| {},
        )?;
        reporter.advance("every candidate at its bucket's largest size");
        reporter.finish();
        times.check = checked.elapsed();
        let ladder = package.ladder();
        let (decisions, above_ladder) = match options.tuning {
            Tuning::Runtime => {
                let decisions = time_and_decide(
                    runtime,
                    collectives,
                    package,
                    &report.outcomes,
                    options,
                    reporter,
                    &mut times,
                )?;
                let timed = Instant::now();
                let above = above_ladder(
                    runtime,
                    collectives,
                    ladder,
                    &report.outcomes,
                    &decisions,
                    options,
                )?;
                times.timing += timed.elapsed();
                (decisions, above)
            }
            Tuning::Static => (
                static_decisions(collectives, package, &report.outcomes, &options.policy())
                    .map_err(|source| SelectError::Decision { rank, source })?,
                pieces::nccl_untimed("static tuning, nothing timed"),
            ),
        };
        Choice {
            format_version: crate::tune::choice::CHOICE_FORMAT_VERSION,
            tool_version: crate::TOOL_VERSION.to_owned(),
            package: package.identity().to_owned(),
            ladder: ladder.name.clone(),
            world_size: runtime.world(),
            fingerprint: key.clone(),
            topology: fingerprint.topology.clone(),
            tuning: options.tuning,
            policy,
            buckets: decisions
                .into_iter()
                .map(|decision| BucketChoice {
                    min_bytes: ladder.bucket_min_bytes(decision.index),
                    max_bytes: ladder.buckets[decision.index].max_bytes,
                    decision,
                })
                .collect(),
            above_ladder,
        }
    };

    // Nothing is written unless every rank holds the same bytes.
    let digest = choice.digest();
    runtime
        .agree_on(&digest, "the choice")
        .map_err(|error| match error {
            RuntimeError::Disagreement(disagreement) => SelectError::Choice {
                rank,
                source: ChoiceError::Disagreement {
                    rank: disagreement.other,
                    theirs: crate::hash::hex(&disagreement.theirs),
                    ours: crate::hash::hex(&disagreement.ours),
                },
            },
            error => error.into(),
        })?;
    times.selection = started.elapsed();

    let choice_file = match &options.out {
        Some(dir) => Some(
            write_choice(dir, rank, &choice)
                .map_err(|source| SelectError::Choice { rank, source })?,
        ),
        None => None,
    };
    let cache_entry = match (&cache, options.tuning) {
        (Some(cache), Tuning::Runtime) if !cache_hit => Some(
            cache
                .store(&key, &choice.to_bytes())
                .map_err(|source| SelectError::Cache { rank, source })?,
        ),
        (Some(cache), Tuning::Runtime) => Some(cache.path(&key)),
        _ => None,
    };
    Ok(Selection {
        choice,
        cache_hit,
        cache_entry,
        choice_file,
        times,
        load_memory_bytes: 0,
    })
}

/// What static tuning knows of one candidate: its profile, why it cannot run (if so), and
/// whether its output equals the reference sum where it is served.
struct StaticCandidate {
    profile: String,
    dropped: Option<String>,
    qualified_exact: bool,
}

/// One bucket's samples for [`decide_static`]: a candidate is exact where it was checked exact
/// and the policy says it can be ([`is_exact`]; plain NCCL summing beyond two
/// ranks may match once by chance). Where the NCCL fallback sums in rank order (`rank_ordered`:
/// under the exact policy where plain NCCL is not exact, with the sum kernel in the package), a
/// plain NCCL candidate is served by the rank-order path, so it counts as exact when the bucket
/// has no rank-order candidate that runs; where it has one, that one is preferred.
fn static_samples(
    ladder: &Ladder,
    index: usize,
    candidates: Vec<StaticCandidate>,
    rank_ordered: bool,
) -> BucketSamples {
    let is = |profile: &str, test: fn(&crate::ladder::Profile) -> bool| {
        ladder.profile(profile).is_some_and(test)
    };
    let rank_order_runs = candidates.iter().any(|candidate| {
        candidate.dropped.is_none()
            && is(
                &candidate.profile,
                crate::ladder::Profile::is_nccl_rank_order,
            )
    });
    let served_in_rank_order = |profile: &str| {
        rank_ordered && !rank_order_runs && is(profile, crate::ladder::Profile::is_plain_nccl)
    };
    let (collective, world) = (ladder.collective, ladder.world_size);
    let can_be_exact =
        |profile: &str| (ladder.profile(profile)).is_some_and(|p| is_exact(collective, p, world));
    BucketSamples {
        index,
        default: ladder.buckets[index].default.clone(),
        sizes: Vec::new(),
        candidates: candidates
            .into_iter()
            .map(|candidate| CandidateSamples {
                exact: (candidate.qualified_exact && can_be_exact(&candidate.profile))
                    || served_in_rank_order(&candidate.profile),
                profile: candidate.profile,
                dropped: candidate.dropped,
                samples: Vec::new(),
            })
            .collect(),
    }
}

/// Static tuning: per bucket the decision of [`decide_static`] over what the checks found.
fn static_decisions(
    collectives: &Collectives,
    package: &Package,
    outcomes: &[Outcome],
    policy: &Policy,
) -> Result<Vec<BucketDecision>, DecisionError> {
    let ladder = package.ladder();
    let rank_ordered = rank_order_applies(ladder.collective, ladder.world_size, policy.exact_only)
        && collectives.has_rank_order();
    (0..ladder.buckets.len())
        .map(|index| {
            let candidates = collectives
                .bucket_entries(index)
                .map(|(id, entry)| StaticCandidate {
                    profile: entry.profile.clone(),
                    dropped: entry.dropped.as_ref().map(ToString::to_string),
                    qualified_exact: !matches!(outcomes[id], Outcome::Qualified { exact: false }),
                })
                .collect();
            decide_static(
                &static_samples(ladder, index, candidates, rank_ordered),
                policy,
            )
        })
        .collect()
}

/// Messages above the largest bucket: when its winner is a custom kernel, NCCL on the whole
/// message against each of the bucket's custom candidates in pieces, at twice the largest
/// bucket's message (`pieces`). Collective.
fn above_ladder(
    runtime: &Runtime,
    collectives: &Collectives,
    ladder: &Ladder,
    outcomes: &[Outcome],
    decisions: &[BucketDecision],
    options: &SelectOptions,
) -> Result<AboveLadder, SelectError> {
    let rank = runtime.rank();
    let (Some(last), Some(bucket)) = (decisions.last(), ladder.buckets.last()) else {
        return Ok(pieces::nccl_untimed("the ladder has no bucket"));
    };
    let exact_only = options.policy().exact_only;
    let contenders = match pieces::Contenders::under(ladder, collectives, &last.winner, exact_only)
    {
        Ok(contenders) => contenders,
        Err(reason) => return Ok(pieces::nccl_untimed(&reason)),
    };
    let bytes = 2 * bucket.max_bytes;
    let buffers = pieces::PieceBuffers::new(runtime, collectives, bytes)?;
    let mut timer = Timer::new(runtime)?;
    let group = pieces::time_contenders(
        runtime,
        collectives,
        &mut timer,
        &contenders,
        (buffers.operands(bytes), buffers.staging()),
        options.timing,
        options.margin,
    )?;
    let decision = pieces::decide(
        ladder,
        collectives,
        outcomes,
        &contenders,
        group,
        bytes,
        &options.policy(),
    )
    .map_err(|source| SelectError::Decision { rank, source })?;
    Ok(pieces::route_of(decision, bytes))
}

/// Per bucket: every surviving candidate (checked exact at the bucket's largest size before)
/// timed at the bucket's smallest and largest message; the decision over the gathered matrix.
fn time_and_decide(
    runtime: &Runtime,
    collectives: &mut Collectives,
    package: &Package,
    outcomes: &[Outcome],
    options: &SelectOptions,
    reporter: &dyn Reporter,
    times: &mut SelectTimes,
) -> Result<Vec<BucketDecision>, SelectError> {
    let rank = runtime.rank();
    let ladder = package.ladder();
    let element_bytes = ladder.dtype.size_bytes();

    let timed = Instant::now();
    let mut timer = Timer::new(runtime)?;
    let mut samples = Vec::with_capacity(ladder.buckets.len());
    reporter.start("timing", ladder.buckets.len() as u64);
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        // Both edges of the bucket (one size when they are equal), ascending.
        let mut sizes = vec![ladder.bucket_min_bytes(index), bucket.max_bytes];
        sizes.dedup();
        let live: Vec<EntryId> = collectives
            .bucket_entries(index)
            .filter(|(id, entry)| {
                entry.dropped.is_none()
                    && (options.allow_inexact
                        || !matches!(outcomes[*id], Outcome::Qualified { exact: false }))
            })
            .map(|(id, _)| id)
            .collect();
        // One group, size by size: every live candidate at the smallest size, then every one at
        // the largest, so that each round interleaves both sizes. Every rank builds the same
        // list in the same order.
        let entries: Vec<(EntryId, usize)> = sizes
            .iter()
            .flat_map(|&bytes| {
                let elements = (bytes / element_bytes).max(1) as usize;
                live.iter().map(move |&id| (id, elements))
            })
            .collect();
        // A candidate stops being timed (at every size) once another dominates it, and the
        // bucket once at most one is not dominated (`tune::early_stop`).
        let keep = |so_far: &[Vec<Vec<Option<f64>>>]| -> Vec<bool> {
            let by_candidate: Vec<Vec<Vec<Vec<Option<f64>>>>> = (0..live.len())
                .map(|candidate| {
                    so_far
                        .iter()
                        .skip(candidate)
                        .step_by(live.len())
                        .cloned()
                        .collect()
                })
                .collect();
            let keep = keep_timing(&by_candidate, options.margin);
            (0..so_far.len())
                .map(|entry| keep[entry % live.len()])
                .collect()
        };
        let group = timer.time_until(runtime, collectives, &entries, options.timing, &keep)?;
        // `[entry][rank][round]` back to `[candidate][size][rank][round]`.
        let mut rows: Vec<Vec<Vec<Vec<Option<f64>>>>> =
            vec![Vec::with_capacity(sizes.len()); live.len()];
        for (entry, at_size) in group.samples.into_iter().enumerate() {
            rows[entry % live.len()].push(at_size);
        }
        let mut timed_samples = rows.into_iter();
        let candidates = collectives
            .bucket_entries(index)
            .map(|(id, entry)| {
                let exact = !matches!(outcomes[id], Outcome::Qualified { exact: false });
                let is_live = live.contains(&id);
                CandidateSamples {
                    profile: entry.profile.clone(),
                    dropped: if is_live {
                        None
                    } else {
                        Some(
                            entry
                                .dropped
                                .as_ref()
                                .map_or_else(|| INEXACT_EXCLUDED.to_owned(), ToString::to_string),
                        )
                    },
                    exact,
                    samples: if is_live {
                        timed_samples
                            .next()
                            .expect("one row of samples per live candidate")
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        samples.push(BucketSamples {
            index,
            default: bucket.default.clone(),
            sizes,
            candidates,
        });
        reporter.advance(&format!("bucket {index}"));
    }
    reporter.finish();
    times.timing = timed.elapsed();
    decide(&samples, runtime.world() as usize, &options.policy())
        .map_err(|source| SelectError::Decision { rank, source })
}

#[cfg(test)]
mod tests {
    use super::{rank_order_applies, static_samples, StaticCandidate};
    use crate::ladder::{Collective, Ladder};
    use crate::tune::{decide_static, Policy};

    fn ladder(collective: Collective, world: u32) -> Ladder {
        serde_json::from_value(serde_json::json!({
            "format_version": 1, "name": "static", "collective": collective, "dtype": "bf16",
            "world_size": world, "targets": ["sm_90"],
            "profiles": [
                { "id": "custom", "algorithm": "one_shot" },
                { "id": "nccl", "algorithm": "nccl" },
                { "id": "nccl_rank_order", "algorithm": "nccl", "order": "rank" }
            ],
            "buckets": [
                { "max_bytes": 65536, "threads": 512, "blocks": 8,
                  "candidates": ["custom", "nccl", "nccl_rank_order"], "default": "custom" },
                { "max_bytes": 131_072, "threads": 512, "blocks": 8,
                  "candidates": ["custom", "nccl"], "default": "custom" }
            ]
        }))
        .unwrap()
    }

    /// The static winner of bucket `index` when the custom kernel runs or not (`custom`), with
    /// every candidate checked exact: plain NCCL may match the reference by chance, and where
    /// it sums in its own order that is not taken as exactness.
    fn winner(ladder: &Ladder, index: usize, custom: bool, exact_only: bool) -> String {
        let candidates = ladder.buckets[index]
            .candidates
            .iter()
            .map(|profile| StaticCandidate {
                profile: profile.clone(),
                dropped: (profile == "custom" && !custom).then(|| "no peer access".to_owned()),
                qualified_exact: true,
            })
            .collect();
        let policy = Policy {
            exact_only,
            ..Policy::default()
        };
        let rank_ordered = rank_order_applies(ladder.collective, ladder.world_size, exact_only);
        decide_static(
            &static_samples(ladder, index, candidates, rank_ordered),
            &policy,
        )
        .unwrap()
        .winner
    }

    /// Between hosts (no custom candidate runs) static tuning falls back to NCCL: plain at two
    /// ranks, under an inexact policy and for an all-gather, the rank-order profile beyond two
    /// ranks under the exact policy; a bucket with nothing but plain NCCL keeps it (served in
    /// rank order).
    #[test]
    fn the_static_fallback_is_plain_nccl_at_two_ranks_and_rank_order_beyond_when_exact() {
        for (world, exact_only, summed) in [
            (2, true, "nccl"),
            (2, false, "nccl"),
            (4, true, "nccl_rank_order"),
            (4, false, "nccl"),
            (8, true, "nccl_rank_order"),
        ] {
            for collective in Collective::ALL {
                let ladder = ladder(collective, world);
                let expected = match collective {
                    Collective::AllGather => "nccl",
                    _ => summed,
                };
                let case = format!("{collective}, world {world}, exact {exact_only}");
                assert_eq!(winner(&ladder, 0, false, exact_only), expected, "{case}");
                assert_eq!(winner(&ladder, 1, false, exact_only), "nccl", "{case}");
                // The default wins wherever it runs.
                assert_eq!(winner(&ladder, 0, true, exact_only), "custom", "{case}");
            }
        }
    }
}
