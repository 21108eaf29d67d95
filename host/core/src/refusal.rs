//! Why a policy module was not taken, as a kind: what an operator does about each differs, and
//! so does what pinset does next. A registry that is away is no verdict on the module: the
//! module is asked for again with backoff and never counted as refused. A module or signature
//! that may yet appear (not found, unsigned) is checked again on the same schedule, and at once
//! when the configuration changes. Every other refusal stands until the module's digest or the
//! trusted keys change.

use std::time::Duration;

/// The kind of a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The registry did not answer, too slowly, or with a server error.
    RegistryAway,
    /// The registry refused the request (its credentials, its permissions, an answer pinset
    /// will not read).
    RegistryRefused,
    /// The registry has nothing at that digest.
    NotFound,
    /// The registry served other content than the digest named.
    WrongDigest,
    /// Keys are required and the module has no cosign signature.
    Unsigned,
    /// Signatures exist and none verifies with the trusted keys.
    SignatureRefused,
    /// Not a module of a contract pinset knows (not Wasm, another contract version, too large, a
    /// file where a signature is required).
    NotAPolicy,
    /// It failed its smoke test on the node's own facts.
    SmokeTestFailed,
    /// It fell back to the reference in its first reconcile.
    FellBack,
}

/// First wait before a module refused for a reason that may pass is checked again; it doubles
/// up to [`RECHECK_MAX`].
pub const RECHECK_MIN: Duration = Duration::from_secs(30);
pub const RECHECK_MAX: Duration = Duration::from_secs(300);

impl Refusal {
    /// The registry is away: no verdict on the module.
    pub fn transient(self) -> bool {
        self == Refusal::RegistryAway
    }

    /// Checked again on the schedule ([`Refusal::recheck_after`]): what may pass by itself.
    pub fn rechecked(self) -> bool {
        matches!(
            self,
            Refusal::RegistryAway
                | Refusal::RegistryRefused
                | Refusal::NotFound
                | Refusal::Unsigned
        )
    }

    /// The wait before check number `attempt` (1-based) of a refusal that is rechecked.
    pub fn recheck_after(attempt: u32) -> Duration {
        RECHECK_MIN
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
            .min(RECHECK_MAX)
    }

    /// CamelCase, as a condition's reason and a status's `reason` say it.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::RegistryAway => "RegistryAway",
            Refusal::RegistryRefused => "RegistryRefused",
            Refusal::NotFound => "NotFound",
            Refusal::WrongDigest => "WrongDigest",
            Refusal::Unsigned => "Unsigned",
            Refusal::SignatureRefused => "SignatureRefused",
            Refusal::NotAPolicy => "NotAPolicy",
            Refusal::SmokeTestFailed => "SmokeTestFailed",
            Refusal::FellBack => "FellBack",
        }
    }

    pub fn from_reason(reason: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.reason() == reason)
    }

    pub const ALL: [Refusal; 9] = [
        Refusal::RegistryAway,
        Refusal::RegistryRefused,
        Refusal::NotFound,
        Refusal::WrongDigest,
        Refusal::Unsigned,
        Refusal::SignatureRefused,
        Refusal::NotAPolicy,
        Refusal::SmokeTestFailed,
        Refusal::FellBack,
    ];

    /// What the operator does about it, said after the cause.
    pub fn action(self) -> &'static str {
        match self {
            Refusal::RegistryAway => "pinset asks again with backoff; nothing to change",
            Refusal::RegistryRefused => {
                "check the registry's credentials (the node's config.json), permissions and \
                 answers (the cause says which)"
            }
            Refusal::NotFound => "push the module, or name the digest that was pushed",
            Refusal::WrongDigest => "the registry or a mirror serves other content: check it",
            Refusal::Unsigned => "sign it (pinset policy sign); it is checked again shortly",
            Refusal::SignatureRefused => {
                "sign it with a trusted key, or trust the key that signed it"
            }
            Refusal::NotAPolicy => "name a policy module built for this pinset",
            Refusal::SmokeTestFailed | Refusal::FellBack => {
                "fix the module and configure its new digest"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_may_pass_is_checked_again_on_a_capped_schedule() {
        assert!(Refusal::RegistryAway.transient() && Refusal::RegistryAway.rechecked());
        assert!(Refusal::Unsigned.rechecked() && !Refusal::Unsigned.transient());
        assert!(!Refusal::SmokeTestFailed.rechecked() && !Refusal::FellBack.rechecked());
        let waits: Vec<u64> = (1..=6)
            .map(|n| Refusal::recheck_after(n).as_secs())
            .collect();
        assert_eq!(waits, vec![30, 60, 120, 240, 300, 300]);
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_reason(r.reason()), Some(r));
        }
    }
}
