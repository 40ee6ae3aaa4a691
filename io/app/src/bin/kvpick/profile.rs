//! `--profile FILE.svg`: samples the whole process's CPU (every thread)
//! from start to stop with pprof's in-process SIGPROF sampler and writes a
//! flame graph at exit. No system profiler, no debug symbols beyond the
//! release profile's line tables.

use std::path::Path;
#[cfg(feature = "profile")]
use std::path::PathBuf;

/// Samples per second: enough for a load run of tens of seconds, cheap
/// enough not to move the numbers much.
#[cfg(feature = "profile")]
const FREQUENCY_HZ: i32 = 499;

pub struct Profiler {
    #[cfg(feature = "profile")]
    guard: Option<(pprof::ProfilerGuard<'static>, PathBuf)>,
}

impl Profiler {
    #[cfg(feature = "profile")]
    pub fn start(path: Option<&Path>) -> Result<Profiler, String> {
        let Some(path) = path else { return Ok(Profiler { guard: None }) };
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY_HZ)
            // Unwinding through these from a signal handler can deadlock.
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| format!("could not start the profiler: {e}"))?;
        tracing::info!(file = %path.display(), hz = FREQUENCY_HZ, "CPU profile recording until stop");
        Ok(Profiler { guard: Some((guard, path.to_owned())) })
    }

    #[cfg(not(feature = "profile"))]
    pub fn start(path: Option<&Path>) -> Result<Profiler, String> {
        match path {
            None => Ok(Profiler {}),
            Some(_) => Err("this build has no profiler (built without the `profile` feature)".into()),
        }
    }

    #[cfg(feature = "profile")]
    pub fn finish(self) -> Result<(), String> {
        let Some((guard, path)) = self.guard else { return Ok(()) };
        let report = guard.report().build().map_err(|e| e.to_string())?;
        let file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        report.flamegraph(file).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(file = %path.display(), "CPU profile written");
        Ok(())
    }

    #[cfg(not(feature = "profile"))]
    pub fn finish(self) -> Result<(), String> {
        Ok(())
    }
}
