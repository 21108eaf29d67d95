//! A fleet rollout at scale against a real API server (release build): 100 pools of 3 nodes,
//! each node a simulated agent that honours its rollout grant, and `pinset controller` as its own
//! process deciding with the embedded default fleet policy.
//!
//! The fleet: 110 PinnedImageSets of 20 images (10 every pool selects, one per pool); pools 0–49
//! keep the default pace (a canary, then waves of max(1, 10 %) = 1 node), pools 50–89 carry
//! `pinset.io/rollout-max-pulling: "2"` (a canary, then 2 at once), and in pools 90–99 every pull
//! of the changed set fails (the canary fails; the pool must hold). Every node starts Ready with
//! every set pinned at generation 1; then one common set gains an image, and all 100 pools roll
//! generation 2 out at once.
//!
//! A simulated agent watches the MachineConfigNodes, starts "pulling" (300–500 ms) the moment its
//! grant covers a generation it does not hold, then reports the set pinned (or failed) through
//! the status, as the agent does. Every start and finish is recorded on one clock, and from that
//! record, not from logs:
//! - at no instant does a pool have more nodes pulling than its policy allows (1 before the
//!   canary finished; then 1 or 2), and a pool whose canary failed never grants another node;
//! - grant latency: from a node's finishing status write to the next grant in its pool, as the
//!   agents see it (p50 / p99 / max), against the API's own round trip in the same run (a status
//!   write until the watch shows it);
//! - the controller's CPU time and API writes for the whole rollout, per wave;
//! - `pinset rollout status pool-0`, run as an operator would during the rollout: it must exit
//!   0, and how long after the pool's last node finished it did, and its CPU time.
//!
//! Then the pools' node policy changes (the PolicyConfiguration names one module for all 100
//! pools): the change rolls out as one more target entry, canary first, the same way; a simulated
//! node "swaps" in 20–40 ms (a real agent's check, swap and first reconcile: 27 ms median,
//! `benches/policy_swaps.rs`) and reports the module in `status.policy`. In pools 90–99 the
//! changed target means a new canary (the default fleet policy holds "until it succeeds or the
//! sets change"): it fails the set again, and the pool holds with two failed nodes. Same record,
//! same checks: the time from the change to each canary and to the last node.
//!
//! `cargo bench --bench rollout` (needs the API server bed: `bash scripts/test.sh` builds it).
//! `REPEATS` (default 3) sets the repetitions.

#[path = "../tests/it/support.rs"]
mod support;

mod cluster;

use cluster::{Controller, Fleet, wait_until};
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use pinset_k8s::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FLEET: Fleet = Fleet {
    pools: 100,
    sets: 110,
    common: 10,
    images: 20,
    nodes_per_pool: 3,
    ready: true,
    annotations: pool_annotations,
};

/// The set whose change rolls out to every pool.
const CHANGED: usize = 0;

/// The node policy module the second change names for every pool (the controller only reads
/// the reference; the simulated nodes report it).
fn policy_module() -> String {
    format!("/etc/pinset/rollout-bench.wasm@sha256:{}", "5".repeat(64))
}

fn policy_entry() -> String {
    pinset_core::rollout::policy_set(&policy_module())
}

fn pool_annotations(pool: usize) -> BTreeMap<String, String> {
    match Pace::of(pool) {
        Pace::Two => [("pinset.io/rollout-max-pulling".into(), "2".into())].into(),
        _ => BTreeMap::new(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pace {
    /// The default: one node at a time after the canary.
    One,
    /// The pool's annotation: two at a time after the canary.
    Two,
    /// Every pull of the changed set fails: the canary fails and the pool holds.
    FailingCanary,
}

impl Pace {
    fn name(self) -> &'static str {
        match self {
            Pace::One => "1 at a time",
            Pace::Two => "2 at a time",
            Pace::FailingCanary => "canary fails",
        }
    }

    fn of(pool: usize) -> Pace {
        match pool {
            0..50 => Pace::One,
            50..90 => Pace::Two,
            _ => Pace::FailingCanary,
        }
    }

    /// Nodes allowed to pull at once, before and after the pool's canary finished.
    fn allowed(self, canary_done: bool) -> usize {
        match (self, canary_done) {
            (Pace::Two, true) => 2,
            _ => 1,
        }
    }

    /// Grants and waves the rollout of one pool of 3 takes.
    fn expected(self) -> (usize, usize) {
        match self {
            Pace::One => (3, 3),
            Pace::Two => (3, 2),
            Pace::FailingCanary => (1, 1),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    /// The node saw a grant and started pulling.
    Started,
    /// The node stopped pulling and is about to write its status.
    Finished,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    at: Instant,
    node: usize,
    what: What,
}

/// One simulated node: its sets as (desired, current, last failed generation).
#[derive(Clone, Default)]
struct NodeState {
    sets: BTreeMap<String, (i64, i64, Option<i64>)>,
    pulling: bool,
    /// A finishing status write not yet seen through the watch: when it was sent.
    echo_pending: Option<Instant>,
}

/// The simulated agents and what they recorded.
#[derive(Default)]
struct Sim {
    nodes: Vec<NodeState>,
    log: Vec<Record>,
    /// Status write → seen through the watch, for the API's own round trip.
    echoes: Vec<Duration>,
}

type Shared = Arc<Mutex<Sim>>;

fn sim() -> Shared {
    let nodes = (0..FLEET.nodes())
        .map(|n| NodeState {
            sets: FLEET
                .sets_of(FLEET.pool_of(n))
                .into_iter()
                .map(|s| (Fleet::set_name(s), (1, 1, None)))
                .collect(),
            ..Default::default()
        })
        .collect();
    Arc::new(Mutex::new(Sim {
        nodes,
        ..Default::default()
    }))
}

fn node_index(mcn: &MachineConfigNode) -> Option<usize> {
    mcn.metadata
        .name
        .as_deref()?
        .strip_prefix("node-")?
        .parse()
        .ok()
}

/// Watch every MachineConfigNode; start a pull for each grant a node does not hold yet.
async fn agents(client: kube::Client, sim: Shared) {
    let api: Api<MachineConfigNode> = Api::all(client.clone());
    let mut events = watcher(api, watcher::Config::default())
        .applied_objects()
        .boxed();
    while let Some(event) = events.next().await {
        let Ok(mcn) = event else { continue };
        let Some(n) = node_index(&mcn) else { continue };
        let start = {
            let mut sim = sim.lock().unwrap();
            observe_echo(&mut sim, n, &mcn);
            to_pull(&sim.nodes[n], &mcn).inspect(|_| {
                sim.nodes[n].pulling = true;
                sim.log.push(Record {
                    at: Instant::now(),
                    node: n,
                    what: What::Started,
                });
            })
        };
        if let Some(sets) = start {
            tokio::spawn(pull(client.clone(), sim.clone(), n, sets));
        }
    }
}

/// A finishing write of node `n` now visible through the watch.
fn observe_echo(sim: &mut Sim, n: usize, mcn: &MachineConfigNode) {
    let Some(sent) = sim.nodes[n].echo_pending else {
        return;
    };
    let changed = Fleet::set_name(CHANGED);
    let reported = mcn
        .status
        .iter()
        .flat_map(|s| &s.pinned_image_sets)
        .find(|s| s.name == changed)
        .is_some_and(|s| s.current_generation == Some(2) || s.last_failed_generation == Some(2));
    if reported {
        sim.echoes.push(sent.elapsed());
        sim.nodes[n].echo_pending = None;
    }
}

/// The sets and generations the node's grant lets it pull that it neither holds nor failed.
fn to_pull(node: &NodeState, mcn: &MachineConfigNode) -> Option<Vec<(String, i64)>> {
    if node.pulling {
        return None;
    }
    let grant = mcn.spec.rollout_grant.as_ref()?;
    let sets: Vec<(String, i64)> = grant
        .sets
        .iter()
        .filter(|g| {
            node.sets.get(&g.name).is_some_and(|(_, current, failed)| {
                g.generation > *current && *failed < Some(g.generation)
            })
        })
        .map(|g| (g.name.clone(), g.generation))
        .collect();
    (!sets.is_empty()).then_some(sets)
}

/// Pull for 300–500 ms, then report the sets pinned, or failed in a failing pool.
async fn pull(client: kube::Client, sim: Shared, n: usize, sets: Vec<(String, i64)>) {
    let swap = sets.iter().all(|(name, _)| name == &policy_entry());
    let ms = match swap {
        true => 20 + (n as u64 * 7) % 20,
        false => 300 + (n as u64 * 37) % 200,
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let fails = Pace::of(FLEET.pool_of(n)) == Pace::FailingCanary;
    let status = {
        let mut sim = sim.lock().unwrap();
        let now = Instant::now();
        sim.log.push(Record {
            at: now,
            node: n,
            what: What::Finished,
        });
        let node = &mut sim.nodes[n];
        for (name, generation) in &sets {
            let entry = node.sets.get_mut(name).expect("a set of the node's pool");
            entry.0 = *generation;
            // A policy swap does not depend on pulls: only sets fail.
            if fails && *name != policy_entry() {
                entry.2 = Some(*generation);
            } else {
                entry.1 = *generation;
            }
        }
        node.echo_pending = Some(now);
        status_of(n, node)
    };
    let api: Api<MachineConfigNode> = Api::all(client);
    let ssa = PatchParams::apply("bench").force();
    api.patch_status(&Fleet::node_name(n), &ssa, &Patch::Apply(&status))
        .await
        .expect("a simulated agent's status write");
    sim.lock().unwrap().nodes[n].pulling = false;
}

fn status_of(n: usize, node: &NodeState) -> serde_json::Value {
    let entry = policy_entry();
    let sets: Vec<_> = node
        .sets
        .iter()
        .filter(|(name, _)| **name != entry)
        .map(|(name, (desired, current, failed))| {
            let error = || {
                format!(
                    "pulling {}: manifest unknown",
                    Fleet::image(CHANGED, FLEET.images)
                )
            };
            (
                name.clone(),
                *desired,
                *current,
                failed.map(|g| (g, error())),
            )
        })
        .collect();
    let mut status = FLEET.node_status(n, &sets);
    if let Some((_, 1, _)) = node.sets.get(&entry) {
        status["status"]["policy"] = json!({"name": "bench", "version": "1",
            "digest": format!("sha256:{}", "6".repeat(64)), "module": policy_module(),
            "since": "2026-12-03T00:00:00Z"});
    }
    status
}

/// Every pool's status shows its rollout of `generation` of the changed set complete: all
/// nodes done, or the canary failed and the others waiting. An error names the first pool that
/// is not there yet.
async fn rolled_out(client: &kube::Client, generation: i64) -> Result<(), String> {
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let list = pools
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    if list.items.len() != FLEET.pools {
        return Err(format!("{} pools", list.items.len()));
    }
    let target = format!("{}@{generation},", Fleet::set_name(CHANGED));
    for p in &list.items {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let index: usize = name
            .strip_prefix("pool-")
            .and_then(|i| i.parse().ok())
            .ok_or(format!("pool {name}"))?;
        let r = p.status.as_ref().and_then(|s| s.rollout.as_ref());
        let there = r.is_some_and(|r| {
            r.target.starts_with(&target)
                && match Pace::of(index) {
                    Pace::FailingCanary if generation > 1 => r.failed == 1 && r.waiting == 2,
                    _ => r.done == 3,
                }
        });
        if !there {
            return Err(format!("{name}: {:?}", p.status));
        }
    }
    Ok(())
}

/// Every pool's status shows the node policy rolled out: all nodes done, or (pools 90–99) the
/// canary refused it and the others wait.
async fn policy_rolled_out(client: &kube::Client) -> Result<(), String> {
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let list = pools
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let entry = policy_entry();
    for p in &list.items {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        let index: usize = name
            .strip_prefix("pool-")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let r = p.status.as_ref().and_then(|s| s.rollout.as_ref());
        let there = r.is_some_and(|r| {
            r.target.contains(&entry)
                && match Pace::of(index) {
                    Pace::FailingCanary => r.failed == 2 && r.waiting == 1,
                    _ => r.done == 3,
                }
        });
        if !there {
            return Err(format!("{name}: {:?}", p.status));
        }
    }
    Ok(())
}

/// Wait until the agents' record (no API traffic) has `expected` nodes finished.
async fn nodes_finished(sim: &Shared, what: &str, expected: usize) {
    wait_until(what, || {
        let finished = (sim.lock().unwrap().log.iter())
            .filter(|r| r.what == What::Finished)
            .count();
        async move {
            match finished >= expected {
                true => Ok(()),
                false => Err(format!("{finished} of {expected} nodes finished")),
            }
        }
    })
    .await;
}

/// The pools' node policy changes: the record from the change to every pool rolled out.
async fn policy_phase(client: &kube::Client, sim: &Shared) -> (Analysis, Duration) {
    {
        let mut sim = sim.lock().unwrap();
        sim.log.clear();
        for node in &mut sim.nodes {
            node.sets.insert(policy_entry(), (0, 0, None));
        }
    }
    let expected: usize = (0..FLEET.pools).map(|p| Pace::of(p).expected().0).sum();
    let pools: serde_json::Map<String, serde_json::Value> = (0..FLEET.pools)
        .map(|p| {
            (
                Fleet::pool_name(p),
                json!({"module": policy_module().split_once('@').unwrap().0,
            "sha256": "5".repeat(64)}),
            )
        })
        .collect();
    let changed_at = Instant::now();
    support::apiserver::configure_policies(client, "bench", json!({"pools": pools}))
        .await
        .expect("the policy configuration");
    nodes_finished(sim, "every granted node swapped", expected).await;
    let elapsed = changed_at.elapsed()
        + wait_until("every pool rolled the policy out", || {
            policy_rolled_out(client)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = sim.lock().unwrap().log.clone();
    // The held pools grant one new canary, which fails the set again.
    (analyse(&log, changed_at), elapsed)
}

/// What the record says of one rollout.
struct Analysis {
    grants: usize,
    max_pulling: BTreeMap<&'static str, usize>,
    /// Each grant that followed a node finishing: finish → grant seen.
    after_finish: Vec<Duration>,
    /// Each pool's canary: the set change → grant seen.
    canary: Vec<Duration>,
    last_finish: Instant,
    /// The change the record starts from.
    first_change: Instant,
}

/// Walk the record in time order, pool by pool; panic at the first instant a pool pulls more
/// than it may, or a held pool grants again.
fn analyse(log: &[Record], changed_at: Instant) -> Analysis {
    let mut a = Analysis {
        grants: 0,
        max_pulling: BTreeMap::new(),
        after_finish: Vec::new(),
        canary: Vec::new(),
        last_finish: changed_at,
        first_change: changed_at,
    };
    let mut log = log.to_vec();
    log.sort_by_key(|r| r.at);
    for pool in 0..FLEET.pools {
        let pace = Pace::of(pool);
        let (mut pulling, mut canary_done, mut last_finish) = (0usize, false, None::<Instant>);
        for r in log.iter().filter(|r| FLEET.pool_of(r.node) == pool) {
            match r.what {
                What::Started => {
                    pulling += 1;
                    a.grants += 1;
                    let allowed = pace.allowed(canary_done);
                    assert!(
                        pulling <= allowed,
                        "pool-{pool} ({pace:?}): {pulling} nodes pulling at once, {allowed} allowed (node-{} started at {:?})",
                        r.node,
                        r.at - changed_at
                    );
                    match last_finish {
                        Some(f) => a.after_finish.push(r.at - f),
                        None => a.canary.push(r.at - changed_at),
                    }
                }
                What::Finished => {
                    pulling -= 1;
                    canary_done = true;
                    last_finish = Some(r.at);
                    a.last_finish = a.last_finish.max(r.at);
                }
            }
            let max = a.max_pulling.entry(pace.name()).or_default();
            *max = (*max).max(pulling);
        }
        let granted = log
            .iter()
            .filter(|r| FLEET.pool_of(r.node) == pool && r.what == What::Started)
            .count();
        assert_eq!(
            granted,
            pace.expected().0,
            "pool-{pool} ({pace:?}): nodes granted"
        );
    }
    a
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    if values.is_empty() {
        return Duration::ZERO;
    }
    values[((values.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The controller's writes by kind, from its metrics.
async fn writes(c: &Controller) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for kind in ["node_grant", "pool_status", "pool_spec", "set_status"] {
        let n = c
            .metric_with("pinset_api_writes_total", &format!("kind=\"{kind}\""))
            .await;
        out.insert(kind, n);
    }
    let conflicts = c
        .metric_with("pinset_api_write_conflicts_total", "kind=\"pool_status\"")
        .await;
    out.insert("pool_status conflicts", conflicts);
    out
}

/// Events recorded so far, by reason.
async fn events(client: &kube::Client) -> BTreeMap<String, usize> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for e in api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        *out.entry(e.reason.unwrap_or_default()).or_default() += 1;
    }
    out
}

/// `pinset rollout status pool-0`, following that pool through the rollout as an operator
/// would, in its own process.
struct Follower {
    /// When it exited, its exit code and its CPU time (user + system).
    exit: std::thread::JoinHandle<(Instant, i32, Duration)>,
}

impl Follower {
    fn start(kubeconfig: &std::path::Path) -> Follower {
        let child = std::process::Command::new(support::PINSET)
            .args([
                "rollout",
                "status",
                "pool-0",
                "--timeout",
                "120s",
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .env("PINSET_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start pinset rollout status");
        let pid = child.id() as libc::pid_t;
        let exit = std::thread::spawn(move || {
            let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
            // Reaped here, with its resource usage; `child` is not waited on again.
            let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            assert_eq!(reaped, pid, "wait4 on pinset rollout status");
            let time = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
            drop(child);
            (
                Instant::now(),
                code,
                time(usage.ru_utime) + time(usage.ru_stime),
            )
        });
        Follower { exit }
    }

    /// Its exit, once pool-0 rolled out: how long after the pool's last node finished, and
    /// its CPU time.
    fn finish(self, log: &[Record]) -> (Duration, Duration) {
        let (at, code, cpu) = self.exit.join().expect("the follower's waiter");
        assert_eq!(code, 0, "pinset rollout status pool-0 exit code");
        let last = log
            .iter()
            .filter(|r| FLEET.pool_of(r.node) == 0 && r.what == What::Finished)
            .map(|r| r.at)
            .max()
            .expect("pool-0's nodes finished");
        (at.saturating_duration_since(last), cpu)
    }
}

/// One repetition on a fresh API server; `None` when the bed is missing.
async fn run() -> Option<Row> {
    let server = support::apiserver::ApiServer::start().await?;
    server.install_crds().await;
    server.install_events().await;
    let client = server.client().await;
    FLEET.populate(&client).await;
    let sim = sim();
    let watch = tokio::spawn(agents(client.clone(), sim.clone()));
    let c = Controller::start(&server.kubeconfig);
    wait_until("every pool at generation 1, nothing to grant", || {
        rolled_out(&client, 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cpu0, writes0, events0) = (c.cpu(), writes(&c).await, events(&client).await);
    let (server0, own0) = (server.cpu(), support::procfs::cpu(std::process::id()));
    let reconciles0 = reconciles(&c).await;
    assert_eq!(writes0["node_grant"], 0, "a converged fleet needs no grant");

    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let images: Vec<_> = (0..=FLEET.images)
        .map(|i| json!({"name": Fleet::image(CHANGED, i)}))
        .collect();
    let follower = Follower::start(&server.kubeconfig);
    let changed_at = Instant::now();
    sets.patch(
        &Fleet::set_name(CHANGED),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": images}})),
    )
    .await
    .expect("change the common set");
    // Watch the agents' record (no API traffic), then check every pool's status says so.
    let finishes: usize = (0..FLEET.pools).map(|p| Pace::of(p).expected().0).sum();
    nodes_finished(&sim, "every granted node finished", finishes).await;
    let elapsed =
        changed_at.elapsed() + wait_until("every pool rolled out", || rolled_out(&client, 2)).await;
    // The held pools have a second to misbehave.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu = c.cpu() - cpu0;
    let others = (
        server.cpu() - server0,
        support::procfs::cpu(std::process::id()) - own0,
    );
    let writes1 = writes(&c).await;
    let waves = c.metric("pinset_rollout_waves_total").await as usize;
    let events: BTreeMap<String, usize> = events(&client)
        .await
        .into_iter()
        .map(|(reason, n)| {
            (
                reason.clone(),
                n - events0.get(&reason).copied().unwrap_or(0),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let reconciles1 = reconciles(&c).await;
    let reconciles = (reconciles1.0 - reconciles0.0, reconciles1.1 - reconciles0.1);
    let (analysis, follow) = {
        let sim = sim.lock().unwrap();
        (analyse(&sim.log, changed_at), follower.finish(&sim.log))
    };
    let echoes = sim.lock().unwrap().echoes.clone();
    let policy = policy_phase(&client, &sim).await;
    watch.abort();
    let expected_waves: usize = (0..FLEET.pools).map(|p| Pace::of(p).expected().1).sum();
    assert_eq!(waves, expected_waves, "waves");
    assert_eq!(
        writes1["node_grant"] as usize, analysis.grants,
        "grant writes = nodes that started"
    );
    let writes: BTreeMap<&str, u64> = writes1.iter().map(|(k, v)| (*k, v - writes0[k])).collect();
    Some(Row {
        analysis,
        policy,
        echoes,
        changed_at,
        elapsed,
        cpu,
        waves,
        writes,
        events,
        reconciles,
        others,
        follow,
    })
}

/// The controller's pool reconciles so far: how many, and their total time.
async fn reconciles(c: &Controller) -> (u64, f64) {
    let metrics = c.metrics().await;
    let value = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains("kind=\"pool\""))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("pinset_reconcile_seconds_count") as u64,
        value("pinset_reconcile_seconds_sum"),
    )
}

/// One repetition's figures.
struct Row {
    analysis: Analysis,
    /// The node policy change that follows: its record, and the time to every pool's status.
    policy: (Analysis, Duration),
    echoes: Vec<Duration>,
    changed_at: Instant,
    elapsed: Duration,
    cpu: Duration,
    waves: usize,
    writes: BTreeMap<&'static str, u64>,
    /// Events recorded during the rollout, by reason.
    events: BTreeMap<String, usize>,
    /// Pool reconciles during the rollout and their total time in seconds.
    reconciles: (u64, f64),
    /// CPU of the API server with etcd, and of this process (the simulated agents).
    others: (Duration, Duration),
    /// `pinset rollout status pool-0`: from the pool's last node finishing to its exit, and
    /// its CPU time.
    follow: (Duration, Duration),
}

impl Row {
    fn print(mut self, index: usize) {
        let a = &mut self.analysis;
        // Conflicts were refused: not writes.
        let total: u64 = self
            .writes
            .iter()
            .filter(|(k, _)| !k.ends_with("conflicts"))
            .map(|(_, v)| v)
            .sum();
        let by_kind: Vec<String> = self
            .writes
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let waves = self.waves as f64;
        println!(
            "    pool reconciles: {}, mean {:.1} ms; CPU: controller {:.2} s, API server + etcd {:.2} s, simulated agents {:.2} s",
            self.reconciles.0,
            self.reconciles.1 * 1000.0 / self.reconciles.0.max(1) as f64,
            self.cpu.as_secs_f64(),
            self.others.0.as_secs_f64(),
            self.others.1.as_secs_f64(),
        );
        println!("    events: {:?}", self.events);
        let (p, elapsed) = &mut self.policy;
        println!(
            "    node policy change: last node {:.2} s, every pool's status {:.2} s; canary p50 {} / p99 {} ms; grant after finish p50 {} / p99 {} ms; {} nodes swapped or refused, max at once {:?}",
            (p.last_finish - p.first_change).as_secs_f64(),
            elapsed.as_secs_f64(),
            ms(percentile(&mut p.canary, 0.5)),
            ms(percentile(&mut p.canary, 0.99)),
            ms(percentile(&mut p.after_finish, 0.5)),
            ms(percentile(&mut p.after_finish, 0.99)),
            p.grants,
            p.max_pulling,
        );
        println!(
            "    pinset rollout status pool-0: exit 0 {} ms after the pool's last node finished, CPU {} ms",
            ms(self.follow.0),
            ms(self.follow.1)
        );
        println!(
            "{index:>3} {:>6.2}s {:>7.2}s {:>6} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8.1} {:>7.2} {:>6}  {:?} ({})",
            (a.last_finish - self.changed_at).as_secs_f64(),
            self.elapsed.as_secs_f64(),
            a.grants,
            self.waves,
            ms(percentile(&mut a.canary, 0.99)),
            ms(percentile(&mut a.after_finish, 0.5)),
            ms(percentile(&mut a.after_finish, 0.99)),
            ms(percentile(&mut a.after_finish, 1.0)),
            ms(percentile(&mut self.echoes, 0.5)),
            ms(percentile(&mut self.echoes, 0.99)),
            self.cpu.as_secs_f64() * 1000.0 / waves,
            total as f64 / waves,
            self.events.values().sum::<usize>(),
            a.max_pulling,
            by_kind.join(", "),
        );
    }
}

#[tokio::main]
async fn main() {
    let repeats = support::repeats_or(3);
    println!(
        "rollout: {} pools × {} nodes, {} sets × {} images; set-{CHANGED:04} (every pool) gains an image",
        FLEET.pools, FLEET.nodes_per_pool, FLEET.sets, FLEET.images
    );
    println!(
        "{:>3} {:>7} {:>8} {:>6} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>8} {:>7}  max pulling (writes)",
        "run",
        "rollout",
        "status",
        "grants",
        "waves",
        "canary",
        "p50",
        "p99",
        "max",
        "echo50",
        "echo99",
        "CPU/wave",
        "wr/wave",
        "events"
    );
    println!(
        "{:>3} {:>7} {:>8} {:>6} {:>5} {:>6} {:>20} {:>13} {:>7} {:>8}",
        "", "", "", "", "", "p99 ms", "grant after finish, ms", "API echo, ms", "ms", ""
    );
    for index in 1..=repeats {
        let Some(row) = run().await else { return };
        row.print(index);
    }
}
