//! What the node's kernel tells: pressure stall information and filesystem space; and files
//! written whole.

use pinset_policy_sdk::Pressure;
use std::path::Path;

/// `some avg10` of `/proc/pressure/{io,cpu,memory}`; each `None` when the kernel has no PSI.
pub fn pressure() -> Pressure {
    pressure_in(Path::new("/proc/pressure"))
}

pub fn pressure_in(dir: &Path) -> Pressure {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|s| some_avg10(&s))
    };
    Pressure {
        io: read("io"),
        cpu: read("cpu"),
        memory: read("memory"),
    }
}

/// The `avg10` of the `some` line of a PSI file.
pub fn some_avg10(text: &str) -> Option<f32> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))
        .and_then(|v| v.parse().ok())
}

/// (capacity, available) bytes of the filesystem holding `path`.
pub fn filesystem_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// Give the memory freed so far back to the operating system. A reconcile allocates memory
/// that is freed when it ends but that the allocator would otherwise keep, spread over its
/// per-thread arenas, for the life of a long-running process (measured by `benches/agent.rs`).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub use pinset_registry::files::write_atomic;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_psi() {
        let text = "some avg10=12.34 avg60=1.00 avg300=0.50 total=123\nfull avg10=3.00 avg60=0.00 avg300=0.00 total=5\n";
        assert_eq!(some_avg10(text), Some(12.34));
        assert_eq!(some_avg10("garbage"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("io"), text).unwrap();
        let p = pressure_in(dir.path());
        assert_eq!((p.io, p.cpu), (Some(12.34), None));
    }

    #[test]
    fn filesystem_space_of_a_real_path() {
        let (cap, avail) = filesystem_space(Path::new("/")).unwrap();
        assert!(cap > 0 && avail <= cap);
        assert!(filesystem_space(Path::new("/nonexistent/x")).is_none());
    }
}
