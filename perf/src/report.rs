//! Printing results: Markdown tables (readable in a terminal, pasteable into
//! a README), number formats, and where the numbers were measured.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// A table of text cells; the first column is left-aligned, others right.
#[derive(Clone, Debug)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Table {
        Table {
            title: title.into(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row; missing cells print empty, extra cells are kept.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// A line printed under the table.
    pub fn note(&mut self, note: impl Into<String>) -> &mut Self {
        self.notes.push(note.into());
        self
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.rows.iter().map(Vec::len).chain([self.header.len()]).max().unwrap_or(0);
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_owned();
        let mut widths = vec![3; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, i).chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, row: &[String]| -> fmt::Result {
            for (i, width) in widths.iter().enumerate() {
                let text = cell(row, i);
                if i == 0 {
                    write!(f, "| {text:<width$} ")?;
                } else {
                    write!(f, "| {text:>width$} ")?;
                }
            }
            writeln!(f, "|")
        };
        writeln!(f, "### {}\n", self.title)?;
        line(f, &self.header)?;
        for (i, width) in widths.iter().enumerate() {
            let dashes = "-".repeat(width.saturating_sub(1));
            if i == 0 { write!(f, "| {dashes}- ")? } else { write!(f, "| {dashes}: ")? }
        }
        writeln!(f, "|")?;
        for row in &self.rows {
            line(f, row)?;
        }
        if !self.notes.is_empty() {
            writeln!(f)?;
            for note in &self.notes {
                writeln!(f, "{note}")?;
            }
        }
        Ok(())
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nanoseconds, grouped: `12,345`.
pub fn ns(n: u64) -> String {
    thousands(n)
}

/// A rate in millions per second: `5.23`.
pub fn millions(per_sec: f64) -> String {
    format!("{:.2}", per_sec / 1e6)
}

/// How many times better `ours` is than `theirs`, both "higher is better".
pub fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 && ours.is_finite() { format!("{:.2}×", ours / theirs) } else { "n/a".into() }
}

/// How many times faster `ours` is than `theirs`, both durations.
pub fn speedup(ours: u64, theirs: u64) -> String {
    ratio(theirs as f64, ours as f64)
}

/// Bytes with one decimal: `41.3`.
pub fn bytes(b: f64) -> String {
    format!("{b:.1}")
}

/// "met" or by how much a "higher is better" value falls short of its target.
pub fn at_least(value: f64, target: f64) -> String {
    if value >= target {
        format!("met ({:.2}× target)", value / target)
    } else {
        format!("MISSED by {}", percent(1.0 - value / target))
    }
}

/// "met" or by how much a "lower is better" value exceeds its target.
pub fn at_most(value: f64, target: f64) -> String {
    if value <= target {
        format!("met ({:.0}% of target)", value / target * 100.0)
    } else {
        format!("MISSED by {}", percent(value / target - 1.0))
    }
}

/// A share as a percentage, with a decimal below 10% so a near miss never reads "0%".
fn percent(share: f64) -> String {
    let pct = share * 100.0;
    if pct < 10.0 { format!("{pct:.1}%") } else { format!("{pct:.0}%") }
}

/// The CPU's model name from `/proc/cpuinfo`, and how many CPUs it lists.
pub fn cpu() -> String {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return "unknown CPU".into();
    };
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim());
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count();
    format!("{model} ({cpus} CPUs)")
}

/// The 1, 5 and 15-minute load averages from `/proc/loadavg`. On a
/// machine with few cores, anything near 1 or more means another process
/// competed with the benchmark.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "n/a".into())
}

/// Today's UTC date, `YYYY-MM-DD`.
pub fn utc_date() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(millions(5_234_000.0), "5.23");
        assert_eq!(speedup(100, 250), "2.50×");
        assert_eq!(at_least(4.0, 5.0), "MISSED by 20%");
        assert_eq!(at_most(6.0, 5.0), "MISSED by 20%");
        assert!(at_most(2.5, 5.0).starts_with("met"));
        assert_eq!(at_most(5_003.0, 5_000.0), "MISSED by 0.1%");
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new("t", &["name", "value"]);
        t.row(["a", "1"]).row(["longer", "12,345"]);
        let text = t.to_string();
        assert!(text.contains("| longer | 12,345 |"), "{text}");
        assert!(text.contains("| a      |      1 |"), "{text}");
    }
}
