//! Minimal SVG charts (line and grouped bars), written by hand, for the
//! routing benchmark's and the soak's plots: SVG text needs no font
//! files, and this keeps the benchmarks free of a plotting dependency.

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const COLOURS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

/// An axis: linear or log10, from `lo` to `hi`.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
}

impl Axis {
    /// Spans `values` (positive ones only on a log axis), with a margin.
    pub fn fit(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            return Axis { lo: if log { 1.0 } else { 0.0 }, hi: 10.0, log };
        }
        if log {
            Axis {
                lo: 10f64.powf(lo.log10().floor()),
                hi: 10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
                log,
            }
        } else {
            Axis { lo: lo.min(0.0), hi: if hi > lo.min(0.0) { hi * 1.05 } else { 1.0 }, log }
        }
    }

    /// Position of `v` in 0..=1.
    fn unit(&self, v: f64) -> f64 {
        if self.log {
            let v = v.max(self.lo);
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (self.lo.log10().round() as i32, self.hi.log10().round() as i32);
            return (a..=b).map(|e| 10f64.powi(e)).collect();
        }
        let raw = (self.hi - self.lo) / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw);
        let mut ticks = Vec::new();
        let mut t = (self.lo / step).ceil() * step;
        while t <= self.hi + step * 1e-9 {
            ticks.push(t);
            t += step;
        }
        ticks
    }
}

fn label(v: f64) -> String {
    if v.abs() >= 1000.0 {
        // 1500 is "1.5k", not "2k" beside a tick at 2000.
        let k = v / 1000.0;
        if k.fract() == 0.0 { format!("{k:.0}k") } else { format!("{k:.1}k") }
    } else if v.abs() >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Frame, title, axis labels, y grid; returns the document so far.
fn frame(title: &str, x_label: &str, y_label: &str, y: &Axis) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        s,
        "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        TOP + (HEIGHT - TOP - BOTTOM) / 2.0,
        escape(y_label)
    );
    for t in y.ticks() {
        let py = y_px(y, t);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            label(t)
        );
    }
    let _ = writeln!(
        s,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>",
        WIDTH - LEFT - RIGHT,
        HEIGHT - TOP - BOTTOM
    );
    s
}

fn x_px(x: &Axis, v: f64) -> f64 {
    LEFT + x.unit(v) * (WIDTH - LEFT - RIGHT)
}

fn y_px(y: &Axis, v: f64) -> f64 {
    HEIGHT - BOTTOM - y.unit(v) * (HEIGHT - TOP - BOTTOM)
}

fn legend(s: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let py = TOP + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{:.1}\" width=\"14\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1}\">{}</text>",
            WIDTH - RIGHT + 12.0,
            py - 9.0,
            COLOURS[i % COLOURS.len()],
            WIDTH - RIGHT + 32.0,
            py,
            escape(name)
        );
    }
}

/// One polyline per series.
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    x: Axis,
    y: Axis,
    series: &[(&str, Vec<(f64, f64)>)],
) -> String {
    let mut s = frame(title, x_label, y_label, &y);
    for t in x.ticks() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x_px(&x, t),
            HEIGHT - BOTTOM + 16.0,
            label(t)
        );
    }
    for (i, (_, points)) in series.iter().enumerate() {
        let path: Vec<String> =
            points.iter().map(|&(px, py)| format!("{:.1},{:.1}", x_px(&x, px), y_px(&y, py))).collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>",
            COLOURS[i % COLOURS.len()],
            path.join(" ")
        );
    }
    legend(&mut s, &series.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}

/// Groups of bars: `values[series][group]`.
pub fn bars(title: &str, y_label: &str, y: Axis, groups: &[&str], series: &[(&str, Vec<f64>)]) -> String {
    let mut s = frame(title, "", y_label, &y);
    let group_w = (WIDTH - LEFT - RIGHT) / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    let base = y_px(&y, if y.log { y.lo } else { 0.0 });
    for (g, name) in groups.iter().enumerate() {
        let gx = LEFT + g as f64 * group_w;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            gx + group_w / 2.0,
            HEIGHT - BOTTOM + 16.0,
            escape(name)
        );
        for (i, (_, values)) in series.iter().enumerate() {
            let Some(&v) = values.get(g) else { continue };
            let top = y_px(&y, v).min(base);
            let _ = writeln!(
                s,
                "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                gx + group_w * 0.1 + i as f64 * bar_w,
                bar_w * 0.92,
                base - top,
                COLOURS[i % COLOURS.len()]
            );
        }
    }
    legend(&mut s, &series.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}
