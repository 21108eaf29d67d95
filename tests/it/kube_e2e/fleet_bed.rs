//! The fleet scenarios' bed: three worker nodes ([`FLEET_NODES`]), each an agent on a
//! containerd of its own, and the controller, started once the test has written its objects.

use super::*;
use pinset_k8s::api::PoolRollout;
use std::cell::RefCell;

/// See the module's documentation. The controller can be stopped and started again (its
/// metrics on the same port); every process is killed when the bed is dropped.
pub(super) struct FleetBed {
    pub(super) cluster: Cluster,
    pub(super) runtimes: Vec<support::Containerd>,
    /// Each node's containerd, as the test asks it.
    pub(super) cris: Vec<pinset_node::cri::client::CriClient>,
    pub(super) pools: Api<MachineConfigPool>,
    pub(super) sets: Api<PinnedImageSet>,
    pub(super) nodes: Api<MachineConfigNode>,
    /// The operator's kubeconfig (`pinset rollout …` runs with it).
    pub(super) operator: String,
    pub(super) controller_port: u16,
    controller: RefCell<Option<Proc>>,
    agents: RefCell<Vec<Proc>>,
    /// Each agent's metrics port.
    pub(super) agent_ports: Vec<u16>,
}

impl FleetBed {
    /// The cluster and the nodes' containerds; `None` as [`Cluster::with_runtime`].
    pub(super) async fn start() -> Option<FleetBed> {
        let cluster = Cluster::start().await?;
        let runtimes = cluster.runtimes(FLEET_NODES.len())?;
        let all = || cluster.client.clone();
        let (pools, sets, nodes) = (Api::all(all()), Api::all(all()), Api::all(all()));
        Some(FleetBed {
            cris: runtimes.iter().map(cri).collect(),
            operator: cluster.operator_kc.display().to_string(),
            controller_port: support::free_port(),
            controller: RefCell::new(None),
            agents: RefCell::new(Vec::new()),
            agent_ports: FLEET_NODES.iter().map(|_| support::free_port()).collect(),
            cluster,
            runtimes,
            pools,
            sets,
            nodes,
        })
    }

    /// [`FleetBed::start`], and `count` images of 150 kB pushed to its registry.
    pub(super) async fn with_images(
        prefix: &str,
        count: usize,
        seed: u64,
    ) -> Option<(FleetBed, Vec<String>)> {
        let bed = FleetBed::start().await?;
        let registry = &bed.cluster.registry;
        let images = support::push_images(registry, prefix, count, 150_000, seed).await;
        Some((bed, images))
    }

    /// Start the controller (after stopping the running one), logging to `log`.
    pub(super) fn controller(&self, log: &str, extra: &[String]) {
        self.stop_controller();
        let started = self.cluster.controller(self.controller_port, log, extra);
        *self.controller.borrow_mut() = Some(started);
    }

    /// The controller, with `flags`, and plain agents: the fleet scenarios' processes.
    pub(super) fn run(&self, flags: &[String]) {
        self.controller("controller.log", flags);
        self.agents(&[], |_| Vec::new());
    }

    /// SIGTERM the controller, which must exit cleanly.
    pub(super) fn stop_controller(&self) {
        if let Some(mut running) = self.controller.borrow_mut().take() {
            running.terminate();
        }
    }

    /// One agent per node, as a worker in a zone of its own (`zone-NAME`) with `labels` too,
    /// with the flags `extra` gives for the node's name.
    pub(super) fn agents(&self, labels: &[(String, String)], extra: impl Fn(&str) -> Vec<String>) {
        let nodes = FLEET_NODES
            .iter()
            .zip(&self.runtimes)
            .zip(&self.agent_ports);
        let agents = nodes.map(|((name, runtime), port)| {
            let mut all = roles(&["worker"]);
            all.push(("topology.kubernetes.io/zone".into(), format!("zone-{name}")));
            all.extend_from_slice(labels);
            let log = format!("{name}.log");
            self.cluster
                .agent(name, &all, runtime, *port, &log, &extra(name))
        });
        *self.agents.borrow_mut() = agents.collect();
    }

    /// The agents' process ids, and whether each still runs.
    pub(super) fn agents_running(&self) -> Vec<(u32, bool)> {
        let mut agents = self.agents.borrow_mut();
        let state = |a: &mut Proc| (a.child.id(), a.child.try_wait().unwrap().is_none());
        agents.iter_mut().map(state).collect()
    }

    /// The last lines of node `i`'s agent's log.
    pub(super) fn agent_log(&self, i: usize) -> String {
        self.agents.borrow()[i].log()
    }

    /// The last lines of the controller's and of every agent's log.
    pub(super) fn logs(&self) -> String {
        let controller = self.controller.borrow();
        let controller = controller.as_ref().map(Proc::log).unwrap_or_default();
        let mut out = format!("--- controller ---\n{controller}\n");
        for (name, a) in FLEET_NODES.iter().zip(self.agents.borrow().iter()) {
            out.push_str(&format!("--- {name} ---\n{}\n", a.log()));
        }
        out
    }

    /// What the nodes hold of generation `generation` of the set `apps` ([`look`]).
    pub(super) async fn look(&self, generation: i64, images: &[String]) -> FleetLook {
        look(&self.nodes, &self.cris, "apps", generation, images).await
    }

    /// Wait (as [`eventually`]) until `accept` takes the pool `worker`'s rollout status and its
    /// Degraded and PolicyFallback messages ([`rollout_of`]); what it returned.
    pub(super) async fn pool_when<T>(
        &self,
        what: &str,
        accept: impl Fn(Option<PoolRollout>, String, String) -> Option<T>,
    ) -> T {
        eventually(what, &|| self.logs(), || async {
            let p = self.pools.get("worker").await.map_err(|e| e.to_string())?;
            let (rollout, degraded, fallback) = rollout_of(&p);
            let shown = format!("{rollout:?}, degraded {degraded:?}, fallback {fallback:?}");
            accept(rollout, degraded, fallback).ok_or(shown)
        })
        .await
    }

    /// Make `images` the set `apps` (a new generation).
    pub(super) async fn set_images(&self, images: &[String]) {
        let names: Vec<_> = images.iter().map(|n| json!({"name": n})).collect();
        let patch = json!({"spec": {"pinnedImages": names}});
        let merge = Patch::Merge(patch);
        let params = PatchParams::default();
        self.sets.patch("apps", &params, &merge).await.unwrap();
    }

    /// Wait until the pool's Events name every one of `reasons`.
    pub(super) async fn pool_events(&self, reasons: &[&str]) {
        let wanted: Vec<(&str, &str)> = reasons.iter().map(|r| (*r, "")).collect();
        self.events_of("worker", &wanted).await
    }

    /// Wait until the Events regarding the object `name` include, for each (reason, text) of
    /// `wanted`, one of that reason whose note contains the text.
    pub(super) async fn events_of(&self, name: &str, wanted: &[(&str, &str)]) {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::all(self.cluster.client.clone());
        let what = format!("the Events of {name}");
        eventually(&what, &|| self.logs(), || async {
            let listed = events.list(&Default::default()).await;
            let items = listed.map_err(|e| e.to_string())?.items;
            let seen: Vec<(String, String)> = items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .map(|e| {
                    (
                        e.reason.clone().unwrap_or_default(),
                        e.note.clone().unwrap_or_default(),
                    )
                })
                .collect();
            let has = |(reason, text): &&(&str, &str)| {
                seen.iter().any(|(r, n)| r == reason && n.contains(text))
            };
            let missing: Vec<_> = wanted.iter().filter(|w| !has(w)).collect();
            match missing.is_empty() {
                true => Ok(()),
                false => Err(format!("missing {missing:?} among {seen:?}")),
            }
        })
        .await
    }
}
