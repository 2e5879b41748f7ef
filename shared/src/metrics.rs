//! Prometheus metrics created and registered in one call, on the registry passed in (no global
//! registry): each service's `metrics.rs` lists its metrics with these, one line of name, help
//! and labels each.

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Registers `metric` on `registry` and hands it back.
pub fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> prometheus::Result<M> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// An `IntCounter` named `name`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    register(registry, IntCounter::new(name, help)?)
}

/// An `IntCounterVec` with `labels`.
pub fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// An `IntGauge`.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    register(registry, IntGauge::new(name, help)?)
}

/// An `IntGaugeVec` with `labels`.
pub fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels)?)
}

/// A floating-point `Gauge`.
pub fn float_gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<Gauge> {
    register(registry, Gauge::new(name, help)?)
}

/// A `Histogram` with `buckets` (upper bounds, in the metric's unit).
pub fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Result<Histogram> {
    register(registry, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?)
}

/// A `HistogramVec` with `buckets` and `labels`.
pub fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    register(registry, HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_registered_with_their_name_help_and_labels() {
        let registry = Registry::new();
        let runs =
            counter_vec(&registry, "jetsched_test_runs_total", "Runs by outcome", &["outcome"]).unwrap();
        runs.with_label_values(&["ok"]).inc();
        let lag = histogram(&registry, "jetsched_test_lag_seconds", "Lag", &[0.1, 1.0]).unwrap();
        lag.observe(0.5);
        let families = registry.gather();
        let names: Vec<(&str, &str)> = families.iter().map(|f| (f.name(), f.help())).collect();
        assert_eq!(
            names,
            [("jetsched_test_lag_seconds", "Lag"), ("jetsched_test_runs_total", "Runs by outcome")]
        );
        assert!(gauge(&registry, "jetsched_test_runs_total", "again").is_err(), "a name registers once");
    }
}
