//! What pinset's side of a contract is made of besides its Wasm ABI ([`Contract`]): the trait
//! an instance answers, the SDK trait a native policy implements, the reference policy that
//! answers when a module's answer is not used, and how a candidate module is smoke-tested.
//! Everything generic over a contract — [`crate::Native`], [`crate::Guarded`],
//! [`crate::smoke_test`] and the loaders — is written once over [`Hooks`]; each contract's row
//! is in its own file (`node.rs`, `fleet.rs`).

use crate::{Contract, Described, Guarded, WasmInstance};
use pinset_policy_sdk::PolicyInfo;

/// One contract's hooks, as pinset calls them.
pub trait Hooks: Contract + Sized {
    /// The SDK trait a native policy of this contract implements, as a trait object.
    type Native: ?Sized + Send;
    /// The trait an instance of this contract answers, as a trait object: a module's
    /// [`WasmInstance`] or a [`crate::Native`] policy.
    type Instance: ?Sized + Described;
    /// What a smoke test asks a candidate module: the node's or the pool's current facts.
    type Probe<'a>: Copy;
    /// The reference policy's name (`builtin:…`).
    const REFERENCE: &'static str;

    /// The reference policy: the default policy's source compiled natively.
    fn reference() -> Box<Self::Native>;
    /// What a native policy says of itself.
    fn native_info(policy: &Self::Native) -> PolicyInfo;
    /// An instance of a module as the trait object guards hold.
    fn boxed(instance: WasmInstance<Self>) -> Box<Self::Instance>;
    /// Ask every hook of the contract once on `probe` (a smoke test's questions); failures are
    /// kept by `guarded`.
    fn probe(guarded: &mut Guarded<Self>, probe: Self::Probe<'_>);
}
