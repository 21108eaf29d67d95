//! Status conditions: built so that `lastTransitionTime` moves only when the status does, and
//! compared without it so that an unchanged condition is never written again.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition `type_` as it should be now, keeping the transition time of `existing` when the
/// status did not change.
pub fn make(
    existing: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let since = existing
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation,
    }
}

/// The condition of type `type_`, if there is one.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The message of the condition `type_` when it is True.
pub fn true_message<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    find(conditions, type_)
        .filter(|c| c.status == "True")
        .map(|c| c.message.as_str())
}

/// Equal in everything but the transition time.
pub fn same(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let first = make(&[], "Degraded", true, "Failed", "image x", Some(1));
        // `Degraded` made again over `first`.
        let over_first = |status: bool, reason: &str, message: &str| {
            make(
                std::slice::from_ref(&first),
                "Degraded",
                status,
                reason,
                message,
                Some(1),
            )
        };
        let again = over_first(true, "Failed", "image y");
        assert_eq!(again.last_transition_time, first.last_transition_time);
        assert!(!same(&first, &again), "the message changed");
        assert!(same(&first, &over_first(true, "Failed", "image x")));
        // A transition at a later instant than the first (the clock's next tick, waited for).
        while k8s_openapi::jiff::Timestamp::now() <= first.last_transition_time.0 {
            std::hint::spin_loop();
        }
        let cleared = over_first(false, "AsExpected", "");
        assert!(cleared.last_transition_time.0 > first.last_transition_time.0);
    }
}
