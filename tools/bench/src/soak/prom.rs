//! Reading the services' Prometheus text expositions: a counter summed over its series, a
//! histogram's cumulative buckets, and a quantile of the observations between two readings.

use std::collections::BTreeMap;

/// Sum of the samples of metric `name` (exact name, any labels) whose labels contain every
/// `key="value"` of `labels`, in a Prometheus text exposition.
pub(super) fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            if !(rest.is_empty() || rest.starts_with('{')) {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Cumulative bucket counts of histogram `name` by upper bound, summed over its other labels.
pub(super) fn histogram(text: &str, name: &str) -> BTreeMap<u64, f64> {
    let bucket = format!("{name}_bucket{{");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&bucket) else { continue };
        let Some((labels, value)) = rest.rsplit_once(' ') else { continue };
        let Some(le) = labels.split("le=\"").nth(1).and_then(|s| s.split('"').next()) else { continue };
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
        let value: f64 = value.parse().unwrap_or(0.0);
        // Keyed by the bound's bits: non-negative floats order like their bits.
        *out.entry(le.to_bits()).or_insert(0.0) += value;
    }
    out
}

/// Quantile `q` (0..1) in milliseconds of the observations between two cumulative snapshots,
/// interpolated linearly within a bucket (as Prometheus' `histogram_quantile`); NaN if none.
pub(super) fn window_quantile(before: &BTreeMap<u64, f64>, after: &BTreeMap<u64, f64>, q: f64) -> f64 {
    let buckets: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| (f64::from_bits(*le), n - before.get(le).copied().unwrap_or(0.0)))
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, cumulative) in &buckets {
        if cumulative >= rank {
            if le.is_infinite() {
                return lower.0 * 1000.0;
            }
            let share = if cumulative > lower.1 { (rank - lower.1) / (cumulative - lower.1) } else { 1.0 };
            return (lower.0 + (le - lower.0) * share) * 1000.0;
        }
        lower = (le, cumulative);
    }
    lower.0 * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\n\
        jetsched_fire_lag_seconds_bucket{trigger=\"scheduled\",le=\"0.001\"} 50\n\
        jetsched_fire_lag_seconds_bucket{trigger=\"scheduled\",le=\"0.01\"} 90\n\
        jetsched_fire_lag_seconds_bucket{trigger=\"scheduled\",le=\"+Inf\"} 100\n\
        jetsched_fire_lag_seconds_sum{trigger=\"scheduled\"} 1\n\
        jetsched_worker_runs_total{outcome=\"succeeded\",queue=\"default\"} 7\n\
        jetsched_worker_runs_total{outcome=\"retried\",queue=\"default\"} 2\n\
        jetsched_worker_runs_total_other 5\n";

    #[test]
    fn parses_counters_and_window_quantiles() {
        assert_eq!(metric_sum(TEXT, "jetsched_worker_runs_total", &[]), 9.0);
        assert_eq!(metric_sum(TEXT, "jetsched_worker_runs_total", &[("outcome", "succeeded")]), 7.0);
        let after = histogram(TEXT, "jetsched_fire_lag_seconds");
        let before = BTreeMap::new();
        assert!((window_quantile(&before, &after, 0.5) - 1.0).abs() < 1e-9);
        assert!((window_quantile(&before, &after, 0.7) - 5.5).abs() < 1e-9);
        assert_eq!(window_quantile(&before, &after, 0.99), 10.0);
        assert!(window_quantile(&after, &after, 0.5).is_nan());
    }
}
