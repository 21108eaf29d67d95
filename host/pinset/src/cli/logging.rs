//! Logs: to stderr, as text for people or as one JSON object per line for log pipelines
//! (`--log-format json`; the manifests use it), never drawn over a progress bar: every progress
//! bar lives in [`bars`], and each log line is written while the bars are hidden.

use indicatif::MultiProgress;
use std::io::Write;
use std::sync::LazyLock;

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `2026-12-01T10:00:00Z  INFO message key=value`.
    #[default]
    Text,
    /// `{"timestamp":…,"level":"INFO","message":…,"node":…,"span":{…}}`, one per line.
    Json,
}

static BARS: LazyLock<MultiProgress> = LazyLock::new(MultiProgress::new);

/// Where progress bars are drawn: a bar added here is hidden while a log line is written.
pub fn bars() -> &'static MultiProgress {
    &BARS
}

/// One log event, buffered and written at once with the bars hidden.
struct Line(Vec<u8>);

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            BARS.suspend(|| {
                let _ = std::io::stderr().write_all(&self.0);
            });
        }
    }
}

fn line() -> Line {
    Line(Vec::with_capacity(256))
}

/// `--log` / `PINSET_LOG` checked before anything runs: a filter tracing cannot read is a usage
/// error naming why, not a silent fall back to `info`.
pub fn parse_filter(filter: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(|_| filter.to_string())
        .map_err(|e| format!("{e} (EnvFilter syntax, e.g. `info` or `info,pinset_node=debug`)"))
}

/// Logs go to stderr so that command output on stdout stays clean.
pub fn init(filter: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(pinset_k8s::quiet_client(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(pinset_k8s::quiet_client("info")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(line)
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_filter_tracing_cannot_read_is_refused_with_why() {
        assert_eq!(
            super::parse_filter("info,pinset=debug").unwrap(),
            "info,pinset=debug"
        );
        let e = super::parse_filter("pinset=bogus").unwrap_err();
        assert!(e.contains("EnvFilter syntax"), "{e}");
    }
}
