//! `pinset node` (pull and pin for one node from YAML files) and `pinset plan` (show what the
//! policy decides, without pulling).

use super::PolicyOpts;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use pinset_core::decisions::Decisions;
use pinset_core::desired::{self, Desired, NodeInfo};
use pinset_core::status::NodeStatus;
use pinset_core::timeline::Recorder;
use pinset_core::yaml::Fields;
use pinset_k8s::objects::{self, Objects};
use pinset_node::config::MirrorFlags;
use pinset_node::cri::client::{STANDARD_ENDPOINTS, find_endpoint};
use pinset_node::executor::Event;
use pinset_node::pin::AnyPins;
use pinset_node::pin::crio::{self, Reload};
use pinset_node::{NodeConfig, ReconcileError, Reconciler, Report};
use pinset_policy::{Guarded, PolicyModule};
use pinset_policy_sdk::fmt_bytes;
use pinset_registry::auth::Credentials;
use pinset_registry::mirrors::MirrorSource;
use pinset_registry::size::{Cached, RegistrySizer};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The objects a node works from.
#[derive(clap::Args, Clone, Debug)]
pub struct Inputs {
    /// PinnedImageSet YAML or JSON files or directories, or - for standard input (`pinset set
    /// … | pinset plan --sets - …`; MachineConfigPools found there count too).
    #[arg(long, required = true, num_args = 1.., value_name = "PATH")]
    pub sets: Vec<PathBuf>,
    /// MachineConfigPool YAML files or directories; default: the standard master and worker pools.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub pools: Vec<PathBuf>,
    /// The Node object (YAML) of this node.
    #[arg(long, value_name = "FILE")]
    pub node: PathBuf,
    /// Which Node of --node, when the file holds several.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Accept fields the objects' types do not know, with a warning each (default: refused,
    /// as kubectl's strict field validation).
    #[arg(long)]
    pub lenient: bool,
}

/// How the node reaches its runtime and pins.
#[derive(clap::Args, Clone, Debug)]
pub struct RuntimeOpts {
    /// CRI endpoint of the container runtime; default: the first of
    /// unix:///run/crio/crio.sock and unix:///run/containerd/containerd.sock that exists.
    #[arg(long, value_name = "ENDPOINT")]
    pub cri: Option<String>,
    /// Pin back end. `auto`: the runtime's own, asked with CRI Version; `crio`: the drop-in
    /// 50-pinned-images and a reload; `containerd`: the image label
    /// io.cri-containerd.pinned=pinned through containerd's API on the --cri socket.
    #[arg(long, value_enum, default_value = "auto")]
    pub pin: PinKind,
    /// Directory of the CRI-O drop-in.
    #[arg(long, default_value = crio::DEFAULT_DIR, value_name = "DIR")]
    pub crio_dropin_dir: PathBuf,
    /// Command that makes CRI-O re-read its configuration (split on white space; "" for none),
    /// killed if it runs past 30 s (the pin change is then retried with the reconcile). Default: SIGHUP to the host's crio process, found in /proc (what `systemctl reload crio`
    /// does; the agent needs the host's PID namespace).
    #[arg(long, value_name = "COMMAND")]
    pub crio_reload: Option<String>,
    #[command(flatten)]
    pub sizing: SizingOpts,
}

/// How pinset reaches registries itself (sizing, `set from-images`): credentials, plain-HTTP
/// registries and the node's mirror configuration.
#[derive(clap::Args, Clone, Debug)]
pub struct RegistryAccess {
    /// Registry credentials (kubelet config.json; missing or empty: none); default: the
    /// registries file's `auth`.
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,
    /// CRI-O's registries.conf to go through (its drop-ins: FILE.d/*.conf). Default on a
    /// CRI-O node: $CONTAINERS_REGISTRIES_CONF, else /etc/containers/registries.conf.
    #[arg(long, value_name = "FILE")]
    pub registries_conf: Option<PathBuf>,
    /// containerd's registry hosts directory (HOST/hosts.toml) to go through. Default on a
    /// containerd node: the config_path the runtime reports, else /etc/containerd/certs.d.
    #[arg(long, value_name = "DIR")]
    pub registry_config_path: Option<PathBuf>,
}

impl RegistryAccess {
    /// The credentials file: `--auth`, else the registries file's.
    pub fn auth(&self) -> Option<PathBuf> {
        super::sources::get().auth(self.auth.as_deref())
    }

    /// The credentials these flags name: the credentials file's and the providers'.
    pub fn credentials(&self) -> Result<Arc<Credentials>> {
        super::sources::credentials(self.auth.as_deref())
    }

    /// The registries spoken to over plain HTTP (`--insecure-registry` and the file's).
    pub fn insecure(&self) -> Vec<String> {
        super::sources::get().insecure_registries.clone()
    }

    /// The mirror configuration flags name.
    pub fn mirrors(&self) -> MirrorFlags {
        MirrorFlags {
            registries_conf: self.registries_conf.clone(),
            hosts_dir: self.registry_config_path.clone(),
        }
    }
}

/// How images are sized from their registries (`node`, `plan`, the agent).
#[derive(clap::Args, Clone, Debug)]
pub struct SizingOpts {
    #[command(flatten)]
    pub registry: RegistryAccess,
    /// Do not size images from their registries: the policy is told their size is unknown.
    #[arg(long)]
    pub no_sizing: bool,
    /// The total time one round of sizing may take, in seconds: images a dark registry or
    /// mirror leaves unsized by then count as "size unknown".
    #[arg(long, value_name = "SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub sizing_budget: u64,
}

impl SizingOpts {
    pub fn mirrors(&self) -> MirrorFlags {
        self.registry.mirrors()
    }

    pub fn budget(&self) -> Duration {
        Duration::from_secs(self.sizing_budget)
    }

    /// The registry sizer these options describe, through the mirrors of `source`; `None`
    /// with `--no-sizing`.
    pub fn sizer(&self, source: MirrorSource) -> Result<Option<Arc<Cached<RegistrySizer>>>> {
        if self.no_sizing {
            return Ok(None);
        }
        let credentials = self.registry.credentials()?;
        Ok(Some(pinset_node::config::sizer(
            &self.registry.insecure(),
            credentials,
            source,
            self.budget(),
        )))
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinKind {
    Auto,
    Crio,
    Containerd,
}

/// The objects of files, directories and `-` (standard input, read once).
fn load_objects(paths: &[PathBuf], fields: Fields) -> Result<Objects> {
    let mut out = Objects::default();
    for path in paths {
        if path.as_os_str() == "-" {
            let text = super::read_input(path, None)?;
            objects::parse(&text, path, fields, &mut out)?;
        } else {
            objects::load_path(path, fields, &mut out)?;
        }
    }
    Ok(out)
}

/// Read the objects and compute this node's desired state.
pub fn desired_state(inputs: &Inputs) -> Result<(NodeInfo, Desired)> {
    let fields = if inputs.lenient {
        Fields::Lenient
    } else {
        Fields::Strict
    };
    let mut objects: Objects = load_objects(&inputs.sets, fields)?;
    super::warn_if_empty("--sets", &inputs.sets, objects.sets.len(), "PinnedImageSet");
    let more = load_objects(&inputs.pools, fields)?;
    if !inputs.pools.is_empty() {
        super::warn_if_empty(
            "--pools",
            &inputs.pools,
            more.pools.len(),
            "MachineConfigPool",
        );
    }
    objects.pools.extend(more.pools);
    objects.warnings.extend(more.warnings);
    let mut node_objects = Objects::default();
    objects::load_file(&inputs.node, fields, &mut node_objects)?;
    objects.warnings.extend(node_objects.warnings);
    for warning in &objects.warnings {
        tracing::warn!("{warning} (read because of --lenient)");
    }
    let node = pick_node(
        &inputs.node,
        node_objects.nodes,
        inputs.node_name.as_deref(),
    )?;
    let pools = if objects.pools.is_empty() {
        desired::standard_pools()
    } else {
        objects.pools
    };
    let d = desired::desired(&node, &pools, &objects.sets);
    if d.pools.is_empty() {
        tracing::warn!(node = %node.name, "the node is in no pool: nothing to do");
    }
    for invalid in &d.invalid {
        tracing::error!("{invalid}");
    }
    Ok((node, d))
}

/// The Node of `file` named `name`, or its only one.
fn pick_node(file: &std::path::Path, nodes: Vec<NodeInfo>, name: Option<&str>) -> Result<NodeInfo> {
    let names = || {
        nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => match nodes.iter().position(|n| n.name == name) {
            Some(i) => Ok(nodes.into_iter().nth(i).expect("position found")),
            None => bail!(
                "{}: no Node named {name} (found: {})",
                file.display(),
                names()
            ),
        },
        None if nodes.len() > 1 => bail!(
            "{}: {} Nodes ({}): choose one with --node-name",
            file.display(),
            nodes.len(),
            names()
        ),
        None => match nodes.into_iter().next() {
            Some(node) => Ok(node),
            None => bail!("{}: no Node object", file.display()),
        },
    }
}

/// A progress bar over images and bytes; pull events print above it.
pub fn progress_bar(total_images: u64, label: &str) -> ProgressBar {
    let bar = super::logging::bars().add(ProgressBar::new(total_images));
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{bar:32.cyan/blue}] {pos}/{len} images {msg} ({elapsed}, eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Print executor events above `bar` and advance it; when stdout is not a terminal (the bar is
/// hidden) one plain line per event instead.
pub async fn show_events(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    bar: ProgressBar,
) -> Recorder {
    let (mut bytes, mut total_bytes) = (0u64, 0u64);
    let mut timeline = Recorder::default();
    let t0 = std::time::Instant::now();
    let plain = bar.is_hidden();
    let say = |line: String| match plain {
        true => println!("{line}"),
        false => bar.println(line),
    };
    while let Some(e) = rx.recv().await {
        record(&mut timeline, t0.elapsed().as_secs_f64() * 1000.0, &e);
        match e {
            Event::Planned {
                pulls,
                bytes: planned,
                ..
            } => {
                bar.set_length(pulls);
                total_bytes = planned;
                bar.set_message(format!("0 B / {}", fmt_bytes(total_bytes)));
            }
            Event::Started { reference, .. } if plain => say(format!("  pulling {reference}")),
            Event::Started { .. } => {}
            Event::Pulled {
                reference,
                bytes: b,
                duration,
            } => {
                bytes += b.unwrap_or(0);
                bar.inc(1);
                bar.set_message(format!("{} / {}", fmt_bytes(bytes), fmt_bytes(total_bytes)));
                say(format!("  pulled  {reference} in {duration:.2?}"));
            }
            Event::Failed { reference, error } => say(format!("  FAILED  {reference}: {error}")),
            Event::Retrying {
                reference,
                attempt,
                error,
                wait,
            } => say(format!(
                "  retry   {reference} (attempt {attempt} failed: {error}; next in {wait:?})"
            )),
            Event::Throttle { pause, .. } if plain => {
                say(format!("  pause   {pause:?} (throttle)"))
            }
            Event::Throttle { pause, .. } => bar.set_message(format!(
                "{} / {}, throttling {pause:?}",
                fmt_bytes(bytes),
                fmt_bytes(total_bytes)
            )),
        }
    }
    timeline
}

/// One executor event on the timeline, `at_ms` after the reconcile's events began.
fn record(timeline: &mut Recorder, at_ms: f64, e: &Event) {
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    match e {
        Event::Planned { .. } => {}
        Event::Started { reference, slot } => timeline.started(at_ms, reference, *slot),
        Event::Retrying {
            reference, wait, ..
        } => timeline.retrying(at_ms, reference, ms(wait)),
        Event::Pulled {
            reference, bytes, ..
        } => timeline.finished(at_ms, reference, true, *bytes),
        Event::Failed { reference, .. } => timeline.finished(at_ms, reference, false, None),
        Event::Throttle { reference, pause } => timeline.throttle(at_ms, reference, ms(pause)),
    }
}

/// Write the timeline of a reconcile as `path` (SVG) and beside it `….trace.json` (Chrome
/// trace format); the paths written.
pub fn write_timeline(
    recorder: Recorder,
    node: &str,
    report: &Report,
    path: &Path,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let mut notes = Vec::new();
    if let Some(plan) = &report.plan {
        notes.push(format!(
            "admission: {} — {}",
            plan.verdict(),
            plan.admission.reason
        ));
        notes.push(format!(
            "{} pull(s), {} at once; {} pulled, {} failed",
            plan.pulls.len(),
            plan.concurrency,
            report.outcome.pulled.len(),
            report.outcome.failed.len()
        ));
    }
    let t = recorder.finish(format!("pinset: pulls of node {node}"), notes);
    let trace = super::write_timeline(path, &t)?;
    Ok((path.to_path_buf(), trace))
}

pub fn summary(node: &str, report: &Report, status: &NodeStatus) -> String {
    let mut out = String::new();
    let o = &report.outcome;
    out.push_str(&format!(
        "node {node}: {} pulled, {} failed, {} not attempted; {} desired image(s) present\n",
        o.pulled.len(),
        o.failed.len(),
        o.drained.len(),
        report.present_after
    ));
    if let Some(pin) = &report.pin {
        out.push_str(&format!(
            "pins: +{} −{} ({})\n",
            pin.pinned.len(),
            pin.unpinned.len(),
            pin.describe(report.backend)
        ));
    }
    if let Some(drift) = &status.pin_drift {
        out.push_str(&format!("  pins lost behind pinset's back: {drift}\n"));
    }
    for s in status.sets.values() {
        let state = match (s.current_generation, s.last_failed_generation) {
            (Some(c), _) if c == s.desired_generation => "done".to_string(),
            (_, Some(f)) if f == s.desired_generation => {
                format!(
                    "FAILED: {}",
                    s.last_failed_generation_error.as_deref().unwrap_or("")
                )
            }
            _ => "in progress".to_string(),
        };
        out.push_str(&format!(
            "  set {} generation {}: {state}\n",
            s.name, s.desired_generation
        ));
    }
    for f in &status.policy_fallbacks {
        out.push_str(&format!("  policy fallback: {f}\n"));
    }
    if !report.phases.is_empty() {
        out.push_str(&format!("  time: {}\n", report.phase_times()));
    }
    out
}

/// `pinset node`: make every image of the node's sets present and pinned; with `--watch`, again
/// whenever an input file changes (a change cancels the running reconcile).
pub async fn node_cmd(
    inputs: &Inputs,
    runtime: &RuntimeOpts,
    policy: &PolicyOpts,
    watch: Option<&super::CompileOpts>,
    timeline: Option<&Path>,
) -> Result<ExitCode> {
    // A watching node runs for long: it compiles its policy in a child process.
    let compiler = match watch {
        Some(bounds) => super::child_compiler(bounds)?,
        None => pinset_policy::Compiler::InProcess,
    };
    let (_wasm, module) = super::load_policy_with(policy, compiler)?;
    let reconciler = runtime.config()?.connect().await?;
    node_loop(inputs, &reconciler, &module, watch.is_some(), timeline).await
}

impl RuntimeOpts {
    /// The node configuration these options describe (the runtime's socket found by probing
    /// when `--cri` is not given).
    pub fn config(&self) -> Result<NodeConfig> {
        let cri = match &self.cri {
            Some(endpoint) => endpoint.clone(),
            None => find_endpoint(&STANDARD_ENDPOINTS)?,
        };
        Ok(NodeConfig {
            cri,
            pin: match self.pin {
                PinKind::Auto => pinset_node::config::PinKind::Auto,
                PinKind::Crio => pinset_node::config::PinKind::Crio,
                PinKind::Containerd => pinset_node::config::PinKind::Containerd,
            },
            crio_dropin_dir: self.crio_dropin_dir.clone(),
            crio_reload: Reload::from_flag(self.crio_reload.as_deref()),
            auth: self.sizing.registry.auth(),
            credential_providers: super::sources::providers().cloned(),
            insecure_registries: self.sizing.registry.insecure(),
            sizing: !self.sizing.no_sizing,
            mirrors: self.sizing.mirrors(),
            sizing_budget: self.sizing.budget(),
        })
    }
}

async fn node_loop(
    inputs: &Inputs,
    reconciler: &Reconciler<RegistrySizer, AnyPins>,
    policy: &PolicyModule,
    watch: bool,
    timeline: Option<&Path>,
) -> Result<ExitCode> {
    let mut status = NodeStatus::default();
    loop {
        let (node, desired) = desired_state(inputs)?;
        let cancel = CancellationToken::new();
        let watcher = watch.then(|| spawn_watcher(inputs, cancel.clone()));
        let decisions = Box::new(Guarded::of(policy));
        let report = run_with_progress(
            reconciler,
            &desired,
            &node,
            decisions,
            &mut status,
            cancel.clone(),
            timeline,
        )
        .await;
        if let Some(w) = watcher {
            w.abort();
        }
        let report = report.with_context(|| format!("reconciling node {}", node.name))?;
        if report.cancelled {
            println!("inputs changed: cancelled the running reconcile; starting again");
            continue;
        }
        print!("{}", summary(&node.name, &report, &status));
        if !watch {
            return Ok(if status.degraded.is_some() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        println!("watching the inputs for changes…");
        let changed = CancellationToken::new();
        let w = spawn_watcher(inputs, changed.clone());
        changed.cancelled().await;
        w.abort();
    }
}

pub async fn run_with_progress<
    S: pinset_registry::size::Sizer + 'static,
    B: pinset_node::pin::PinBackend,
>(
    reconciler: &Reconciler<S, B>,
    desired: &Desired,
    node: &NodeInfo,
    decisions: Box<dyn Decisions>,
    status: &mut NodeStatus,
    cancel: CancellationToken,
    timeline: Option<&Path>,
) -> Result<Report, ReconcileError> {
    let bar = progress_bar(desired.images.len() as u64, &node.name);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let shower = tokio::spawn(show_events(rx, bar.clone()));
    let report = reconciler
        .reconcile(desired, node, decisions, status, cancel, Some(tx))
        .await;
    let recorder = shower.await.unwrap_or_default();
    bar.finish_and_clear();
    if let (Some(path), Ok(report)) = (timeline, &report) {
        match write_timeline(recorder, &node.name, report, path) {
            Ok((svg, trace)) => println!("timeline: {} ({})", svg.display(), trace.display()),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %super::error_line(&e), "cannot write the timeline")
            }
        }
    }
    report
}

/// Cancels `token` when any input file's modification time changes (polled every 250 ms).
fn spawn_watcher(inputs: &Inputs, token: CancellationToken) -> tokio::task::JoinHandle<()> {
    let paths: Vec<PathBuf> = inputs
        .sets
        .iter()
        .chain(&inputs.pools)
        .chain(std::iter::once(&inputs.node))
        .cloned()
        .collect();
    let stamp = move || -> Vec<Option<std::time::SystemTime>> {
        let mut out = Vec::new();
        for p in &paths {
            let mut files = vec![p.clone()];
            if p.is_dir() {
                if let Ok(rd) = std::fs::read_dir(p) {
                    files.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
                }
                files.sort();
            }
            out.extend(
                files
                    .iter()
                    .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()),
            );
        }
        out
    };
    tokio::spawn(async move {
        let first = stamp();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if stamp() != first {
                token.cancel();
                return;
            }
        }
    })
}
