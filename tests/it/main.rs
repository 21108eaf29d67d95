//! pinset's integration and end-to-end tests, one test binary: a module per subject, sharing
//! `support` (the test bed of `pinset-testkit` and the `pinset` binary cargo built for them).
//! One binary links once and runs its tests in parallel threads, where a binary per file linked
//! and ran one after another.
//!
//! Tests that need the bed (a registry, containerd, the API server, wkg) fail when it cannot be
//! started, naming what did not start; `PINSET_SKIP_BED=1` skips them instead, for a
//! developer's quick loop (`pinset-testkit`, `bed_required`).

mod support;

mod cli_node;
mod containerd_bed;
mod credential_providers;
mod deploy_manifests;
mod docs;
mod fleet_sandbox;
mod hostile_registry;
mod kube_api;
mod kube_e2e;
mod layers;
mod mirrors;
mod node_pipeline;
mod policy_artifacts;
mod policy_sandbox;
mod policy_scaffold;
mod policy_scenarios;
mod registry_sizing;
mod releases;
