//! Server-side apply of one part of a MachineConfigNode, by one field manager: the agent owns
//! `spec.node`, `spec.pool`, its owner reference to the Node and the status, the controller owns
//! `spec.rolloutGrant`; neither touches the other's fields.

use crate::api::MachineConfigNode;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Apply `value` as the `part` (`spec` or `status`) of MachineConfigNode `name`, as `manager`.
pub async fn node_part(
    api: &Api<MachineConfigNode>,
    name: &str,
    manager: &str,
    part: &str,
    value: serde_json::Value,
) -> Result<(), kube::Error> {
    send(api, name, manager, part, &object(name, part, value)).await
}

/// Apply `spec` as the spec of MachineConfigNode `name` with `owners` as its owner references,
/// as `manager`: the references it applied before and leaves out now are removed (they are a
/// list keyed by uid), those of other managers stay.
pub async fn node_spec(
    api: &Api<MachineConfigNode>,
    name: &str,
    manager: &str,
    spec: serde_json::Value,
    owners: &[serde_json::Value],
) -> Result<(), kube::Error> {
    let mut body = object(name, "spec", spec);
    if !owners.is_empty() {
        body["metadata"]["ownerReferences"] = json!(owners);
    }
    send(api, name, manager, "spec", &body).await
}

/// The owner reference a MachineConfigNode gives its Node `node` (uid `uid`), as OpenShift's
/// do: the garbage collector deletes it once the Node is gone. It blocks no deletion of the
/// Node (which would need the right to update the Node's finalizers).
pub fn node_owner(node: &str, uid: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid})
}

/// MachineConfigNode `name` with only `part` set to `value`: what one writer applies.
fn object(name: &str, part: &str, value: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": MachineConfigNode::api_version(&()),
        "kind": MachineConfigNode::kind(&()),
        "metadata": {"name": name},
        part: value,
    })
}

async fn send(
    api: &Api<MachineConfigNode>,
    name: &str,
    manager: &str,
    part: &str,
    body: &serde_json::Value,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(manager).force();
    let result = if part == "status" {
        api.patch_status(name, &params, &Patch::Apply(body)).await
    } else {
        api.patch(name, &params, &Patch::Apply(body)).await
    };
    result.map(drop)
}
