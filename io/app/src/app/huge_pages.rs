//! Transparent huge pages, per `--transparent-huge-pages`.
//!
//! mimalloc (kvpick's allocator) madvises its arenas `MADV_HUGEPAGE`, so on
//! a system whose THP mode is `madvise` (or `always`) they are eligible,
//! and khugepaged, once it reaches the process, collapses each 2 MiB range
//! holding a few live objects into a whole huge page: resident memory
//! stepped up by about 20 MiB at the same age of every 30-minute soak
//! (perf/README.md, "Soak and chaos"), the growth all in `AnonHugePages`.
//! Opting out keeps resident memory what kvpick uses. The flag is the
//! process's: it covers every mapping, existing and future, and is read
//! by the kernel on each fault and by khugepaged.

use super::HugePages;

/// Applies `choice`; the error is the kernel's, for a warning (the process
/// runs on either way).
pub fn apply(choice: HugePages) -> Result<(), std::io::Error> {
    if choice == HugePages::Allowed {
        return Ok(());
    }
    // SAFETY: PR_SET_THP_DISABLE takes an integer argument and touches no
    // memory of ours; the unused arguments must be 0.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_THP_DISABLE,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Whether the kernel holds the process out of transparent huge pages.
pub fn disabled() -> bool {
    // SAFETY: PR_GET_THP_DISABLE takes no pointer; the rest must be 0.
    let rc = unsafe {
        libc::prctl(
            libc::PR_GET_THP_DISABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    rc == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_opts_the_process_out_and_allowed_leaves_it() {
        // The flag is per process and cannot be taken back by this
        // module: check `allowed` first, on a fresh test process.
        let before = disabled();
        apply(HugePages::Allowed).unwrap();
        assert_eq!(disabled(), before, "allowed changes nothing");
        apply(HugePages::Never).unwrap();
        assert!(disabled());
    }
}
