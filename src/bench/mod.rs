//! What `prepare bench` measures ([`Bench`]), and the measurements as data: per message size
//! every contender's figures, the serving paths and the decode emulation's step times;
//! written as JSON and drawn as SVG plots (`plot`).

pub mod epilogue;
mod measure;
pub mod plot;
mod shape;
mod targets;
pub mod text;

pub use measure::{default_sizes, Bench, BenchError, EpilogueBuffers, ServingBuffers};
pub use shape::{bench_shape, RowsWidth, BENCH_WIDTH};

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::ladder::Collective;

/// What the bus bandwidth multiplies the full message's bytes per second by for `collective` on
/// `world` ranks, nccl-tests' convention: 2(n-1)/n for the all-reduce (the fused all-reduce
/// too: its collective is the all-reduce), (n-1)/n for the reduce-scatter and the all-gather,
/// so that each reads as what a link carries.
pub fn bus_factor(collective: Collective, world: u32) -> f64 {
    let (links, world) = (f64::from(world.saturating_sub(1)), f64::from(world));
    match collective {
        Collective::AllReduce | Collective::AllReduceAddRmsNorm => 2.0 * links / world,
        Collective::ReduceScatter | Collective::AllGather => links / world,
    }
}

/// [`bus_factor`] as the docs and the bench's header write it.
pub fn bus_formula(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce | Collective::AllReduceAddRmsNorm => "bytes x 2(n-1)/n / time",
        Collective::ReduceScatter | Collective::AllGather => "bytes x (n-1)/n / time",
    }
}

/// The bus bandwidth, GB/s, of a `collective` of `bytes` (the full message's) on `world` ranks
/// taking `median_us` microseconds.
pub fn bus_gbps(collective: Collective, world: u32, bytes: u64, median_us: f64) -> f64 {
    bytes as f64 * bus_factor(collective, world) / (median_us * 1e3)
}

/// What several operations of `collective` are called (`all-reduces`).
pub fn operations(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "all-reduces",
        Collective::ReduceScatter => "reduce-scatters",
        Collective::AllGather => "all-gathers",
        Collective::AllReduceAddRmsNorm => "all-reduces + RMSNorms",
    }
}

/// What one operation of `collective` is called in the bench's words (`all-reduce`).
pub fn operation(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "all-reduce",
        Collective::ReduceScatter => "reduce-scatter",
        Collective::AllGather => "all-gather",
        Collective::AllReduceAddRmsNorm => "all-reduce + RMSNorm",
    }
}

/// One contender at one message size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeRow {
    /// Message size, bytes (the full message's; a reduce-scatter's or all-gather's is its
    /// shape's).
    pub bytes: u64,
    /// The bucket covering it.
    pub bucket: usize,
    /// The rows x width a reduce-scatter or all-gather was timed at ([`bench_shape`]); none
    /// for the all-reduce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<RowsWidth>,
    /// The profile timed (`nccl` is NCCL).
    pub profile: String,
    /// Median microseconds per operation (per round the slowest rank counts).
    pub median_us: Option<f64>,
    /// Fastest round.
    pub min_us: Option<f64>,
    /// Slowest round.
    pub max_us: Option<f64>,
    /// Rounds with a valid sample from every rank.
    pub rounds: usize,
    /// Operations per timed replay.
    pub ops_per_sample: u32,
    /// Bus bandwidth at the median, GB/s, by the collective's formula ([`bus_gbps`]).
    pub bus_gbps: Option<f64>,
    /// NCCL's median over this one's (above 1: faster than NCCL).
    pub speedup_vs_nccl: Option<f64>,
    /// Why it was not timed.
    pub excluded: Option<String>,
    /// Whether it is the tuned choice for this size.
    pub chosen: bool,
    /// What an `all_reduce_add_rms_norm` candidate runs ([`epilogue::Form`]); none for the
    /// other collectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<targets::Form>,
    /// Whether its outputs at this size equalled the reference on every rank, checked once
    /// before timing (`all_reduce_add_rms_norm`); none where not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<bool>,
}

/// How far the tuned choice is behind the fastest contender at one message size.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceGap {
    /// Message size, bytes.
    pub bytes: u64,
    /// The tuned choice and its median, microseconds.
    pub chosen: (String, f64),
    /// The fastest contender at that size and its median (the choice itself when it is).
    pub best: (String, f64),
}

impl ChoiceGap {
    /// The choice's median over the best one's, less one: 0.03 is 3% slower.
    pub fn behind(&self) -> f64 {
        self.chosen.1 / self.best.1 - 1.0
    }
}

/// The size at which the tuned choice is furthest behind the fastest contender timed at that
/// size (NCCL included), among the sizes where the choice was timed; `None` when it was timed
/// nowhere. Ties go to the smaller size.
pub fn largest_choice_gap(rows: &[SizeRow]) -> Option<ChoiceGap> {
    let mut largest: Option<ChoiceGap> = None;
    for chosen in rows.iter().filter(|row| row.chosen) {
        let Some(chosen_us) = chosen.median_us else {
            continue;
        };
        let best = rows
            .iter()
            .filter(|row| row.bytes == chosen.bytes)
            .filter_map(|row| row.median_us.map(|median| (row, median)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or((chosen, chosen_us), |best| best);
        let gap = ChoiceGap {
            bytes: chosen.bytes,
            chosen: (chosen.profile.clone(), chosen_us),
            best: (best.0.profile.clone(), best.1),
        };
        if largest
            .as_ref()
            .is_none_or(|largest| gap.behind() > largest.behind())
        {
            largest = Some(gap);
        }
    }
    largest
}

/// One batch size of the decode emulation: two all-reduces per layer over every layer, in one
/// graph, with the tuned choice and with NCCL alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeRow {
    /// Rows of the hidden state (tokens in the batch).
    pub batch: usize,
    /// Elements per all-reduce (batch x hidden).
    pub elements: usize,
    /// The profile the choice takes at that size.
    pub tuned_profile: String,
    /// Median microseconds per token step with the choice.
    pub tuned_us: f64,
    /// Median microseconds per token step with NCCL alone.
    pub nccl_us: f64,
    /// `nccl_us / tuned_us`.
    pub speedup: f64,
    /// `all_reduce_add_rms_norm`: the fastest candidate of the bucket that runs an all-reduce
    /// kernel, then `add_rms_norm` (prepare unfused), timed in the same rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfused_profile: Option<String>,
    /// Its median microseconds per token step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfused_us: Option<f64>,
    /// `unfused_us / tuned_us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_vs_unfused: Option<f64>,
}

/// The decode model emulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeShape {
    /// Transformer layers.
    pub layers: usize,
    /// Operations of the package's collective per layer (the attention's and the MLP's
    /// outputs): all-reduces, or reduce-scatters or all-gathers of batch rows x hidden.
    pub all_reduces_per_layer: usize,
    /// Hidden width, elements.
    pub hidden: usize,
}

impl Default for DecodeShape {
    /// A 61-layer, 7168-wide model (DeepSeek-V3's shape) with two all-reduces per layer.
    fn default() -> DecodeShape {
        DecodeShape {
            layers: 61,
            all_reduces_per_layer: 2,
            hidden: 7168,
        }
    }
}

/// Everything one `prepare bench` run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The ladder's name.
    pub ladder: String,
    /// The ladder's collective: what was timed, and the bus bandwidth's formula. Reports
    /// written before it was recorded were all-reduces.
    #[serde(default = "all_reduce")]
    pub collective: Collective,
    /// The package identity.
    pub package: String,
    /// Ranks.
    pub world_size: u32,
    /// Every rank's GPU name, in rank order.
    pub gpus: Vec<String>,
    /// NCCL's version.
    pub nccl_version: String,
    /// The driver version.
    pub driver_version: String,
    /// Interleaved rounds per size.
    pub rounds: u32,
    /// Every contender at every size, sizes ascending.
    pub sizes: Vec<SizeRow>,
    /// The decode model, when the emulation ran.
    pub decode_shape: Option<DecodeShape>,
    /// The decode emulation, batch ascending.
    pub decode: Vec<DecodeRow>,
    /// The serving path at every size a bucket covers, sizes ascending.
    #[serde(default)]
    pub serving: Vec<ServingRow>,
    /// `all_reduce_add_rms_norm`: per size the figures the speed targets read
    /// ([`epilogue::summarize`]), sizes ascending; empty for the other collectives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epilogue: Vec<targets::EpilogueSize>,
}

fn all_reduce() -> Collective {
    Collective::AllReduce
}

/// The chosen candidate at one size through the serving handle's paths, timed in one
/// interleaved group: on the registered buffer (zero copy, into the out-of-place output or in
/// place) and on a server's own memory (any tensor, out of place or in place). Medians of the
/// slowest rank per round, microseconds per all-reduce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingRow {
    /// Message size, bytes.
    pub bytes: u64,
    /// The bucket's index.
    pub bucket: usize,
    /// The chosen profile.
    pub profile: String,
    /// Zero copy: the message in the registered buffer, the sum into the out-of-place output.
    pub zero_copy_us: f64,
    /// Zero copy in place: the sum over the message in the registered buffer.
    pub zero_copy_in_place_us: Option<f64>,
    /// Any tensor: the message in the server's memory, the sum into another of its buffers.
    pub any_tensor_us: f64,
    /// Any tensor in place.
    pub any_tensor_in_place_us: f64,
}
