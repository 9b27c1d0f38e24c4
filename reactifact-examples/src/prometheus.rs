//! The Prometheus recorder of the example programs (`metrics`, `outbox-bench --metrics`):
//! `metrics-exporter-prometheus`'s, without its HTTP listener, with histogram buckets for
//! every metric whose name ends in `_seconds` (without them the exporter renders summaries,
//! whose quantiles cannot be aggregated across processes).

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// The bucket bounds, in seconds, of every histogram whose name ends in `_seconds`: from half
/// a millisecond (a commit in memory) to ten seconds (a delivery that waited out retries).
pub const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the Prometheus recorder as the process's `metrics` recorder. The caller runs the
/// handle's `run_upkeep` every few seconds (this install leaves it to the program) and serves
/// `render`.
///
/// # Errors
/// If a recorder is installed already.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install_recorder()
}
