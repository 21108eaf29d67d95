//! pinset's pure core: the domain types and rules every other crate builds on.
//!
//! - [`reference`](mod@reference), [`selector`], [`quantity`]: image references by digest,
//!   label selectors, Kubernetes quantities;
//! - [`desired`]: from PinnedImageSets, pools and a node to the node's desired state;
//! - [`pool`]: which sets a pool lists and how its nodes count (the controller's rules);
//! - [`decisions`]: the [`decisions::Decisions`] a reconcile asks for (implemented by the policy
//!   crate), the hooks, fallbacks, and the observer that metrics implement;
//! - [`plan`]: from decisions to a pull plan; [`settle`]: from presence and pull outcomes to
//!   per-set verdicts; [`drift`]: pins lost behind pinset's back;
//! - [`status`]: the per-set status model; [`scenario`], [`fleet_scenario`]: the offline
//!   scenario formats (node decisions, fleet decisions); [`diff`]: what a scenario expected and
//!   what the policy answered, where they differ;
//! - [`rollout`]: a pool's rollout against its target (phases, the request a fleet policy gets,
//!   which nodes a grant adds, the pool's ceiling, where a rollout stands); [`rollout_sim`]: a
//!   whole rollout played offline against a fleet policy;
//! - [`startup_taint`]: the taint that keeps a new node from pods until its sets are pinned;
//! - [`timeline`]: pull and rollout timelines, drawn as SVG or a Chrome trace;
//! - [`yaml`]: YAML read with positions (`FILE:LINE:COL: field.path`), unknown fields refused.
//!
//! May depend on: the policy SDK's contract types, serde, thiserror, the YAML parser. Must not
//! depend on any runtime or adapter: no tokio, tonic, kube, wasmtime, hyper. It does no network
//! or process I/O and reads no clock; it touches the file system only to read the input files a
//! command names (scenario files, and [`yaml_files`] of a directory), and writes nothing.

pub mod decisions;
pub mod desired;
pub mod diff;
pub mod drift;
pub mod fleet_scenario;
pub mod input;
pub mod plan;
pub mod pool;
pub mod quantity;
pub mod reference;
pub mod refusal;
pub mod rollout;
pub mod rollout_sim;
pub mod scenario;
pub mod scenario_reference;
pub mod selector;
pub mod settle;
pub mod startup_taint;
pub mod status;
pub mod timeline;
pub mod yaml;

/// The `*.yaml` and `*.yml` files of a directory, sorted.
pub fn yaml_files(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    Ok(files)
}
