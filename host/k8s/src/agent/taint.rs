//! The startup taint (`--startup-taint`) lifted from the node's Node once the core's verdict
//! says so ([`pinset_core::startup_taint`]): after each round, when the Node carries it. The
//! patch carries the Node's resource version, so a taint list changed meanwhile (another
//! controller's taint) is never overwritten: the write is refused (409), and tried again at the
//! agent's retry on the Node as its watch brings it.

use super::{Agent, FIELD_MANAGER, Rounds};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use pinset_core::startup_taint::{Lifted, StartupTaint, TaintVerdict, verdict};
use pinset_node::pin::PinBackend;
use pinset_registry::size::Sizer;
use serde_json::json;
use std::time::Duration;

impl<S: Sizer + 'static, B: PinBackend> Agent<S, B> {
    /// After a round: the startup taint lifted when the node's Node carries it and the verdict
    /// says so (an Event on the MachineConfigNode says why); kept otherwise, said once per
    /// reason. `false` when lifting it failed: the agent tries again soon, not at its resync.
    pub(super) async fn lift_startup_taint(&self, rounds: &mut Rounds) -> bool {
        let Some(taint) = &self.config.startup_taint else {
            return true;
        };
        if rounds.caches.node.is_none() {
            // Facts from a node file: no Node to lift it from (the flags refuse the pair).
            return true;
        }
        let node = match super::watch::api_node(&self.config, &self.client, &rounds.caches).await {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the Node to lift its startup taint; trying again");
                return false;
            }
        };
        let taints = (node.spec.as_ref()).and_then(|s| s.taints.clone());
        let (ours, others): (Vec<Taint>, Vec<Taint>) = (taints.unwrap_or_default().into_iter())
            .partition(|t| taint.matches(&t.key, &t.effect));
        if ours.is_empty() {
            return true;
        }
        match verdict(
            &rounds.status,
            age(&node),
            self.config.startup_taint_deadline,
        ) {
            TaintVerdict::Keep(why) => {
                if rounds.taint_kept.as_ref() != Some(&why) {
                    tracing::info!(%taint, %why, "startup taint kept");
                    rounds.taint_kept = Some(why);
                }
                true
            }
            TaintVerdict::Lift(kind, why) => self.lift(taint, &node, others, (kind, &why)).await,
        }
    }

    /// Write Node `node` without the startup taint (`others` its other taints), at the
    /// resource version it was read at; whether that is done.
    async fn lift(
        &self,
        taint: &StartupTaint,
        node: &Node,
        others: Vec<Taint>,
        (kind, why): (Lifted, &str),
    ) -> bool {
        let name = &self.config.node_name;
        let version = node.metadata.resource_version.clone();
        let patch = json!({
            "metadata": {"resourceVersion": version},
            "spec": {"taints": others},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let api: Api<Node> = Api::all(self.client.clone());
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(%taint, %why, "startup taint lifted");
                self.metrics.count_api_write("node_taints");
                self.metrics.count_startup_taint(kind.name());
                let event = crate::events::STARTUP_TAINT_LIFTED.event(&format!("{taint}: {why}"));
                // A refusal to record it is warned by `record`; the lift stands.
                let _ = self.record(&[event]).await;
                true
            }
            // Changed meanwhile (another taint, a label): tried again soon on the Node as the
            // watch brings it — a change of taints alone does not wake the agent's loop.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(%taint, "the Node changed meanwhile; lifting the startup taint again");
                self.metrics.count_api_write_conflict("node_taints");
                false
            }
            Err(e) => {
                let error = crate::forbidden::refusal(&e).unwrap_or_else(|| e.to_string());
                tracing::warn!(%taint, %error, "cannot lift the startup taint; trying again");
                self.metrics.count_startup_taint("failed");
                false
            }
        }
    }
}

/// How long ago the Node was created (zero when it does not say).
fn age(node: &Node) -> Duration {
    let created = node.metadata.creation_timestamp.as_ref();
    let now = k8s_openapi::jiff::Timestamp::now();
    created
        .and_then(|t| Duration::try_from(now.duration_since(t.0)).ok())
        .unwrap_or_default()
}
