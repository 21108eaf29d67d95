//! `pinset rollout status | pause | resume POOL`: a pool's fleet rollout from a terminal, as
//! `kubectl rollout` does it for a Deployment.

use super::plan::Output;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use pinset_core::rollout::{Standing, Watched};
use pinset_k8s::rollout_status::{self, RolloutStatus};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum RolloutCommand {
    /// Follow a pool's rollout until every node has its PinnedImageSets pinned. Exit 0 when
    /// they have (with --watch=false: when the rollout could be read); 1 when the pool is
    /// Degraded for the target (a failed canary holds it, a node failed), when --timeout passes
    /// first, or when the pool cannot be read.
    Status(StatusArgs),
    /// Pause a pool's rollout (annotation pinset.io/rollout-paused=true): no node is granted
    /// until it is resumed; nodes granted before go on. Exit 1 when it is already paused.
    Pause(PoolArgs),
    /// Resume a paused rollout (the annotation removed). Exit 1 when it is not paused.
    Resume(PoolArgs),
}

#[derive(clap::Args, Clone, Debug)]
pub struct PoolArgs {
    /// The MachineConfigPool.
    pub pool: String,
    /// kubeconfig to use; default: in-cluster, then $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Follow the rollout until it ends; `--watch=false` prints where it stands and exits.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub watch: bool,
    /// Give up after this long (`90s`, `10m`, `1h`; a bare number is seconds; 0: never).
    #[arg(long, default_value = "0", value_parser = duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// text for people (a progress bar on a terminal, a line per change elsewhere); json or yaml
    /// for scripts: the last status, once.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
    /// When it ends, draw the rollout as followed into FILE (SVG: a lane per node, a bar from
    /// when it was seen pulling to when it was seen at the target, red when it failed) and
    /// FILE's .trace.json.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
}

/// `90s`, `10m`, `1h`, or seconds.
fn duration(text: &str) -> Result<Duration, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: expected a number and s, m or h, such as 90s or 10m"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{text:?}: the unit is s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

pub async fn run(cmd: RolloutCommand) -> Result<ExitCode> {
    match cmd {
        RolloutCommand::Status(args) => status(&args).await,
        RolloutCommand::Pause(args) => pause(&args, true).await,
        RolloutCommand::Resume(args) => pause(&args, false).await,
    }
}

async fn pause(args: &PoolArgs, pause: bool) -> Result<ExitCode> {
    let client = pinset_k8s::client(args.kubeconfig.as_deref()).await?;
    rollout_status::set_paused(client, &args.pool, pause).await?;
    let done = if pause { "paused" } else { "resumed" };
    println!("machineconfigpool/{} {done}", args.pool);
    Ok(ExitCode::SUCCESS)
}

async fn status(args: &StatusArgs) -> Result<ExitCode> {
    let client = pinset_k8s::client(args.pool.kubeconfig.as_deref()).await?;
    let mut view = View::new(args);
    let mut last = None;
    let follow = rollout_status::follow(client, &args.pool.pool, |s| {
        last = Some(s.clone());
        view.show(s);
        args.watch && !matches!(s.standing, Standing::Complete | Standing::Degraded(_))
    });
    // The last status read, and whether --timeout passed first.
    let end = if args.timeout.is_zero() {
        follow.await.map(|s| (Some(s), false))
    } else {
        match tokio::time::timeout(args.timeout, follow).await {
            Ok(read) => read.map(|s| (Some(s), false)),
            Err(_) => Ok((last, true)),
        }
    };
    // The bar goes before anything else is printed, the error included.
    view.finish();
    let (status, timed_out) = end?;
    if let Some(path) = &args.timeline {
        let trace = view.write_timeline(path, status.as_ref())?;
        eprintln!("timeline: {} ({})", path.display(), trace.display());
    }
    Ok(report(args, status, timed_out))
}

/// The end of `status`: the last status in the chosen format and the exit code.
fn report(args: &StatusArgs, status: Option<RolloutStatus>, timed_out: bool) -> ExitCode {
    if let Some(s) = &status {
        match args.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(s).unwrap_or_default()),
            Output::Yaml => print!("{}", serde_saphyr::to_string(s).unwrap_or_default()),
            Output::Text => println!("{}", final_line(s, timed_out)),
        }
    }
    let failed = match &status {
        _ if timed_out => {
            // Where it stood is on stdout, in the chosen format.
            let unread = if status.is_none() {
                " (nothing read yet)"
            } else {
                ""
            };
            eprintln!(
                "error: timed out after {}s waiting for MachineConfigPool {} to roll out{unread}",
                args.timeout.as_secs(),
                args.pool.pool
            );
            true
        }
        Some(s) => match &s.standing {
            Standing::Degraded(why) => {
                eprintln!("error: MachineConfigPool {} is Degraded: {why}", s.pool);
                true
            }
            _ => false,
        },
        None => false,
    };
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// How far the nodes are: `1 of 3 nodes at apps@2 (1 pulling, 1 waiting)`.
fn line(s: &RolloutStatus) -> String {
    format!("{} of {} nodes {}", s.done, s.nodes, at(s))
}

/// `at apps@2 (1 pulling, 1 waiting)`: the target and the nodes short of it.
fn at(s: &RolloutStatus) -> String {
    let target = if s.target.is_empty() {
        "their target (the pool selects no PinnedImageSet)".to_string()
    } else {
        s.target.clone()
    };
    let rest = super::nonzero(&[
        (s.pulling, "pulling"),
        (s.failed, "failed"),
        (s.waiting, "waiting"),
    ]);
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!(" ({})", rest.join(", "))
    };
    format!("at {target}{rest}")
}

/// What the rollout waits for: the pause, the controller, or the fleet policy's reason.
fn waiting_for(s: &RolloutStatus) -> String {
    match (&s.message, &s.reason) {
        (Some(m), _) => m.clone(),
        (None, Some(r)) => r.clone(),
        _ => String::new(),
    }
}

fn final_line(s: &RolloutStatus, timed_out: bool) -> String {
    match &s.standing {
        Standing::Complete => {
            format!(
                "MachineConfigPool {} successfully rolled out: {}",
                s.pool,
                line(s)
            )
        }
        _ if timed_out => format!("MachineConfigPool {}: {}", s.pool, line(s)),
        Standing::Degraded(_) => format!("MachineConfigPool {} is Degraded: {}", s.pool, line(s)),
        Standing::Paused => format!(
            "MachineConfigPool {} is paused: {}: {}",
            s.pool,
            line(s),
            waiting_for(s)
        ),
        Standing::Progressing => format!(
            "MachineConfigPool {} is rolling out: {}: {}",
            s.pool,
            line(s),
            waiting_for(s)
        ),
    }
}

/// While following, in text: a bar on a terminal, else a line whenever what it says changes
/// (the counts, the standing, the fleet policy's reason). The last status is [`report`]'s.
struct View {
    /// Lines are printed (text output, following, no terminal).
    lines: bool,
    bar: Option<ProgressBar>,
    printed: Option<String>,
    /// When each node was seen working and done, for `--timeline`.
    watched: Watched,
    began: Instant,
}

fn bar_style() -> Result<ProgressStyle, indicatif::style::TemplateError> {
    ProgressStyle::with_template(
        "{prefix} [{bar:32.cyan/blue}] {pos}/{len} nodes {msg} ({elapsed})",
    )
}

impl View {
    fn new(args: &StatusArgs) -> Self {
        let follow_text = args.output == Output::Text && args.watch;
        let bar = follow_text
            .then(|| {
                super::logging::bars()
                    .add(ProgressBar::no_length())
                    .with_style(bar_style().expect("valid template"))
            })
            .filter(|b| !b.is_hidden());
        if let Some(b) = &bar {
            b.set_prefix(args.pool.pool.clone());
            b.enable_steady_tick(Duration::from_millis(200));
        }
        Self {
            lines: follow_text && bar.is_none(),
            bar,
            printed: None,
            watched: Watched::default(),
            began: Instant::now(),
        }
    }

    fn show(&mut self, s: &RolloutStatus) {
        let members = s
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.granted, m.phase));
        self.watched.observe(self.elapsed_ms(), members);
        let why = waiting_for(s);
        if let Some(bar) = &self.bar {
            bar.set_length(u64::from(s.nodes));
            bar.set_position(u64::from(s.done));
            bar.set_message(match why.is_empty() {
                true => at(s),
                false => format!("{} — {why}", at(s)),
            });
            return;
        }
        let last = matches!(s.standing, Standing::Complete | Standing::Degraded(_));
        let why = if why.is_empty() {
            why
        } else {
            format!(": {why}")
        };
        let text = format!(
            "Waiting for MachineConfigPool {} to roll out: {}{why}",
            s.pool,
            line(s)
        );
        if self.lines && !last && self.printed.as_ref() != Some(&text) {
            println!("{text}");
            self.printed = Some(text);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// The rollout as followed, drawn into `path`; the trace's path.
    fn write_timeline(&self, path: &Path, last: Option<&RolloutStatus>) -> Result<PathBuf> {
        let title = match last {
            Some(s) => format!(
                "pinset rollout status: MachineConfigPool {}, target {}",
                s.pool, s.target
            ),
            None => "pinset rollout status".to_string(),
        };
        let mut notes = vec![
            "each node from when it was seen pulling to when it was seen at the target (red: failed), as this follow saw it".to_string(),
        ];
        notes.extend(last.map(|s| final_line(s, false)));
        let t = self.watched.timeline(title, notes, self.elapsed_ms());
        super::write_timeline(path, &t).context("--timeline")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(standing: Standing, message: Option<&str>) -> RolloutStatus {
        RolloutStatus {
            pool: "worker".into(),
            target: "apps@2".into(),
            standing,
            message: message.map(str::to_string),
            nodes: 4,
            granted: 2,
            pulling: 1,
            done: 1,
            failed: 0,
            waiting: 2,
            paused: false,
            observed: true,
            policy: Some("embedded:default".into()),
            reason: Some("wave: node w-1".into()),
            members: Vec::new(),
        }
    }

    #[test]
    fn what_the_last_line_says() {
        let going = status(Standing::Progressing, None);
        assert_eq!(
            final_line(&going, false),
            "MachineConfigPool worker is rolling out: 1 of 4 nodes at apps@2 (1 pulling, 2 \
             waiting): wave: node w-1"
        );
        assert_eq!(
            final_line(&going, true),
            "MachineConfigPool worker: 1 of 4 nodes at apps@2 (1 pulling, 2 waiting)"
        );
        let paused = status(Standing::Paused, Some("paused by pinset.io/rollout-paused"));
        assert!(
            final_line(&paused, false).ends_with("2 waiting): paused by pinset.io/rollout-paused"),
            "the pause, not the policy's last reason"
        );
        let mut done = status(Standing::Complete, None);
        (done.done, done.pulling, done.waiting) = (4, 0, 0);
        assert_eq!(
            final_line(&done, false),
            "MachineConfigPool worker successfully rolled out: 4 of 4 nodes at apps@2"
        );
        done.target.clear();
        assert!(line(&done).contains("the pool selects no PinnedImageSet"));
    }

    #[test]
    fn the_bar_template_is_valid() {
        assert!(bar_style().is_ok());
    }

    #[test]
    fn durations() {
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert!(duration("1d").unwrap_err().contains("s, m or h"));
        assert!(duration("m").unwrap_err().contains("such as 90s"));
        assert!(duration("-5s").is_err());
    }
}
