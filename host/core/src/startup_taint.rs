//! A startup taint: a node kept from new pods until the images of its pools' PinnedImageSets
//! are pinned — new nodes otherwise take pods before the pre-pull (z2jh #345, #3011; spegel
//! #587; karpenter #3289, whose `startupTaints` expect a daemon to lift them). The operator
//! registers new nodes with the taint (the kubelet's `--register-with-taints`, a node pool's
//! startup taints); the agent lifts it when [`verdict`] says so. Which taint, and when it goes.

use crate::status::NodeStatus;
use std::time::Duration;

/// A taint named as `kubectl taint … KEY[:EFFECT]-` names one to remove: its key, and its
/// effect when given (else any effect of that key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartupTaint {
    pub key: String,
    pub effect: Option<String>,
}

/// The effects a taint may have.
pub const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("startup taint {text:?}: {why} (KEY or KEY:EFFECT, as kubectl taint names one)")]
pub struct TaintError {
    pub text: String,
    pub why: String,
}

impl std::str::FromStr for StartupTaint {
    type Err = TaintError;

    fn from_str(text: &str) -> Result<Self, TaintError> {
        let refused = |why: String| TaintError {
            text: text.into(),
            why,
        };
        let (key, effect) = match text.split_once(':') {
            Some((key, effect)) => (key, Some(effect)),
            None => (text, None),
        };
        if let Some(effect) = effect.filter(|e| !EFFECTS.contains(e)) {
            return Err(refused(format!(
                "effect {effect:?} is not one of {}",
                EFFECTS.join(", ")
            )));
        }
        check_key(key).map_err(refused)?;
        Ok(StartupTaint {
            key: key.into(),
            effect: effect.map(str::to_string),
        })
    }
}

/// A taint key is a qualified name: `[PREFIX/]NAME`, the prefix a DNS subdomain (at most 253
/// characters), the name at most 63 alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let alnum_ends = |s: &str| {
        let ends = [s.chars().next(), s.chars().last()];
        ends.iter()
            .all(|c| c.is_some_and(|c| c.is_ascii_alphanumeric()))
    };
    let name_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if name.is_empty() || name.len() > 63 || !name_chars || !alnum_ends(name) {
        return Err(format!(
            "key name {name:?}: at most 63 letters, digits, '-', '_' or '.', beginning and ending \
             with a letter or digit"
        ));
    }
    let Some(prefix) = prefix else {
        return Ok(());
    };
    let label = |l: &str| {
        let chars = l
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        !l.is_empty() && l.len() <= 63 && chars && alnum_ends(l)
    };
    if prefix.len() > 253 || !prefix.split('.').all(label) {
        return Err(format!(
            "key prefix {prefix:?}: a DNS subdomain (lowercase labels joined by '.')"
        ));
    }
    Ok(())
}

impl StartupTaint {
    /// Whether a node's taint of `key` and `effect` is this one.
    pub fn matches(&self, key: &str, effect: &str) -> bool {
        self.key == key && self.effect.as_deref().is_none_or(|e| e == effect)
    }
}

impl std::fmt::Display for StartupTaint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.effect {
            Some(effect) => write!(f, "{}:{effect}", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// What becomes of the taint after a round, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaintVerdict {
    /// Kept: the node's images are not all pinned yet (what is missing).
    Keep(String),
    /// Lifted, for this reason (and what was missing at a deadline).
    Lift(Lifted, String),
}

/// Why a taint is lifted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifted {
    /// Every set of the node's pools is pinned.
    Pinned,
    /// The node is older than the deadline, whatever is missing.
    Deadline,
}

impl Lifted {
    /// Its name in metrics: `pinned`, `deadline`.
    pub fn name(self) -> &'static str {
        match self {
            Lifted::Pinned => "pinned",
            Lifted::Deadline => "deadline",
        }
    }
}

/// The taint's verdict after a round that left the node `status`, `age` after the node was
/// created: lifted once every set of the node's pools is pinned at its desired generation —
/// none waiting for a rollout grant, the round not failed — or, with a `deadline`, once the
/// node is that old whatever is missing (a set that cannot be pulled does not keep a node
/// from pods for ever, unless the operator wants it so).
pub fn verdict(status: &NodeStatus, age: Duration, deadline: Option<Duration>) -> TaintVerdict {
    let Some(missing) = missing(status) else {
        let sets = status.sets.len();
        return TaintVerdict::Lift(
            Lifted::Pinned,
            format!("every PinnedImageSet of the node's pools is pinned ({sets} set(s))"),
        );
    };
    match deadline {
        Some(deadline) if age >= deadline => TaintVerdict::Lift(
            Lifted::Deadline,
            format!(
                "not all pinned {} s after the node was created (the deadline): {missing}",
                deadline.as_secs()
            ),
        ),
        _ => TaintVerdict::Keep(missing),
    }
}

/// What keeps the node from being ready for pods, `None` when nothing does.
fn missing(status: &NodeStatus) -> Option<String> {
    let mut out = Vec::new();
    let unpinned: Vec<String> = (status.sets.values())
        .filter(|s| s.current_generation != Some(s.desired_generation))
        .map(|s| match &s.last_failed_generation_error {
            Some(e) if s.last_failed_generation == Some(s.desired_generation) => {
                format!("{} failed: {e}", s.name)
            }
            _ => format!("{} not pinned", s.name),
        })
        .collect();
    if !unpinned.is_empty() {
        out.push(format!("set(s) {}", unpinned.join("; ")));
    }
    if !status.waiting.is_empty() {
        let names: Vec<&str> = status.waiting.iter().map(|(n, _)| n.as_str()).collect();
        out.push(format!("waiting for a rollout grant: {}", names.join(", ")));
    }
    if let Some(failure) = &status.degraded {
        out.push(format!("the round failed: {failure}"));
    }
    (!out.is_empty()).then(|| out.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::SetStatus;

    fn taint(text: &str) -> Result<StartupTaint, String> {
        text.parse().map_err(|e: TaintError| e.to_string())
    }

    #[test]
    fn a_taint_is_named_as_kubectl_names_one() {
        let t = taint("pinset.io/images-pending:NoSchedule").unwrap();
        assert!(t.matches("pinset.io/images-pending", "NoSchedule"));
        assert!(!t.matches("pinset.io/images-pending", "NoExecute"));
        let any = taint("images-pending").unwrap();
        assert!(any.matches("images-pending", "NoExecute"));
        assert_eq!(any.to_string(), "images-pending");
        assert_eq!(t.to_string(), "pinset.io/images-pending:NoSchedule");
        for (bad, why) in [
            (
                "pinset.io/x:Sometimes",
                "effect \"Sometimes\" is not one of",
            ),
            ("", "key name \"\""),
            ("-x", "key name \"-x\""),
            ("Pinset.io/x", "key prefix \"Pinset.io\""),
            (&"x".repeat(64), "at most 63"),
        ] {
            let e = taint(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("KEY or KEY:EFFECT"),
                "{bad}: {e}"
            );
        }
    }

    fn status(sets: &[(&str, i64, Option<i64>, Option<&str>)]) -> NodeStatus {
        let mut status = NodeStatus::default();
        for &(name, desired, current, failed) in sets {
            let set = SetStatus {
                name: name.into(),
                desired_generation: desired,
                current_generation: current,
                last_failed_generation: failed.map(|_| desired),
                last_failed_generation_error: failed.map(str::to_string),
            };
            status.sets.insert(name.into(), set);
        }
        status
    }

    #[test]
    fn the_taint_goes_when_every_set_is_pinned_or_the_deadline_passed() {
        let young = Duration::from_secs(60);
        let pinned = status(&[("a", 2, Some(2), None), ("b", 1, Some(1), None)]);
        let lift = |why: &str| TaintVerdict::Lift(Lifted::Pinned, why.into());
        let every = "every PinnedImageSet of the node's pools is pinned (2 set(s))";
        assert_eq!(verdict(&pinned, young, None), lift(every));
        let nothing = "every PinnedImageSet of the node's pools is pinned (0 set(s))";
        assert_eq!(verdict(&NodeStatus::default(), young, None), lift(nothing));

        let behind = status(&[("a", 2, Some(1), None), ("b", 1, None, Some("image gone"))]);
        let missing = "set(s) a not pinned; b failed: image gone";
        assert_eq!(
            verdict(&behind, young, None),
            TaintVerdict::Keep(missing.into())
        );
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            verdict(&behind, young, hour),
            TaintVerdict::Keep(missing.into())
        );
        let late =
            format!("not all pinned 3600 s after the node was created (the deadline): {missing}");
        let at_deadline = TaintVerdict::Lift(Lifted::Deadline, late);
        assert_eq!(
            verdict(&behind, Duration::from_secs(3600), hour),
            at_deadline
        );

        let mut waiting = pinned.clone();
        waiting.waiting = vec![("c".into(), 1)];
        let keep = TaintVerdict::Keep("waiting for a rollout grant: c".into());
        assert_eq!(verdict(&waiting, young, None), keep);
        let mut failed = pinned;
        failed.degraded = Some("node not Ready".into());
        let keep = TaintVerdict::Keep("the round failed: node not Ready".into());
        assert_eq!(verdict(&failed, young, None), keep);
    }
}
