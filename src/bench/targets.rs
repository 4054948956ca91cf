//! The data of what `prepare bench` reports of a package of `all_reduce_add_rms_norm`: what
//! each candidate runs ([`Form`]) and per size the figures the speed targets read
//! ([`EpilogueSize`]); `super::epilogue` makes them.

use serde::{Deserialize, Serialize};

use crate::ladder::{Collective, EpilogueForm, Ladder};

/// What a candidate of `all_reduce_add_rms_norm` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// One kernel does the sum, the residual add and the RMSNorm.
    Fused,
    /// The profile's all-reduce kernel into `normed`, then `add_rms_norm`.
    Separate,
    /// The bucket's plain NCCL all-reduce, then `add_rms_norm`.
    Nccl,
    /// NCCL's exact rank-order all-reduce, then `add_rms_norm`.
    NcclRankOrder,
}

impl Form {
    /// The form of `profile` in `bucket` of `ladder`; `None` for a ladder of another
    /// collective or a profile it does not hold.
    pub fn of(ladder: &Ladder, bucket: usize, profile: &str) -> Option<Form> {
        let form = ladder
            .profile(profile)?
            .epilogue_form(Collective::AllReduceAddRmsNorm)?;
        let plain_nccl = ladder
            .plain_nccl(bucket)
            .is_some_and(|nccl| nccl.id == profile);
        Some(match form {
            EpilogueForm::Fused(_) => Form::Fused,
            EpilogueForm::SeparateKernel => Form::Separate,
            EpilogueForm::SeparateNccl if plain_nccl => Form::Nccl,
            EpilogueForm::SeparateNccl => Form::NcclRankOrder,
        })
    }
}

/// One contender's figure: its profile and median microseconds per operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The profile.
    pub profile: String,
    /// Median microseconds per operation.
    pub median_us: f64,
}

/// The figures of one size (rows x hidden) that the speed targets read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpilogueSize {
    /// Tokens.
    pub rows: u64,
    /// Elements per row.
    pub hidden: u64,
    /// The message's bytes (rows x hidden elements).
    pub bytes: u64,
    /// The tuned choice.
    pub chosen: Option<Figure>,
    /// The fastest fused candidate.
    pub fused: Option<Figure>,
    /// The fastest candidate running an all-reduce kernel, then `add_rms_norm`.
    pub unfused: Option<Figure>,
    /// NCCL's all-reduce, then `add_rms_norm`.
    pub nccl: Option<Figure>,
    /// The all-reduce package's tuned choice at the same bytes, from its own run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_reduce: Option<Figure>,
    /// `unfused / fused`: above 1, fusing pays.
    pub unfused_over_fused: Option<f64>,
    /// `nccl / fused`.
    pub nccl_over_fused: Option<f64>,
    /// `fused - all_reduce`, microseconds: what the residual add and the norm cost the fused
    /// call over the all-reduce alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_minus_all_reduce_us: Option<f64>,
}
