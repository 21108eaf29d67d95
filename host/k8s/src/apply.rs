//! Server-side apply of one part of a MachineConfigNode, by one field manager: the agent owns
//! `spec.node`, `spec.pool` and the status, the controller owns `spec.rolloutGrant`; neither
//! touches the other's fields.

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
    let body = json!({
        "apiVersion": MachineConfigNode::api_version(&()),
        "kind": MachineConfigNode::kind(&()),
        "metadata": {"name": name},
        part: value,
    });
    let params = PatchParams::apply(manager).force();
    let result = if part == "status" {
        api.patch_status(name, &params, &Patch::Apply(&body)).await
    } else {
        api.patch(name, &params, &Patch::Apply(&body)).await
    };
    result.map(drop)
}
