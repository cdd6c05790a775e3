//! Medians over repeated runs: single timings on a shared machine are noise.

/// Median, minimum and maximum of a series of measurements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for an empty series.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[mid - 1] + sorted[mid]) / 2.0
        } else {
            sorted[mid]
        };
        Some(Self {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn median_of_odd_and_even_series() {
        assert_eq!(
            Summary::of(&[3.0, 1.0, 2.0]),
            Some(Summary {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(
            Summary::of(&[4.0, 1.0, 2.0, 3.0]).map(|s| s.median),
            Some(2.5)
        );
        assert_eq!(Summary::of(&[]), None);
    }
}
