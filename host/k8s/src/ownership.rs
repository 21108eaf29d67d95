//! Whether the cluster's `machineconfiguration.openshift.io` CRDs are pinset's to serve.
//!
//! On OpenShift the Machine Config Operator owns those CRDs and runs its own PinnedImageSet
//! controller and node daemon. pinset started there would write the same fields as a second
//! controller, so `pinset controller` and `pinset agent` read the CRDs first and refuse to start
//! when OpenShift's release payload installed them. The rule ([`owner`]) is pure; [`check`]
//! reads the CRDs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use std::time::Duration;

/// The CRDs pinset serves, by name.
pub const CRD_NAMES: [&str; 3] = [
    "pinnedimagesets.machineconfiguration.openshift.io",
    "machineconfigpools.machineconfiguration.openshift.io",
    "machineconfignodes.machineconfiguration.openshift.io",
];

/// The label pinset's CRDs carry (`pinset crds`, deploy/components/crds).
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "pinset");

/// Who installed a CRD, judged from its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// pinset's own (its label).
    Pinset,
    /// OpenShift's release payload: `evidence` names the annotation or owner that shows it.
    OpenShift { evidence: String },
    /// Someone else, or pinset before it labelled its CRDs: served as they are.
    Unknown,
}

/// OpenShift marks the CRDs of its payload with annotations in its own domains
/// (`include.release.openshift.io/…`, `release.openshift.io/…`, `api-approved.openshift.io`,
/// `capability.openshift.io/…`) and may own them through its ClusterVersion/ClusterOperator.
pub fn owner(meta: &ObjectMeta) -> Owner {
    let openshift_domain = |key: &str| {
        let domain = key.split_once('/').map_or(key, |(d, _)| d);
        domain == "openshift.io" || domain.ends_with(".openshift.io")
    };
    if let Some(key) = meta
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| openshift_domain(k))
    {
        return Owner::OpenShift {
            evidence: format!("annotation {key}"),
        };
    }
    if let Some(r) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.api_version.starts_with("config.openshift.io/"))
    {
        return Owner::OpenShift {
            evidence: format!("owned by {} {}", r.kind, r.name),
        };
    }
    let labels = meta.labels.as_ref();
    if labels
        .and_then(|l| l.get(PART_OF.0))
        .is_some_and(|v| v == PART_OF.1)
    {
        return Owner::Pinset;
    }
    Owner::Unknown
}

#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error(
        "CRD {crd} belongs to OpenShift ({evidence}): this cluster's Machine Config Operator pins images itself and pinset must not run beside it. Use OpenShift's own PinnedImageSet (machineconfiguration.openshift.io/v1) and remove pinset's controller and agent (kubectl delete -k deploy/base); see docs/openshift.md"
    )]
    OpenShift { crd: String, evidence: String },
}

/// Reads pinset's CRDs and refuses OpenShift's. A CRD that is absent or unreadable (no RBAC to
/// get it) is no reason to refuse (said at warn); a server that does not answer is asked again
/// every `retry` until it does, so a refusal never depends on a network blip. `Ok(false)`:
/// `shutdown` came first.
pub async fn check(
    client: kube::Client,
    retry: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<bool, OwnershipError> {
    tokio::select! {
        checked = check_crds(client, retry) => checked.map(|()| true),
        () = shutdown.cancelled() => Ok(false),
    }
}

async fn check_crds(client: kube::Client, retry: Duration) -> Result<(), OwnershipError> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for crd in CRD_NAMES {
        let meta = loop {
            match api.get_metadata_opt(crd).await {
                Ok(found) => break found.map(|m| m.metadata),
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    tracing::warn!(
                        crd,
                        "cannot read the CRD to check who owns it (RBAC: get customresourcedefinitions); assuming pinset's"
                    );
                    break None;
                }
                Err(e) => {
                    tracing::warn!(crd, error = %e, "reading the CRD to check who owns it; asking again");
                    tokio::time::sleep(retry).await;
                }
            }
        };
        match meta.as_ref().map(owner) {
            Some(Owner::OpenShift { evidence }) => {
                return Err(OwnershipError::OpenShift {
                    crd: crd.into(),
                    evidence,
                });
            }
            Some(Owner::Unknown) => {
                tracing::info!(
                    crd,
                    "CRD not labelled {}={}: served as found",
                    PART_OF.0,
                    PART_OF.1
                )
            }
            Some(Owner::Pinset) | None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(annotations: &[(&str, &str)], labels: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            annotations: map(annotations),
            labels: map(labels),
            ..Default::default()
        }
    }

    #[test]
    fn openshifts_payload_annotations_mark_its_crds() {
        for key in [
            "include.release.openshift.io/self-managed-high-availability",
            "api-approved.openshift.io",
            "release.openshift.io/feature-set",
            "capability.openshift.io/name",
        ] {
            assert!(
                matches!(owner(&meta(&[(key, "true")], &[])), Owner::OpenShift { evidence } if evidence.contains(key)),
                "{key}"
            );
        }
        // A look-alike domain is not OpenShift's.
        assert_eq!(
            owner(&meta(&[("notopenshift.io/x", "")], &[])),
            Owner::Unknown
        );
    }

    #[test]
    fn openshift_wins_over_a_pinset_label_and_owners_count() {
        let both = meta(&[("api-approved.openshift.io", "x")], &[PART_OF]);
        assert!(matches!(owner(&both), Owner::OpenShift { .. }));
        let mut owned = meta(&[], &[]);
        owned.owner_references = Some(vec![OwnerReference {
            api_version: "config.openshift.io/v1".into(),
            kind: "ClusterVersion".into(),
            name: "version".into(),
            uid: "u".into(),
            ..Default::default()
        }]);
        assert!(
            matches!(owner(&owned), Owner::OpenShift { evidence } if evidence.contains("ClusterVersion version"))
        );
        assert_eq!(owner(&meta(&[], &[PART_OF])), Owner::Pinset);
        assert_eq!(owner(&meta(&[], &[])), Owner::Unknown);
    }
}
