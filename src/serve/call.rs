//! A serving call as every rank must make it, in words and as the call check's slot, and the
//! refusal when the ranks' slots differ ([`super::agreement`] makes the check).

use super::ServeError;
use crate::agree;
use crate::hash::sha256_hex;
use crate::ladder::{Collective, Dtype};
use crate::shape::RankRows;

/// The environment variable that turns the check on for handles started after it is set.
pub const CHECK_CALLS_VARIABLE: &str = "PREPARE_CHECK_CALLS";

/// The bytes of a call's slot in the check's all-gather.
pub(super) const SLOT_BYTES: usize = 256;

/// Whether `value` (the variable's) turns the check on: `1`, `true`, `yes` or `on`.
pub(super) fn checks_calls(value: Option<&str>) -> bool {
    value.is_some_and(|value| {
        matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// A serving call as every rank must make it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Call<'a> {
    /// An all-reduce of this many elements.
    AllReduce { dtype: Dtype, elements: u64 },
    /// A reduce-scatter or all-gather of rows x width.
    Rows {
        collective: Collective,
        dtype: Dtype,
        rows: Rows<'a>,
        width: u64,
    },
    /// An all-reduce + residual add + RMSNorm.
    Epilogue {
        dtype: Dtype,
        rows: u64,
        hidden: u64,
        eps: f32,
        residual: bool,
    },
}

impl Call<'_> {
    /// The call in words, as the refusal names it; every field the ranks must agree on.
    pub(super) fn describe(&self) -> String {
        match *self {
            Call::AllReduce { dtype, elements } => {
                format!("all_reduce {dtype} of {elements} elements")
            }
            Call::Rows {
                collective,
                dtype,
                rows,
                width,
            } => match rows {
                // A list equal to the rule's is the ordinary call (the same route, the same
                // bits), so it is described as that call.
                Rows::PerRank(counts) if rule_rows(counts).is_some() => {
                    let rows = Rows::Rule(rule_rows(counts).unwrap_or_default());
                    Call::Rows {
                        collective,
                        dtype,
                        rows,
                        width,
                    }
                    .describe()
                }
                Rows::Rule(rows) => format!(
                    "{collective} {dtype} of {rows} rows x {width} (rows owned by the shape rule)"
                ),
                Rows::PerRank(counts) => {
                    let list = format!("{counts:?}");
                    let total = counts
                        .iter()
                        .try_fold(0_u64, |sum, &count| sum.checked_add(count));
                    let total = total.map_or_else(|| "too many".to_owned(), |t| t.to_string());
                    let described = format!(
                        "{collective} {dtype} of {total} rows x {width}, rows per rank {list}"
                    );
                    if described.len() <= SLOT_BYTES {
                        return described;
                    }
                    let bytes: Vec<u8> = counts
                        .iter()
                        .flat_map(|count| count.to_le_bytes())
                        .collect();
                    let hex = &sha256_hex(&bytes)[..16];
                    format!(
                        "{collective} {dtype} of {total} rows x {width}, rows per rank of {} \
                         ranks (sha256 {hex}...)",
                        counts.len()
                    )
                }
            },
            Call::Epilogue {
                dtype,
                rows,
                hidden,
                eps,
                residual,
            } => format!(
                "all_reduce_add_rms_norm {dtype} of {rows} rows x {hidden}, eps {eps:e} \
                 (bits {:#010x}), {}",
                eps.to_bits(),
                if residual {
                    "with a residual"
                } else {
                    "without a residual"
                }
            ),
        }
    }

    /// The call's slot: its description, zero-padded to [`SLOT_BYTES`].
    pub(super) fn slot(&self) -> Vec<u8> {
        let mut slot = self.describe().into_bytes();
        slot.truncate(SLOT_BYTES);
        slot.resize(SLOT_BYTES, 0);
        slot
    }
}

/// The rows of the message whose shape rule gives `counts` (one count per rank), if it does.
fn rule_rows(counts: &[u64]) -> Option<u64> {
    let world = u32::try_from(counts.len()).ok()?;
    let layout = RankRows::given(counts, world).ok()?;
    layout.follows_rule().then(|| layout.rows())
}

/// A slot as words.
fn slot_text(slot: &[u8]) -> String {
    let end = slot
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(slot.len());
    String::from_utf8_lossy(&slot[..end]).into_owned()
}

/// The refusal of `rank` when the gathered slots (every rank's, in rank order) are not all its
/// own `call`'s.
pub(super) fn refusal(rank: u32, call: &Call<'_>, gathered: &[u8]) -> Option<ServeError> {
    let ours = call.slot();
    let disagreement = agree::disagreement(rank, &ours, gathered, "the call")?;
    Some(ServeError::CallsDisagree {
        rank,
        other: disagreement.other,
        ours: slot_text(&ours),
        theirs: slot_text(&disagreement.theirs),
    })
}

/// How the ranks own a call's rows.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rows<'a> {
    /// The shape rule's runs of this many rows.
    Rule(u64),
    /// Rank r owns the r-th count (a v-form).
    PerRank(&'a [u64]),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered(calls: &[Call<'_>]) -> Vec<u8> {
        calls.iter().flat_map(Call::slot).collect()
    }

    fn rows(rows: u64, width: u64) -> Call<'static> {
        Call::Rows {
            collective: Collective::ReduceScatter,
            dtype: Dtype::Bf16,
            rows: Rows::Rule(rows),
            width,
        }
    }

    #[test]
    fn ranks_making_the_same_call_agree() {
        let call = rows(2048, 4096);
        assert!(refusal(1, &call, &gathered(&[call, call, call])).is_none());
    }

    #[test]
    fn every_rank_refuses_when_one_rank_passes_other_rows_naming_both_calls() {
        let calls = [rows(2048, 4096), rows(2047, 4096), rows(2048, 4096)];
        let all = gathered(&calls);
        for (rank, call) in calls.iter().enumerate() {
            let refused = refusal(rank as u32, call, &all).expect("the calls differ");
            let ServeError::CallsDisagree {
                rank: refusing,
                other,
                ours,
                theirs,
            } = &refused
            else {
                panic!("not a disagreement: {refused}");
            };
            assert_eq!(*refusing, rank as u32);
            assert_eq!(*other, u32::from(rank != 1));
            assert_eq!(*ours, call.describe());
            assert_eq!(*theirs, calls[*other as usize].describe());
        }
        let message = refusal(0, &calls[0], &all).unwrap().to_string();
        assert!(
            message.contains("rank 1") && message.contains("2047 rows x 4096"),
            "{message}"
        );
    }

    #[test]
    fn every_field_of_a_call_is_compared() {
        let base = rows(16, 7);
        let differing = [
            rows(17, 7),
            rows(16, 8),
            Call::Rows {
                collective: Collective::AllGather,
                dtype: Dtype::Bf16,
                rows: Rows::Rule(16),
                width: 7,
            },
            Call::Rows {
                collective: Collective::ReduceScatter,
                dtype: Dtype::Fp32,
                rows: Rows::Rule(16),
                width: 7,
            },
            Call::Rows {
                collective: Collective::ReduceScatter,
                dtype: Dtype::Bf16,
                rows: Rows::PerRank(&[7, 9]),
                width: 7,
            },
            Call::AllReduce {
                dtype: Dtype::Bf16,
                elements: 112,
            },
        ];
        for other in differing {
            assert!(
                refusal(0, &base, &gathered(&[base, other])).is_some(),
                "{} and {} agreed",
                base.describe(),
                other.describe()
            );
        }
    }

    #[test]
    fn per_rank_lists_and_the_fused_call_s_fields_are_compared() {
        let list = |counts: &'static [u64]| Call::Rows {
            collective: Collective::AllGather,
            dtype: Dtype::Fp16,
            rows: Rows::PerRank(counts),
            width: 4096,
        };
        // The same total, another split.
        let (a, b) = (list(&[3, 1]), list(&[2, 2]));
        assert!(refusal(0, &a, &gathered(&[a, b])).is_some());
        assert!(refusal(0, &a, &gathered(&[a, a])).is_none());
        // The rule's own list is the ordinary call.
        let ordinary = Call::Rows {
            collective: Collective::AllGather,
            dtype: Dtype::Fp16,
            rows: Rows::Rule(5),
            width: 4096,
        };
        let rule = list(&[2, 2, 1]);
        assert!(refusal(0, &rule, &gathered(&[rule, ordinary, ordinary])).is_none());
        assert!(refusal(0, &b, &gathered(&[b, ordinary, ordinary])).is_some());

        let fused = |eps: f32, residual: bool| Call::Epilogue {
            dtype: Dtype::Bf16,
            rows: 8,
            hidden: 4096,
            eps,
            residual,
        };
        let base = fused(1e-6, true);
        for other in [fused(1e-5, true), fused(1e-6, false)] {
            assert!(refusal(0, &base, &gathered(&[base, other])).is_some());
        }
        assert!(refusal(0, &base, &gathered(&[base, fused(1e-6, true)])).is_none());
    }

    #[test]
    fn a_list_too_long_for_the_slot_is_compared_by_its_digest() {
        let long: Vec<u64> = (0..72).map(|rank| 1_000_000 + rank).collect();
        let mut other = long.clone();
        other[71] += 1;
        let call = |counts| Call::Rows {
            collective: Collective::AllGather,
            dtype: Dtype::Bf16,
            rows: Rows::PerRank(counts),
            width: 4096,
        };
        let (a, b) = (call(&long), call(&other));
        assert!(a.describe().len() <= SLOT_BYTES, "{}", a.describe());
        assert!(a.describe().contains("sha256"), "{}", a.describe());
        assert!(refusal(0, &a, &gathered(&[a, b])).is_some());
        assert!(refusal(0, &a, &gathered(&[a, call(&long)])).is_none());
    }

    #[test]
    fn the_variable_turns_the_check_on_only_when_it_says_so() {
        for on in ["1", "true", "YES", " on "] {
            assert!(checks_calls(Some(on)), "{on}");
        }
        for off in [
            None,
            Some(""),
            Some("0"),
            Some("false"),
            Some("off"),
            Some("2"),
        ] {
            assert!(!checks_calls(off), "{off:?}");
        }
    }
}
