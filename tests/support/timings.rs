//! Synthetic timings for the decision: reproducible noise around a median.

/// A small deterministic generator, so samples and the decisions made from them are
/// reproducible.
#[derive(Debug, Clone)]
pub struct Noise(pub u64);

impl Noise {
    /// The next value in [0, 1).
    pub fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64) / ((1_u64 << 53) as f64)
    }

    /// One size's samples, `rounds` on each of `ranks`, in microseconds around `center` with
    /// +-`jitter` relative noise, as `CandidateSamples::samples` holds them.
    pub fn samples(
        &mut self,
        center: f64,
        jitter: f64,
        ranks: usize,
        rounds: usize,
    ) -> Vec<Vec<Option<f64>>> {
        (0..ranks)
            .map(|_| {
                (0..rounds)
                    .map(|_| Some(center * (1.0 + jitter * (2.0 * self.next() - 1.0))))
                    .collect()
            })
            .collect()
    }
}
