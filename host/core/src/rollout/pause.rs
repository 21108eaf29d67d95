//! A paused rollout: the pool's annotation, and the grant that stands in for the policy's.

use super::*;

/// The pool annotation that pauses its rollout: while it is set, no node is granted (the fleet
/// policy is not asked); nodes granted before go on, since a grant is never taken back.
pub const PAUSED_ANNOTATION: &str = "pinset.io/rollout-paused";

/// Whether the pool's rollout is paused, and what is wrong with the annotation when its value
/// is neither `true` nor `false`. Such a value pauses: whoever wrote it meant to stop.
pub fn paused(annotations: &BTreeMap<String, String>) -> (bool, Option<String>) {
    match annotations.get(PAUSED_ANNOTATION).map(|v| v.trim()) {
        None | Some("false") => (false, None),
        Some("true") => (true, None),
        Some(other) => (
            true,
            Some(format!(
                "annotation {PAUSED_ANNOTATION}={other:?} is neither \"true\" nor \"false\"; \
                 the rollout stays paused until it is fixed"
            )),
        ),
    }
}

/// The answer for a paused pool, in place of the fleet policy's: no node, and why.
pub fn paused_grant(request: &RolloutRequest) -> Grant {
    let c = counts(request);
    Grant::none(format!(
        "paused by {PAUSED_ANNOTATION}: no node is granted until it is removed; {} granted \
         node(s) still pulling go on, {} wait, {}/{} at the target",
        c.pulling,
        c.waiting,
        c.done,
        request.nodes.len()
    ))
}
