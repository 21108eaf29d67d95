//! The Kubernetes API pinset serves and reads, in the group `machineconfiguration.openshift.io` so
//! that objects written for the reference system apply unchanged. Every field of OpenShift's v1
//! PinnedImageSet, MachineConfigPool and MachineConfigNode that a user or another controller may
//! write is in the schema — served, so kept rather than pruned — even where pinset does not use
//! it; pinset writes only its own fields (status by server-side apply or merge patch), so the
//! others are never touched. Every CEL rule carries a message.
//!
//! One kind is pinset's own, in `pinset.io`: [`PolicyConfiguration`], the node policy of each
//! pool (cluster-scoped, one object named `cluster`).
//!
//! Validation lives in the CRD schema, so the API server itself refuses bad input: digest-only
//! image names, 1..500 unique images per set, bounded names, and the generation rules of the
//! node status (including "generations never decrease" as transition rules).

// Several `printcolumn(...)` attributes repeat the same keys by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "machineconfiguration.openshift.io";
/// The synchronizer type pinset reports in a pool's `poolSynchronizersStatus`.
pub const SYNCHRONIZER: &str = "PinnedImageSets";
pub const CONDITION_PROGRESSING: &str = "PinnedImageSetsProgressing";
pub const CONDITION_DEGRADED: &str = "PinnedImageSetsDegraded";
/// pinset's addition: a policy decision was answered by the built-in reference policy.
pub const CONDITION_POLICY_FALLBACK: &str = "PinnedImageSetsPolicyFallback";
/// The reason of a node's PolicyFallback condition when its pool's module was refused (not
/// fetched, verified or loaded); the controller gathers these into the pool's condition.
pub const REASON_POLICY_REFUSED: &str = "PolicyRefused";

/// Images that must be present and pinned on the nodes of every pool whose
/// `machineConfigSelector` matches the set's labels.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "machineconfiguration.openshift.io",
    version = "v1",
    kind = "PinnedImageSet",
    plural = "pinnedimagesets",
    singular = "pinnedimageset",
    shortname = "pis",
    status = "PinnedImageSetStatus",
    doc = "Container images, by digest, to pre-pull and pin on the nodes of the pools whose machineConfigSelector matches this set's labels",
    printcolumn(
        name = "Images",
        type_ = "integer",
        json_path = ".status.imageCount",
        description = "Number of images in the set"
    ),
    printcolumn(
        name = "Pools",
        type_ = "string",
        json_path = ".status.pools",
        description = "Pools that select the set"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PinnedImageSetSpec {
    /// The images, each by digest, unique by name.
    #[schemars(length(min = 1, max = 500))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pinned_images: Vec<PinnedImageRef>,
}

/// One image of a set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PinnedImageRef {
    /// Image reference by digest: `host[:port]/path@sha256:<64 lowercase hex digits>`.
    #[schemars(length(min = 1, max = 447))]
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": "self.contains('@')",
            "message": "must reference the image by digest (host[:port]/path@sha256:<64 hex digits>): tags are not allowed, because a tag can move after the image is pinned; resolve the tag to its digest"
        },
        {
            "rule": "!self.contains('@') || self.matches('^[^@]+@sha256:[a-f0-9]{64}$')",
            "message": "the digest must be sha256: followed by 64 lowercase hexadecimal digits, after a single '@'"
        },
        {
            "rule": "!self.contains('@') || self.split('@')[0].matches('^[a-zA-Z0-9][a-zA-Z0-9.-]*(:[0-9]+)?/[a-z0-9]+([._/-]+[a-z0-9]+)*$')",
            "message": "the name before '@' must be host[:port]/path with a registry host and a lowercase repository path"
        }
    ]))]
    pub name: String,
}

/// Written by the controller: how big the set is and which pools select it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedImageSetStatus {
    #[serde(default)]
    pub image_count: u32,
    /// Names of the pools whose `spec.pinnedImageSets` lists this set, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// OpenShift's: conditions another controller may write. Kept; pinset writes none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The fields of a MachineConfigPool that pinset reads and writes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "machineconfiguration.openshift.io",
    version = "v1",
    kind = "MachineConfigPool",
    plural = "machineconfigpools",
    singular = "machineconfigpool",
    shortname = "mcp",
    status = "MachineConfigPoolStatus",
    doc = "A pool of nodes and the configuration (here: PinnedImageSets) selected for them",
    printcolumn(
        name = "Sets",
        type_ = "string",
        json_path = ".spec.pinnedImageSets[*].name",
        description = "PinnedImageSets of the pool"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.poolSynchronizersStatus[?(@.poolSynchronizerType==\"PinnedImageSets\")].machineCount"
    ),
    printcolumn(
        name = "Pinned",
        type_ = "integer",
        json_path = ".status.poolSynchronizersStatus[?(@.poolSynchronizerType==\"PinnedImageSets\")].updatedMachineCount",
        description = "Nodes with every set of the pool pulled and pinned"
    ),
    printcolumn(
        name = "Granted",
        type_ = "integer",
        json_path = ".status.rollout.granted",
        description = "Nodes the fleet policy allowed to pull the target"
    ),
    printcolumn(
        name = "Pulling",
        type_ = "integer",
        json_path = ".status.rollout.pulling"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.rollout.failed"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PinnedImageSetsDegraded\")].status"
    ),
    printcolumn(
        name = "Rollout",
        type_ = "string",
        json_path = ".status.rollout.reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigPoolSpec {
    /// Selects the PinnedImageSets (and MachineConfigs) of the pool by their labels. Empty
    /// selects nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_config_selector: Option<LabelSelector>,
    /// Selects the nodes of the pool. Empty selects no node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Written by the controller: the selected sets, sorted by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pinned_image_sets: Option<Vec<SetRef>>,
    /// OpenShift's: the pool's configuration updates are stopped. Kept; pinset's own pause is
    /// the annotation `pinset.io/rollout-paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// OpenShift's: how many (or what percentage of) machines may be updating at once. Kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// OpenShift's: the rendered MachineConfig the pool targets, and its sources. Kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<PoolConfiguration>,
    /// OpenShift's (OSStreams): the OS image stream of the pool. Kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_image_stream: Option<NameRef>,
}

/// A MachineConfigPool's `configuration`: a reference to the rendered MachineConfig (the fields
/// of an ObjectReference) and the MachineConfigs it was rendered from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source: Vec<k8s_openapi::api::core::v1::ObjectReference>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SetRef {
    /// A PinnedImageSet's name: a DNS subdomain (RFC 1123), as OpenShift requires.
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9]))*$"
        )
    )]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigPoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["poolSynchronizerType"]))]
    pub pool_synchronizers_status: Vec<PoolSynchronizerStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// pinset's addition: the fleet rollout of the pool's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<PoolRollout>,
    /// pinset's addition: how many nodes run each node policy module, most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub policies: Vec<PoolPolicy>,
    /// pinset's addition: what this status was computed from, so that a reader can tell
    /// whether it speaks of the change just made (`pinset rollout status` waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<PoolObserved>,
    /// OpenShift's machine-config fields, written by its controller; kept.
    #[serde(flatten)]
    pub machine_config: PoolMachineConfigStatus,
}

/// The status fields of a MachineConfigPool that OpenShift's machine-config controller writes.
/// pinset neither reads nor writes them; they are served so that they are kept.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolMachineConfigStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<PoolConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_machine_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_machine_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_machine_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_machine_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cert_expirys: Vec<CertExpiry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_image_stream: Option<NameRef>,
}

/// A certificate bundle's expiry as OpenShift reports it on a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct CertExpiry {
    pub bundle: String,
    pub subject: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Time>,
}

/// One node policy module of a pool and the number of its nodes deciding with it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolPolicy {
    /// `sha256:<64 hex digits>` of the module.
    #[schemars(length(max = 71))]
    pub digest: String,
    #[schemars(length(max = 1024))]
    pub module: String,
    #[schemars(length(max = 256))]
    pub name: String,
    #[schemars(length(max = 256))]
    pub version: String,
    pub nodes: u32,
}

/// The objects a pool's status was computed from, as `observedGeneration` says it for one
/// object: a change made after them is not in the status yet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolObserved {
    /// The pool's `metadata.generation`.
    pub generation: i64,
    /// The PolicyConfiguration the controller follows, by name (absent: it follows none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub policy_configuration: Option<String>,
    /// That PolicyConfiguration's `metadata.generation` (absent: it did not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_configuration_generation: Option<i64>,
    /// What keeps the configured node policy out of the target for now (its signature being
    /// checked); absent when the target holds it or it is refused (then the pool is Degraded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub pending: Option<String>,
}

/// Where the pool's rollout stands: node counts against the target, and the fleet policy's
/// last decision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRollout {
    /// The target: `set@generation` of every set of the pool.
    pub target: String,
    /// Nodes holding a grant for the target.
    pub granted: u32,
    /// Granted nodes working towards it.
    pub pulling: u32,
    pub done: u32,
    pub failed: u32,
    /// Nodes waiting for a grant.
    pub waiting: u32,
    /// The fleet policy that decided last.
    pub policy: String,
    #[schemars(length(max = 4096))]
    pub reason: String,
}

/// Node counts of one synchronizer of a pool. No count is negative or exceeds the pool's
/// machines, no more nodes are ready than available, and the observed generation never goes
/// back except to zero (OpenShift's rules, verdict for verdict).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.machineCount >= self.updatedMachineCount", "message": "machineCount must be greater than or equal to updatedMachineCount"},
    {"rule": "self.machineCount >= self.readyMachineCount", "message": "machineCount must be greater than or equal to readyMachineCount"},
    {"rule": "self.machineCount >= self.availableMachineCount", "message": "machineCount must be greater than or equal to availableMachineCount"},
    {"rule": "self.machineCount >= self.unavailableMachineCount", "message": "machineCount must be greater than or equal to unavailableMachineCount"},
    {"rule": "self.availableMachineCount >= self.readyMachineCount", "message": "availableMachineCount must be greater than or equal to readyMachineCount"}
]))]
pub struct PoolSynchronizerStatus {
    pub pool_synchronizer_type: String,
    /// Nodes in the pool.
    #[schemars(range(min = 0))]
    pub machine_count: i64,
    /// Nodes with every set of the pool at its current generation, pulled and pinned.
    #[schemars(range(min = 0))]
    pub updated_machine_count: i64,
    /// Updated nodes that are not degraded.
    #[schemars(range(min = 0))]
    pub ready_machine_count: i64,
    #[schemars(range(min = 0))]
    pub available_machine_count: i64,
    /// Nodes whose PinnedImageSetsDegraded condition is True.
    #[schemars(range(min = 0))]
    pub unavailable_machine_count: i64,
    /// The pool generation these counts were computed for: it never moves back, except to zero
    /// (OpenShift's rule: a synchronizer that starts over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= oldSelf || (self == 0 && oldSelf > 0)", "message": "observedGeneration must not move backwards except to zero"}
    ]))]
    pub observed_generation: Option<i64>,
}

/// One node's configuration state; pinset's agent writes the PinnedImageSet parts.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "machineconfiguration.openshift.io",
    version = "v1",
    kind = "MachineConfigNode",
    plural = "machineconfignodes",
    singular = "machineconfignode",
    shortname = "mcn",
    status = "MachineConfigNodeStatus",
    doc = "The state of one node; named like the node",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool.name"),
    printcolumn(
        name = "Images",
        type_ = "string",
        json_path = ".status.pinnedImageProgress.summary",
        description = "Images present of images wanted, and bytes pulled"
    ),
    printcolumn(
        name = "Progressing",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PinnedImageSetsProgressing\")].status"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PinnedImageSetsDegraded\")].status"
    ),
    printcolumn(
        name = "Fallback",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PinnedImageSetsPolicyFallback\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".status.policy.module",
        description = "The node policy module it decides with, as the configuration names it",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"PinnedImageSetsDegraded\")].message",
        priority = 1
    )
)]
#[kube(validation = kube::core::Rule::new("self.metadata.name == self.spec.node.name").message("a MachineConfigNode is named like its node: metadata.name must equal spec.node.name"))]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigNodeSpec {
    pub node: NameRef,
    /// The node's primary pool.
    pub pool: NameRef,
    /// Written by the controller (its own field manager): what the pool's fleet policy allows
    /// this node to pull. The agent pulls a set only up to the generation granted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_grant: Option<RolloutGrant>,
    /// OpenShift's: the MachineConfig the node is to be updated to. Kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_version: Option<DesiredConfig>,
    /// OpenShift's (ImageModeStatusReporting): the OS image the node is to boot. Kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_image: Option<DesiredImage>,
}

/// OpenShift's desired MachineConfig of a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DesiredConfig {
    #[schemars(length(max = 253))]
    pub desired: String,
}

/// OpenShift's desired OS image of a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesiredImage {
    #[schemars(length(max = 447))]
    pub desired_image: String,
}

/// OpenShift's current and desired MachineConfig of a node, as its daemon reports them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ConfigVersionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub current: Option<String>,
    #[schemars(length(max = 253))]
    pub desired: String,
}

/// OpenShift's current and desired OS image of a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigImageStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 447))]
    pub current_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 447))]
    pub desired_image: Option<String>,
}

/// A node's rollout grant: the sets and generations it may pull, and how.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutGrant {
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub sets: Vec<GrantedSet>,
    /// Pulls at once on this node, over the node policy's concurrency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_pulls: Option<u32>,
    /// The fleet policy's reason, when granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct GrantedSet {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(range(min = 1))]
    pub generation: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NameRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigNodeStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Every set of every pool of the node, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pinned_image_sets: Vec<NodeSetStatus>,
    /// pinset's addition: how far the node is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_image_progress: Option<NodeProgress>,
    /// pinset's addition: the node as its agent sees it (for the fleet policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_state: Option<NodeState>,
    /// pinset's addition: the node policy module the node decides with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<NodePolicy>,
    /// pinset's addition: the module the node last refused to swap to, and why (it kept
    /// `policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_rejected: Option<RejectedNodePolicy>,
    /// OpenShift's, written by its machine-config daemon; kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= oldSelf", "message": "observedGeneration must not decrease"}
    ]))]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_version: Option<ConfigVersionStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_image: Option<ConfigImageStatus>,
}

/// A node policy module a node refused: which, why, since when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectedNodePolicy {
    /// As the policy configuration names it.
    #[schemars(length(max = 1024))]
    pub module: String,
    /// The kind of refusal: `NotFound`, `WrongDigest`, `Unsigned`, `SignatureRefused`,
    /// `NotAPolicy`, `SmokeTestFailed` or `FellBack` (empty when written by an older agent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub reason: String,
    /// The step that refused it (fetch, signature, load, smoke test, first reconcile) and why.
    #[schemars(length(max = 4096))]
    pub cause: String,
    pub since: Time,
}

/// The node policy a node decides with: what the module says it is, its digest and source, and
/// since when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePolicy {
    #[schemars(length(max = 256))]
    pub name: String,
    #[schemars(length(max = 256))]
    pub version: String,
    /// `sha256:<64 hex digits>`: the digest the configuration names the module by (an OCI
    /// artifact's manifest digest, a file's sha256), else the sha256 of its bytes.
    #[schemars(length(max = 71))]
    pub digest: String,
    /// `sha256:<64 hex digits>` of the module's bytes (an artifact's layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 71))]
    pub module_digest: Option<String>,
    /// A file, `oci://REGISTRY/REPO@sha256:…`, or the embedded default.
    #[schemars(length(max = 1024))]
    pub module: String,
    /// When the agent started deciding with it.
    pub since: Time,
    /// Swapped in, and no reconcile with it has succeeded yet: the node does not count as done
    /// with it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probation: bool,
}

/// The node's readiness and labels, as the agent last read them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NodeState {
    pub ready: bool,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// One set on one node. Generations are at least 1 and never decrease.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.currentGeneration) || self.desiredGeneration >= self.currentGeneration",
        "message": "desiredGeneration must be greater than or equal to currentGeneration"
    },
    {
        "rule": "!has(self.lastFailedGeneration) || self.desiredGeneration >= self.lastFailedGeneration",
        "message": "desiredGeneration must be greater than or equal to lastFailedGeneration"
    },
    {
        "rule": "!has(self.lastFailedGeneration) || has(self.lastFailedGenerationError)",
        "message": "lastFailedGenerationError is required with lastFailedGeneration"
    },
    {
        "rule": "!has(oldSelf.currentGeneration) || (has(self.currentGeneration) && self.currentGeneration >= oldSelf.currentGeneration)",
        "message": "currentGeneration must not decrease"
    }
]))]
pub struct NodeSetStatus {
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9]))*$"
        )
    )]
    pub name: String,
    #[schemars(range(min = 1))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= oldSelf", "message": "desiredGeneration must not decrease"}
    ]))]
    pub desired_generation: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub current_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub last_failed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub last_failed_generation_error: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    pub images_done: u64,
    pub images_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// `images_done/images_total` and the bytes, for `kubectl get`.
    pub summary: String,
}

/// The CRDs pinset serves. PinnedImageSet is served as `v1` (stored) and `v1alpha1` (same schema,
/// so objects written for either apply unchanged).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut sets = PinnedImageSet::crd();
    let mut alpha = sets.spec.versions[0].clone();
    alpha.name = "v1alpha1".into();
    alpha.storage = false;
    sets.spec.versions.push(alpha);
    let mut crds = vec![
        sets,
        MachineConfigPool::crd(),
        MachineConfigNode::crd(),
        PolicyConfiguration::crd(),
    ];
    for crd in &mut crds {
        let (key, value) = crate::ownership::PART_OF;
        crd.metadata
            .labels
            .get_or_insert_default()
            .insert(key.into(), value.into());
    }
    crds
}

/// pinset's own API group.
pub const PINSET_GROUP: &str = "pinset.io";
/// The policy configuration the agents and the controller follow, by default.
pub const POLICY_CONFIGURATION: &str = "cluster";

/// Which node policy module each pool's nodes decide with, and the cosign public keys their
/// signatures must verify with. A change of a pool's module rolls out to its nodes canary-first
/// (`pinset rollout status POOL` follows it); each node checks the module before it swaps.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "pinset.io",
    version = "v1alpha1",
    kind = "PolicyConfiguration",
    plural = "policyconfigurations",
    singular = "policyconfiguration",
    shortname = "pinsetpolicy",
    doc = "The node policy module of each pool and the keys its signature must verify with; pinset follows the object named cluster"
)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Every pool's module must carry a cosign signature by one of these keys (unless the pool
    /// names its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
    /// The module of each pool, by pool name; pools not listed decide with the embedded default.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 256))]
    pub pools: std::collections::BTreeMap<String, ModuleRef>,
    /// The controller's fleet policy (`pinset:fleet/rollout`), over its `--fleet-policy` flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetConfig>,
}

/// The fleet policy module of every pool, and of single pools (which win).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleRef>,
    #[serde(default)]
    #[schemars(extend("maxProperties" = 256))]
    pub pools: std::collections::BTreeMap<String, ModuleRef>,
}

/// The public keys (PEM, as `cosign.pub` holds them) a module's signature must verify with.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Verify {
    #[schemars(length(max = 16))]
    pub keys: Vec<String>,
}

/// One pool's node policy module.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModuleRef {
    /// `oci://REGISTRY/REPOSITORY@sha256:<64 hex>` (pinned by digest: a tag is refused), or an
    /// absolute path of a file on the node.
    #[schemars(length(min = 1, max = 1024))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.startsWith('/') || (self.startsWith('oci://') && self.contains('@sha256:') && !self.contains(' '))",
        "message": "must be oci://REGISTRY/REPOSITORY@sha256:<64 hex digits> or an absolute file path: a module is named by digest, because a tag can move after the module is checked (`pinset policy push` prints the digest)"
    }]))]
    pub module: String,
    /// A file's sha256: any other bytes are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 64, max = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    /// This pool's keys instead of the configuration's (`keys: []`: no signature required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
}

/// The CRDs as one multi-document YAML stream (`pinset crds`).
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| serde_saphyr::to_string(crd).expect("a CRD serializes"))
        .collect::<Vec<_>>()
        .join("---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every CEL rule of every CRD in `value`, as (path, rule, message).
    fn rules(value: &serde_json::Value, path: &str, out: &mut Vec<(String, String, String)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    if key == "x-kubernetes-validations" {
                        for rule in v.as_array().into_iter().flatten() {
                            let text = |k: &str| rule[k].as_str().unwrap_or_default().to_string();
                            out.push((path.to_string(), text("rule"), text("message")));
                        }
                    } else {
                        rules(v, &format!("{path}.{key}"), out);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| rules(v, path, out)),
            _ => {}
        }
    }

    #[test]
    fn every_validation_rule_says_what_it_wants() {
        let mut found = Vec::new();
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            rules(&serde_json::to_value(&crd).unwrap(), &name, &mut found);
        }
        assert!(found.len() >= 12, "{found:?}");
        for (path, rule, message) in &found {
            assert!(message.len() > 10, "{path}: rule {rule:?} has no message");
        }
    }

    /// OpenShift's fields pinset does not use are part of the schema (served, so not pruned).
    #[test]
    fn openshift_fields_are_in_the_schema() {
        let yaml = crds_yaml();
        for field in [
            "paused:",
            "maxUnavailable:",
            "configuration:",
            "osImageStream:",
            "machineCount:",
            "degradedMachineCount:",
            "certExpirys:",
            "configVersion:",
            "configImage:",
            "desiredImage:",
            "currentImage:",
        ] {
            assert!(yaml.contains(field), "{field} is not served");
        }
    }
}
