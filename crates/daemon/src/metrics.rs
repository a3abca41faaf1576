//! The daemon's metrics as Prometheus scrapes them: at each scrape every part (the mirror,
//! the forwarding workers, their connection tables, the firewall) adds its figures to one
//! `prometheus-client` registry, whose encoder writes the exposition (OpenMetrics text:
//! a counter's samples end in `_total`, a histogram has its buckets, `_sum` and `_count`,
//! the page ends with `# EOF`). The figures are read from what each part counts already;
//! only the mirror's lag is observed as it happens, into a histogram the daemon keeps.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The labels of one sample: name and value pairs.
pub type Labels = Vec<(String, String)>;

/// One label.
pub fn label(name: &str, value: impl ToString) -> Labels {
    vec![(name.to_string(), value.to_string())]
}

/// What a metric is.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A total that only grows (its samples are named with `_total`).
    Counter,
}

/// The content type of [`Exposition::text`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics of one scrape.
#[derive(Debug, Default)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    /// No metric yet.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Metric `name` (a counter's with or without `_total`, which the encoder adds) with
    /// its samples, each with its labels.
    pub fn add(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let help = help.trim_end_matches('.');
        match kind {
            Kind::Gauge => {
                let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                for (labels, v) in samples {
                    family.get_or_create(&labels).set(v);
                }
                self.registry.register(name, help, family);
            }
            Kind::Counter => {
                let family = Family::<Labels, Counter<f64, AtomicU64>>::default();
                for (labels, v) in samples {
                    family.get_or_create(&labels).inc_by(v);
                }
                let name = name.strip_suffix("_total").unwrap_or(name);
                self.registry.register(name, help, family);
            }
        }
    }

    /// Metric `name` with one sample and no label.
    pub fn one(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        match kind {
            Kind::Gauge => {
                let g = Gauge::<f64, AtomicU64>::default();
                g.set(value);
                self.registry.register(name, help.trim_end_matches('.'), g);
            }
            Kind::Counter => {
                let c = Counter::<f64, AtomicU64>::default();
                c.inc_by(value);
                let name = name.strip_suffix("_total").unwrap_or(name);
                self.registry.register(name, help.trim_end_matches('.'), c);
            }
        }
    }

    /// A histogram kept across scrapes (its observations are shared with `h`).
    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.registry
            .register(name, help.trim_end_matches('.'), h.clone());
    }

    /// The exposition, as the content type [`CONTENT_TYPE`] says.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // Writing to a string does not fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// A histogram of durations in seconds, from 10 µs to about 2.6 s (10 buckets, each four
/// times the last).
pub fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 4.0, 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition reads back, by a Prometheus text parser, as the figures added: a
    /// gauge by its labels, a counter's samples named with `_total` whatever it was
    /// given, a histogram's `_count` and `_sum`; the page ends as OpenMetrics asks.
    #[test]
    fn the_exposition_reads_back_as_the_figures_added() {
        let mut e = Exposition::new();
        e.add(
            "fibre_test_routes",
            Kind::Gauge,
            "Routes.",
            [(label("table", 254), 7.0), (label("table", 255), 3.0)],
        );
        e.one("fibre_test_updates_total", Kind::Counter, "Updates.", 12.0);
        e.one("fibre_test_batches", Kind::Counter, "Batches.", 2.0);
        let h = seconds_histogram();
        h.observe(0.002);
        h.observe(0.5);
        e.histogram("fibre_test_lag_seconds", "Lag.", &h);
        let text = e.text();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("it parses");
        let value = |name: &str, table: Option<&str>| {
            let s = scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == name && table.is_none_or(|t| s.labels.get("table") == Some(t))
                })
                .unwrap_or_else(|| panic!("{name} in {text}"));
            match s.value {
                prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v) => v,
                ref other => panic!("{name}: {other:?}"),
            }
        };
        assert_eq!(value("fibre_test_routes", Some("254")), 7.0);
        assert_eq!(value("fibre_test_routes", Some("255")), 3.0);
        assert_eq!(value("fibre_test_updates_total", None), 12.0);
        assert_eq!(value("fibre_test_batches_total", None), 2.0);
        assert_eq!(value("fibre_test_lag_seconds_count", None), 2.0);
        assert!((value("fibre_test_lag_seconds_sum", None) - 0.502).abs() < 1e-9);
    }
}
