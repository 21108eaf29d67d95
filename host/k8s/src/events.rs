//! Kubernetes Events (events.k8s.io/v1) on pinset's objects: what the agent and the controller
//! want an operator to see in `kubectl describe` and `kubectl get events`. Recording an Event is
//! best effort: a failure never stops the work, and is logged as a warning once per kind of
//! failure (a refusal for lack of rights, an API server without Events, an outage…), later
//! ones of that kind at debug.

use kube::Resource;
use kube::runtime::events::{Event, Recorder, Reporter};

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
