//! The Prometheus text exposition format (version 0.0.4): `# HELP` and
//! `# TYPE` once per family, then its samples.

use std::fmt::Write;

use super::BucketSnapshot;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// The family whose header was written last; samples of one family
    /// must stay together.
    family: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        if self.family != name {
            let help = help.replace('\\', "\\\\").replace('\n', "\\n");
            let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
            self.family = name.to_owned();
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], extra: Option<(&str, &str)>, value: f64) {
        self.text.push_str(name);
        let mut all = labels.iter().copied().chain(extra).peekable();
        if all.peek().is_some() {
            self.text.push('{');
            for (i, (key, value)) in all.enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let value = value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.text, "{key}=\"{value}\"");
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }

    /// A monotonic counter; `name` should end in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.header(name, "counter", help);
        self.sample(name, labels, None, value as f64);
    }

    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.header(name, "gauge", help);
        self.sample(name, labels, None, value);
    }

    pub fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &BucketSnapshot) {
        self.header(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (bound, count) in h.bounds.iter().zip(&h.cumulative) {
            self.sample(&bucket, labels, Some(("le", &number(*bound))), *count as f64);
        }
        self.sample(&bucket, labels, Some(("le", "+Inf")), h.count() as f64);
        self.sample(&format!("{name}_sum"), labels, None, h.sum);
        self.sample(&format!("{name}_count"), labels, None, h.count() as f64);
    }

    pub fn finish(self) -> String {
        self.text
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        // `{}` prints the shortest exact form: 0.00005, 1024, 2.5.
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Buckets;

    #[test]
    fn families_are_written_once_with_escaped_labels() {
        let mut e = Exposition::new();
        e.counter("a_total", "A.", &[("k", "x\"y")], 3);
        e.counter("a_total", "A.", &[("k", "z")], 4);
        let b = Buckets::new(&[0.5]);
        b.observe(0.25);
        e.histogram("h_seconds", "H.", &[], &b.snapshot());
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{k=\"x\\\"y\"} 3\na_total{k=\"z\"} 4\n\
             # HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"0.5\"} 1\n\
             h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0.25\nh_seconds_count 1\n"
        );
    }
}
