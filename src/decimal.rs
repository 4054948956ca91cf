//! Numbers as text for people: a fixed number of decimals at most, without trailing zeros. A
//! leaf: it names nothing else in the crate.

/// `value` to at most `decimals` decimals, without trailing zeros or a bare point: `2.5`, `3`,
/// `0.01`.
pub fn trimmed(value: f64, decimals: usize) -> String {
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::trimmed;

    #[test]
    fn trailing_zeros_and_a_bare_point_are_dropped() {
        assert_eq!(trimmed(2.5, 2), "2.5");
        assert_eq!(trimmed(0.01, 6), "0.01");
        assert_eq!(trimmed(10.0, 0), "10");
        assert_eq!(trimmed(1000.0, 1), "1000");
        assert_eq!(trimmed(0.0123, 2), "0.01");
    }
}
