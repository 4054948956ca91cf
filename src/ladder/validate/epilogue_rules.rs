//! What an `all_reduce_add_rms_norm` ladder takes beside the all-reduce's rules: every custom
//! profile is either one of the fused kernels' shapes or says `"epilogue": "separate"` (the
//! all-reduce kernel, then `add_rms_norm`); NCCL profiles are always separate and do not say
//! so, and run without a symmetric window. No other collective takes the field. Nothing here
//! depends on the hidden size: a bucket covers rows x hidden bytes of any shape, and the
//! serving call refuses a hidden size no kernel takes.

use super::diagnostic::{json_string, Diagnostic, Rule};
use crate::ladder::{Collective, FusedForm, Profile};

/// Every problem of profile `index` with the epilogue, each naming the profile.
pub(super) fn epilogue_refusals(
    collective: Collective,
    index: usize,
    profile: &Profile,
) -> Vec<Diagnostic> {
    let at = |field: &str| format!("/profiles/{index}/{field}");
    let id = json_string(&profile.id);
    let fused = collective == Collective::AllReduceAddRmsNorm;
    let mut found = Vec::new();
    if let Some(epilogue) = profile.epilogue {
        let found_value = json_string(epilogue.name());
        if !fused {
            found.push(Diagnostic::new(
                Rule::EpilogueNotForCollective,
                at("epilogue"),
                found_value,
                format!(
                    "no epilogue field (profile {id}: collective {collective} has no epilogue; \
                     \"epilogue\" is for all_reduce_add_rms_norm)"
                ),
            ));
        } else if profile.is_nccl() {
            found.push(Diagnostic::new(
                Rule::EpilogueOnNccl,
                at("epilogue"),
                found_value,
                format!(
                    "no epilogue field (profile {id}: NCCL's all-reduce is always followed by \
                     the separate add_rms_norm kernel)"
                ),
            ));
        }
        return found;
    }
    if !fused {
        return found;
    }
    if profile.is_nccl() {
        if let Some(window) = profile.window {
            found.push(Diagnostic::new(
                Rule::WindowNotForCollective,
                at("window"),
                json_string(window.name()),
                format!(
                    "no window field (profile {id}: collective {collective} has no symmetric \
                     NCCL window yet; NCCL sums into normed in the caller's memory)"
                ),
            ));
        }
    } else if profile.fused_shape().is_none() {
        let shapes: Vec<&str> = FusedForm::ALL
            .iter()
            .map(|form| form.profile_fields())
            .collect();
        found.push(Diagnostic::new(
            Rule::NeitherFusedNorSeparate,
            format!("/profiles/{index}"),
            format!("profile {id}, no fused kernel's shape and no epilogue field"),
            format!(
                "\"epilogue\": \"separate\" (the all-reduce kernel, then add_rms_norm), or a \
                 fused kernel's shape: {}",
                shapes.join(", ")
            ),
        ));
    }
    found
}
