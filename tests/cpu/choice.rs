//! Choice files: identical bytes (and digests, which the ranks agree on before writing) for
//! equal choices, atomic files per rank, and reading back with the format version checked.

use std::path::PathBuf;

use prepare::tune::choice::{write_choice, BucketChoice, Choice, Tuning, CHOICE_FORMAT_VERSION};
use prepare::tune::{
    BucketDecision, CandidateOutcome, CandidateResult, DecisionReason, Policy, SizeFigures,
};

use crate::support::fixtures::format_1_candidate;

fn choice() -> Choice {
    Choice {
        format_version: CHOICE_FORMAT_VERSION,
        tool_version: prepare::TOOL_VERSION.to_owned(),
        package: "ab".repeat(32),
        ladder: "h200_nvlink_tp2".to_owned(),
        world_size: 2,
        fingerprint: "cd".repeat(32),
        topology: "peer_kernels".to_owned(),
        tuning: Tuning::Runtime,
        policy: Policy::default(),
        buckets: vec![BucketChoice {
            min_bytes: 2,
            max_bytes: 16384,
            decision: BucketDecision {
                index: 0,
                winner: "one_shot_push".to_owned(),
                baseline: "nccl".to_owned(),
                reason: DecisionReason::Faster {
                    ratio: 0.55,
                    tested_bytes: 16384,
                    p_value: 1e-9,
                },
                bit_exact: true,
                candidates: vec![
                    CandidateResult {
                        profile: "one_shot_push".to_owned(),
                        exact: true,
                        outcome: CandidateOutcome::Timed {
                            slowdown: 1.0,
                            sizes: vec![
                                SizeFigures {
                                    bytes: 2,
                                    median_us: 3.75,
                                    min_us: 3.5,
                                    max_us: 4.0,
                                    rounds: 30,
                                },
                                SizeFigures {
                                    bytes: 16384,
                                    median_us: 5.5,
                                    min_us: 5.25,
                                    max_us: 6.0,
                                    rounds: 29,
                                },
                            ],
                        },
                    },
                    CandidateResult {
                        profile: "rsag_phased".to_owned(),
                        exact: true,
                        outcome: CandidateOutcome::Excluded {
                            reason: "capture failed".to_owned(),
                        },
                    },
                ],
            },
        }],
        above_ladder: prepare::pieces::nccl_untimed(
            "the largest bucket chose nccl, NCCL, so pieces would be NCCL too",
        ),
    }
}

/// The error reading [`choice`] as JSON with `change` made, and the path of the file read.
fn refusal(change: impl FnOnce(&mut serde_json::Value)) -> (String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("choice.json");
    let mut value = serde_json::to_value(choice()).unwrap();
    change(&mut value);
    std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
    (Choice::read(&path).unwrap_err().to_string(), path)
}

#[test]
fn a_choice_round_trips_through_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_choice(dir.path(), 1, &choice()).unwrap();
    assert_eq!(path, dir.path().join("choice.rank1.json"));
    assert_eq!(Choice::read(&path).unwrap(), choice());
    assert_eq!(std::fs::read(&path).unwrap(), choice().to_bytes());
}

#[test]
fn equal_choices_have_equal_bytes_and_digests() {
    assert_eq!(choice().to_bytes(), choice().to_bytes());
    assert_eq!(choice().digest(), choice().digest());
    let mut other = choice();
    other.buckets[0].decision.winner = "nccl".to_owned();
    assert_ne!(other.digest(), choice().digest());
}

#[test]
fn an_unknown_format_version_is_refused() {
    let (message, _) = refusal(|value| value["format_version"] = 7.into());
    assert!(
        message.ends_with(&format!(
            "is not a valid choice: format_version 7 is not known to prepare {} (it reads 3)",
            prepare::TOOL_VERSION
        )),
        "{message}"
    );
}

/// A choice of format 1 (every candidate timed at its bucket's largest message only) is
/// refused for its version, before its shape is looked at.
#[test]
fn a_choice_of_format_1_is_refused_naming_its_version() {
    let (message, path) = refusal(|value| {
        value["format_version"] = 1.into();
        value["buckets"][0]["reason"] =
            serde_json::json!({"kind": "faster", "ratio": 0.55, "p_value": 1e-9});
        value["buckets"][0]["candidates"][0] = format_1_candidate("one_shot_push");
    });
    assert_eq!(
        message,
        format!(
            "{} is not a valid choice: format_version 1 is not known to prepare {} (it reads 3)",
            path.display(),
            prepare::TOOL_VERSION
        )
    );
}

/// A choice of format 2 (no route above the ladder) is refused for its version.
#[test]
fn a_choice_of_format_2_is_refused_naming_its_version() {
    let (message, path) = refusal(|value| {
        value["format_version"] = 2.into();
        value.as_object_mut().unwrap().remove("above_ladder");
    });
    assert_eq!(
        message,
        format!(
            "{} is not a valid choice: format_version 2 is not known to prepare {} (it reads 3)",
            path.display(),
            prepare::TOOL_VERSION
        )
    );
}

/// The route above the ladder is written with its reason, and a choice without it is refused.
#[test]
fn the_route_above_the_ladder_is_part_of_the_choice() {
    let value = serde_json::to_value(choice()).unwrap();
    assert_eq!(
        value["above_ladder"],
        serde_json::json!({
            "route": "nccl",
            "reason": "NCCL on the whole message: the largest bucket chose nccl, NCCL, so pieces \
                       would be NCCL too",
            "decision": null
        })
    );
    // NCCL takes such messages whole: no candidate runs on pieces.
    assert_eq!(choice().above_ladder.pieces_winner(), None);
    let (message, _) = refusal(|value| {
        value.as_object_mut().unwrap().remove("above_ladder");
    });
    assert!(
        message.contains("missing field `above_ladder`"),
        "{message}"
    );
}

#[test]
fn a_timed_candidate_holds_its_figures_per_size() {
    let value = serde_json::to_value(choice()).unwrap();
    assert_eq!(value["format_version"], CHOICE_FORMAT_VERSION);
    assert_eq!(CHOICE_FORMAT_VERSION, 3);
    assert_eq!(
        value["buckets"][0]["candidates"][0],
        serde_json::json!({
            "profile": "one_shot_push",
            "exact": true,
            "status": "timed",
            "slowdown": 1.0,
            "sizes": [
                {"bytes": 2, "median_us": 3.75, "min_us": 3.5, "max_us": 4.0, "rounds": 30},
                {"bytes": 16384, "median_us": 5.5, "min_us": 5.25, "max_us": 6.0, "rounds": 29}
            ]
        })
    );
    assert_eq!(
        value["buckets"][0]["reason"],
        serde_json::json!({"kind": "faster", "ratio": 0.55, "tested_bytes": 16384, "p_value": 1e-9})
    );
}

#[test]
fn an_unknown_top_level_field_is_refused() {
    let (message, _) = refusal(|value| value["surprise"] = true.into());
    assert!(message.contains("unknown field `surprise`"), "{message}");
}

/// [`choice`] with an NCCL candidate in its bucket, which the checks found `exact` or not, under
/// `policy`.
fn choice_with_nccl(exact: bool, policy: Policy) -> Choice {
    let mut choice = choice();
    choice.policy = policy;
    choice.buckets[0].decision.candidates.push(CandidateResult {
        profile: "nccl".to_owned(),
        exact,
        outcome: CandidateOutcome::Excluded {
            reason: prepare::tune::INEXACT_EXCLUDED.to_owned(),
        },
    });
    choice
}

#[test]
fn forcing_an_inexact_candidate_under_the_exact_policy_is_refused_naming_it_and_the_policy() {
    let inexact = choice_with_nccl(false, Policy::default());
    assert_eq!(
        inexact.force_refusal(0, "nccl").as_deref(),
        Some(
            "nccl in bucket 0 of h200_nvlink_tp2 cannot be forced: its output differs from the \
             reference sum on these ranks, and the policy is exact (a handle started with \
             allow_inexact can force it)"
        )
    );
    // An exact candidate, one not recorded, or a bucket that does not exist is not this
    // refusal's (the handle says what is wrong with the last two).
    assert_eq!(inexact.force_refusal(0, "one_shot_push"), None);
    assert_eq!(inexact.force_refusal(0, "no_such_profile"), None);
    assert_eq!(inexact.force_refusal(1, "nccl"), None);
    assert_eq!(
        choice_with_nccl(true, Policy::default()).force_refusal(0, "nccl"),
        None
    );
    let allowed = Policy {
        exact_only: false,
        ..Policy::default()
    };
    assert_eq!(
        choice_with_nccl(false, allowed).force_refusal(0, "nccl"),
        None
    );
}
