//! `pinset plan`: the policy's decisions for one node, without pulling — as text for people or
//! as a document (`-o json|yaml`) for scripts. The document's fields are described on
//! [`PlanReport`] and in docs/node.md.

use super::node::{Inputs, SizingOpts, desired_state};
use super::{PolicyOpts, load_policy};
use anyhow::{Context, Result};
use pinset_core::decisions::Decisions;
use pinset_core::desired::{Desired, NodeInfo};
use pinset_core::plan::{self, Plan};
use pinset_core::timeline::{Recorder, Timeline};
use pinset_node::Reconciler;
use pinset_node::config::PinKind;
use pinset_node::cri::client::{CriClient, CriConfig};
use pinset_node::facts::{self, Facts, Unsized};
use pinset_policy::{Guarded, NodeContract};
use pinset_policy_sdk::{DiskFacts, Verdict, fmt_bytes};
use pinset_registry::mirrors::MirrorSource;
use pinset_registry::size::{Cached, RegistrySizer};
use serde::Serialize;
use std::process::ExitCode;
use std::sync::Arc;

/// How `plan` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Text,
    Json,
    Yaml,
}

/// `plan --timeline`: the pulls drawn as the policy would run them at a simulated pull rate.
#[derive(clap::Args, Clone, Debug)]
pub struct Simulation {
    /// Draw the plan's pulls as they would run (slots, the policy's throttle after each) into
    /// FILE (SVG) and FILE's .trace.json.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<std::path::PathBuf>,
    /// Simulated pull rate per slot for --timeline, MiB/s (an image of unknown size takes 1 s).
    #[arg(long, default_value_t = 100.0, value_name = "MIB_PER_S", value_parser = positive_rate)]
    pub pull_rate_mib: f64,
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!("{text:?}: expected a rate above 0")),
    }
}

/// The plan's pulls on `concurrency` slots in the policy's order: each takes its size at
/// `rate` MiB/s (1 s when unknown), then the slot pauses for the policy's throttle (asked with
/// that simulated outcome and the node's current pressure).
fn simulate(
    node: &str,
    plan: &Plan,
    facts: &Facts,
    policy: &mut Guarded<NodeContract>,
    rate: f64,
) -> Timeline {
    let request = &facts.request;
    let mut free_at = vec![0.0_f64; plan.concurrency.max(1) as usize];
    let mut recorder = Recorder::default();
    let pressure = pinset_node::os::pressure();
    for (n, &i) in plan.pulls.iter().enumerate() {
        let Some(image) = request.images.get(i as usize) else {
            continue;
        };
        let (slot, start) = free_at
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        let ms = image
            .size_bytes
            .map_or(1000.0, |b| b as f64 / (rate * 1048576.0) * 1000.0);
        recorder.started(start, image.reference, slot);
        recorder.finished(start + ms, image.reference, true, image.size_bytes);
        let outcome = pinset_policy_sdk::PullOutcome {
            reference: image.reference.to_string(),
            bytes: image.size_bytes,
            duration_ms: ms as u64,
            remaining: (plan.pulls.len() - n - 1) as u32,
            ..Default::default()
        };
        let pause = policy
            .throttle(&request.node, &outcome, &pressure)
            .as_secs_f64()
            * 1000.0;
        recorder.throttle(start + ms, image.reference, pause);
        free_at[slot] = start + ms + pause;
    }
    recorder.finish(
        format!("pinset plan: node {node}, simulated at {rate} MiB/s per slot"),
        vec![
            format!("admission: {} — {}", plan.verdict(), plan.admission.reason),
            format!("{} pull(s), {} at once", plan.pulls.len(), plan.concurrency),
        ],
    )
}

/// What `plan -o json|yaml` prints (camelCase keys).
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub node: String,
    pub pools: Vec<String>,
    pub policy: PolicyRef,
    /// The node's sets, with their generation and image count.
    pub sets: Vec<SetRef>,
    /// Sets refused before the policy is asked (an image by tag…), with why.
    pub refused: Vec<Refused>,
    pub admission: AdmissionReport,
    /// Images of the sets (deduplicated), and how many of them the runtime already has.
    pub images: usize,
    pub present: usize,
    /// The pulls in the policy's order.
    pub pulls: Vec<Pull>,
    /// Sum of the known sizes of the pulls.
    pub known_bytes: u64,
    /// Pulls at once: the policy's, at most the rollout grant's cap (`--max-pulls`).
    pub concurrency: u32,
    /// The policy's own concurrency when the grant's cap lowered it.
    pub policy_concurrency: Option<u32>,
    /// The pause the policy asks after the first pull at the current pressure.
    pub throttle_after_pull_ms: Option<u64>,
    /// Hooks where the policy failed and the reference decided, with why.
    pub fallbacks: Vec<String>,
    /// Images left unsized, per registry, with the first cause.
    pub unsized_images: Vec<Unsized>,
    /// The mirror configuration sizing went through.
    pub mirrors: MirrorsReport,
}

#[derive(Serialize, Debug, Default)]
pub struct MirrorsReport {
    /// `registries.conf FILE`, `containerd hosts directory DIR` or `no mirror configuration`.
    pub source: String,
    /// Why it was not used (FILE:LINE: cause): sized without mirrors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, Debug)]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
    pub module: String,
}

#[derive(Serialize, Debug)]
pub struct SetRef {
    pub name: String,
    pub generation: i64,
    pub images: usize,
}

#[derive(Serialize, Debug)]
pub struct Refused {
    pub set: String,
    pub error: String,
}

impl SetRef {
    fn of(s: &pinset_core::desired::DesiredSet) -> SetRef {
        SetRef {
            name: s.name.clone(),
            generation: s.generation,
            images: s.images.len(),
        }
    }
}

impl Refused {
    fn of(bad: &pinset_core::desired::InvalidSet) -> Refused {
        Refused {
            set: bad.set.clone(),
            error: bad.error.to_string(),
        }
    }
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReport {
    /// `admit-all`, `admit-some` or `reject`: the contract's words.
    pub verdict: &'static str,
    /// For `admit-some`: how many images were admitted.
    pub admitted: Option<usize>,
    pub reason: String,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Pull {
    pub image: String,
    pub sets: Vec<String>,
    pub size_bytes: Option<u64>,
    /// The endpoint that served the image's manifest (`host[/path]/repository`): a mirror or
    /// its own registry.
    pub sized_by: Option<String>,
}

/// `pinset plan`. With `--cri` the reconcile's own facts phase runs (snapshot, disk, sizes);
/// without, every image counts as absent; sizes come from the registries unless `--no-sizing`. Exits 1 when a set is refused or the
/// policy rejects the admission.
pub async fn plan_cmd(
    inputs: &Inputs,
    cri: Option<String>,
    max_pulls: Option<u32>,
    sizing: &SizingOpts,
    sim: &Simulation,
    policy: &PolicyOpts,
    output: Output,
) -> Result<ExitCode> {
    let (node, desired) = desired_state(inputs)?;
    let (_runtime, module) = load_policy(policy)?;
    let (facts, mirrors) = match cri {
        Some(endpoint) => runtime_facts(endpoint, sizing, &desired, &node).await?,
        None => {
            let source = sizing.mirrors().offline()?;
            let sizer = sizing.sizer(source.clone())?;
            (offline_facts(&desired, &node, sizer.as_ref()).await, source)
        }
    };
    let mut guarded = Guarded::of(&module);
    let plan = plan::make(&mut guarded, &facts.request, max_pulls);
    if let Some(path) = &sim.timeline {
        let t = simulate(&node.name, &plan, &facts, &mut guarded, sim.pull_rate_mib);
        let trace = super::write_timeline(path, &t).context("--timeline")?;
        eprintln!("timeline: {} ({})", path.display(), trace.display());
    }
    let mut report = report(&node, &desired, &plan, &facts, &mut guarded, module.name());
    report.mirrors = MirrorsReport {
        source: mirrors.describe(),
        error: facts.sizing.mirrors_error.clone(),
    };
    match output {
        Output::Text => print_text(&report),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&report)?),
    }
    // A dry run whose input would fail fails too: a refused set, a rejected admission.
    Ok(if desired.invalid.is_empty() && !plan.rejected() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The reconcile's own facts phase on the runtime at `endpoint`: snapshot and disk, sizes of
/// what is absent, through the mirrors of the runtime found there.
async fn runtime_facts(
    endpoint: String,
    sizing: &SizingOpts,
    desired: &Desired,
    node: &NodeInfo,
) -> Result<(Facts, MirrorSource)> {
    let client = CriClient::new(CriConfig {
        endpoint,
        ..Default::default()
    })?;
    let runtime = client.version().await?.runtime_name;
    let source = match PinKind::for_runtime(&runtime) {
        Some(pin) => sizing.mirrors().for_runtime(pin, &client).await,
        None => sizing.mirrors().offline()?,
    };
    let sizer = sizing.sizer(source.clone())?;
    let mut reconciler = Reconciler::<RegistrySizer, ()>::new(client, ());
    if let Some(sizer) = sizer {
        reconciler = reconciler.with_sizer(sizer);
    }
    Ok((reconciler.facts(desired, node).await?, source))
}

/// Facts without a runtime: nothing present, disk unknown, sizes from the registries (unless
/// `--no-sizing`).
async fn offline_facts(
    desired: &Desired,
    node: &NodeInfo,
    sizer: Option<&Arc<Cached<RegistrySizer>>>,
) -> Facts {
    let present = vec![false; desired.images.len()];
    let sizing = facts::sizes(sizer, desired, &present).await;
    let request = facts::request(
        desired,
        node.facts(&desired.pools),
        DiskFacts::default(),
        &present,
        &sizing.sizes,
    );
    Facts {
        snapshot: Default::default(),
        present,
        request,
        phases: Vec::new(),
        sizing,
    }
}

/// The plan's pulls in order, with their sizes and the endpoints that sized them.
fn pulls(plan: &Plan, facts: &Facts) -> Vec<Pull> {
    let request = &facts.request;
    plan.pulls
        .iter()
        .filter_map(|&i| Some((i, request.images.get(i as usize)?)))
        .map(|(i, image)| Pull {
            image: image.reference.to_string(),
            sets: image.sets().map(String::from).collect(),
            size_bytes: image.size_bytes,
            sized_by: facts
                .sizing
                .sizes
                .get(i as usize)
                .and_then(|s| s.as_ref()?.endpoint.clone()),
        })
        .collect()
}

fn report(
    node: &NodeInfo,
    desired: &Desired,
    plan: &Plan,
    facts: &Facts,
    policy: &mut Guarded<NodeContract>,
    module: &str,
) -> PlanReport {
    let request = &facts.request;
    let pulls = pulls(plan, facts);
    let throttle = pulls.first().map(|first| {
        let outcome = pinset_policy_sdk::PullOutcome {
            reference: first.image.clone(),
            remaining: plan.pulls.len().saturating_sub(1) as u32,
            ..Default::default()
        };
        let pause = policy.throttle(&request.node, &outcome, &pinset_node::os::pressure());
        pause.as_millis() as u64
    });
    let info = policy.info();
    let (verdict, admitted) = match &plan.admission.verdict {
        Verdict::AdmitAll => ("admit-all", None),
        Verdict::AdmitSome(subset) => ("admit-some", Some(subset.len())),
        Verdict::Reject => ("reject", None),
    };
    PlanReport {
        node: node.name.clone(),
        pools: desired.pools.clone(),
        policy: PolicyRef {
            name: info.name,
            version: info.version,
            module: module.to_string(),
        },
        sets: desired.sets.iter().map(SetRef::of).collect(),
        refused: desired.invalid.iter().map(Refused::of).collect(),
        admission: AdmissionReport {
            verdict,
            admitted,
            reason: plan.admission.reason.clone(),
        },
        images: request.images.len(),
        present: facts.present.iter().filter(|p| **p).count(),
        known_bytes: pulls.iter().filter_map(|p| p.size_bytes).sum(),
        pulls,
        concurrency: plan.concurrency,
        policy_concurrency: plan.capped_from,
        throttle_after_pull_ms: throttle,
        fallbacks: policy.fallbacks().iter().map(ToString::to_string).collect(),
        unsized_images: facts.sizing.left.clone(),
        mirrors: MirrorsReport::default(),
    }
}

fn print_text(r: &PlanReport) {
    print_head(r);
    println!(
        "pulls: {} of {} image(s) ({} present), {} known bytes, {} at once",
        r.pulls.len(),
        r.images,
        r.present,
        fmt_bytes(r.known_bytes),
        r.concurrency
    );
    if let Some(asked) = r.policy_concurrency {
        println!(
            "  capped by the rollout grant (max-pulls {}): the policy asked {asked} at once",
            r.concurrency
        );
    }
    if let Some(ms) = r.throttle_after_pull_ms {
        println!(
            "throttle after a pull (current pressure): {:?}",
            std::time::Duration::from_millis(ms)
        );
    }
    println!("mirrors: {}", r.mirrors.source);
    if let Some(e) = &r.mirrors.error {
        println!("  not used, sized without mirrors: {e}");
    }
    for u in &r.unsized_images {
        println!(
            "registry {}: {} image(s) left unsized: {}",
            u.registry, u.images, u.cause
        );
    }
    for (n, pull) in r.pulls.iter().enumerate() {
        let size = match (pull.size_bytes, &pull.sized_by) {
            (None, _) => "size unknown".into(),
            (Some(b), Some(by)) => format!("{} via {by}", fmt_bytes(b)),
            (Some(b), None) => fmt_bytes(b),
        };
        println!(
            "  {:>4}. {}  [{}]  ({size})",
            n + 1,
            pull.image,
            pull.sets.join(", ")
        );
    }
    for f in &r.fallbacks {
        println!("policy fallback: {f}");
    }
}

/// The node, its policy, its sets and the admission.
fn print_head(r: &PlanReport) {
    let p = &r.policy;
    println!(
        "node {}  pools {}  policy {} {} ({})",
        r.node,
        r.pools.join(", "),
        p.name,
        p.version,
        p.module
    );
    for s in &r.sets {
        println!(
            "  set {} (generation {}): {} image(s)",
            s.name, s.generation, s.images
        );
    }
    for bad in &r.refused {
        println!("  set {} refused: {}", bad.set, bad.error);
    }
    let verdict = match r.admission.admitted {
        Some(n) => format!("{} ({n} image(s))", r.admission.verdict),
        None => r.admission.verdict.to_string(),
    };
    println!("admission: {verdict} — {}", r.admission.reason);
}
