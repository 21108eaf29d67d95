//! A node's policy swap, between two reconciles: what the configuration and the grant ask,
//! the candidate checked off the async runtime, the result counted.

use super::policies::{self, Wanted};
use super::{Agent, Rounds, watch};
use crate::policy_config::{ConfigSource, PolicyConfig};
use pinset_core::desired::{Desired, NodeInfo};
use pinset_node::pin::PinBackend;
use pinset_node::registry::size::Sizer;
use pinset_policy_sdk::AdmissionRequest;

impl<S: Sizer + 'static, B: PinBackend> Agent<S, B> {
    /// The configuration now; the last one read when it cannot be read (said on the status:
    /// the node keeps what it runs, the agent goes on).
    fn policy_config(&self, rounds: &mut Rounds) -> PolicyConfig {
        match rounds.policy_source.current() {
            Ok(config) => {
                rounds.policy.set_config_error(None);
                rounds.last_config = config.clone();
                config
            }
            Err(e) => {
                tracing::warn!(error = %e, "policy configuration unreadable; keeping the last one read");
                rounds.policy.set_config_error(Some(e.to_string()));
                rounds.last_config.clone()
            }
        }
    }

    /// What `config` asks of this node of `pools`, under its grant when it needs one.
    fn wanted(&self, rounds: &Rounds, config: &PolicyConfig, pools: &[String]) -> Wanted {
        let needs_grant = matches!(rounds.policy_source, ConfigSource::Watched { .. });
        let grant = watch::grant_of(&self.config, &rounds.caches.own).filter(|_| needs_grant);
        Wanted::of(config, pools, grant.as_ref())
    }

    /// A swap is due that was not already tried and refused: wakes an idle agent.
    pub(super) fn policy_due(&self, rounds: &Rounds, desired: &Desired) -> bool {
        let Ok(config) = rounds.policy_source.current() else {
            return false;
        };
        let wanted = self.wanted(rounds, &config, &desired.pools);
        rounds.policy.pending(&wanted)
    }

    /// Before a reconcile: when the configuration and the grant ask for another module, check
    /// it (fetch, signature, compile, smoke test on the node's facts) and swap to it, or keep
    /// the running one and say why.
    pub(super) async fn swap_policy(
        &self,
        rounds: &mut Rounds,
        node: &NodeInfo,
        desired: &Desired,
    ) {
        let config = self.policy_config(rounds);
        let wanted = self.wanted(rounds, &config, &desired.pools);
        if !rounds.policy.should_try(&wanted) {
            return;
        }
        let reference = wanted.reference();
        let module = reference
            .clone()
            .unwrap_or_else(|| pinset_policy::EMBEDDED_DEFAULT_NAME.into());
        let request = match self.smoke_facts(desired, node).await {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(%module, error = %e, "cannot read the node's facts to test the policy module; trying at the next round");
                return;
            }
        };
        let loader = self.loader.clone();
        let pressure = pinset_node::os::pressure();
        let checked = tokio::task::spawn_blocking(move || {
            policies::candidate(&loader, &wanted, &request, &pressure)
        })
        .await
        .unwrap_or_else(|e| Err(format!("checking task failed: {e}")));
        let result = match checked {
            Ok(loaded) => rounds.policy.accept(loaded),
            Err(cause) => rounds.policy.reject(module, cause),
        };
        self.metrics.count_policy_swap(result.as_str());
    }

    /// The node's facts as a policy sees them: its images (present or not), disk and labels;
    /// no image is sized for a test.
    async fn smoke_facts(
        &self,
        desired: &Desired,
        node: &NodeInfo,
    ) -> Result<AdmissionRequest, pinset_node::cri::client::CriError> {
        use pinset_node::facts;
        let (listed, disk) =
            tokio::join!(self.reconciler.cri().list_images(), self.reconciler.disk());
        let present = facts::Snapshot::of(&listed?).presence(desired);
        Ok(facts::request(
            desired,
            facts::node_facts(node, &desired.pools),
            disk?,
            &present,
            &vec![None; desired.images.len()],
        ))
    }
}
