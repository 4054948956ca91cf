//! The exact policy in the decision (the default): a candidate whose output differs from the
//! reference sum (plain NCCL beyond two ranks) is kept out of runtime and static tuning alike,
//! a bucket left with none is an error that says so, and allowing inexact candidates keeps them.

use prepare::tune::{
    decide_bucket, decide_static, CandidateOutcome, CandidateSamples, DecisionError, Policy,
    INEXACT_EXCLUDED,
};

use super::decision::{bucket, bucket_at, dropped, timed};

/// The policy that keeps inexact candidates.
fn inexact_allowed() -> Policy {
    Policy {
        exact_only: false,
        ..Policy::default()
    }
}

#[test]
fn the_default_policy_keeps_a_non_matching_nccl_out_and_allowing_inexact_keeps_it() {
    let mut nccl = timed("nccl", 5.0, 0.01, 4, 30, 16);
    nccl.exact = false;
    let candidates = vec![timed("rsag", 10.0, 0.01, 4, 30, 17), nccl];
    assert!(Policy::default().exact_only);
    let exact = decide_bucket(&bucket("rsag", candidates.clone()), 4, &Policy::default()).unwrap();
    assert_eq!(exact.winner, "rsag");
    assert!(exact.bit_exact);
    assert_eq!(
        exact.candidates[1].outcome,
        CandidateOutcome::Excluded {
            reason: INEXACT_EXCLUDED.to_owned()
        }
    );
    let loose = inexact_allowed();
    let inexact = decide_bucket(&bucket("rsag", candidates), 4, &loose).unwrap();
    assert_eq!(inexact.winner, "nccl");
    assert!(!inexact.bit_exact);
}

#[test]
fn a_bucket_whose_only_candidate_is_inexact_is_an_error_under_the_exact_policy() {
    // Beyond two ranks, with every custom candidate dropped (no peer access, between hosts),
    // plain NCCL is all that is left, and it differs from the reference sum.
    let mut nccl = timed("nccl", 5.0, 0.01, 4, 30, 20);
    nccl.exact = false;
    let candidates = vec![dropped("rsag", "no peer access: two hosts"), nccl];
    let error =
        decide_bucket(&bucket("nccl", candidates.clone()), 4, &Policy::default()).unwrap_err();
    assert!(
        matches!(error, DecisionError::NothingExact { bucket: 3, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "bucket 3: no exact candidate could be timed (rsag: no peer access: two hosts; nccl: its \
         output differs from the reference sum, which the exact policy keeps out); allowing \
         inexact candidates would serve it with one whose output differs from the reference sum"
    );
    // Allowed, NCCL serves it, and the choice says it is not bit-exact.
    let loose = inexact_allowed();
    let decision = decide_bucket(&bucket("nccl", candidates), 4, &loose).unwrap();
    assert_eq!(decision.winner, "nccl");
    assert!(!decision.bit_exact);
}

/// A candidate as static tuning sees it: never timed, dropped or not, exact or not.
fn untimed(profile: &str, exact: bool, dropped: Option<&str>) -> CandidateSamples {
    CandidateSamples {
        profile: profile.to_owned(),
        dropped: dropped.map(str::to_owned),
        exact,
        samples: Vec::new(),
    }
}

#[test]
fn static_tuning_takes_the_default_unless_the_exact_policy_keeps_it_out() {
    let loose = inexact_allowed();
    let exact_default = bucket_at(
        "rsag",
        &[],
        vec![untimed("rsag", true, None), untimed("nccl", false, None)],
    );
    for policy in [Policy::default(), loose] {
        let decision = decide_static(&exact_default, &policy).unwrap();
        assert_eq!(
            (decision.winner.as_str(), decision.bit_exact),
            ("rsag", true)
        );
    }
    // An inexact default (a ladder of two ranks may have NCCL as its default, and NCCL may
    // differ there on another machine): the exact policy takes the first exact candidate.
    let inexact_default = bucket_at(
        "nccl",
        &[],
        vec![
            untimed("one_shot", true, Some("capture failed")),
            untimed("nccl", false, None),
            untimed("rsag", true, None),
        ],
    );
    let exact = decide_static(&inexact_default, &Policy::default()).unwrap();
    assert_eq!((exact.winner.as_str(), exact.bit_exact), ("rsag", true));
    assert_eq!(
        exact.candidates[1].outcome,
        CandidateOutcome::Excluded {
            reason: INEXACT_EXCLUDED.to_owned()
        }
    );
    let inexact = decide_static(&inexact_default, &loose).unwrap();
    assert_eq!(
        (inexact.winner.as_str(), inexact.bit_exact),
        ("nccl", false)
    );
}

#[test]
fn static_tuning_with_only_an_inexact_candidate_left_is_an_error_under_the_exact_policy() {
    let between_hosts = bucket_at(
        "rsag",
        &[],
        vec![
            untimed("rsag", true, Some("no peer access: two hosts")),
            untimed("nccl", false, None),
        ],
    );
    let error = decide_static(&between_hosts, &Policy::default()).unwrap_err();
    assert!(
        matches!(error, DecisionError::NothingExact { bucket: 3, .. }),
        "{error:?}"
    );
    let loose = inexact_allowed();
    assert_eq!(
        decide_static(&between_hosts, &loose).unwrap().winner,
        "nccl"
    );
    // Nothing runs at all: the error names every reason, under either policy.
    let nothing = bucket_at(
        "rsag",
        &[],
        vec![untimed("rsag", true, Some("capture failed"))],
    );
    assert_eq!(
        decide_static(&nothing, &loose).unwrap_err(),
        DecisionError::NothingTimed {
            bucket: 3,
            reasons: "rsag: capture failed".to_owned()
        }
    );
}
