//! A pool's node policy change, rolled out as one more entry of its target.

use super::*;

/// A change of a pool's node policy rolls out as one more entry of the pool's target, named
/// by the module: granted canary first and in waves like a set, `Done` on a node that decides
/// with it, `Failed` on a node that refused it (the cause is the entry's error).
pub const POLICY_SET_PREFIX: &str = "policy@";

/// The target entry of the node policy `reference` (a file, `FILE@sha256:…` or
/// `oci://…@sha256:…`): `policy@sha256:HEX` when the reference names a digest, else
/// `policy@REFERENCE` (at most 253 characters, a set name's limit).
pub fn policy_set(reference: &str) -> String {
    let name = match reference.rsplit_once("@sha256:") {
        Some((_, hex)) => format!("{POLICY_SET_PREFIX}sha256:{hex}"),
        None => format!("{POLICY_SET_PREFIX}{reference}"),
    };
    name.chars().take(253).collect()
}

/// Whether `name` is a target entry of a node policy rather than a set.
pub fn is_policy_set(name: &str) -> bool {
    name.starts_with(POLICY_SET_PREFIX)
}

/// Add to a node's sets the policy entries its status implies: the module it runs (at the
/// target), the one it refused (failed, with the cause). The generation of a policy entry is 1:
/// its name is its version.
pub fn add_policy_states(
    sets: &mut BTreeMap<String, SetStatus>,
    running: Option<&str>,
    rejected: Option<(&str, &str)>,
) {
    let mut put = |module: &str, status: SetStatus| {
        let name = policy_set(module);
        let status = SetStatus {
            name: name.clone(),
            desired_generation: 1,
            ..status
        };
        sets.insert(name, status);
    };
    if let Some((module, cause)) = rejected {
        let error = format!("node policy {module}: {cause}");
        let failed = SetStatus {
            last_failed_generation: Some(1),
            last_failed_generation_error: Some(error),
            ..Default::default()
        };
        put(module, failed);
    }
    if let Some(module) = running {
        let current = SetStatus {
            current_generation: Some(1),
            ..Default::default()
        };
        put(module, current);
    }
}

/// The grant without its policy entries: what the node may pull (a policy grant changes no
/// pull, and must not restart a reconcile).
pub fn sets_only(grant: &RolloutGrant) -> RolloutGrant {
    RolloutGrant {
        sets: grant
            .sets
            .iter()
            .filter(|(name, _)| !is_policy_set(name))
            .map(|(n, g)| (n.clone(), *g))
            .collect(),
        max_pulls: grant.max_pulls,
    }
}
