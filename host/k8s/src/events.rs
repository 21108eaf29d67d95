//! Kubernetes Events (events.k8s.io/v1) on pinset's objects: what the agent and the controller
//! want an operator to see in `kubectl describe` and `kubectl get events`. Recording an Event is
//! best effort: a failure is logged at debug and never stops the work.

use kube::Resource;
use kube::runtime::events::{Event, Recorder, Reporter};

/// Record `events` about the cluster-scoped object `obj` as `controller` (`instance`: the
/// node of an agent). A refusal for lack of rights is said (warn) and returned; any other
/// failure costs a debug line (an API server without Events).
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
                None => {
                    tracing::debug!(error = %e, reason = %event.reason, object = name, "event not recorded")
                }
            }
        }
    }
    refused
}
