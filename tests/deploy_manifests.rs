//! The manifests in deploy/ stay true to the binary: the CRDs are exactly what `pinset crds`
//! prints, every document parses, and every flag the Deployment and DaemonSet pass exists.

mod support;

use std::collections::BTreeSet;

fn docs(file: &str) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(support::workspace().join("deploy").join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("deploy/{file}: {e}"))
        })
        .collect()
}

#[test]
fn crds_match_the_binary() {
    let (code, out, err) = support::pinset(&["crds"]);
    assert_eq!(code, 0, "{err}");
    let file = std::fs::read_to_string(support::workspace().join("deploy/crds.yaml")).unwrap();
    assert!(
        out == file,
        "deploy/crds.yaml is stale: regenerate it with `cargo run -p pinset -- crds > deploy/crds.yaml`"
    );
    let kinds: Vec<String> = docs("crds.yaml")
        .iter()
        .map(|d| d["spec"]["names"]["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        vec!["PinnedImageSet", "MachineConfigPool", "MachineConfigNode"]
    );
}

/// `--flag` names a subcommand accepts, from its `--help`.
fn flags(subcommand: &str) -> BTreeSet<String> {
    let (code, out, err) = support::pinset(&[subcommand, "--help"]);
    assert_eq!(code, 0, "{err}");
    out.split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches([',', '.'])
                .split('=')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn every_manifest_parses_and_passes_only_real_flags() {
    let kustomization = &docs("kustomization.yaml")[0];
    for file in kustomization["resources"].as_sequence().unwrap() {
        for doc in docs(file.as_str().unwrap()) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{file:?}: {doc:?}"
            );
        }
    }
    for (file, kind) in [
        ("controller.yaml", "Deployment"),
        ("agent.yaml", "DaemonSet"),
    ] {
        let doc = &docs(file)[0];
        assert_eq!(doc["kind"], kind);
        let args: Vec<&str> = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let known = flags(args[0]);
        for arg in &args[1..] {
            let flag = arg.split('=').next().unwrap();
            assert!(
                known.contains(flag),
                "deploy/{file}: {flag} is not a flag of `pinset {}`",
                args[0]
            );
        }
    }
    let example = &docs("example-set.yaml")[0];
    assert_eq!(example["kind"], "PinnedImageSet");
}
