//! Running this benchmark binary again as a child process, so that what it
//! measures starts from a fresh heap (one index, one indexer per process:
//! in one process, the one measured after another ran on a heap the first
//! had grown and freed; perf/README, 2026-12-07).

use std::process::{Command, Stdio};

/// Runs this binary with `args` (stdin closed, stderr passed through) and
/// returns the last non-empty line it printed, trimmed: the child's report.
pub fn report_of_this_binary<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let output = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    if !output.status.success() {
        return Err(format!("exited with {}", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()).ok_or("printed no report")?;
    Ok(line.to_owned())
}
