//! The agent's writes: its MachineConfigNode status (server-side apply by its own field
//! manager, only when it changed) and progress while it pulls.

use super::{AgentConfig, AgentError, FIELD_MANAGER};
use crate::api::{
    CONDITION_DEGRADED, CONDITION_POLICY_FALLBACK, CONDITION_PROGRESSING, MachineConfigNode,
    MachineConfigNodeStatus, NodeProgress, NodeSetStatus, NodeState,
};
use crate::condition;
use crate::events;
use crate::metrics::Metrics;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use pinset_core::desired::Desired;
use pinset_core::status::{MAX_ERROR_CHARS, NodeStatus, Progress, SetStatus, cap};
use pinset_node::executor::Event;
use pinset_policy_sdk::fmt_bytes;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Each set's (current, last failed) generation as the Events last told them, so a set is
/// announced pinned or failed once per generation, not at every resync.
#[derive(Debug, Default)]
pub struct Seen {
    sets: std::collections::BTreeMap<String, (Option<i64>, Option<i64>)>,
    refused: Option<String>,
    /// The last wait for a policy module's registry announced.
    waiting: Option<String>,
    /// The running module's digest.
    policy: Option<String>,
    /// The last sizing warning announced.
    sizing: Option<String>,
}

impl Seen {
    /// What a status already says (the agent starts from its MachineConfigNode's).
    pub fn of(status: &NodeStatus) -> Seen {
        Seen {
            sets: status
                .sets
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        (s.current_generation, s.last_failed_generation),
                    )
                })
                .collect(),
            refused: status.policy_refused.clone(),
            waiting: status.policy_waiting.clone(),
            policy: status.policy.as_ref().map(|p| p.digest.clone()),
            sizing: status.sizing.clone(),
        }
    }
}

/// The Events a finished reconcile is worth: sets pinned or failed at a generation not yet
/// announced, pins lost and repaired, decisions a policy failed to make. A quiet resync is none.
pub fn events(status: &NodeStatus, seen: &mut Seen) -> Vec<kube::runtime::events::Event> {
    let mut out = Vec::new();
    for (name, set) in &status.sets {
        let (current, failed) = seen.sets.get(name).copied().unwrap_or_default();
        let g = Some(set.desired_generation);
        if set.current_generation == g && current != g {
            let note = format!("set {name} pinned at generation {}", set.desired_generation);
            out.push(events::SET_PINNED.event(&note));
        }
        if set.last_failed_generation == g && failed != g {
            let why = set
                .last_failed_generation_error
                .as_deref()
                .unwrap_or("failed");
            let note = format!("set {name} generation {}: {why}", set.desired_generation);
            out.push(events::SET_FAILED.event(&note));
        }
    }
    out.extend(policy_events(status, seen));
    // Once per warning: unsized images or an unreadable mirror configuration, said again only
    // when it changes.
    if let Some(warning) = status
        .sizing
        .as_ref()
        .filter(|w| seen.sizing.as_ref() != Some(*w))
    {
        out.push(events::SIZING_INCOMPLETE.event(warning));
    }
    *seen = Seen::of(status);
    if let Some(drift) = &status.pin_drift {
        out.push(events::PINS_REPAIRED.event(drift));
    }
    if !status.policy_fallbacks.is_empty() {
        let note = status.policy_fallbacks.join("; ");
        out.push(events::NODE_POLICY_FALLBACK.event(&note));
    }
    out
}

/// A node policy refused (`PolicyRejected`, once per refusal) or swapped in (`PolicySwapped`).
fn policy_events(status: &NodeStatus, seen: &Seen) -> Vec<kube::runtime::events::Event> {
    let mut out = Vec::new();
    // Once per cause: a module refused again for the same reason is not announced again; a
    // registry away is said as such, not as a refusal, once per cause too.
    let new_cause = |now: &Option<String>, before: &Option<String>| {
        now.as_ref()
            .filter(|w| before.as_ref() != Some(*w))
            .cloned()
    };
    if let Some(why) = new_cause(&status.policy_refused, &seen.refused) {
        out.push(events::POLICY_REJECTED.event(&why));
    }
    if let Some(why) = new_cause(&status.policy_waiting, &seen.waiting) {
        out.push(events::POLICY_WAITING.event(&why));
    }
    let running = status.policy.as_ref();
    if let Some(p) = running.filter(|p| seen.policy.as_ref().is_some_and(|d| *d != p.digest)) {
        let note = format!(
            "deciding with {} ({} {}, {})",
            p.module, p.name, p.version, p.digest
        );
        out.push(events::POLICY_SWAPPED.event(&note));
    }
    out
}

/// What the agent last wrote, so unchanged status is not written again.
#[derive(Default)]
pub(super) struct Published {
    pub(super) spec: Option<PublishedSpec>,
    pub(super) status: Option<MachineConfigNodeStatus>,
    pub(super) conditions: Vec<Condition>,
}

/// What the MachineConfigNode's spec and owner were last written with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PublishedSpec {
    /// The node's primary pool.
    pub(super) pool: Option<String>,
    /// The uid of the Node that owns the MachineConfigNode.
    pub(super) owner: Option<String>,
}

/// Publish progress while the reconcile runs (at most once per `publish_interval`). Returns what
/// it wrote last.
pub(super) async fn publish_progress(
    mut rx: UnboundedReceiver<Event>,
    mut preview: NodeStatus,
    desired: &Desired,
    api: &Api<MachineConfigNode>,
    config: &AgentConfig,
    metrics: &Metrics,
) -> Published {
    let mut published = Published::default();
    let mut dirty = true;
    let mut next = Instant::now();
    loop {
        let deadline = tokio::time::Instant::from_std(next);
        tokio::select! {
            event = rx.recv() => match event {
                None => return published,
                Some(Event::Planned { bytes, present, pulls }) => {
                    preview.start(desired, Progress {
                        images_done: present,
                        images_total: desired.images.len() as u64,
                        bytes_done: 0,
                        bytes_total: bytes,
                    });
                    preview.progressing = Some(format!("pulling {pulls} image(s) of {} set(s)", desired.sets.len()));
                    dirty = true;
                }
                Some(Event::Pulled { bytes, .. }) => {
                    preview.advance(1, bytes.unwrap_or(0));
                    dirty = true;
                }
                Some(_) => {}
            },
            _ = tokio::time::sleep_until(deadline), if dirty => {
                if let Err(e) = write_status(api, &config.node_name, &mut published, &preview, metrics).await {
                    match crate::forbidden::refusal(&e) {
                        Some(why) => tracing::warn!(error = %why, "progress not published; retrying with backoff"),
                        None => tracing::warn!(error = %e, "progress not published"),
                    }
                }
                dirty = false;
                next = Instant::now() + config.publish_interval;
            }
        }
    }
}

pub(super) fn set_status(s: NodeSetStatus) -> SetStatus {
    SetStatus {
        name: s.name,
        desired_generation: s.desired_generation,
        current_generation: s.current_generation,
        last_failed_generation: s.last_failed_generation,
        last_failed_generation_error: s.last_failed_generation_error,
    }
}

/// The reason of the Progressing condition while sets wait for a rollout grant.
pub const REASON_WAITING: &str = "WaitingForRolloutGrant";

/// Progressing, Degraded and PolicyFallback for `status`.
fn conditions(status: &NodeStatus, previous: &[Condition]) -> Vec<Condition> {
    let (progressing, reason) = match &status.progressing {
        Some(p) => (Some(p.clone()), "ImagePrefetch"),
        None if !status.waiting.is_empty() => (
            Some(pinset_core::rollout::waiting_message(&status.waiting)),
            REASON_WAITING,
        ),
        None => (None, "AsExpected"),
    };
    vec![
        condition::make(
            previous,
            CONDITION_PROGRESSING,
            progressing.is_some(),
            reason,
            &progressing.unwrap_or_else(|| {
                if status.degraded.is_some() {
                    "not progressing: see PinnedImageSetsDegraded".into()
                } else {
                    let mut done = format!("all {} set(s) pulled and pinned", status.sets.len());
                    if let Some(drift) = &status.pin_drift {
                        done = format!("{done}; {}", cap(drift, 1024));
                    }
                    if let Some(sizing) = &status.sizing {
                        done = format!("{done}; sizing: {}", cap(sizing, 1024));
                    }
                    if let Some(forbidden) = &status.forbidden {
                        done = format!("{done}; {}", cap(forbidden, 1024));
                    }
                    done
                }
            }),
            None,
        ),
        condition::make(
            previous,
            CONDITION_DEGRADED,
            status.degraded.is_some(),
            if status.degraded.is_some() {
                "PrefetchFailed"
            } else {
                "AsExpected"
            },
            &cap(status.degraded.as_deref().unwrap_or(""), MAX_MESSAGE_CHARS),
            None,
        ),
        policy_condition(status, previous),
    ]
}

/// PolicyFallback: True when a decision was answered by the reference, or the pool's module was
/// refused (reason `PolicyRefused`, said first: every decision of the node is then the default's).
/// An RFC 3339 time of the status model; now when it does not parse.
fn time(rfc3339: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        rfc3339
            .parse()
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now()),
    )
}

fn policy_condition(status: &NodeStatus, previous: &[Condition]) -> Condition {
    let said: Vec<&str> = status
        .policy_refused
        .iter()
        .chain(&status.policy_fallbacks)
        .map(String::as_str)
        .collect();
    let (reason, message) = match (&status.policy_refused, said.is_empty()) {
        (Some(_), _) => (crate::api::REASON_POLICY_REFUSED, said.join("; ")),
        (None, false) => ("PolicyFailed", said.join("; ")),
        // No fallback: the node keeps its module while the registry is away.
        (None, true) => match &status.policy_waiting {
            Some(waiting) => ("WaitingForRegistry", waiting.clone()),
            None => ("AsExpected", String::new()),
        },
    };
    condition::make(
        previous,
        CONDITION_POLICY_FALLBACK,
        !said.is_empty(),
        reason,
        &cap(&message, MAX_MESSAGE_CHARS),
        None,
    )
}

/// The MachineConfigNode status for `status`; conditions keep their transition times.
pub fn node_status(status: &NodeStatus, previous: &[Condition]) -> MachineConfigNodeStatus {
    let p = status.progress;
    let conditions = conditions(status, previous);
    let per_set = (SET_ERRORS_BUDGET / status.sets.len().max(1)).min(MAX_ERROR_CHARS);
    MachineConfigNodeStatus {
        node_state: status.node_ready.map(|ready| NodeState {
            ready,
            labels: status.node_labels.clone(),
        }),
        conditions,
        policy: status.policy.as_ref().map(|p| crate::api::NodePolicy {
            name: cap(&p.name, 256),
            version: cap(&p.version, 256),
            digest: p.digest.clone(),
            module_digest: Some(p.module_digest.clone()),
            module: cap(&p.module, 1024),
            since: time(&p.since),
            probation: p.probation,
        }),
        policy_rejected: status
            .policy_rejected
            .as_ref()
            .map(|r| crate::api::RejectedNodePolicy {
                module: cap(&r.module, 1024),
                reason: cap(&r.reason, 64),
                cause: cap(&r.cause, 4096),
                since: time(&r.since),
            }),
        pinned_image_sets: status
            .sets
            .values()
            .map(|s| node_set_status(s, per_set))
            .collect(),
        pinned_image_progress: Some(NodeProgress {
            images_done: p.images_done,
            images_total: p.images_total,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            summary: format!(
                "{}/{} ({}/{})",
                p.images_done,
                p.images_total,
                fmt_bytes(p.bytes_done),
                fmt_bytes(p.bytes_total)
            ),
        }),
        // OpenShift's daemon's fields are not the agent's to write (server-side apply leaves
        // them).
        ..Default::default()
    }
}

/// One set's status on the node, its error capped at `max_error` characters.
fn node_set_status(s: &SetStatus, max_error: usize) -> NodeSetStatus {
    NodeSetStatus {
        name: s.name.clone(),
        desired_generation: s.desired_generation.max(1),
        current_generation: s.current_generation,
        last_failed_generation: s.last_failed_generation,
        last_failed_generation_error: s.last_failed_generation.map(|_| {
            let error = s.last_failed_generation_error.as_deref();
            cap(error.unwrap_or_default(), max_error)
        }),
    }
}

/// Characters of condition messages written (the API allows 32 768).
const MAX_MESSAGE_CHARS: usize = 8192;
/// Characters all the sets' errors may take together: the status stays far below the API
/// server's ~1.5 MiB object limit however many sets a node has (each set's error at most
/// `MAX_ERROR_CHARS`, less when many sets failed).
const SET_ERRORS_BUDGET: usize = 256 << 10;

/// Same status, transition times aside.
fn same_status(a: &MachineConfigNodeStatus, b: &MachineConfigNodeStatus) -> bool {
    a.pinned_image_sets == b.pinned_image_sets
        && a.pinned_image_progress == b.pinned_image_progress
        && a.node_state == b.node_state
        && a.policy == b.policy
        && a.policy_rejected == b.policy_rejected
        && a.conditions.len() == b.conditions.len()
        && a.conditions
            .iter()
            .zip(&b.conditions)
            .all(|(x, y)| condition::same(x, y))
}

pub(super) async fn write_status(
    api: &Api<MachineConfigNode>,
    name: &str,
    published: &mut Published,
    status: &NodeStatus,
    metrics: &Metrics,
) -> Result<(), AgentError> {
    let st = node_status(status, &published.conditions);
    if published
        .status
        .as_ref()
        .is_some_and(|p| same_status(p, &st))
    {
        return Ok(());
    }
    apply_node(
        api,
        name,
        "status",
        serde_json::to_value(&st).expect("status serializes"),
    )
    .await?;
    metrics.count_api_write("node_status");
    published.conditions = st.conditions.clone();
    published.status = Some(st);
    Ok(())
}

/// Server-side apply of one part (`spec` or `status`) of the node's MachineConfigNode, as
/// pinset's agent (its own field manager: other writers' fields are left alone).
pub(super) async fn apply_node(
    api: &Api<MachineConfigNode>,
    name: &str,
    part: &'static str,
    value: serde_json::Value,
) -> Result<(), AgentError> {
    crate::apply::node_part(api, name, FIELD_MANAGER, part, value)
        .await
        .map_err(|source| AgentError::Write {
            node: name.into(),
            what: part,
            source,
        })
}

/// Server-side apply of the node's MachineConfigNode spec, with the Node of uid `owner` as its
/// owner when known ([`crate::apply::node_owner`]).
pub(super) async fn apply_spec(
    api: &Api<MachineConfigNode>,
    name: &str,
    spec: serde_json::Value,
    owner: Option<&str>,
) -> Result<(), AgentError> {
    let owners: Vec<_> = owner
        .map(|uid| crate::apply::node_owner(name, uid))
        .into_iter()
        .collect();
    crate::apply::node_spec(api, name, FIELD_MANAGER, spec, &owners)
        .await
        .map_err(|source| AgentError::Write {
            node: name.into(),
            what: "spec",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(sets: &[(&str, i64)]) -> Desired {
        Desired {
            sets: sets
                .iter()
                .map(|(n, g)| pinset_core::desired::DesiredSet {
                    name: n.to_string(),
                    generation: *g,
                    images: vec![],
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_at_work_is_progressing_and_never_degraded_for_taking_time() {
        let mut st = NodeStatus::default();
        st.start(
            &desired(&[("a", 1)]),
            Progress {
                images_total: 760,
                bytes_total: 1 << 40,
                ..Default::default()
            },
        );
        st.advance(100, 1 << 30);
        let s = node_status(&st, &[]);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(get(CONDITION_PROGRESSING).status, "True");
        assert_eq!(get(CONDITION_PROGRESSING).reason, "ImagePrefetch");
        assert_eq!(get(CONDITION_DEGRADED).status, "False");
        assert_eq!(get(CONDITION_POLICY_FALLBACK).status, "False");
        let p = s.pinned_image_progress.unwrap();
        assert_eq!((p.images_done, p.images_total), (100, 760));
        assert_eq!(p.summary, "100/760 (1.0 GiB/1.0 TiB)");
        assert_eq!(s.pinned_image_sets[0].desired_generation, 1);
        assert_eq!(s.pinned_image_sets[0].current_generation, None);
    }

    #[test]
    fn failures_name_the_images_and_fallbacks_show() {
        let mut st = NodeStatus::default();
        st.start(&desired(&[("a", 2)]), Progress::default());
        st.fail("a", 2, "1 image(s) missing: q.io/x@sha256:00: not found");
        st.policy_fallbacks = vec!["order: trap".into()];
        st.finish(Some(
            "PinnedImageSet a: 1 image(s) missing: q.io/x@sha256:00: not found".into(),
        ));
        let s = node_status(&st, &[]);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(get(CONDITION_PROGRESSING).status, "False");
        let d = get(CONDITION_DEGRADED);
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "PrefetchFailed")
        );
        assert!(d.message.contains("q.io/x@sha256:00"));
        assert_eq!(get(CONDITION_POLICY_FALLBACK).message, "order: trap");
        let set = &s.pinned_image_sets[0];
        assert_eq!(set.last_failed_generation, Some(2));
        assert!(
            set.last_failed_generation_error
                .as_ref()
                .unwrap()
                .contains("not found")
        );
        // Unchanged status compares equal even with fresh transition times.
        assert!(same_status(&s, &node_status(&st, &s.conditions)));
    }

    #[test]
    fn a_refused_module_is_said_first_with_its_reason_and_announced_once() {
        let mut st = NodeStatus {
            policy_refused: Some(
                "policy of pool infra: oci://r/p@sha256:1: no cosign signature".into(),
            ),
            policy_fallbacks: vec!["order: trap".into()],
            ..Default::default()
        };
        let s = node_status(&st, &[]);
        let c = crate::condition::find(&s.conditions, CONDITION_POLICY_FALLBACK).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "PolicyRefused")
        );
        assert!(
            c.message.starts_with("policy of pool infra") && c.message.ends_with("order: trap"),
            "{c:?}"
        );
        let mut seen = Seen::default();
        let reasons = |e: Vec<kube::runtime::events::Event>| -> Vec<String> {
            e.into_iter().map(|e| e.reason).collect()
        };
        assert_eq!(
            reasons(events(&st, &mut seen)),
            ["PolicyRejected", "PolicyFallback"]
        );
        assert_eq!(
            reasons(events(&st, &mut seen)),
            ["PolicyFallback"],
            "the refusal is said once"
        );
        // A swap is announced once, not at the first status the agent reads.
        st.policy_fallbacks.clear();
        st.policy = Some(pinset_core::status::RunningPolicy {
            digest: "sha256:1".into(),
            ..Default::default()
        });
        assert!(reasons(events(&st, &mut seen)).is_empty());
        st.policy.as_mut().unwrap().digest = "sha256:2".into();
        assert_eq!(reasons(events(&st, &mut seen)), ["PolicySwapped"]);
        assert!(reasons(events(&st, &mut seen)).is_empty());
    }

    #[test]
    fn a_swapped_or_refused_policy_is_a_status_to_write() {
        let mut st = NodeStatus {
            policy: Some(pinset_core::status::RunningPolicy {
                digest: "sha256:1".into(),
                since: "2026-12-03T00:00:00Z".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let before = node_status(&st, &[]);
        assert!(same_status(&before, &node_status(&st, &[])));
        st.policy.as_mut().unwrap().digest = "sha256:2".into();
        assert!(!same_status(&before, &node_status(&st, &[])), "a swap");
        let swapped = node_status(&st, &[]);
        st.policy_rejected = Some(pinset_core::status::RejectedPolicy {
            module: "oci://r/p@sha256:3".into(),
            reason: "SmokeTestFailed".into(),
            cause: "smoke test".into(),
            since: "2026-12-03T00:00:01Z".into(),
        });
        assert!(!same_status(&swapped, &node_status(&st, &[])), "a refusal");
    }

    #[test]
    fn repaired_pins_and_fallbacks_are_events_and_a_quiet_run_is_none() {
        let mut st = NodeStatus::default();
        let mut seen = Seen::default();
        assert!(events(&st, &mut seen).is_empty());
        st.pin_drift = Some("repaired 1 lost pin(s) (1 pin-removed): pin-removed: q.io/x".into());
        st.policy_fallbacks = vec!["x".repeat(5000)];
        let e = events(&st, &mut seen);
        assert_eq!(
            e.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            vec!["PinsRepaired", "PolicyFallback"]
        );
        assert!(
            e[0].note
                .as_deref()
                .unwrap()
                .contains("pin-removed: q.io/x")
        );
        assert!(e[1].note.as_deref().unwrap().chars().count() <= 1024);
    }

    fn progressing(st: &NodeStatus) -> Condition {
        let mut all = conditions(st, &[]).into_iter();
        all.find(|c| c.type_ == CONDITION_PROGRESSING).unwrap()
    }

    #[test]
    fn a_sizing_warning_is_an_event_once_and_on_the_progressing_condition() {
        let mut st = NodeStatus::default();
        let mut seen = Seen::default();
        st.sizing = Some("registry quay.io: 40 image(s) left unsized: unreachable".into());
        let reasons = |e: Vec<kube::runtime::events::Event>| {
            e.into_iter().map(|e| e.reason).collect::<Vec<_>>()
        };
        assert_eq!(reasons(events(&st, &mut seen)), ["SizingIncomplete"]);
        assert!(reasons(events(&st, &mut seen)).is_empty(), "said once");
        let progressing = progressing(&st);
        assert!(
            progressing
                .message
                .ends_with("; sizing: registry quay.io: 40 image(s) left unsized: unreachable"),
            "{}",
            progressing.message
        );
        st.sizing =
            Some("mirror configuration not used: /etc/containers/registries.conf:3: x".into());
        assert_eq!(
            reasons(events(&st, &mut seen)),
            ["SizingIncomplete"],
            "a new warning is said"
        );
        st.sizing = None;
        assert!(reasons(events(&st, &mut seen)).is_empty());
    }

    #[test]
    fn a_refused_right_is_said_on_the_progressing_condition() {
        let st = NodeStatus {
            forbidden: Some("forbidden: u may not create events (events.k8s.io); grant it".into()),
            ..Default::default()
        };
        let progressing = progressing(&st);
        assert!(
            progressing
                .message
                .ends_with("; forbidden: u may not create events (events.k8s.io); grant it"),
            "{}",
            progressing.message
        );
    }

    #[test]
    fn a_set_is_announced_pinned_or_failed_once_per_generation() {
        let set = |current, failed| SetStatus {
            name: "a".into(),
            desired_generation: 2,
            current_generation: current,
            last_failed_generation: failed,
            last_failed_generation_error: failed.map(|_| "q.io/x: not found".into()),
        };
        let mut st = NodeStatus::default();
        let reasons = |st: &NodeStatus, seen: &mut Seen| -> Vec<String> {
            events(st, seen).into_iter().map(|e| e.reason).collect()
        };
        // Restarted with the set already pinned: nothing to announce.
        st.sets.insert("a".into(), set(Some(2), None));
        let mut seen = Seen::of(&st);
        assert!(reasons(&st, &mut seen).is_empty());
        st.sets.insert("a".into(), set(Some(1), Some(2)));
        let mut seen = Seen::of(&NodeStatus::default());
        assert_eq!(reasons(&st, &mut seen), ["SetFailed"]);
        assert!(
            reasons(&st, &mut seen).is_empty(),
            "a resync says nothing again"
        );
        st.sets.insert("a".into(), set(Some(2), Some(2)));
        assert_eq!(reasons(&st, &mut seen), ["SetPinned"]);
        assert!(reasons(&st, &mut seen).is_empty());
    }

    #[test]
    fn the_status_stays_small_however_many_sets_fail_with_long_errors() {
        let names: Vec<(String, i64)> = (0..100).map(|n| (format!("set-{n:03}"), 1)).collect();
        let refs: Vec<(&str, i64)> = names.iter().map(|(n, g)| (n.as_str(), *g)).collect();
        let mut st = NodeStatus::default();
        st.start(&desired(&refs), Progress::default());
        for (name, _) in &names {
            st.fail(name, 1, &format!("{name}: {}", "x".repeat(40_000)));
        }
        st.finish(Some("y".repeat(1 << 20)));
        let s = node_status(&st, &[]);
        let bytes = serde_json::to_vec(&s).unwrap().len();
        assert!(bytes < 300 << 10, "{bytes} bytes");
        for set in &s.pinned_image_sets {
            let e = set.last_failed_generation_error.as_ref().unwrap();
            assert!(
                e.starts_with(&set.name) && e.ends_with("more characters)"),
                "{e:.80}"
            );
        }
        let degraded = s
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED)
            .unwrap();
        assert!(degraded.message.chars().count() <= MAX_MESSAGE_CHARS);
    }
}
