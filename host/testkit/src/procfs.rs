//! What `/proc` says about a process the benchmarks started: memory fields and CPU time.

use std::time::Duration;

/// A `/proc/PID/status` field (`VmRSS:`, `RssAnon:`, …) in KiB; 0 when the process is gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The lines of `/proc/PID/status` whose field is one of `fields` (`VmHWM`, `RssAnon`, …),
/// white space folded, joined with `, `; empty when the process is gone.
pub fn status_lines(pid: u32, fields: &[&str]) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let wanted = |l: &&str| fields.iter().any(|f| l.split(':').next() == Some(*f));
    let lines = status.lines().filter(wanted);
    let folded = lines.map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "));
    folded.collect::<Vec<_>>().join(", ")
}

/// CPU time the process has used so far (user + system), in clock ticks of 10 ms.
pub fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: state, ppid, …; utime and stime are 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((field(11) + field(12)) * 10)
}
