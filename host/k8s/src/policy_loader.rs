//! How a policy module that a configuration or a flag names becomes a module pinset decides
//! with — one path for the agent (node modules), the controller (fleet modules) and the
//! command line, generic over the contract: fetched (a file, or an `oci://` artifact through
//! the registry and the node's cache, its signature checked against the keys configured,
//! within [`pinset_registry::limits::POLICY_FETCH`]), compiled and bound to its contract (its
//! sha256 pin checked), and, before it replaces a running module, smoke-tested on the current
//! facts ([`pinset_policy::smoke_test`]). Every refusal carries its kind
//! ([`Refusal`]): a registry away or a missing signature is told from a bad module by type.

use crate::policy_config::ModuleRef;
use pinset_core::refusal::Refusal;
use pinset_policy::{CompiledModule, Contract, Hooks, Limits, LoadError, Module, WasmRuntime};
use pinset_registry::policy_source::{Fetched, Fetcher, Source, SourceError, fetch_blocking};
use pinset_registry::signature::VerifyingKey;

/// Why a module was not taken: the kind, and the words.
pub type Refusing = (Refusal, String);

/// Fetches, verifies, compiles and checks policy modules.
pub struct Loader {
    pub runtime: WasmRuntime,
    pub limits: Limits,
    pub fetcher: Fetcher,
    /// The most the policy cache keeps besides the modules in use (`--policy-cache-max-mib`).
    pub cache_max_bytes: u64,
}

fn refused(e: SourceError) -> Refusing {
    (e.refusal(), e.to_string())
}

/// A module that does not compile, export its contract or match its pin is not a policy.
fn not_a_policy(e: LoadError) -> Refusing {
    (Refusal::NotAPolicy, e.to_string())
}

impl Loader {
    /// A loader for tests: no registry, no cache, modules up to `max_bytes`.
    #[cfg(test)]
    pub(crate) fn for_tests(max_bytes: u64) -> Self {
        Loader {
            runtime: WasmRuntime::new().unwrap(),
            limits: Limits::default(),
            fetcher: Fetcher {
                artifacts: pinset_registry::artifact::Artifacts::new(vec![], Default::default()),
                cache: None,
                max_bytes,
            },
            cache_max_bytes: 1 << 20,
        }
    }

    /// The bytes of `m`, its signature checked when `keys` are given. Async: the step that
    /// touches the network, bounded in time and bytes.
    pub async fn fetch(&self, m: &ModuleRef, keys: &[VerifyingKey]) -> Result<Fetched, Refusing> {
        let source = Source::parse(&m.module).map_err(refused)?;
        self.fetcher.fetch(&source, keys).await.map_err(refused)
    }

    /// [`Self::fetch`] for the synchronous paths (commands, startup, a restart's restore), on a
    /// runtime of its own.
    pub fn fetch_blocking(
        &self,
        m: &ModuleRef,
        keys: &[VerifyingKey],
    ) -> Result<Fetched, Refusing> {
        let source = Source::parse(&m.module).map_err(refused)?;
        fetch_blocking(&self.fetcher, &source, keys).map_err(refused)
    }

    /// `fetched` compiled, its pin checked, for whichever contracts it is then bound to
    /// (`pinset policy info`).
    pub fn compile(&self, m: &ModuleRef, fetched: &Fetched) -> Result<CompiledModule, LoadError> {
        let pin = m.sha256.as_deref();
        self.runtime
            .compile_module(&fetched.name, &fetched.bytes, pin, self.limits)
    }

    /// `fetched` compiled and bound to contract `C`. Blocking (CPU).
    pub fn bind<C: Contract>(
        &self,
        m: &ModuleRef,
        fetched: &Fetched,
    ) -> Result<Module<C>, Refusing> {
        let compiled = self.compile(m, fetched).map_err(not_a_policy)?;
        self.runtime.bind::<C>(&compiled).map_err(not_a_policy)
    }

    /// `fetched` bound to `C` and smoke-tested on `probe` (the facts of `on`: "the node's
    /// facts", "the pool's rollout"). Blocking.
    pub fn prove<C: Hooks>(
        &self,
        m: &ModuleRef,
        fetched: &Fetched,
        probe: C::Probe<'_>,
        on: &str,
    ) -> Result<Module<C>, Refusing> {
        let module = self.bind::<C>(m, fetched)?;
        pinset_policy::smoke_test(&module, probe).map_err(|f| {
            // The refusal names the module once, beside this cause: the error's own prefix goes.
            let own = format!("policy {}: ", fetched.name);
            let cause = f.message.strip_prefix(&own).unwrap_or(&f.message);
            (
                Refusal::SmokeTestFailed,
                format!("smoke test on {on}: {cause}"),
            )
        })?;
        Ok(module)
    }

    /// Fetched and bound, without a smoke test: a module named at startup (a flag), or one a
    /// node ran before its restart (it passed one then). Blocking.
    pub fn load<C: Contract>(
        &self,
        m: &ModuleRef,
        keys: &[VerifyingKey],
    ) -> Result<Module<C>, Refusing> {
        let fetched = self.fetch_blocking(m, keys)?;
        self.bind(m, &fetched)
    }

    /// Keep the policy cache within its bound, the digests in `keep` whatever their size (see
    /// [`pinset_registry::policy_source::prune`]). Blocking (a directory listing).
    pub fn prune(&self, keep: &[String]) {
        let Some(dir) = &self.fetcher.cache else {
            return;
        };
        let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
        match pinset_registry::policy_source::prune(dir, &keep, self.cache_max_bytes) {
            Ok(p) if p.removed > 0 => {
                tracing::info!(cache = %dir.display(), removed = p.removed, kept_bytes = p.kept_bytes, "policy cache pruned")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(cache = %dir.display(), error = %e, "cannot prune the policy cache")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy::{FleetContract, NodeContract};

    fn file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> ModuleRef {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        ModuleRef::from_reference(path.to_str().unwrap()).unwrap()
    }

    fn request() -> (
        pinset_policy_sdk::AdmissionRequest,
        pinset_policy_sdk::Pressure,
    ) {
        let node = pinset_core::desired::NodeInfo {
            name: "w".into(),
            ready: true,
            allocatable_ephemeral_bytes: Some(100 << 30),
            ..Default::default()
        };
        let request = pinset_policy_sdk::AdmissionRequest {
            node: node.facts(&["worker".into()]),
            ..Default::default()
        };
        (request, Default::default())
    }

    #[tokio::test]
    async fn a_module_is_fetched_bound_and_proved_for_its_contract_and_refused_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let loader = Loader::for_tests(16 << 20);
        let m = file(dir.path(), "default.wasm", pinset_policy::EMBEDDED_DEFAULT);
        let fetched = loader.fetch(&m, &[]).await.unwrap();
        let (request, pressure) = request();
        let on = "the node's facts";
        let module = loader.prove::<NodeContract>(&m, &fetched, (&request, &pressure), on);
        assert!(module.is_ok(), "the default passes its smoke test");
        // The embedded default exports both contracts: bound as each.
        assert!(loader.bind::<FleetContract>(&m, &fetched).is_ok());

        let garbage = file(dir.path(), "garbage.wasm", b"not wasm");
        let (kind, why) = loader.load::<NodeContract>(&garbage, &[]).err().unwrap();
        assert_eq!(kind, Refusal::NotAPolicy, "{why}");

        let pinned = ModuleRef {
            sha256: Some("0".repeat(64)),
            ..m.clone()
        };
        let (kind, why) = loader.load::<NodeContract>(&pinned, &[]).err().unwrap();
        assert!(
            kind == Refusal::NotAPolicy && why.contains("sha256"),
            "{why}"
        );

        let missing = ModuleRef::from_reference("/nonexistent/p.wasm").unwrap();
        let (kind, _) = loader.fetch(&missing, &[]).await.unwrap_err();
        assert_eq!(kind, Refusal::NotFound, "may pass by itself: rechecked");

        let small = Loader::for_tests(1024);
        let (kind, why) = small.fetch(&m, &[]).await.unwrap_err();
        assert!(
            kind == Refusal::NotAPolicy && why.contains("over the limit"),
            "{why}"
        );
    }
}
