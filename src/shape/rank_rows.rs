//! The rows each rank owns, given by the caller (the v-forms of the reduce-scatter and the
//! all-gather, as vLLM's `reduce_scatterv` / `all_gatherv` and SGLang's data-parallel
//! attention take them): rank r owns `rows_per_rank[r]` whole rows, the runs contiguous in
//! rank order and together the whole message. The shape rule's layout is one such list; a
//! list equal to it is told apart ([`RankRows::follows_rule`]) so the call can go exactly as
//! the ordinary one does.

use std::ops::Range;
use std::sync::Arc;

use super::{owned_rows, ShapeError};

/// Per-rank row counts of one message, checked: one per rank of the world, their sum the
/// message's rows. Cheap to clone (the offsets are shared).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankRows {
    // `world + 1` offsets: rank r owns rows `offsets[r]..offsets[r + 1]`.
    offsets: Arc<[u64]>,
}

impl RankRows {
    /// Rank r owning `rows_per_rank[r]` rows, on `world` ranks; refused when the list is not
    /// one count per rank or its sum overflows a u64.
    pub fn given(rows_per_rank: &[u64], world: u32) -> Result<RankRows, ShapeError> {
        if rows_per_rank.len() != world as usize {
            return Err(ShapeError::RowsPerRankLength {
                given: rows_per_rank.len(),
                world,
            });
        }
        let mut offsets = Vec::with_capacity(rows_per_rank.len() + 1);
        offsets.push(0_u64);
        let mut total = 0_u64;
        for &count in rows_per_rank {
            total = total
                .checked_add(count)
                .ok_or(ShapeError::RowsPerRankOverflow { world })?;
            offsets.push(total);
        }
        Ok(RankRows {
            offsets: offsets.into(),
        })
    }

    /// The shape rule's layout of `rows` on `world` ranks ([`owned_rows`]); refused for a world
    /// of 0.
    pub fn rule(rows: u64, world: u32) -> Result<RankRows, ShapeError> {
        let counts = (0..world)
            .map(|rank| owned_rows(rows, world, rank).map(|run| run.end - run.start))
            .collect::<Result<Vec<u64>, ShapeError>>()?;
        if counts.is_empty() {
            return Err(ShapeError::RankOutsideWorld { rank: 0, world });
        }
        RankRows::given(&counts, world)
    }

    /// Ranks.
    pub fn world(&self) -> u32 {
        (self.offsets.len() - 1) as u32
    }

    /// Rows of the whole message: the counts' sum.
    pub fn rows(&self) -> u64 {
        self.offsets[self.offsets.len() - 1]
    }

    /// The rows rank `rank` owns, a contiguous run.
    pub fn owned_rows(&self, rank: u32) -> Result<Range<u64>, ShapeError> {
        let world = self.world();
        if rank >= world {
            return Err(ShapeError::RankOutsideWorld { rank, world });
        }
        let rank = rank as usize;
        Ok(self.offsets[rank]..self.offsets[rank + 1])
    }

    /// How many rows each rank owns, in rank order.
    pub fn counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.offsets.windows(2).map(|pair| pair[1] - pair[0])
    }

    /// Whether this is the shape rule's layout of its rows: then a call with it goes exactly as
    /// the ordinary call of those rows (the same candidates, the same bits).
    pub fn follows_rule(&self) -> bool {
        let (rows, world) = (self.rows(), self.world());
        (0..world).all(|rank| owned_rows(rows, world, rank).ok() == self.owned_rows(rank).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The runs are the counts, back to back in rank order from row 0, and together the
        /// whole message.
        #[test]
        fn the_runs_are_the_counts_back_to_back_in_rank_order(
            counts in proptest::collection::vec(0u64..1_000, 1..=16),
        ) {
            let world = counts.len() as u32;
            let layout = RankRows::given(&counts, world).expect("one count per rank");
            proptest::prop_assert_eq!(layout.world(), world);
            proptest::prop_assert_eq!(layout.rows(), counts.iter().sum::<u64>());
            proptest::prop_assert_eq!(layout.counts().collect::<Vec<_>>(), counts.clone());
            let mut next = 0;
            for (rank, &count) in (0..world).zip(&counts) {
                let run = layout.owned_rows(rank).expect("a rank");
                proptest::prop_assert_eq!(run, next..next + count);
                next += count;
            }
            proptest::prop_assert_eq!(next, layout.rows());
        }

        /// A list follows the rule exactly when it is the rule's counts of its sum.
        #[test]
        fn a_list_follows_the_rule_exactly_when_it_is_the_rule_s_counts(
            counts in proptest::collection::vec(0u64..6, 1..=8),
        ) {
            let world = counts.len() as u32;
            let layout = RankRows::given(&counts, world).expect("one count per rank");
            let rule: Vec<u64> = (0..world)
                .map(|rank| {
                    let run = owned_rows(layout.rows(), world, rank).expect("a rank");
                    run.end - run.start
                })
                .collect();
            proptest::prop_assert_eq!(layout.follows_rule(), counts == rule);
            proptest::prop_assert!(RankRows::rule(layout.rows(), world).expect("a world").follows_rule());
        }
    }

    #[test]
    fn the_rule_s_layout_is_told_from_every_other() {
        let given = |counts: &[u64]| RankRows::given(counts, counts.len() as u32).unwrap();
        assert!(given(&[3, 3, 2, 2]).follows_rule());
        assert!(given(&[4, 4]).follows_rule());
        assert!(given(&[1, 0, 0]).follows_rule());
        assert!(given(&[0, 0]).follows_rule());
        // The same rows, another cut: the shorter run first, equal sums of uneven runs, a
        // rank past the rows owning one.
        assert!(!given(&[2, 3, 3, 2]).follows_rule());
        assert!(!given(&[3, 5]).follows_rule());
        assert!(!given(&[0, 1, 0]).follows_rule());
        assert_eq!(given(&[2, 0, 5]).owned_rows(2), Ok(2..7));
        assert_eq!(
            RankRows::rule(10, 4).unwrap().counts().collect::<Vec<_>>(),
            [3, 3, 2, 2]
        );
    }

    #[test]
    fn a_list_not_one_count_per_rank_or_overflowing_is_refused_by_name() {
        let refused = RankRows::given(&[1, 2, 3], 2).unwrap_err();
        assert_eq!(
            refused,
            ShapeError::RowsPerRankLength { given: 3, world: 2 }
        );
        assert_eq!(
            refused.to_string(),
            "rows_per_rank has 3 counts for a world of 2 ranks: give one count per rank"
        );
        assert!(RankRows::given(&[], 1).is_err());
        let refused = RankRows::given(&[u64::MAX, 1], 2).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "rows_per_rank's counts on 2 ranks sum to more than 2^64 - 1 rows"
        );
        assert_eq!(
            RankRows::given(&[1, 1], 2).unwrap().owned_rows(2),
            Err(ShapeError::RankOutsideWorld { rank: 2, world: 2 })
        );
        assert!(RankRows::rule(4, 0).is_err());
    }
}
