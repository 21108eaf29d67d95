//! The pool controller at fleet scale against a real API server (release build):
//! 1 000 PinnedImageSets (20 images each) across 100 pools, and 300 MachineConfigNodes (3 per
//! pool) reporting every set of their pool done.
//!
//! Measured per repetition, on a fresh API server each time, with `pinset controller` as a
//! separate process:
//! - cold: time from start until every pool lists its sets and counts its nodes and every set's
//!   status is written; the API writes it made; its peak RSS (VmHWM);
//! - restart on the converged cluster: time until every pool and set has been reconciled again,
//!   and the writes made (must be zero);
//! - one set changed: the writes that follow.
//!
//! `cargo bench --bench controller` (needs the API server bed: `bash scripts/test.sh` builds it).
//! `REPEATS` (default 3) sets the repetitions.

#[path = "../tests/it/support.rs"]
mod support;

mod cluster;

use cluster::{Controller, Fleet, wait_for};
use kube::api::{Api, ListParams, Patch, PatchParams};
use pinset_k8s::api::{MachineConfigPool, PinnedImageSet};
use serde_json::json;
use std::time::Duration;

/// 1 000 sets (10 that every pool selects), 20 images each, 100 pools of 3 nodes. The nodes do
/// not report readiness: no rollout grant is ever written here (`cargo bench --bench rollout`
/// measures those).
const FLEET: Fleet = Fleet {
    pools: 100,
    sets: 1000,
    common: 10,
    images: 20,
    nodes_per_pool: 3,
    ready: false,
    annotations: cluster::no_annotations,
};

/// Every pool lists its sets and counts its nodes all updated; every set has its status.
async fn converged(client: &kube::Client) -> bool {
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let Ok(pools) = pools.list(&ListParams::default()).await else {
        return false;
    };
    let n = FLEET.nodes_per_pool as i64;
    let pools_ok = pools.items.len() == FLEET.pools
        && pools.items.iter().all(|p| {
            let index: usize = p
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix("pool-")?.parse().ok())
                .unwrap_or(usize::MAX);
            p.spec
                .pinned_image_sets
                .as_ref()
                .is_some_and(|s| s.len() == FLEET.sets_of(index).len())
                && p.status.as_ref().is_some_and(|st| {
                    st.pool_synchronizers_status
                        .iter()
                        .any(|s| s.machine_count == n && s.updated_machine_count == n)
                })
        });
    if !pools_ok {
        return false;
    }
    let Ok(sets) = sets.list(&ListParams::default()).await else {
        return false;
    };
    sets.items.len() == FLEET.sets
        && sets.items.iter().all(|s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.image_count as usize == FLEET.images && !st.pools.is_empty())
        })
}

#[tokio::main]
async fn main() {
    let repeats = support::repeats_or(3);
    println!(
        "controller: {} sets × {} images, {} pools ({}–{} sets each), {} nodes",
        FLEET.sets,
        FLEET.images,
        FLEET.pools,
        FLEET.sets_of(0).len(),
        FLEET.sets_of(FLEET.pools - 1).len(),
        FLEET.nodes()
    );
    println!(
        "{:>3} {:>8} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8}",
        "run",
        "cold",
        "cold CPU",
        "writes",
        "peak RSS",
        "RSS after",
        "restart",
        "writes",
        "1 change"
    );
    for run in 1..=repeats {
        let Some(server) = support::apiserver::ApiServer::start().await else {
            return;
        };
        server.install_crds().await;
        let client = server.client().await;
        FLEET.populate(&client).await;

        let c = Controller::start(&server.kubeconfig);
        let cold = wait_for("cold convergence", || converged(&client)).await;
        // Let the last status writes land, then count.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cold_writes = c.metric("pinset_api_writes_total").await;
        let (peak, rss, cpu) = (c.status_kib("VmHWM:"), c.status_kib("VmRSS:"), c.cpu());
        drop(c);

        let c = Controller::start(&server.kubeconfig);
        let restart = wait_for("restart: every object reconciled", || async {
            c.count("pool").await >= FLEET.pools as u64 && c.count("set").await >= FLEET.sets as u64
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let restart_writes = c.metric("pinset_api_writes_total").await;

        // One set gains an image: its status changes (image count); nothing else does.
        let sets: Api<PinnedImageSet> = Api::all(client.clone());
        let before = c.metric("pinset_api_writes_total").await;
        let images: Vec<serde_json::Value> = (0..=FLEET.images)
            .map(|i| json!({"name": Fleet::image(500, i)}))
            .collect();
        sets.patch(
            "set-0500",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pinnedImages": images}})),
        )
        .await
        .unwrap();
        wait_for("the changed set's status", || async {
            sets.get("set-0500")
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| s.image_count as usize == FLEET.images + 1)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let change_writes = c.metric("pinset_api_writes_total").await - before;
        println!(
            "{run:>3} {:>7.2}s {:>8.2}s {:>7} {:>5} MiB {:>5} MiB {:>7.2}s {:>8} {:>8}",
            cold.as_secs_f64(),
            cpu.as_secs_f64(),
            cold_writes,
            peak / 1024,
            rss / 1024,
            restart.as_secs_f64(),
            restart_writes,
            change_writes
        );
    }
}
