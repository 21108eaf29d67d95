//! `pinset crds`, `pinset controller` and `pinset agent`: pinset in a cluster.

use super::PolicyOpts;
use super::node::RuntimeOpts;
use anyhow::{Context, Result};
use pinset_k8s::agent;
use pinset_k8s::controller;
use pinset_k8s::metrics::Metrics;
use pinset_k8s::ownership;
use pinset_k8s::policy_config;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Clone, Debug)]
pub struct ClusterOpts {
    /// kubeconfig to use; default: in-cluster, then $KUBECONFIG or ~/.kube/config.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the /metrics, /healthz and /readyz endpoint.
    /// `:PORT` listens on every address, as in controller-runtime.
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR", value_parser = listen_addr)]
    pub metrics_addr: SocketAddr,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ControllerOpts {
    /// Fleet rollout policy: `FILE.wasm[@sha256:HEX]` for every pool, or
    /// `POOL=FILE.wasm[@sha256:HEX]` for one (wins); repeatable. A module exporting
    /// `pinset:fleet/rollout` (it may export the node decisions too). Default: the embedded
    /// default policy's (a canary, then waves of 10 %).
    #[arg(long, value_name = "[POOL=]FILE|oci://REF")]
    pub fleet_policy: Vec<String>,
    /// How `oci://` fleet policies are fetched and verified.
    #[command(flatten)]
    pub fetch: super::FetchOpts,
    #[command(flatten)]
    pub compile: super::CompileOpts,
    /// The PolicyConfiguration the agents follow: a change of a pool's node policy module
    /// rolls out to its nodes canary-first, like a change of its sets.
    #[arg(long, value_name = "NAME")]
    pub policy_configuration: Option<String>,
}

/// When the agent pulls a changed set.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rollout {
    /// When the pool's fleet policy grants it (the controller records grants).
    Grants,
    /// At once, as the reference does (no controller needed).
    Free,
}

#[derive(clap::Args, Clone, Debug)]
pub struct AgentOpts {
    /// This node's name (the DaemonSet passes it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub compile: super::CompileOpts,
    /// Read this node's facts (labels, conditions, allocatable) from a Node YAML file instead of
    /// the core API (environments without one).
    #[arg(long, value_name = "FILE")]
    pub node_file: Option<PathBuf>,
    /// Policy per pool, from a YAML file (`pools: {POOL: {module: FILE, sha256: HEX}}`), read
    /// at start: the node's own, taken without a rollout grant.
    #[arg(long, value_name = "FILE", conflicts_with = "policy_configuration")]
    pub policy_config: Option<PathBuf>,
    /// Policy per pool, followed in this PolicyConfiguration (pinset.io; the same fields as
    /// --policy-config's file): a change is seen within seconds; a pool's new module is taken
    /// when the controller grants it, and checked before it replaces the running one.
    #[arg(long, value_name = "NAME")]
    pub policy_configuration: Option<String>,
    /// Policy of one pool: `POOL=FILE.wasm[@sha256:HEX]` or
    /// `POOL=oci://REGISTRY/REPO@sha256:HEX`; repeatable; wins over --policy-config.
    #[arg(long, value_name = "POOL=FILE")]
    pub pool_policy: Vec<String>,
    /// Reconcile again this often even when nothing changed.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub resync_seconds: u64,
    /// First wait before retrying a failed reconcile (doubles up to 5 minutes).
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub retry_seconds: u64,
    /// Pull a changed set when the pool's fleet policy grants it, or at once.
    #[arg(long, value_enum, default_value = "grants")]
    pub rollout: Rollout,
    /// Lift this taint (`KEY` or `KEY:EFFECT`, as kubectl taint names one) from the node once
    /// every PinnedImageSet of its pools is pinned: new nodes registered with it take no pods
    /// before their images are in place. Needs the Node from the API (not --node-file) and the
    /// right to patch nodes (deploy/components/startup-taint).
    #[arg(long, value_name = "KEY[:EFFECT]", conflicts_with = "node_file")]
    pub startup_taint: Option<pinset_core::startup_taint::StartupTaint>,
    /// Lift the startup taint anyway once the node is this old, whatever is not pinned (0:
    /// never; the node waits for its images).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "SECONDS",
        requires = "startup_taint"
    )]
    pub startup_taint_deadline_seconds: u64,
}

/// How often the CRDs' owner is asked again while the API server does not answer.
const OWNERSHIP_RETRY: Duration = Duration::from_secs(2);

/// `HOST:PORT`, or `:PORT` for every address.
fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{text:?}: {e} (expected HOST:PORT or :PORT)"))
}

/// `pinset crds`
pub fn crds() -> ExitCode {
    print!("{}", pinset_k8s::api::crds_yaml());
    ExitCode::SUCCESS
}

/// Cancelled on SIGTERM or SIGINT.
fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
        t.cancel();
    });
    token
}

async fn serve(
    opts: &ClusterOpts,
    metrics: &Metrics,
    ready: &Arc<AtomicBool>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let addr = pinset_k8s::http::serve(
        opts.metrics_addr,
        metrics.clone(),
        ready.clone(),
        shutdown.clone(),
    )
    .await
    .with_context(|| format!("serving metrics on {}", opts.metrics_addr))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(())
}

/// The process's metrics, `pinset_build_info` set.
fn metrics() -> Metrics {
    let metrics = Metrics::new();
    metrics.set_build_info(
        env!("CARGO_PKG_VERSION"),
        env!("PINSET_COMMIT"),
        pinset_policy::CONTRACT,
        pinset_policy::FLEET_CONTRACT,
    );
    metrics
}

/// The fleet policies of `--fleet-policy`, compiled in a child process: files (their sha256
/// pinned with `@sha256:`) or `oci://` artifacts, fetched and verified as `policy` says.
fn fleet_table(
    flags: &[String],
    fetch: &super::FetchOpts,
    runtime: &pinset_policy::WasmRuntime,
) -> Result<controller::FleetTable> {
    let loader = fetch.loader(runtime, pinset_policy::Limits::default())?;
    let keys = fetch.keys()?;
    let load = |arg: &str| -> Result<pinset_policy::FleetModule> {
        let m = pinset_k8s::policy_config::ModuleRef::from_reference(arg)
            .ok_or_else(|| anyhow::anyhow!("no module named"))?;
        (loader.load::<pinset_policy::FleetContract>(&m, &keys))
            .map_err(|(_, why)| anyhow::anyhow!(why))
    };
    let mut default = None;
    let mut by_pool = std::collections::BTreeMap::new();
    for flag in flags {
        match flag.split_once('=') {
            Some((pool, rest)) if !pool.is_empty() && !pool.contains('/') => {
                let module = load(rest).with_context(|| format!("--fleet-policy {flag}"))?;
                by_pool.insert(pool.to_string(), module);
            }
            _ => default = Some(load(flag).with_context(|| format!("--fleet-policy {flag}"))?),
        }
    }
    let mut table = match default {
        Some(default) => controller::FleetTable {
            default,
            by_pool: Default::default(),
        },
        None => controller::FleetTable::embedded(runtime)?,
    };
    table.by_pool = by_pool;
    Ok(table)
}

/// `pinset controller`
pub async fn controller(opts: &ClusterOpts, controller_opts: &ControllerOpts) -> Result<ExitCode> {
    let shutdown = shutdown_on_signals();
    let fetch = &controller_opts.fetch;
    let runtime = fetch.runtime(super::child_compiler(&controller_opts.compile)?)?;
    let flags = fleet_table(&controller_opts.fleet_policy, fetch, &runtime)?;
    let loader = fetch.loader(&runtime, pinset_policy::Limits::default())?;
    let gate = controller::SignatureGate::new(Some(loader.fetcher.artifacts.clone()));
    let fleet = controller::FleetPolicies::new(flags, Some(loader));
    pinset_node::os::release_free_memory();
    let client = pinset_k8s::client(opts.kubeconfig.as_deref()).await?;
    if !ownership::check(client.clone(), OWNERSHIP_RETRY, &shutdown).await? {
        return Ok(ExitCode::SUCCESS);
    }
    let metrics = metrics();
    let ready = Arc::new(AtomicBool::new(false));
    serve(opts, &metrics, &ready, &shutdown).await?;
    let node_policies = controller_opts
        .policy_configuration
        .clone()
        .map(|n| (n, gate));
    controller::run(client, metrics, fleet, node_policies, ready, shutdown).await;
    Ok(ExitCode::SUCCESS)
}

/// `pinset agent`
pub async fn agent(
    opts: &ClusterOpts,
    agent_opts: &AgentOpts,
    runtime: &RuntimeOpts,
    policy: &PolicyOpts,
) -> Result<ExitCode> {
    let shutdown = shutdown_on_signals();
    let (wasm, default) =
        super::load_policy_with(policy, super::child_compiler(&agent_opts.compile)?)?;
    let policy_settings = match &agent_opts.policy_configuration {
        Some(name) => agent::PolicySettings::Followed {
            name: name.clone(),
            flags: agent_opts.pool_policy.clone(),
        },
        None => agent::PolicySettings::Fixed(policy_config::fixed(
            agent_opts.policy_config.as_ref(),
            &agent_opts.pool_policy,
        )?),
    };
    let loader = Arc::new(policy.fetch.loader(&wasm, policy.limits())?);
    pinset_node::os::release_free_memory();
    let client = pinset_k8s::client(opts.kubeconfig.as_deref()).await?;
    if !ownership::check(client.clone(), OWNERSHIP_RETRY, &shutdown).await? {
        return Ok(ExitCode::SUCCESS);
    }
    let metrics = metrics();
    let reconciler = runtime
        .config()?
        .connect()
        .await?
        .with_observer(Arc::new(metrics.clone()));
    let ready = Arc::new(AtomicBool::new(false));
    serve(opts, &metrics, &ready, &shutdown).await?;
    let mut cfg = agent::AgentConfig::new(agent_opts.node_name.clone());
    cfg.node_file = agent_opts.node_file.clone();
    cfg.resync = Duration::from_secs(agent_opts.resync_seconds);
    cfg.retry_min = Duration::from_secs(agent_opts.retry_seconds.max(1));
    cfg.wait_for_grants = agent_opts.rollout == Rollout::Grants;
    cfg.startup_taint = agent_opts.startup_taint.clone();
    let deadline = agent_opts.startup_taint_deadline_seconds;
    cfg.startup_taint_deadline = (deadline > 0).then(|| Duration::from_secs(deadline));
    agent::Agent {
        client,
        config: cfg,
        reconciler,
        loader,
        default_policy: default,
        policy_settings,
        metrics,
        ready,
    }
    .run(shutdown)
    .await;
    Ok(ExitCode::SUCCESS)
}
