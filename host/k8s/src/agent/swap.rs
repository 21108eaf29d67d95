//! A node's policy swap, between two reconciles: what the configuration and the grant ask, the
//! check of a candidate (or of the running module under keys that changed) started in the
//! background, and its outcome taken by a later round. A round never waits on a registry.

use super::checks::Outcome;
use super::policies::{self, CheckKey, SwapResult, WantedPolicy};
use super::{Agent, Rounds, watch};
use crate::policy_config::{ConfigSource, PolicyConfig};
use pinset_core::desired::{Desired, NodeInfo};
use pinset_node::pin::PinBackend;
use pinset_policy_sdk::AdmissionRequest;
use pinset_registry::size::Sizer;

impl<S: Sizer + 'static, B: PinBackend> Agent<S, B> {
    /// The configuration now; the last one read when it cannot be read (said on the status:
    /// the node keeps what it runs, the agent goes on).
    pub(super) fn policy_config(&self, rounds: &mut Rounds) -> PolicyConfig {
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
    pub(super) fn wanted(
        &self,
        rounds: &Rounds,
        config: &PolicyConfig,
        pools: &[String],
    ) -> WantedPolicy {
        let needs_grant = matches!(rounds.policy_source, ConfigSource::Watched { .. });
        let grant = watch::grant_of(&self.config, &rounds.caches.own).filter(|_| needs_grant);
        WantedPolicy::of(config, pools, grant.as_ref())
    }

    /// The running module under the keys trusted now, when they are not the ones it was checked
    /// with: a check to make before anything else (a removed key stops what it vouched for).
    fn recheck(rounds: &Rounds, wanted: &WantedPolicy) -> Option<(CheckKey, WantedPolicy)> {
        let running = rounds.policy.running().reference.clone()?;
        let keys = policies::fingerprint(&wanted.keys);
        if keys == rounds.policy.running_keys() {
            return None;
        }
        let again = WantedPolicy {
            module: crate::policy_config::ModuleRef::from_reference(&running),
            ..wanted.clone()
        };
        Some((CheckKey::of(&again), again))
    }

    /// Something for a round to do about the policy: a check ended, or one is due. Wakes an
    /// idle agent.
    pub(super) fn policy_due(&self, rounds: &Rounds, desired: &Desired) -> bool {
        let Ok(config) = rounds.policy_source.current() else {
            return false;
        };
        let wanted = self.wanted(rounds, &config, &desired.pools);
        let key = CheckKey::of(&wanted);
        if let Some((recheck, _)) = Self::recheck(rounds, &wanted) {
            return rounds.checks.finished(&recheck) || rounds.checks.due(&recheck);
        }
        let candidate = rounds.policy.should_try(&wanted) && !rounds.policy.refused_for_good(&key);
        rounds.checks.finished(&key) || (candidate && rounds.checks.due(&key))
    }

    /// Before a reconcile: take what a finished check found, or start the check that is due —
    /// of the running module when the trusted keys changed, else of the module the
    /// configuration and the grant ask for. Returns at once: the checks run in the background.
    pub(super) async fn swap_policy(
        &self,
        rounds: &mut Rounds,
        node: &NodeInfo,
        desired: &Desired,
    ) {
        let config = self.policy_config(rounds);
        let wanted = self.wanted(rounds, &config, &desired.pools);
        let recheck = Self::recheck(rounds, &wanted);
        let key = match &recheck {
            Some((key, _)) => key.clone(),
            None => CheckKey::of(&wanted),
        };
        if let Some(outcome) = rounds.checks.take(&key) {
            if let Some(result) = self.apply(rounds, &key, outcome) {
                self.metrics.count_policy_swap(result.as_str());
            }
            return;
        }
        if !rounds.checks.due(&key) {
            return;
        }
        match recheck {
            Some((key, again)) => {
                let loader = self.loader.clone();
                rounds.checks.start(key, async move {
                    Outcome::Recheck(policies::fetch(&loader, &again).await.map(drop))
                });
            }
            None if rounds.policy.should_try(&wanted) && !rounds.policy.refused_for_good(&key) => {
                self.start_candidate(rounds, key, wanted, node, desired)
                    .await;
            }
            None => rounds.checks.cancel(),
        }
    }

    /// Start checking `wanted`'s module: fetched and verified, then compiled and smoke-tested on
    /// the node's facts.
    async fn start_candidate(
        &self,
        rounds: &mut Rounds,
        key: CheckKey,
        wanted: WantedPolicy,
        node: &NodeInfo,
        desired: &Desired,
    ) {
        let request = match self.smoke_facts(desired, node).await {
            Ok(request) => request,
            Err(e) => {
                tracing::warn!(module = ?key.module, error = %e, "cannot read the node's facts to test the policy module; trying at the next round");
                return;
            }
        };
        let (loader, default) = (self.loader.clone(), self.default_policy.clone());
        let pressure = pinset_node::os::pressure();
        rounds.checks.start(key, async move {
            let fetched = match policies::fetch(&loader, &wanted).await {
                Ok(fetched) => fetched,
                Err(refused) => return Outcome::Candidate(Err(refused)),
            };
            let proved = tokio::task::spawn_blocking(move || {
                policies::prove(&loader, &default, &wanted, fetched, &request, &pressure)
            })
            .await;
            Outcome::Candidate(proved.unwrap_or_else(|e| {
                Err((
                    pinset_core::refusal::Refusal::NotAPolicy,
                    format!("the check failed: {e}"),
                ))
            }))
        });
    }

    /// What a finished check means for the node's policy.
    fn apply(&self, rounds: &mut Rounds, key: &CheckKey, outcome: Outcome) -> Option<SwapResult> {
        match outcome {
            Outcome::Candidate(Ok(loaded)) => {
                rounds.checks.passed(key);
                let swapped = rounds.policy.accept(loaded, key);
                self.prune_cache(rounds);
                Some(swapped)
            }
            Outcome::Candidate(Err((kind, cause))) => {
                rounds.checks.refused(key, kind);
                Some(rounds.policy.refuse(key, kind, cause))
            }
            Outcome::Recheck(Ok(())) => {
                rounds.checks.passed(key);
                rounds.policy.confirm_keys(&key.keys);
                None
            }
            Outcome::Recheck(Err((kind, cause))) if kind.transient() => {
                // Not re-verified yet: it keeps deciding, and is asked again.
                rounds.checks.refused(key, kind);
                tracing::warn!(module = ?key.module, %cause, "cannot re-verify the running node policy with the new keys: its registry is away");
                None
            }
            Outcome::Recheck(Err((kind, cause))) => {
                rounds.checks.refused(key, kind);
                let default = policies::Loaded::default_of(&self.default_policy);
                rounds.policy.retire(default, key, kind, cause);
                Some(SwapResult::Rejected)
            }
        }
    }

    /// Keep the node's policy cache within its bound, the modules in use kept, off the async
    /// runtime.
    pub(super) fn prune_cache(&self, rounds: &Rounds) {
        let (loader, keep) = (self.loader.clone(), rounds.policy.in_use());
        tokio::task::spawn_blocking(move || loader.prune(&keep));
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
            node.facts(&desired.pools),
            disk?,
            &present,
            &vec![None; desired.images.len()],
        ))
    }
}
