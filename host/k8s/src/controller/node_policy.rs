//! The node policy module a pool's target names, checked by the controller first: where the
//! configuration requires signatures, a module without a valid one (or a file, which carries
//! none) never becomes a target entry, so no node is granted it. Only a definitive answer
//! refuses: a registry the controller cannot reach or may not read leaves the check to the
//! nodes, which verify every module they fetch anyway.

use crate::policy_config::{ModuleRef, PolicyConfig};
use pinset_node::policy_source::Source;
use pinset_node::registry::artifact::Artifacts;
use pinset_node::registry::signature::SignatureError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A refusal is checked again after this long (a signature may have been pushed since).
const RECHECK: Duration = Duration::from_secs(30);

/// What the controller found of each module's signature, by reference.
pub struct SignatureGate {
    artifacts: Option<Artifacts>,
    verdicts: Mutex<HashMap<String, Verdict>>,
}

/// A module's signature as checked (`Err`: why it must not be rolled out), and when.
type Verdict = (Result<(), String>, Instant);

impl SignatureGate {
    /// `artifacts: None`: the controller cannot reach registries; only files are refused here.
    pub fn new(artifacts: Option<Artifacts>) -> Self {
        Self {
            artifacts,
            verdicts: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(why)` when `m`, named for `pool`, must not be rolled out.
    pub(super) async fn check(
        &self,
        config: &PolicyConfig,
        pool: &str,
        m: &ModuleRef,
    ) -> Result<(), String> {
        let keys = config.keys(pool, m).map_err(|e| e.to_string())?;
        if keys.is_empty() {
            return Ok(());
        }
        let reference = m.reference();
        let known = self
            .verdicts
            .lock()
            .expect("verdicts lock")
            .get(&reference)
            .cloned();
        if let Some((verdict, at)) = known
            && (verdict.is_ok() || at.elapsed() < RECHECK)
        {
            return verdict;
        }
        let verdict = match Source::parse(&m.module) {
            Err(e) => Err(e.to_string()),
            Ok(Source::File(_)) => Err(
                "a signature is required and a file carries none: reference a signed oci:// artifact"
                    .into(),
            ),
            Ok(Source::Oci(at)) => match &self.artifacts {
                None => Ok(()),
                Some(artifacts) => match artifacts.verify(&at, &keys).await {
                    Ok(_) => Ok(()),
                    Err(e @ (SignatureError::Unsigned { .. } | SignatureError::Refused { .. })) => {
                        Err(e.to_string())
                    }
                    Err(e) => {
                        tracing::info!(pool, module = %reference, error = %e, "cannot check the signature; the nodes will");
                        return Ok(());
                    }
                },
            },
        };
        if let Err(why) = &verdict {
            tracing::warn!(pool, module = %reference, %why, "node policy refused before any node is granted it");
        }
        let mut verdicts = self.verdicts.lock().expect("verdicts lock");
        verdicts.insert(reference, (verdict.clone(), Instant::now()));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(module: &str, keys: bool) -> PolicyConfig {
        let key = pinset_node::registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public()
            .to_pem();
        let verify = match keys {
            true => format!("verify: {{keys: [{key:?}]}}\n"),
            false => String::new(),
        };
        PolicyConfig::parse(
            &format!("{verify}pools:\n  w: {{module: {module:?}}}\n"),
            "t",
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_file_is_refused_where_a_signature_is_required() {
        let gate = SignatureGate::new(None);
        let file = config("/p/a.wasm", true);
        let why = gate.check(&file, "w", &file.pools["w"]).await.unwrap_err();
        assert!(why.contains("file carries none"), "{why}");
        let unsigned_ok = config("/p/a.wasm", false);
        gate.check(&unsigned_ok, "w", &unsigned_ok.pools["w"])
            .await
            .unwrap();
    }

    /// The registry is asked, and does not answer (its port refuses connections): no verdict,
    /// the nodes check the module themselves.
    #[tokio::test]
    async fn an_unreachable_registry_leaves_the_check_to_the_nodes() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let artifacts = Artifacts::new(
            vec![format!("127.0.0.1:{port}")],
            std::sync::Arc::new(Default::default()),
        );
        let gate = SignatureGate::new(Some(artifacts));
        let oci = config(
            &format!("oci://127.0.0.1:{port}/p@sha256:{}", "a".repeat(64)),
            true,
        );
        gate.check(&oci, "w", &oci.pools["w"]).await.unwrap();
        assert!(
            gate.verdicts.lock().unwrap().is_empty(),
            "an unanswered check is no verdict"
        );
    }
}
