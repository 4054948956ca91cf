//! The forms a profile of `all_reduce_add_rms_norm` takes: fused (one kernel does the sum, the
//! residual add and the RMSNorm) or separate (an all-reduce, then prepare's `add_rms_norm`
//! kernel). NCCL profiles are always separate and never say so.

use super::{Algorithm, Collective, Epilogue, Ladder, Profile, Protocol, Transfer};

/// A fused kernel of `all_reduce_add_rms_norm`: the profile shapes that name one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FusedForm {
    /// `{"algorithm": "one_shot", "transfer": "push", "protocol": "ll"}`.
    OneShotPushLl,
    /// `{"algorithm": "one_shot", "transfer": "push", "protocol": "simple"}`.
    OneShotPushSimple,
    /// `{"algorithm": "rsag"}`, pulled, without protocol or schedule: reduce-scatter of rows,
    /// the norm of the owned rows, all-gather of both outputs.
    TwoShot,
}

impl FusedForm {
    /// Every fused form, in the order docs and messages list them.
    pub const ALL: [FusedForm; 3] = [
        FusedForm::OneShotPushLl,
        FusedForm::OneShotPushSimple,
        FusedForm::TwoShot,
    ];

    /// The kernel's name without the dtype (`all_reduce_add_rms_norm_two_shot`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            FusedForm::OneShotPushLl => "all_reduce_add_rms_norm_one_shot_push_ll",
            FusedForm::OneShotPushSimple => "all_reduce_add_rms_norm_one_shot_push_simple",
            FusedForm::TwoShot => "all_reduce_add_rms_norm_two_shot",
        }
    }

    /// The profile fields that name it, as a ladder writes them.
    pub fn profile_fields(self) -> &'static str {
        match self {
            FusedForm::OneShotPushLl => {
                r#"{"algorithm": "one_shot", "transfer": "push", "protocol": "ll"}"#
            }
            FusedForm::OneShotPushSimple => {
                r#"{"algorithm": "one_shot", "transfer": "push", "protocol": "simple"}"#
            }
            FusedForm::TwoShot => r#"{"algorithm": "rsag"}"#,
        }
    }
}

/// What a profile of a ladder runs, as the package and `prepare show` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EpilogueForm {
    /// One fused kernel.
    Fused(FusedForm),
    /// The profile's all-reduce kernel into `normed`, then `add_rms_norm`.
    SeparateKernel,
    /// NCCL's all-reduce (plain or rank-order) into `normed`, then `add_rms_norm`.
    SeparateNccl,
}

impl EpilogueForm {
    /// What runs, in words (`prepare show`, `prepare export`).
    pub fn describe(self) -> &'static str {
        match self {
            EpilogueForm::Fused(_) => "fused",
            EpilogueForm::SeparateKernel => "the all-reduce kernel, then add_rms_norm",
            EpilogueForm::SeparateNccl => "NCCL's all-reduce, then add_rms_norm",
        }
    }
}

/// Each form the ladder's profiles take, with the ids of its profiles in the ladder's order:
/// fused first, then separate kernels, then NCCL; empty for every collective but
/// `all_reduce_add_rms_norm`.
pub fn epilogue_forms(ladder: &Ladder) -> Vec<(EpilogueForm, Vec<&str>)> {
    let mut forms: Vec<(EpilogueForm, Vec<&str>)> = Vec::new();
    for profile in &ladder.profiles {
        let Some(form) = profile.epilogue_form(ladder.collective) else {
            continue;
        };
        // The fused kernels are one form in the listing.
        let key = |form: EpilogueForm| match form {
            EpilogueForm::Fused(_) => 0,
            EpilogueForm::SeparateKernel => 1,
            EpilogueForm::SeparateNccl => 2,
        };
        match forms.iter_mut().find(|(known, _)| key(*known) == key(form)) {
            Some((_, ids)) => ids.push(&profile.id),
            None => forms.push((form, vec![&profile.id])),
        }
        forms.sort_by_key(|(form, _)| key(*form));
    }
    forms
}

impl Profile {
    /// The fused kernel this profile's shape names, whatever its `epilogue` field says; `None`
    /// for every other shape.
    pub fn fused_shape(&self) -> Option<FusedForm> {
        if self.schedule.is_some() {
            return None;
        }
        match (self.algorithm, self.transfer_or_default(), self.protocol) {
            (Algorithm::OneShot, Transfer::Push, Some(Protocol::Ll)) => {
                Some(FusedForm::OneShotPushLl)
            }
            (Algorithm::OneShot, Transfer::Push, Some(Protocol::Simple)) => {
                Some(FusedForm::OneShotPushSimple)
            }
            (Algorithm::Rsag, Transfer::Pull, None) => Some(FusedForm::TwoShot),
            _ => None,
        }
    }

    /// Whether the profile runs its epilogue after its all-reduce: NCCL profiles always, custom
    /// ones with `"epilogue": "separate"`.
    pub fn has_separate_epilogue(&self) -> bool {
        self.is_nccl() || self.epilogue == Some(Epilogue::Separate)
    }

    /// What the profile runs as a candidate of `collective`: `None` for every collective but
    /// `all_reduce_add_rms_norm`, and for a custom profile there that is neither fused nor
    /// separate (validation refuses it).
    pub fn epilogue_form(&self, collective: Collective) -> Option<EpilogueForm> {
        if collective != Collective::AllReduceAddRmsNorm {
            return None;
        }
        if self.is_nccl() {
            Some(EpilogueForm::SeparateNccl)
        } else if self.has_separate_epilogue() {
            Some(EpilogueForm::SeparateKernel)
        } else {
            self.fused_shape().map(EpilogueForm::Fused)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(json: serde_json::Value) -> Profile {
        serde_json::from_value(json).expect("a profile")
    }

    #[test]
    fn the_three_fused_shapes_name_their_kernels_and_nothing_else_is_fused() {
        let fused = [
            (
                serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "ll"}),
                Some(FusedForm::OneShotPushLl),
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "simple"}),
                Some(FusedForm::OneShotPushSimple),
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "rsag"}),
                Some(FusedForm::TwoShot),
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "rsag", "transfer": "pull"}),
                Some(FusedForm::TwoShot),
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "rsag", "transfer": "push"}),
                None,
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "rsag", "transfer": "push", "protocol": "simple"}),
                None,
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "rsag", "schedule": "phased", "active_clusters": 1}),
                None,
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "one_shot", "transfer": "push"}),
                None,
            ),
            (
                serde_json::json!({"id": "p", "algorithm": "one_shot"}),
                None,
            ),
        ];
        for (json, expected) in fused {
            let profile = profile(json.clone());
            assert_eq!(profile.fused_shape(), expected, "{json}");
            assert_eq!(
                profile.epilogue_form(Collective::AllReduceAddRmsNorm),
                expected.map(EpilogueForm::Fused),
                "{json}"
            );
            assert_eq!(profile.epilogue_form(Collective::AllReduce), None);
        }
        let names: Vec<&str> = FusedForm::ALL
            .iter()
            .map(|form| form.kernel_name())
            .collect();
        assert_eq!(
            names,
            [
                "all_reduce_add_rms_norm_one_shot_push_ll",
                "all_reduce_add_rms_norm_one_shot_push_simple",
                "all_reduce_add_rms_norm_two_shot"
            ]
        );
    }

    #[test]
    fn a_ladder_lists_its_profiles_by_form_fused_first() {
        let ladder: Ladder = serde_json::from_str(include_str!(
            "../../tests/fixtures/ladders/valid/all_reduce_add_rms_norm.json"
        ))
        .expect("the fixture parses");
        let forms: Vec<(&str, Vec<&str>)> = epilogue_forms(&ladder)
            .into_iter()
            .map(|(form, ids)| (form.describe(), ids))
            .collect();
        assert_eq!(
            forms,
            [
                (
                    "fused",
                    vec![
                        "fused_ll",
                        "fused_simple",
                        "fused_two_shot",
                        "fused_two_shot_pull"
                    ]
                ),
                (
                    "the all-reduce kernel, then add_rms_norm",
                    vec![
                        "one_shot_pull",
                        "one_shot_ll",
                        "rsag_push",
                        "rsag_phased",
                        "copy_engine"
                    ]
                ),
                (
                    "NCCL's all-reduce, then add_rms_norm",
                    vec!["nccl", "nccl_4cta", "nccl_rank_order"]
                ),
            ]
        );
        let mut all_reduce = ladder.clone();
        all_reduce.collective = Collective::AllReduce;
        assert!(epilogue_forms(&all_reduce).is_empty());
    }

    #[test]
    fn separate_profiles_and_nccl_run_the_epilogue_after_the_all_reduce() {
        let separate = profile(serde_json::json!({
            "id": "p", "algorithm": "one_shot", "transfer": "push", "protocol": "ll",
            "epilogue": "separate"
        }));
        assert!(separate.has_separate_epilogue());
        assert_eq!(
            separate.epilogue_form(Collective::AllReduceAddRmsNorm),
            Some(EpilogueForm::SeparateKernel)
        );
        for nccl in [
            serde_json::json!({"id": "n", "algorithm": "nccl"}),
            serde_json::json!({"id": "n", "algorithm": "nccl", "order": "rank"}),
        ] {
            let nccl = profile(nccl);
            assert!(nccl.has_separate_epilogue());
            assert_eq!(
                nccl.epilogue_form(Collective::AllReduceAddRmsNorm),
                Some(EpilogueForm::SeparateNccl)
            );
        }
    }
}
