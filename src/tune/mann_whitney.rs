//! The one-sided Mann-Whitney U test: is sample `a` stochastically smaller than sample `b`?
//! Exact for small samples without ties, the normal approximation with tie and continuity
//! corrections otherwise. Inputs are sorted first, so the answer does not depend on order.

use statrs::distribution::{ContinuousCDF, Normal};

/// Largest n_a x n_b for which the exact null distribution is enumerated.
const EXACT_LIMIT: usize = 2500;

/// The p-value of H1 "values in `a` tend to be smaller than values in `b`". `None` when a
/// sample is empty. Values must be finite.
pub fn p_value_less(a: &[f64], b: &[f64]) -> Option<f64> {
    let (n_a, n_b) = (a.len(), b.len());
    if n_a == 0 || n_b == 0 {
        return None;
    }
    let mut pooled: Vec<(f64, bool)> = a
        .iter()
        .map(|&value| (value, true))
        .chain(b.iter().map(|&value| (value, false)))
        .collect();
    pooled.sort_by(|left, right| left.0.total_cmp(&right.0).then(left.1.cmp(&right.1)));

    // Midranks (1-based) with ties averaged; tie groups kept for the variance correction.
    let mut rank_sum_a = 0.0;
    let mut tie_term = 0.0;
    let mut has_ties = false;
    let mut start = 0;
    while start < pooled.len() {
        let mut end = start + 1;
        while end < pooled.len() && pooled[end].0.total_cmp(&pooled[start].0).is_eq() {
            end += 1;
        }
        let size = (end - start) as f64;
        if end - start > 1 {
            has_ties = true;
            tie_term += size * size * size - size;
        }
        let midrank = (start + end + 1) as f64 / 2.0;
        let in_a = pooled[start..end].iter().filter(|entry| entry.1).count();
        rank_sum_a += midrank * in_a as f64;
        start = end;
    }
    // U_a counts pairs (x in a, y in b) with x > y (ties one half): small U_a means a is smaller.
    let u_a = rank_sum_a - (n_a * (n_a + 1)) as f64 / 2.0;

    if !has_ties && n_a * n_b <= EXACT_LIMIT {
        return Some(exact_cdf(n_a, n_b, u_a.round() as usize));
    }
    let (n_a, n_b) = (n_a as f64, n_b as f64);
    let n = n_a + n_b;
    let mean = n_a * n_b / 2.0;
    let variance = n_a * n_b / 12.0 * ((n + 1.0) - tie_term / (n * (n - 1.0)));
    if variance <= 0.0 {
        // Every value is equal: no evidence either way.
        return Some(1.0);
    }
    let z = (u_a - mean + 0.5) / variance.sqrt();
    let normal = Normal::new(0.0, 1.0).expect("the standard normal is valid");
    Some(normal.cdf(z))
}

/// P(U <= u) under the null hypothesis, by counting the arrangements of `n_a` and `n_b`
/// values that give each U (dynamic programming over sample sizes).
fn exact_cdf(n_a: usize, n_b: usize, u: usize) -> f64 {
    let max_u = n_a * n_b;
    // previous[j][k]: arrangements of i - 1 values of a and j of b whose U is k.
    let mut previous = vec![vec![0.0_f64; max_u + 1]; n_b + 1];
    for row in &mut previous {
        row[0] = 1.0;
    }
    for _ in 1..=n_a {
        let mut current = vec![vec![0.0_f64; max_u + 1]; n_b + 1];
        current[0][0] = 1.0;
        for j in 1..=n_b {
            for k in 0..=max_u {
                // The largest value is from a (it beats all j values of b) or from b.
                let from_a = if k >= j { previous[j][k - j] } else { 0.0 };
                current[j][k] = from_a + current[j - 1][k];
            }
        }
        previous = current;
    }
    let counts = &previous[n_b];
    let total: f64 = counts.iter().sum();
    let below: f64 = counts[..=u.min(max_u)].iter().sum();
    below / total
}

#[cfg(test)]
mod tests {
    use super::p_value_less;

    #[test]
    fn clearly_smaller_sample_is_significant() {
        let a: Vec<f64> = (0..10).map(f64::from).collect();
        let b: Vec<f64> = (10..20).map(f64::from).collect();
        // Exact: one arrangement of C(20,10) = 184756.
        let p = p_value_less(&a, &b).unwrap();
        assert!((p - 1.0 / 184_756.0).abs() < 1e-12, "{p}");
        assert!(p_value_less(&b, &a).unwrap() > 0.999);
    }

    #[test]
    fn exact_small_case_matches_hand_count() {
        // n_a = n_b = 2: U in {0,1,2,2,3,4} over the 6 arrangements; U = 0 has probability 1/6.
        let p = p_value_less(&[1.0, 2.0], &[3.0, 4.0]).unwrap();
        assert!((p - 1.0 / 6.0).abs() < 1e-12);
        let p = p_value_less(&[1.0, 3.0], &[2.0, 4.0]).unwrap();
        assert!((p - 2.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn identical_samples_are_not_significant() {
        let a = [5.0; 12];
        assert_eq!(p_value_less(&a, &a), Some(1.0));
    }

    #[test]
    fn order_does_not_matter() {
        let a = [3.1, 2.9, 3.0, 3.05, 2.95, 3.2, 3.0];
        let b = [3.3, 3.4, 3.0, 3.5, 3.25, 3.6, 3.45];
        let mut a_rev = a;
        a_rev.reverse();
        let mut b_rot = b;
        b_rot.rotate_left(3);
        assert_eq!(p_value_less(&a, &b), p_value_less(&a_rev, &b_rot));
    }

    #[test]
    fn empty_sample_has_no_p_value() {
        assert_eq!(p_value_less(&[], &[1.0]), None);
    }
}
