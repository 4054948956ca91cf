//! What a reduce-scatter and an all-gather ladder take: one-shot pull and push profiles with
//! the barrier protocol, one-shot push with the ll protocol, the all-gather's one-shot copy
//! engine, and NCCL profiles (the rank-order one for the reduce-scatter only); no RSAG or full
//! algorithm, no schedule, no simple protocol, no reduce-scatter by the copy engines, no
//! symmetric window and no clustered bucket. The all-reduce's rules about those forms stay
//! silent on these ladders, so each problem is reported once, by the rule here.

use super::diagnostic::{json_string, Diagnostic, Rule};
use crate::ladder::{Algorithm, Bucket, Collective, Profile, Protocol, Transfer};

/// Whether the ladder's profiles and buckets may take every form the all-reduce has; otherwise
/// the rules of this module say which forms the collective takes.
pub(super) fn has_all_reduce_forms(collective: Collective) -> bool {
    !matches!(
        collective,
        Collective::ReduceScatter | Collective::AllGather
    )
}

/// Whether `profile` is of a form the collective has no kernel of (an algorithm or schedule of
/// the all-reduce only): its other fields and its places as a candidate are not judged, since
/// the rules about them speak of the all-reduce's forms.
pub(super) fn is_refused_form(collective: Collective, profile: &Profile) -> bool {
    !has_all_reduce_forms(collective)
        && (!takes_algorithm(profile.algorithm) || profile.schedule.is_some())
}

fn takes_algorithm(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::OneShot | Algorithm::Nccl)
}

/// Every problem of profile `index` that the collective refuses, each with the profile's id
/// and the collective named; none on a ladder with the all-reduce's forms.
pub(super) fn profile_refusals(
    collective: Collective,
    index: usize,
    profile: &Profile,
) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    if has_all_reduce_forms(collective) {
        return found;
    }
    let at = |field: &str| format!("/profiles/{index}/{field}");
    let id = json_string(&profile.id);
    let mut report = |rule, field: &str, value: &str, expected: String| {
        found.push(Diagnostic::new(
            rule,
            at(field),
            json_string(value),
            expected,
        ));
    };
    if !takes_algorithm(profile.algorithm) {
        report(
            Rule::AlgorithmNotForCollective,
            "algorithm",
            profile.algorithm.name(),
            format!(
                "\"one_shot\" or \"nccl\" (profile {id}: collective {collective} has no {} form; \
                 rsag and full are all-reduce algorithms)",
                profile.algorithm.name()
            ),
        );
        // The rest of such a profile describes an all-reduce kernel: nothing more to say.
        return found;
    }
    if profile.schedule.is_some() {
        report(
            Rule::ScheduleNotForCollective,
            "schedule",
            "phased",
            format!(
                "no schedule field (profile {id}: collective {collective} has no phased kernels)"
            ),
        );
    }
    if profile.protocol == Some(Protocol::Simple) && profile.algorithm == Algorithm::OneShot {
        report(
            Rule::ProtocolNotForCollective,
            "protocol",
            Protocol::Simple.name(),
            format!(
                "\"barrier\", \"ll\" (with \"transfer\": \"push\") or no protocol field (profile \
                 {id}: collective {collective} has no double-buffered simple kernel)"
            ),
        );
    }
    if profile.transfer == Some(Transfer::CopyEngine)
        && profile.algorithm == Algorithm::OneShot
        && collective == Collective::ReduceScatter
    {
        report(
            Rule::CopyEngineNotForCollective,
            "transfer",
            Transfer::CopyEngine.name(),
            format!(
                "\"pull\" or \"push\" (profile {id}: collective {collective} has no copy-engine \
                 form; all_reduce and all_gather have)"
            ),
        );
    }
    if let (Some(window), true) = (profile.window, profile.is_nccl()) {
        report(
            Rule::WindowNotForCollective,
            "window",
            window.name(),
            format!(
                "no window field (profile {id}: collective {collective} has no symmetric NCCL \
                 window yet; NCCL runs in the caller's memory)"
            ),
        );
    }
    if let (Some(order), true) = (profile.order, profile.is_nccl()) {
        if collective == Collective::AllGather {
            report(
                Rule::OrderNotForCollective,
                "order",
                order.name(),
                format!(
                    "no order field (profile {id}: collective {collective} sums nothing, so plain \
                     NCCL is exact already; \"order\": \"rank\" is for all_reduce and \
                     reduce_scatter)"
                ),
            );
        }
    }
    found
}

/// The problem of bucket `index` that the collective refuses, if any.
pub(super) fn bucket_refusal(
    collective: Collective,
    index: usize,
    bucket: &Bucket,
) -> Option<Diagnostic> {
    let cluster_size = bucket
        .cluster_size
        .filter(|_| !has_all_reduce_forms(collective))?;
    Some(Diagnostic::new(
        Rule::ClusteredBucketNotForCollective,
        format!("/buckets/{index}/cluster_size"),
        cluster_size.to_string(),
        format!(
            "no cluster_size field (collective {collective} has no cluster kernels, so its \
             buckets launch without clusters)"
        ),
    ))
}
