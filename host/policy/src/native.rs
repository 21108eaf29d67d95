//! A policy compiled into pinset, for either contract: the reference policies (the default
//! policies' own source, so the fallback and the embedded module answer alike) and the native
//! policies of tests and benchmarks. Its calls cannot fail.

use crate::{Described, Hooks, PolicyError};
use pinset_policy_sdk::PolicyInfo;

/// A policy of contract `C` compiled into pinset: `Native<NodeContract>` implements
/// [`crate::PolicyInstance`] over an SDK [`Policy`](pinset_policy_sdk::Policy),
/// `Native<FleetContract>` implements [`crate::FleetInstance`] over an SDK
/// [`Fleet`](pinset_policy_sdk::Fleet).
pub struct Native<C: Hooks> {
    name: String,
    policy: Box<C::Native>,
}

impl<C: Hooks> Native<C> {
    pub fn new(name: impl Into<String>, policy: Box<C::Native>) -> Self {
        Self {
            name: name.into(),
            policy,
        }
    }

    /// The reference policy of the contract ([`Hooks::REFERENCE`]): the fallback of every
    /// failed decision.
    pub fn reference() -> Self {
        Self::new(C::REFERENCE, C::reference())
    }

    /// The SDK policy it calls.
    pub fn policy(&self) -> &C::Native {
        self.policy.as_ref()
    }
}

impl<C: Hooks> Described for Native<C> {
    fn name(&self) -> &str {
        &self.name
    }
    fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
        Ok(C::native_info(&self.policy))
    }
}
