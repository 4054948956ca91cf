//! A cached choice is used only when it fits: this package, this key, this policy, timed, one
//! entry per bucket naming one of the bucket's candidates. Anything else is a miss, so a stale
//! or foreign entry can never be served.

use prepare::select::cached_choice;
use prepare::tune::choice::{Choice, Tuning, CHOICE_FORMAT_VERSION};
use prepare::tune::Policy;

use crate::support::fixtures;
use crate::support::fixtures::{format_1_candidate, CHOICE_KEY};

/// The topology text of the test choices.
const TOPOLOGY: &str = "peer kernels: one host, full peer access";

/// A change to a choice that must make it miss.
type Change = Box<dyn Fn(&mut Choice)>;

#[test]
fn only_a_choice_that_fits_is_taken_from_the_cache() {
    let (_scratch, package) = fixtures::opened_fixture();
    let policy = Policy::default();
    let good = fixtures::defaults_choice(&package, Tuning::Runtime, Policy::default(), TOPOLOGY);
    let fits = |choice: &Choice| cached_choice(&choice.to_bytes(), &package, CHOICE_KEY, &policy);
    assert_eq!(fits(&good), Some(good.clone()));

    let changes: Vec<(&str, Change)> = vec![
        ("another package", Box::new(|c| c.package = "0".repeat(64))),
        ("another key", Box::new(|c| c.fingerprint = "1".repeat(64))),
        ("static tuning", Box::new(|c| c.tuning = Tuning::Static)),
        ("another margin", Box::new(|c| c.policy.margin = 0.05)),
        (
            "another significance",
            Box::new(|c| c.policy.significance = 0.05),
        ),
        ("inexact allowed", Box::new(|c| c.policy.exact_only = false)),
        ("a bucket missing", Box::new(|c| drop(c.buckets.pop()))),
        (
            "a winner not among the bucket's candidates",
            Box::new(|c| c.buckets[0].decision.winner = "rsag_phased".to_owned()),
        ),
        (
            "another bucket range",
            Box::new(|c| c.buckets[1].max_bytes += 2),
        ),
        (
            "an older choice format",
            Box::new(|c| c.format_version = CHOICE_FORMAT_VERSION - 1),
        ),
    ];
    for (what, change) in changes {
        let mut changed = good.clone();
        change(&mut changed);
        assert_eq!(fits(&changed), None, "{what} must miss");
    }
    assert_eq!(
        cached_choice(b"{ torn", &package, CHOICE_KEY, &policy),
        None
    );
}

/// The cache key holds the policy, and a cached choice names its own: one made under the exact
/// policy is not used when inexact candidates are allowed, nor the other way round.
#[test]
fn a_cached_choice_made_under_one_policy_is_not_used_under_the_other() {
    let (_scratch, package) = fixtures::opened_fixture();
    let exact = Policy::default();
    let inexact = Policy {
        exact_only: false,
        ..Policy::default()
    };
    assert!(exact.exact_only);
    for (made, used) in [(exact, inexact), (inexact, exact)] {
        let choice = fixtures::defaults_choice(&package, Tuning::Runtime, made, TOPOLOGY);
        let bytes = choice.to_bytes();
        assert_eq!(
            cached_choice(&bytes, &package, CHOICE_KEY, &made),
            Some(choice.clone())
        );
        assert_eq!(
            cached_choice(&bytes, &package, CHOICE_KEY, &used),
            None,
            "a choice made with exact_only {} was used with exact_only {}",
            made.exact_only,
            used.exact_only
        );
    }
}

/// An entry of choice format 1 (figures at the largest message only) is a miss, not an error:
/// it is timed again and replaced.
#[test]
fn a_cached_choice_of_format_1_misses() {
    let (_scratch, package) = fixtures::opened_fixture();
    let policy = Policy::default();
    let mut value = serde_json::to_value(fixtures::defaults_choice(
        &package,
        Tuning::Runtime,
        Policy::default(),
        TOPOLOGY,
    ))
    .unwrap();
    value["format_version"] = 1.into();
    let winner = value["buckets"][0]["winner"].as_str().unwrap().to_owned();
    value["buckets"][0]["candidates"] = serde_json::json!([format_1_candidate(&winner)]);
    let bytes = serde_json::to_vec_pretty(&value).unwrap();
    assert_eq!(cached_choice(&bytes, &package, CHOICE_KEY, &policy), None);
}
