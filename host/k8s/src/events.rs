//! Kubernetes Events (events.k8s.io/v1) on pinset's objects: what the agent and the controller
//! want an operator to see in `kubectl describe` and `kubectl get events`. Recording an Event is
//! best effort: a failure never stops the work, and is logged as a warning once per kind of
//! failure (a refusal for lack of rights, an API server without Events, an outage…), later
//! ones of that kind at debug.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// One kind of Event pinset records: the one place its reason, type and action are written
/// (`pinset reference events` prints them all: docs/reference/events.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub reason: &'static str,
    pub warning: bool,
    pub action: &'static str,
    /// The object it regards (its `regarding`).
    pub regarding: &'static str,
    /// When it is recorded, and how often.
    pub when: &'static str,
}

impl Kind {
    /// This Event, its note capped at 1 KiB.
    pub fn event(&self, note: &str) -> Event {
        Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.into(),
            note: Some(pinset_core::status::cap(note, 1024)),
            action: self.action.into(),
            secondary: None,
        }
    }
}

const NODE: &str = "MachineConfigNode";
const POOL: &str = "MachineConfigPool";

pub const SET_PINNED: Kind = Kind {
    reason: "SetPinned",
    warning: false,
    action: "Pin",
    regarding: NODE,
    when: "a set reached its generation on the node, pulled and pinned; once per generation",
};
pub const SET_FAILED: Kind = Kind {
    reason: "SetFailed",
    warning: true,
    action: "Pull",
    regarding: NODE,
    when: "a set's generation failed on the node (the error); once per failed generation",
};
pub const SIZING_INCOMPLETE: Kind = Kind {
    reason: "SizingIncomplete",
    warning: true,
    action: "Size",
    regarding: NODE,
    when: "images left unsized (a dark registry, an unreadable mirror configuration); again only when it changes",
};
pub const PINS_REPAIRED: Kind = Kind {
    reason: "PinsRepaired",
    warning: true,
    action: "Repair",
    regarding: NODE,
    when: "pins found lost behind pinset's back (an image deleted, a pin or the drop-in removed or edited) and repaired",
};
pub const NODE_POLICY_FALLBACK: Kind = Kind {
    reason: "PolicyFallback",
    warning: true,
    action: "Decide",
    regarding: NODE,
    when: "the node policy failed a decision and the built-in reference policy answered it",
};
pub const POLICY_REJECTED: Kind = Kind {
    reason: "PolicyRejected",
    warning: true,
    action: "Swap",
    regarding: NODE,
    when: "the node refused to swap to the configured module (signature, digest, smoke test, a failed first reconcile); once per cause",
};
pub const POLICY_WAITING: Kind = Kind {
    reason: "PolicyWaiting",
    warning: false,
    action: "Swap",
    regarding: NODE,
    when: "the configured module's registry is away: the node keeps its module and asks again; once per cause",
};
pub const POLICY_SWAPPED: Kind = Kind {
    reason: "PolicySwapped",
    warning: false,
    action: "Swap",
    regarding: NODE,
    when: "the node decides with another module (which, its name, version and digest)",
};
pub const STARTUP_TAINT_LIFTED: Kind = Kind {
    reason: "StartupTaintLifted",
    warning: false,
    action: "Untaint",
    regarding: NODE,
    when: "the agent lifted the node's startup taint (`--startup-taint`): every set pinned, or the deadline passed (what was missing)",
};
pub const ROLLOUT_WAVE: Kind = Kind {
    reason: "RolloutWave",
    warning: false,
    action: "Grant",
    regarding: POOL,
    when: "the fleet policy granted nodes of the pool (a canary or a wave): which, and why",
};
pub const ROLLOUT_HELD: Kind = Kind {
    reason: "RolloutHeld",
    warning: true,
    action: "Hold",
    regarding: POOL,
    when: "the fleet policy holds the pool's rollout (the default: a failed canary)",
};
pub const POOL_POLICY_FALLBACK: Kind = Kind {
    reason: "PolicyFallback",
    warning: true,
    action: "Grant",
    regarding: POOL,
    when: "the fleet policy failed or was refused and the default fleet policy decided",
};
pub const POLICY_ROLLED_OUT: Kind = Kind {
    reason: "PolicyRolledOut",
    warning: false,
    action: "Rollout",
    regarding: POOL,
    when: "every node of the pool decides with the node policy its target names; once per module",
};
pub const ROLLOUT_PAUSED: Kind = Kind {
    reason: "RolloutPaused",
    warning: false,
    action: "Pause",
    regarding: POOL,
    when: "the pool's rollout was paused (pinset.io/rollout-paused): no node is granted",
};
pub const ROLLOUT_RESUMED: Kind = Kind {
    reason: "RolloutResumed",
    warning: false,
    action: "Resume",
    regarding: POOL,
    when: "the pause was lifted: the fleet policy grants again",
};
pub const POOL_DEGRADED: Kind = Kind {
    reason: "PoolDegraded",
    warning: true,
    action: "Aggregate",
    regarding: POOL,
    when: "the pool turned Degraded (why); once per turn",
};

/// Every kind of Event pinset records, node first, then pool.
pub const ALL: &[Kind] = &[
    SET_PINNED,
    SET_FAILED,
    SIZING_INCOMPLETE,
    PINS_REPAIRED,
    NODE_POLICY_FALLBACK,
    POLICY_REJECTED,
    POLICY_WAITING,
    POLICY_SWAPPED,
    STARTUP_TAINT_LIFTED,
    ROLLOUT_WAVE,
    ROLLOUT_HELD,
    POOL_POLICY_FALLBACK,
    POLICY_ROLLED_OUT,
    ROLLOUT_PAUSED,
    ROLLOUT_RESUMED,
    POOL_DEGRADED,
];

/// Record `events` about the cluster-scoped object `obj` as `controller` (`instance`: the
/// node of an agent). A refusal for lack of rights is said (warn) and returned; any other
/// failure is warned once per kind ([`first_of_its_kind`]), then costs a debug line.
pub async fn record<K>(
    client: kube::Client,
    controller: &str,
    instance: Option<String>,
    name: &str,
    events: &[Event],
) -> Option<String>
where
    K: Resource<DynamicType = ()>,
{
    if events.is_empty() {
        return None;
    }
    let reporter = Reporter {
        controller: controller.into(),
        instance,
    };
    let recorder = Recorder::new(client, reporter);
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(K::api_version(&()).into()),
        kind: Some(K::kind(&()).into()),
        name: Some(name.into()),
        ..Default::default()
    };
    let mut refused = None;
    for event in events {
        if let Err(e) = recorder.publish(event, &reference).await {
            match crate::forbidden::refusal(&e) {
                Some(why) => {
                    tracing::warn!(error = %why, reason = %event.reason, object = name, "event not recorded");
                    refused = Some(why);
                }
                None if first_of_its_kind(&e) => {
                    tracing::warn!(error = %e, reason = %event.reason, object = name, "event not recorded (further failures of this kind are logged at debug)")
                }
                None => {
                    tracing::debug!(error = %e, reason = %event.reason, object = name, "event not recorded")
                }
            }
        }
    }
    refused
}

/// Whether `error` is the first Event failure of its kind in this process: an API answer by
/// its code and reason, anything else by its variant. At most [`KINDS`] kinds are remembered.
fn first_of_its_kind(error: &kube::Error) -> bool {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let kind = match error {
        kube::Error::Api(e) => format!("{} {}", e.code, e.reason),
        other => format!("{other:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect(),
    };
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .expect("event failures");
    seen.len() < KINDS && seen.insert(kind)
}

/// Kinds of Event failure remembered (a warning each).
const KINDS: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_failure_is_warned_once() {
        let api = |code: u16, reason: &str| {
            kube::Error::Api(
                kube::core::Status::failure("no", reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(first_of_its_kind(&api(404, "NotFound")));
        assert!(!first_of_its_kind(&api(404, "NotFound")));
        assert!(first_of_its_kind(&api(500, "InternalError")));
        let transport = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert!(first_of_its_kind(&transport));
        assert!(!first_of_its_kind(
            &kube::Error::LinesCodecMaxLineLengthExceeded
        ));
    }
}
