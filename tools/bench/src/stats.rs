//! Latency samples and the figures reported from them.

use std::time::Duration;

use serde::Serialize;

/// Throughput and latency percentiles of one measured phase.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Figures {
    pub(crate) what: String,
    pub(crate) operations: usize,
    pub(crate) seconds: f64,
    pub(crate) per_second: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl Figures {
    pub(crate) fn from_samples(what: &str, mut samples: Vec<Duration>, elapsed: Duration) -> Figures {
        samples.sort();
        let pick = |q: f64| {
            if samples.is_empty() {
                return 0.0;
            }
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[index].as_secs_f64() * 1000.0
        };
        Figures {
            what: what.to_string(),
            operations: samples.len(),
            seconds: elapsed.as_secs_f64(),
            per_second: samples.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: pick(0.50),
            p99_ms: pick(0.99),
            max_ms: pick(1.0),
        }
    }

    pub(crate) fn print_table(rows: &[Figures]) {
        eprintln!(
            "{:<44} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9}",
            "phase", "ops", "secs", "ops/s", "p50 ms", "p99 ms", "max ms"
        );
        for r in rows {
            eprintln!(
                "{:<44} {:>9} {:>9.2} {:>10.0} {:>9.3} {:>9.3} {:>9.3}",
                r.what, r.operations, r.seconds, r.per_second, r.p50_ms, r.p99_ms, r.max_ms
            );
        }
    }
}

/// The median of `values` (the mean of the middle two of an even count); NaN for none.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
