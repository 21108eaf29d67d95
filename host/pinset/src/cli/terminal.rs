//! The controlling terminal, for what is asked rather than passed: a password, read without
//! echo from `/dev/tty` (so it works with stdin and stdout redirected, as cosign's prompt does).

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;

pub struct Tty(File);

impl Tty {
    /// The controlling terminal; `None` without one (CI, a pod, a pipeline under `setsid`).
    pub fn open() -> Option<Tty> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .ok()?;
        Some(Tty(file))
    }

    /// Print `prompt`, read one line with echo off (restored whatever happens), without its
    /// newline.
    pub fn ask_hidden(&self, prompt: &str) -> Result<String> {
        let mut out = &self.0;
        out.write_all(prompt.as_bytes())
            .and_then(|_| out.flush())
            .context("writing to the terminal")?;
        let echo = Echo::off(&self.0)?;
        let mut line = String::new();
        let read = BufReader::new(&self.0).read_line(&mut line);
        drop(echo);
        let _ = out.write_all(b"\n");
        read.context("reading from the terminal")?;
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }
}

/// The terminal's echo switched off while this lives.
struct Echo<'a> {
    tty: &'a File,
    saved: libc::termios,
}

impl<'a> Echo<'a> {
    fn off(tty: &'a File) -> Result<Echo<'a>> {
        let fd = tty.as_raw_fd();
        // SAFETY: termios is plain data; tcgetattr fills it for a valid descriptor.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open for the life of `tty`; `saved` is a valid termios to fill.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(std::io::Error::last_os_error()).context("reading the terminal's mode");
        }
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: as above; `quiet` is a termios read from this terminal with echo cleared.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) } != 0 {
            return Err(std::io::Error::last_os_error()).context("turning the terminal's echo off");
        }
        Ok(Echo { tty, saved })
    }
}

impl Drop for Echo<'_> {
    fn drop(&mut self) {
        // SAFETY: restores the mode read in `off` on the same open descriptor.
        unsafe { libc::tcsetattr(self.tty.as_raw_fd(), libc::TCSANOW, &self.saved) };
    }
}
