//! The status a node reports: per set desired / current / last-failed generation with the error,
//! progress in images and bytes, and honest conditions. The CLI prints it; the Kubernetes agent
//! publishes it on the node's MachineConfigNode.

use crate::desired::Desired;
use serde::Serialize;
use std::collections::BTreeMap;

/// Longest error kept per set (as the MachineConfigNode API allows).
pub const MAX_ERROR_CHARS: usize = 32_768;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetStatus {
    pub name: String,
    pub desired_generation: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failed_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failed_generation_error: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub images_done: u64,
    pub images_total: u64,
    /// Compressed bytes of the images done, where their size is known.
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// The policy module a node decides with, as its status reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningPolicy {
    /// What the module says it is (its `info`).
    pub name: String,
    pub version: String,
    /// The digest the operator names it by ([`policy_digest`]): an artifact's manifest digest
    /// (the one in `oci://…@sha256:…`), else the sha256 of the module's bytes.
    pub digest: String,
    /// `sha256:<hex>` of the module's bytes (for an artifact: its layer's digest).
    pub module_digest: String,
    /// Where it comes from: a file, `oci://REGISTRY/REPO@sha256:…`, or the embedded default.
    pub module: String,
    /// When the agent started deciding with it (RFC 3339).
    pub since: String,
    /// Swapped in, and no reconcile with it has succeeded yet: a fallback there puts the
    /// previous module back, and the controller does not count the node as done with it.
    pub probation: bool,
}

/// The one digest a policy is named by wherever pinset reports it (statuses, pool counts,
/// metrics labels, rollout targets): the one the operator wrote — the manifest digest of
/// `oci://…@sha256:…`, the pinned sha256 of `FILE@sha256:…` — else the sha256 of the module's
/// bytes (`content`, `sha256:<hex>`: a file named without one, the embedded default).
pub fn policy_digest(reference: Option<&str>, content: &str) -> String {
    match reference.and_then(|r| r.rsplit_once("@sha256:")) {
        Some((_, hex)) => format!("sha256:{hex}"),
        None => content.to_string(),
    }
}

/// A module the node was asked to decide with and did not: it kept its running module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedPolicy {
    /// The module as the configuration names it (a file or `oci://…@sha256:…`).
    pub module: String,
    /// The kind of refusal ([`crate::refusal::Refusal::reason`]): `NotFound`, `Unsigned`,
    /// `SmokeTestFailed`… (a registry that is away is never a rejection).
    pub reason: String,
    /// Which step refused it (fetch, signature, load, smoke test, first reconcile) and why.
    pub cause: String,
    /// When (RFC 3339).
    pub since: String,
}

/// Where the node stands. Progressing while it works, whatever the time it takes; Degraded only
/// for a real failure, which names the failing images.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub sets: BTreeMap<String, SetStatus>,
    pub progress: Progress,
    /// `Some(message)` while a reconcile runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progressing: Option<String>,
    /// Sets (name, generation) waiting for a rollout grant (see [`crate::rollout`]): the node is
    /// Progressing, not failed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<(String, i64)>,
    /// `Some(message)` after a failed reconcile, until one succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// Decisions the policy failed to make in the last reconcile (answered by the reference).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policy_fallbacks: Vec<String>,
    /// Why the module of the node's pool was refused (not fetched, verified or loaded), when it
    /// was: the node decides with the default policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_refused: Option<String>,
    /// The registry of the module the node's pool names is away: the node keeps deciding with
    /// its module and asks again (no verdict on the module, no fallback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_waiting: Option<String>,
    /// The node policy module the node decides with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<RunningPolicy>,
    /// The module the node was last asked to swap to and refused (it kept `policy`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_rejected: Option<RejectedPolicy>,
    /// The node's Ready condition and labels as last read (reported for the fleet policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_ready: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Pins the last reconcile found lost and repaired (see [`crate::drift`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_drift: Option<String>,
    /// What the last reconcile could not size (per registry), or why it sized without the
    /// node's mirror configuration: admission counted without those images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sizing: Option<String>,
    /// A request of the agent's the API server refused for lack of rights (who may not do
    /// what), said until the agent's next status; the agent retries with backoff.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forbidden: Option<String>,
}

impl NodeStatus {
    /// A reconcile of `desired` starts: record its generations, drop sets no longer wanted.
    pub fn start(&mut self, desired: &Desired, progress: Progress) {
        let wanted: Vec<(&str, i64)> = desired
            .sets
            .iter()
            .map(|s| (s.name.as_str(), s.generation))
            .chain(
                desired
                    .invalid
                    .iter()
                    .map(|s| (s.set.as_str(), s.generation)),
            )
            .chain(desired.waiting.iter().map(|(n, g)| (n.as_str(), *g)))
            .collect();
        self.sets
            .retain(|name, _| wanted.iter().any(|(n, _)| n == name));
        for (name, generation) in wanted {
            let s = self
                .sets
                .entry(name.to_string())
                .or_insert_with(|| SetStatus {
                    name: name.to_string(),
                    ..Default::default()
                });
            // Generations never go backwards in status.
            s.desired_generation = s.desired_generation.max(generation);
        }
        for invalid in &desired.invalid {
            self.fail(&invalid.set, invalid.generation, &invalid.to_string());
        }
        self.progress = progress;
        self.waiting = desired.waiting.clone();
        self.progressing = Some(format!(
            "pulling {} image(s) of {} set(s)",
            progress.images_total - progress.images_done,
            desired.sets.len()
        ));
    }

    pub fn advance(&mut self, images: u64, bytes: u64) {
        self.progress.images_done =
            (self.progress.images_done + images).min(self.progress.images_total);
        self.progress.bytes_done =
            (self.progress.bytes_done + bytes).min(self.progress.bytes_total);
    }

    pub fn succeed(&mut self, set: &str, generation: i64) {
        if let Some(s) = self.sets.get_mut(set) {
            s.current_generation = Some(s.current_generation.unwrap_or(0).max(generation));
        }
    }

    pub fn fail(&mut self, set: &str, generation: i64, error: &str) {
        if let Some(s) = self.sets.get_mut(set) {
            s.last_failed_generation = Some(s.last_failed_generation.unwrap_or(0).max(generation));
            s.last_failed_generation_error = Some(cap(error, MAX_ERROR_CHARS));
        }
    }

    /// The reconcile is over: Progressing clears; Degraded holds `failure` until a clean run.
    pub fn finish(&mut self, failure: Option<String>) {
        self.progressing = None;
        self.degraded = failure;
    }

    /// Every set at its desired generation.
    pub fn done(&self) -> bool {
        self.sets
            .values()
            .all(|s| s.current_generation == Some(s.desired_generation))
    }
}

/// `text` in at most `max` characters (the API's `maxLength` counts characters): when longer,
/// cut and marked with how much was left out, `…(N more characters)`, the marker included.
pub fn cap(text: &str, max: usize) -> String {
    let len = text.chars().count();
    if len <= max {
        return text.to_string();
    }
    // The marker's length depends on N, which is at most `len`.
    let marker = format!("…({len} more characters)").chars().count();
    let keep = max.saturating_sub(marker);
    let cut = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    format!("{}…({} more characters)", &text[..cut], len - keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_named_by_the_digest_the_operator_wrote() {
        let content = format!("sha256:{}", "c".repeat(64));
        let oci = format!("oci://r.io/p@sha256:{}", "a".repeat(64));
        assert_eq!(
            policy_digest(Some(&oci), &content),
            format!("sha256:{}", "a".repeat(64))
        );
        let file = format!("/p/a.wasm@sha256:{}", "b".repeat(64));
        assert_eq!(
            policy_digest(Some(&file), &content),
            format!("sha256:{}", "b".repeat(64))
        );
        assert_eq!(policy_digest(Some("/p/a.wasm"), &content), content);
        assert_eq!(
            policy_digest(None, &content),
            content,
            "the embedded default"
        );
    }

    #[test]
    fn capped_text_says_how_much_was_left_out_within_the_limit() {
        assert_eq!(cap("short", 10), "short");
        let long = "é".repeat(40_000);
        let c = cap(&long, MAX_ERROR_CHARS);
        let n = c.chars().count();
        assert!((MAX_ERROR_CHARS - 2..=MAX_ERROR_CHARS).contains(&n), "{n}");
        let kept = c.chars().take_while(|&ch| ch == 'é').count();
        assert!(
            c.ends_with(&format!("…({} more characters)", 40_000 - kept)),
            "{}",
            c.chars().skip(kept).collect::<String>()
        );
    }
    use crate::desired::InvalidSet;
    use crate::reference::RefError;

    fn desired(sets: &[(&str, i64)]) -> Desired {
        Desired::of_sets(sets)
    }

    #[test]
    fn generations_and_conditions() {
        let mut st = NodeStatus::default();
        st.start(
            &desired(&[("a", 1), ("b", 3)]),
            Progress {
                images_total: 4,
                bytes_total: 40,
                ..Default::default()
            },
        );
        assert!(st.progressing.is_some() && st.degraded.is_none());
        st.advance(1, 10);
        st.advance(9, 99);
        assert_eq!(st.progress.images_done, 4, "never past the total");
        st.succeed("a", 1);
        st.fail("b", 3, "img x: connection refused");
        st.finish(Some("1 image failed".into()));
        assert_eq!(st.sets["a"].current_generation, Some(1));
        assert_eq!(st.sets["b"].last_failed_generation, Some(3));
        assert!(!st.done() && st.degraded.is_some() && st.progressing.is_none());

        // Generation 4 of b succeeds; a is removed from the node.
        st.start(&desired(&[("b", 4)]), Progress::default());
        st.succeed("b", 4);
        st.finish(None);
        assert!(st.done() && st.degraded.is_none());
        assert_eq!(st.sets.keys().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(
            st.sets["b"].last_failed_generation,
            Some(3),
            "kept for history"
        );
        let json = serde_json::to_value(&st.sets["b"]).unwrap();
        assert_eq!(json["desiredGeneration"], 4);
        assert_eq!(
            json["lastFailedGenerationError"],
            "img x: connection refused"
        );
    }

    #[test]
    fn invalid_sets_fail_with_the_reason_and_errors_are_capped() {
        let mut d = desired(&[]);
        d.invalid.push(InvalidSet {
            set: "bad".into(),
            generation: 2,
            image: "q.io/a:1".into(),
            error: RefError::Tag("q.io/a:1".into()),
        });
        let mut st = NodeStatus::default();
        st.start(&d, Progress::default());
        let err = st.sets["bad"].last_failed_generation_error.clone().unwrap();
        assert!(
            err.contains("PinnedImageSet bad") && err.contains("q.io/a:1"),
            "{err}"
        );
        st.fail("bad", 2, &"é".repeat(40_000));
        let capped = st.sets["bad"].last_failed_generation_error.clone().unwrap();
        assert!(capped.chars().count() <= MAX_ERROR_CHARS);
        assert!(capped.ends_with("more characters)"), "{capped}");
    }
}
