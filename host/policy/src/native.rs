use super::{Described, PolicyError, PolicyInstance};
use pinset_policy_default::DefaultPolicy;
use pinset_policy_sdk::{
    Admission, AdmissionRequest, Images, NodeFacts, Policy, PolicyInfo, Pressure, PullOutcome,
};

/// A policy compiled into pinset. Its calls cannot fail.
pub struct NativePolicy {
    name: String,
    policy: Box<dyn Policy + Send>,
}

impl NativePolicy {
    pub fn new(name: impl Into<String>, policy: impl Policy + Send + 'static) -> Self {
        Self {
            name: name.into(),
            policy: Box::new(policy),
        }
    }

    /// The reference policy: the default policy's source compiled natively. It is the fallback
    /// for every failed Wasm decision.
    pub fn reference() -> Self {
        Self::new("builtin:default", DefaultPolicy)
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }
}

impl Described for NativePolicy {
    fn name(&self) -> &str {
        &self.name
    }
    fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
        Ok(self.policy.info())
    }
}

impl PolicyInstance for NativePolicy {
    fn admit(&mut self, request: &AdmissionRequest) -> Result<Admission, PolicyError> {
        Ok(self.policy.admit(request))
    }
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Result<Vec<u32>, PolicyError> {
        Ok(self.policy.order(node, images))
    }
    fn concurrency(&mut self, node: &NodeFacts) -> Result<u32, PolicyError> {
        Ok(self.policy.concurrency(node))
    }
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Result<u64, PolicyError> {
        Ok(self.policy.throttle(node, outcome, pressure))
    }
}
