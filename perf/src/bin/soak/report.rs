//! The soak's findings: samples, checks of the books, the verdict, and
//! the files written for them (`report.md`, `samples.csv`, SVG plots).

use std::fmt::Write as _;
use std::path::Path;

use kvpick_perf::report::{cpu, utc_date};
use kvpick_perf::svg::{self, Axis};

use crate::Options;
use crate::accounts::Account;
use crate::serve::LogSummary;
use crate::traffic::CountsSnapshot;

/// One sampling tick.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub seconds: f64,
    /// Whether `/proc` still had the process.
    pub alive: bool,
    pub rss_bytes: u64,
    pub fds: u64,
    pub threads: u64,
    /// `kvpick_reservations_active` (−1 when the scrape failed).
    pub bookings: f64,
    /// Requests the clients have open.
    pub in_flight: u64,
    /// Σ |engine's cached blocks − kvpick's indexed blocks|.
    pub diverged: u64,
    pub engine_blocks: u64,
    pub index_blocks: u64,
    pub ok: u64,
    pub failed: u64,
    /// `kvpick_queue_depth`: requests waiting for capacity.
    pub queue_depth: f64,
    /// Σ of the error counters ([`crate::accounts::ERRORS`]) so far.
    pub errors: f64,
}

/// The books checked once the traffic is paused and drained.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    pub label: String,
    pub fault_seconds: f64,
    /// Whether every request in flight ended.
    pub drained: bool,
    /// Seconds from quiet to balanced books, if they balanced.
    pub balanced_after: Option<f64>,
    /// At the last look.
    pub bookings: f64,
    pub diverged: u64,
    pub detail: String,
    /// Watched counters that moved from just before the fault to the check.
    pub moved: Vec<(&'static str, f64)>,
    /// The counters the fault must show in (one of them).
    pub seen_by: Option<&'static [&'static str]>,
    /// The counters the fault must not move (what it is not).
    pub not_seen_by: &'static [&'static str],
}

impl Checkpoint {
    pub fn balanced(&self) -> bool {
        self.balanced_after.is_some()
    }

    /// Whether the fault showed in its counter (true when it has none).
    pub fn seen(&self) -> bool {
        self.seen_by.is_none_or(|families| self.moved.iter().any(|(f, d)| families.contains(f) && *d > 0.0))
    }

    /// The counters it must not move that moved.
    pub fn mistaken_for(&self) -> Vec<&'static str> {
        self.moved.iter().filter(|(f, d)| self.not_seen_by.contains(f) && *d > 0.0).map(|(f, _)| *f).collect()
    }
}

pub struct Report {
    pub options: Options,
    pub samples: Vec<Sample>,
    pub checkpoints: Vec<Checkpoint>,
    pub load_seconds: f64,
    pub counts: CountsSnapshot,
    /// Watched counters that moved over the whole run.
    pub moved: Vec<(&'static str, f64)>,
    /// The fault kinds that ran (all asked for must, or the run was too short).
    pub injected: std::collections::BTreeSet<crate::chaos::Kind>,
    /// How the server ended on SIGTERM.
    pub exit: Option<Result<String, String>>,
    pub log: LogSummary,
    /// The log's warnings and errors against the counters that stand for them.
    pub accounts: Vec<Account>,
}

/// Resident memory and descriptors early and late after warm-up.
#[derive(Clone, Copy, Debug)]
pub struct Growth {
    pub rss_start: f64,
    pub rss_end: f64,
    pub fds_start: u64,
    pub fds_end: u64,
    pub threads_start: u64,
    pub threads_end: u64,
}

impl Growth {
    pub fn rss(&self) -> f64 {
        self.rss_end / self.rss_start.max(1.0) - 1.0
    }
}

/// `name +delta` for each, `kvpick_` dropped; "none" for none.
fn moved(deltas: &[(&str, f64)]) -> String {
    if deltas.is_empty() {
        return "none".into();
    }
    deltas.iter().map(|(f, d)| format!("{} {d:+}", f.trim_start_matches("kvpick_"))).collect::<Vec<_>>().join(", ")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

impl Report {
    pub fn new(options: Options) -> Report {
        Report {
            options,
            samples: Vec::new(),
            checkpoints: Vec::new(),
            load_seconds: 0.0,
            counts: CountsSnapshot::default(),
            moved: Vec::new(),
            injected: Default::default(),
            exit: None,
            log: LogSummary::default(),
            accounts: Vec::new(),
        }
    }

    /// Medians of the first and the last tenth (at least 3 samples each) of
    /// the samples taken under load after warm-up; `None` with too few.
    pub fn growth(&self) -> Option<Growth> {
        let warm = self.options.warmup().as_secs_f64();
        let steady: Vec<&Sample> =
            self.samples.iter().filter(|s| s.alive && s.seconds >= warm && s.seconds <= self.load_seconds).collect();
        let k = (steady.len() / 10).max(3);
        if steady.len() < 2 * k {
            return None;
        }
        let (early, late) = (&steady[..k], &steady[steady.len() - k..]);
        let rss = |part: &[&Sample]| median(part.iter().map(|s| s.rss_bytes as f64).collect());
        let most = |part: &[&Sample], f: fn(&Sample) -> u64| part.iter().map(|s| f(s)).max().unwrap_or(0);
        Some(Growth {
            rss_start: rss(early),
            rss_end: rss(late),
            fds_start: most(early, |s| s.fds),
            fds_end: most(late, |s| s.fds),
            threads_start: most(early, |s| s.threads),
            threads_end: most(late, |s| s.threads),
        })
    }

    /// Every broken invariant, in words.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.checkpoints.iter().filter(|c| !c.balanced()) {
            let drained = if c.drained { "" } else { "requests still in flight after 35 s; " };
            out.push(format!(
                "books did not balance within {:?} after {} (at {:.1} s): {drained}{}",
                self.options.window, c.label, c.fault_seconds, c.detail
            ));
        }
        for c in self.checkpoints.iter().filter(|c| !c.seen()) {
            out.push(format!(
                "{} (at {:.1} s) did not show in {}",
                c.label,
                c.fault_seconds,
                c.seen_by.unwrap_or_default().join(" or ")
            ));
        }
        for c in &self.checkpoints {
            let wrong = c.mistaken_for();
            if !wrong.is_empty() {
                out.push(format!(
                    "{} (at {:.1} s) moved {}, which it must not",
                    c.label,
                    c.fault_seconds,
                    wrong.join(" and ")
                ));
            }
        }
        let missed: Vec<&str> =
            self.options.faults.iter().filter(|k| !self.injected.contains(k)).map(|k| k.name()).collect();
        if !missed.is_empty() {
            out.push(format!("fault kinds never injected (the run was too short for them): {}", missed.join(", ")));
        }
        for (family, delta) in self.moved.iter().filter(|(f, _)| crate::chaos::NEVER.contains(f)) {
            out.push(format!("{family} rose by {delta} over the run"));
        }
        match self.growth() {
            None => out.push("too few samples after warm-up to judge memory and descriptors".into()),
            Some(g) => {
                if g.rss() > self.options.rss_tolerance {
                    out.push(format!(
                        "resident memory grew {:.1} % after warm-up ({:.1} → {:.1} MiB), over the {:.1} % allowed",
                        100.0 * g.rss(),
                        g.rss_start / 1048576.0,
                        g.rss_end / 1048576.0,
                        100.0 * self.options.rss_tolerance
                    ));
                }
                if g.fds_end > g.fds_start + self.options.fd_slack {
                    out.push(format!(
                        "open descriptors grew from {} to {} after warm-up, over the {} allowed",
                        g.fds_start, g.fds_end, self.options.fd_slack
                    ));
                }
            }
        }
        if let Some(dead) = self.samples.iter().find(|s| !s.alive) {
            out.push(format!("kvpick serve was gone at {:.1} s", dead.seconds));
        }
        for a in self.accounts.iter().filter(|a| !a.settled()) {
            let why = match a.counters {
                None => "no counter stands for it".to_owned(),
                Some(counters) => format!("{} did not rise", counters.join(" or ")),
            };
            out.push(format!("{} {:?} logged {} time(s), but {why}", a.level, a.message, a.lines));
        }
        if !self.log.panics.is_empty() {
            out.push(format!("{} panic line(s) in the log, first: {}", self.log.panics.len(), self.log.panics[0]));
        }
        match &self.exit {
            Some(Ok(_)) => {}
            Some(Err(e)) => out.push(format!("kvpick serve on SIGTERM: {e}")),
            None => out.push("kvpick serve was not stopped".into()),
        }
        if self.counts.ok == 0 {
            out.push("no request succeeded: the soak tested nothing".into());
        }
        out
    }

    pub fn passed(&self) -> bool {
        self.violations().is_empty()
    }

    /// The report as markdown.
    pub fn summary(&self) -> String {
        let o = &self.options;
        let mut s = String::new();
        let _ = writeln!(s, "# kvpick-soak, {}\n", utc_date());
        let _ = writeln!(
            s,
            "{} s of load on {} ({}), {} discovery, {} engines ({}) × {} blocks, time scale {}, {} clients, {:.0} % cancelled; faults: {}; \
             hold {:?}, settle {:?}, window {:?}, warm-up {:?}.\n",
            self.load_seconds.round(),
            cpu(),
            o.kvpick.display(),
            if o.kube { "Kubernetes (a fake API server)" } else { "static (a workers file)" },
            o.engines.len(),
            o.engines.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(", "),
            o.num_blocks,
            o.time_scale,
            o.clients,
            100.0 * o.cancel_share,
            if o.faults.is_empty() {
                "none".to_owned()
            } else {
                o.faults.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
            },
            o.hold,
            o.settle,
            o.window,
            o.warmup(),
        );
        let violations = self.violations();
        if violations.is_empty() {
            let _ = writeln!(s, "**Verdict: passed** (every invariant held).\n");
        } else {
            let _ = writeln!(s, "**Verdict: failed**:\n");
            for v in &violations {
                let _ = writeln!(s, "- {v}");
            }
            s.push('\n');
        }
        let c = &self.counts;
        let _ = writeln!(
            s,
            "## Requests\n\nstarted {}, answered {} ({:.0}/s), cancelled by the client {}, cut by a gateway reset {}, failed {}.\n",
            c.started,
            c.ok,
            c.ok as f64 / self.load_seconds.max(1e-9),
            c.cancelled,
            c.reset,
            c.failures.values().map(|(n, _)| n).sum::<u64>()
        );
        if !c.failures.is_empty() {
            let _ = writeln!(s, "| failure | count | first message |\n|---|---:|---|");
            for (kind, (n, first)) in &c.failures {
                let _ = writeln!(s, "| {kind} | {n} | {} |", first.replace('|', "\\|").replace('\n', " "));
            }
            s.push('\n');
        }
        let balanced: Vec<f64> = self.checkpoints.iter().filter_map(|c| c.balanced_after).collect();
        let _ = writeln!(
            s,
            "## Books after each fault\n\n{} checks, {} balanced; time to balance once quiet: median {:.2} s, worst {:.2} s.\n",
            self.checkpoints.len(),
            balanced.len(),
            median(balanced.clone()),
            balanced.iter().copied().fold(0.0, f64::max)
        );
        let _ = writeln!(
            s,
            "| fault | at (s) | balanced after (s) | last look | counters moved |\n|---|---:|---:|---|---|"
        );
        for c in &self.checkpoints {
            let after = c.balanced_after.map_or_else(|| "**no**".to_owned(), |t| format!("{t:.2}"));
            let _ =
                writeln!(s, "| {} | {:.1} | {after} | {} | {} |", c.label, c.fault_seconds, c.detail, moved(&c.moved));
        }
        let _ = writeln!(s, "\nOver the whole run: {}.\n", moved(&self.moved));
        if let Some(g) = self.growth() {
            let _ = writeln!(
                s,
                "## Memory, descriptors, threads (after warm-up, first and last tenth)\n\n\
                 resident {:.1} → {:.1} MiB ({:+.1} %, allowed {:.1} %); descriptors {} → {} (allowed +{}); threads {} → {}.\n",
                g.rss_start / 1048576.0,
                g.rss_end / 1048576.0,
                100.0 * g.rss(),
                100.0 * o.rss_tolerance,
                g.fds_start,
                g.fds_end,
                o.fd_slack,
                g.threads_start,
                g.threads_end
            );
        }
        let _ = writeln!(s, "## kvpick's log\n\n{} lines, {} panic lines.\n", self.log.lines, self.log.panics.len());
        if !self.accounts.is_empty() {
            let _ = writeln!(s, "| level | message | lines | counted by | rose by |\n|---|---|---:|---|---:|");
            for a in &self.accounts {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    a.level,
                    a.message.replace('|', "\\|"),
                    a.lines,
                    a.counters.map_or_else(|| "nothing".to_owned(), |c| c.join(", ")),
                    a.rose
                );
            }
            s.push('\n');
        }
        if let Some(exit) = &self.exit {
            let _ = writeln!(
                s,
                "On SIGTERM: {}.\n",
                exit.as_ref().map_or_else(|e| e.clone(), |ok| format!("exited, {ok}"))
            );
        }
        s
    }

    /// `report.md`, `samples.csv` and the plots, in `out`.
    pub fn write(&self, out: &Path) -> Result<(), String> {
        let write = |name: &str, text: String| std::fs::write(out.join(name), text).map_err(|e| format!("{name}: {e}"));
        write("report.md", self.summary())?;
        let mut csv = String::from(
            "seconds,alive,rss_bytes,fds,threads,bookings,in_flight,diverged_blocks,engine_blocks,index_blocks,ok,failed,\
             queue_depth,errors\n",
        );
        for x in &self.samples {
            let _ = writeln!(
                csv,
                "{:.2},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                x.seconds,
                u8::from(x.alive),
                x.rss_bytes,
                x.fds,
                x.threads,
                x.bookings,
                x.in_flight,
                x.diverged,
                x.engine_blocks,
                x.index_blocks,
                x.ok,
                x.failed,
                x.queue_depth,
                x.errors
            );
        }
        write("samples.csv", csv)?;
        for (name, svg) in self.plots() {
            write(&name, svg)?;
        }
        Ok(())
    }

    fn plots(&self) -> Vec<(String, String)> {
        let series = |f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
            self.samples.iter().filter(|s| s.alive).map(|s| (s.seconds, f(s))).collect()
        };
        let x = Axis::fit(self.samples.iter().map(|s| s.seconds), false);
        let chart = |name: &str, title: &str, y_label: &str, lines: Vec<(&str, Vec<(f64, f64)>)>| {
            let y = Axis::fit(lines.iter().flat_map(|(_, p)| p.iter().map(|(_, v)| *v)), false);
            (name.to_owned(), svg::lines(title, "seconds", y_label, x, y, &lines))
        };
        vec![
            chart(
                "memory.svg",
                "kvpick serve: resident memory",
                "MiB",
                vec![("resident", series(|s| s.rss_bytes as f64 / 1048576.0))],
            ),
            chart(
                "descriptors-threads.svg",
                "kvpick serve: descriptors and threads",
                "count",
                vec![("open descriptors", series(|s| s.fds as f64)), ("threads", series(|s| s.threads as f64))],
            ),
            chart(
                "bookings.svg",
                "Bookings held by kvpick, requests open at the clients",
                "count",
                vec![
                    ("kvpick bookings", series(|s| s.bookings.max(0.0))),
                    ("client requests open", series(|s| s.in_flight as f64)),
                    ("queued for capacity", series(|s| s.queue_depth.max(0.0))),
                ],
            ),
            chart(
                "errors.svg",
                "Errors counted by kvpick (tokenizer, streams, KV events, refusals), cumulative",
                "count",
                vec![("errors", series(|s| s.errors))],
            ),
            chart(
                "index.svg",
                "KV blocks: engines' caches, kvpick's index, divergence",
                "blocks",
                vec![
                    ("engines cache", series(|s| s.engine_blocks as f64)),
                    ("kvpick indexes", series(|s| s.index_blocks as f64)),
                    ("|difference|, summed per engine", series(|s| s.diverged as f64)),
                ],
            ),
        ]
    }
}
