//! How CRI-O is made to re-read its configuration once the pin drop-in changed.
//!
//! `systemctl reload crio` sends CRI-O SIGHUP (its unit's `ExecReload`); the agent does the same
//! without systemd, a shell or `nsenter` in its image: with the host's PID namespace (`hostPID`)
//! it finds the `crio` processes in `/proc` and signals them. A command stays available as an
//! override for hosts that reload differently.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reload {
    /// SIGHUP to every process named `crio` under this proc filesystem.
    Signal { proc: PathBuf },
    /// A command: program and arguments.
    Command(Vec<String>),
    /// Nothing: CRI-O is not told (tests, a runtime that watches its files).
    None,
}

impl Default for Reload {
    fn default() -> Self {
        Reload::Signal {
            proc: PathBuf::from("/proc"),
        }
    }
}

impl Reload {
    /// From a `--crio-reload` value: absent is the signal, empty is none, else a command split
    /// on white space.
    pub fn from_flag(flag: Option<&str>) -> Reload {
        match flag {
            None => Reload::default(),
            Some(command) if command.trim().is_empty() => Reload::None,
            Some(command) => {
                Reload::Command(command.split_whitespace().map(String::from).collect())
            }
        }
    }

    /// What is done, for errors and logs.
    pub fn describe(&self) -> String {
        match self {
            Reload::Signal { proc } => format!("SIGHUP to crio (found in {})", proc.display()),
            Reload::Command(command) => format!("command {command:?}"),
            Reload::None => "none".into(),
        }
    }

    /// Tell CRI-O; `Err` says why it could not be told.
    pub async fn run(&self) -> Result<(), String> {
        match self {
            Reload::None => Ok(()),
            Reload::Signal { proc } => signal_crio(proc),
            Reload::Command(command) => run_command(command, COMMAND_DEADLINE).await,
        }
    }
}

fn signal_crio(proc: &Path) -> Result<(), String> {
    let pids = processes_named(proc, "crio")
        .map_err(|e| format!("cannot list processes in {}: {e}", proc.display()))?;
    if pids.is_empty() {
        return Err(format!(
            "no process named crio in {}: the agent needs the host's PID namespace (hostPID: true) on a CRI-O node, or --crio-reload COMMAND",
            proc.display()
        ));
    }
    for pid in pids {
        // SAFETY: kill(2) with a PID read from /proc and a valid signal number.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            let e = std::io::Error::last_os_error();
            // A process that exited since /proc was read needs no reload.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(format!("SIGHUP to crio (pid {pid}): {e}"));
            }
        }
        tracing::debug!(pid, "SIGHUP sent to crio");
    }
    Ok(())
}

/// PIDs whose command name (`/proc/PID/comm`) is exactly `name`.
pub fn processes_named(proc: &Path, name: &str) -> std::io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(proc)? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // Processes exit while the directory is read: a missing comm is skipped.
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm"))
            && comm.trim_end_matches('\n') == name
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// How long a reload command may take; it is killed then, and the reload failed (a pin change
/// is retried with the reconcile). `systemctl reload crio` returns in milliseconds.
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(30);
/// How much of a reload command's stderr its error quotes (the rest is read and dropped).
const KEPT_STDERR: u64 = 4096;

/// Run `command` within `deadline`, its stderr read while it runs and quoted in part.
async fn run_command(command: &[String], deadline: Duration) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let Some((program, args)) = command.split_first() else {
        return Ok(());
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let stderr = child.stderr.take();
    let ran = async {
        let mut said = Vec::new();
        if let Some(mut stderr) = stderr {
            (&mut stderr)
                .take(KEPT_STDERR)
                .read_to_end(&mut said)
                .await?;
            tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await?;
        }
        Ok::<_, std::io::Error>((child.wait().await?, said))
    };
    match tokio::time::timeout(deadline, ran).await {
        // Dropped with the future: killed (`kill_on_drop`).
        Err(_) => Err(format!("did not finish within {deadline:?}: killed")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok((status, _))) if status.success() => Ok(()),
        Ok(Ok((status, said))) => Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&said).trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn flag_values() {
        assert_eq!(Reload::from_flag(None), Reload::default());
        assert_eq!(Reload::from_flag(Some("")), Reload::None);
        assert_eq!(
            Reload::from_flag(Some("systemctl reload crio")),
            Reload::Command(vec!["systemctl".into(), "reload".into(), "crio".into()])
        );
    }

    /// A process whose command name is `crio` (sleep run through a symlink of that name: the
    /// kernel names a process after the path it was started by) receives SIGHUP, as CRI-O does
    /// from `systemctl reload crio`; sleep dies of it, which the test observes. (A copy of the
    /// binary would be a file open for writing while other tests fork: "text file busy".)
    #[tokio::test]
    async fn the_signal_reaches_the_process_named_crio() {
        let dir = tempfile::tempdir().unwrap();
        let crio = dir.path().join("crio");
        std::os::unix::fs::symlink("/bin/sleep", &crio).unwrap();
        let mut command = std::process::Command::new(&crio);
        command.arg("30");
        // The stand-in takes SIGHUP's default action whatever this test inherited: a parent that
        // ignores it (`nohup`, some CI runners) passes the ignored disposition on across exec.
        // SAFETY: between fork and exec the closure only calls signal(2), which is
        // async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let pid = child.id() as i32;
        // The kernel renames the process late in exec, after the parent has seen it start.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !processes_named(Path::new("/proc"), "crio")
            .unwrap()
            .contains(&pid)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "pid {pid} never named crio"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Reload::default().run().await.unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGHUP), "{status:?}");
    }

    /// A reload command that hangs is killed at its deadline, and one that floods its stderr
    /// is read to its end and quoted in part: neither holds the pin step.
    #[tokio::test]
    async fn a_reload_command_is_bounded_in_time_and_words() {
        let started = std::time::Instant::now();
        let e = run_command(&["sleep".into(), "60".into()], Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(e, "did not finish within 300ms: killed");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let flood = "head -c 1000000 /dev/zero | tr '\\0' x >&2; exit 3";
        let e = run_command(&["sh".into(), "-c".into(), flood.into()], COMMAND_DEADLINE)
            .await
            .unwrap_err();
        assert!(e.starts_with("exit status: 3: xxx"), "{e}");
        assert_eq!(e.len(), "exit status: 3: ".len() + KEPT_STDERR as usize);
        let ok = ["true".to_string()];
        assert_eq!(run_command(&ok, COMMAND_DEADLINE).await, Ok(()));
    }

    #[tokio::test]
    async fn no_crio_process_says_what_the_agent_needs() {
        let empty = tempfile::tempdir().unwrap();
        let e = Reload::Signal {
            proc: empty.path().into(),
        }
        .run()
        .await
        .unwrap_err();
        assert!(
            e.contains("no process named crio") && e.contains("hostPID"),
            "{e}"
        );
    }
}
