//! Offline policy scenarios: a YAML file gives a node, its disk, its images, pull outcomes with
//! pressure, and the decisions expected of the policy. `pinset policy test` runs them.
//!
//! ```yaml
//! name: control-plane node pulls one image at a time
//! node:
//!   name: master-0
//!   labels: {node-role.kubernetes.io/master: ""}
//!   allocatable: 120Gi          # ephemeral storage; ready: true, diskPressure: false by default
//! disk: {capacity: 200Gi, used: 50Gi, available: 150Gi}
//! images:
//!   - name: quay.io/a/b@sha256:…
//!     sets: [release]            # default [scenario]
//!     size: 1Gi                  # or `layers: [{digest: sha256:…, size: 600Mi}]`; neither = unknown
//!     present: false
//! pulls:                         # each asks the throttle hook
//!   - {image: quay.io/a/b@sha256:…, durationMs: 900, pressure: {io: 12.5}, expectThrottleMs: 1000}
//!     # bytes: default the image's size when the pull succeeded (error: unset)
//! expect:
//!   admission: {verdict: admit-all, reasonContains: "usable"}
//!   order: [quay.io/a/b@sha256:…]
//!   concurrency: 1
//! ```

use crate::decisions::{Decisions, Hook};
use crate::diff::Diff;
use crate::plan;
use crate::quantity::Bytes;
use pinset_policy_sdk::{AdmissionRequest, DiskFacts, Images, Pressure, PullOutcome, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("scenario {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `FILE:LINE:COL: field.path: message`.
    #[error("{path}:{error}")]
    Parse {
        path: PathBuf,
        error: crate::yaml::YamlError,
    },
    #[error("scenario {path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    pub name: String,
    pub description: Option<String>,
    pub node: NodeSpec,
    #[serde(default)]
    pub disk: DiskSpec,
    #[serde(default)]
    pub images: Vec<ImageSpec>,
    #[serde(default)]
    pub pulls: Vec<PullSpec>,
    #[serde(default)]
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeSpec {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub pools: Vec<String>,
    #[serde(default = "yes")]
    pub ready: bool,
    #[serde(default)]
    pub disk_pressure: bool,
    pub allocatable: Option<Bytes>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiskSpec {
    pub capacity: Option<Bytes>,
    pub used: Option<Bytes>,
    pub available: Option<Bytes>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageSpec {
    pub name: String,
    #[serde(default)]
    pub sets: Vec<String>,
    #[serde(default)]
    pub present: bool,
    pub size: Option<Bytes>,
    #[serde(default)]
    pub layers: Vec<LayerSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LayerSpec {
    pub digest: String,
    pub size: Bytes,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PressureSpec {
    pub io: Option<f32>,
    pub cpu: Option<f32>,
    pub memory: Option<f32>,
}

/// The size of the scenario's image `reference`: its `size`, else its layers' sum.
fn image_bytes(images: &[ImageSpec], reference: &str) -> Option<u64> {
    let image = images.iter().find(|i| i.name == reference)?;
    let layers = || {
        let sum = image
            .layers
            .iter()
            .try_fold(0u64, |a, l| a.checked_add(l.size.0));
        sum.filter(|_| !image.layers.is_empty())
    };
    image.size.map(|b| b.0).or_else(layers)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PullSpec {
    /// Defaults to the first image.
    pub image: Option<String>,
    pub error: Option<String>,
    pub bytes: Option<Bytes>,
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default)]
    pub remaining: u32,
    #[serde(default)]
    pub pressure: PressureSpec,
    pub expect_throttle_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expect {
    pub admission: Option<ExpectAdmission>,
    /// The pull order of the admitted, absent images.
    pub order: Option<Vec<String>>,
    pub concurrency: Option<u32>,
    /// Hooks expected to fall back to the reference policy (default: none).
    #[serde(default)]
    pub fallbacks: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExpectAdmission {
    pub verdict: VerdictName,
    /// For `admit-some`: the admitted images.
    pub images: Option<Vec<String>>,
    pub reason_contains: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictName {
    AdmitAll,
    AdmitSome,
    Reject,
}

/// A scenario turned into contract inputs.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    pub scenario: Scenario,
    pub request: AdmissionRequest,
    pub outcomes: Vec<(PullOutcome, Pressure, Option<u64>)>,
}

/// Scenario files named by `paths`: files as given, directories by their `*.yaml`/`*.yml`, sorted.
/// An empty directory adds none (the caller warns, as for every empty input).
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ScenarioError> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let found = crate::yaml_files(path).map_err(|source| ScenarioError::Read {
                path: path.clone(),
                source,
            })?;
            out.extend(found);
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

/// A scenario file's text (node or fleet).
pub fn read(path: &Path) -> Result<String, ScenarioError> {
    crate::input::text(path, crate::input::SCENARIO).map_err(|source| ScenarioError::Read {
        path: path.into(),
        source,
    })
}

/// Read and parse the node scenario at `path`.
pub fn load(path: &Path) -> Result<Loaded, ScenarioError> {
    parse(path, &read(path)?)
}

/// Parse a node scenario read from `path`.
pub fn parse(path: &Path, text: &str) -> Result<Loaded, ScenarioError> {
    let (scenario, _): (Scenario, _) = crate::yaml::from_str(text, crate::yaml::Fields::Strict)
        .map_err(|error| ScenarioError::Parse {
            path: path.into(),
            error,
        })?;
    let invalid = |why: String| ScenarioError::Invalid {
        path: path.into(),
        why,
    };
    let request = request_of(&scenario).map_err(invalid)?;
    if let Some(bad) = scenario.expect.fallbacks.iter().find(|h| !is_hook(h)) {
        return Err(invalid(format!("expect.fallbacks: {bad:?} is not a hook")));
    }
    let mut outcomes = Vec::new();
    for (n, pull) in scenario.pulls.iter().enumerate() {
        let reference = match &pull.image {
            Some(r) => r.clone(),
            None => scenario
                .images
                .first()
                .map(|i| i.name.clone())
                .ok_or_else(|| invalid(format!("pull {n} names no image and there are none")))?,
        };
        // A pull that succeeded moved the image's bytes unless the scenario says otherwise, as
        // the agent reports it: a throttle rule over bytes is tested by default.
        let moved = pull
            .error
            .is_none()
            .then(|| image_bytes(&scenario.images, &reference));
        let outcome = PullOutcome {
            error: pull.error.clone(),
            bytes: pull.bytes.map(|b| b.0).or(moved.flatten()),
            reference,
            duration_ms: pull.duration_ms,
            remaining: pull.remaining,
        };
        let p = &pull.pressure;
        let pressure = Pressure {
            io: p.io,
            cpu: p.cpu,
            memory: p.memory,
        };
        outcomes.push((outcome, pressure, pull.expect_throttle_ms));
    }
    Ok(Loaded {
        path: path.into(),
        scenario,
        request,
        outcomes,
    })
}

fn request_of(s: &Scenario) -> Result<AdmissionRequest, String> {
    let node = crate::desired::NodeInfo {
        name: s.node.name.clone(),
        labels: s.node.labels.clone(),
        ready: s.node.ready,
        disk_pressure: s.node.disk_pressure,
        allocatable_ephemeral_bytes: s.node.allocatable.map(|b| b.0),
    }
    .facts(&s.node.pools);
    let disk = DiskFacts {
        capacity_bytes: s.disk.capacity.map(|b| b.0),
        used_bytes: s.disk.used.map(|b| b.0),
        available_bytes: s.disk.available.map(|b| b.0),
    };
    let mut layer_index: HashMap<&str, (u32, u64)> = HashMap::new();
    let mut images = Images::new();
    let mut names = std::collections::HashSet::new();
    for spec in &s.images {
        if !names.insert(spec.name.as_str()) {
            return Err(format!("image {} is listed twice", spec.name));
        }
        if spec.name.is_empty() || spec.name.chars().any(char::is_whitespace) {
            return Err(format!(
                "image {:?}: a reference is non-empty and has no white space",
                spec.name
            ));
        }
        let (size, layers) = layers_of(spec, &mut images, &mut layer_index)?;
        let sets: Vec<&str> = if spec.sets.is_empty() {
            vec!["scenario"]
        } else {
            spec.sets.iter().map(String::as_str).collect()
        };
        images.push(&spec.name, sets, spec.present, size, &layers);
    }
    Ok(AdmissionRequest { node, disk, images })
}

/// An image's size and its layers' indices in `images`: its layers (each digest one size,
/// shared between images; their sum the image's size when both are given), else one layer of
/// its own of its size, else unknown.
fn layers_of<'a>(
    spec: &'a ImageSpec,
    images: &mut Images,
    index: &mut HashMap<&'a str, (u32, u64)>,
) -> Result<(Option<u64>, Vec<u32>), String> {
    if spec.layers.is_empty() {
        return Ok(match spec.size {
            Some(size) => (Some(size.0), vec![images.add_layer(size.0)]),
            None => (None, Vec::new()),
        });
    }
    let (mut layers, mut total) = (Vec::new(), 0u64);
    for layer in &spec.layers {
        let (idx, size) = *index
            .entry(layer.digest.as_str())
            .or_insert_with(|| (images.add_layer(layer.size.0), layer.size.0));
        if size != layer.size.0 {
            return Err(format!(
                "layer {} has two sizes ({size} and {})",
                layer.digest, layer.size.0
            ));
        }
        layers.push(idx);
        total += size;
    }
    match spec.size {
        Some(given) if given.0 != total => Err(format!(
            "image {}: size {} differs from its layers' sum {total}",
            spec.name, given.0
        )),
        _ => Ok((Some(total), layers)),
    }
}

/// The result of one scenario.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    pub path: PathBuf,
    /// Empty when the scenario passed; otherwise one [`Diff`] per mismatch.
    pub diffs: Vec<Diff>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.diffs.is_empty()
    }
}

fn verdict_name(v: &Verdict) -> VerdictName {
    match v {
        Verdict::AdmitAll => VerdictName::AdmitAll,
        Verdict::AdmitSome(_) => VerdictName::AdmitSome,
        Verdict::Reject => VerdictName::Reject,
    }
}

/// What differs between the expected admission and the plan's.
fn admission_diffs(
    want: &ExpectAdmission,
    plan: &plan::Plan,
    refs: &dyn Fn(&[u32]) -> Vec<String>,
    diffs: &mut Vec<Diff>,
) {
    let got = verdict_name(&plan.admission.verdict);
    if got != want.verdict {
        diffs.push(
            Diff::new("admission.verdict", want.verdict, got)
                .with_note(format!("reason: {}", plan.admission.reason)),
        );
    }
    if let (Some(want_images), Verdict::AdmitSome(subset)) = (&want.images, &plan.admission.verdict)
    {
        let got_images = refs(subset);
        if &got_images != want_images {
            diffs.push(Diff::lists("admission.images", want_images, &got_images));
        }
    }
    if let Some(needle) = &want.reason_contains
        && !plan.admission.reason.contains(needle.as_str())
    {
        diffs.push(Diff::new(
            "admission.reason contains",
            needle,
            &plan.admission.reason,
        ));
    }
}

/// Images an expectation names that the scenario's images do not list: a typo in the scenario,
/// said as such rather than as a wrong answer of the policy.
fn unknown_images(loaded: &Loaded, diffs: &mut Vec<Diff>) {
    let expect = &loaded.scenario.expect;
    let known = |r: &String| loaded.request.images.iter().any(|i| i.reference == r);
    let lists = [
        ("expect.order", expect.order.as_ref()),
        (
            "expect.admission.images",
            expect.admission.as_ref().and_then(|a| a.images.as_ref()),
        ),
    ];
    for (what, list) in lists {
        let unknown: Vec<&String> = list.into_iter().flatten().filter(|r| !known(r)).collect();
        if !unknown.is_empty() {
            diffs.push(Diff::problem(
                what,
                format!("names image(s) the scenario's images do not list: {unknown:?}"),
            ));
        }
    }
}

/// Run a loaded scenario against a policy instance (fresh for this scenario).
pub fn run(loaded: &Loaded, policy: &mut dyn Decisions) -> Outcome {
    let s = &loaded.scenario;
    let request = &loaded.request;
    let refs = |indices: &[u32]| -> Vec<String> {
        indices
            .iter()
            .filter_map(|&i| request.images.get(i as usize))
            .map(|i| i.reference.to_string())
            .collect()
    };
    let mut diffs = Vec::new();
    unknown_images(loaded, &mut diffs);
    let plan = plan::make(policy, request, None);

    if let Some(want) = &s.expect.admission {
        admission_diffs(want, &plan, &refs, &mut diffs);
    }
    if let Some(want) = &s.expect.order {
        let got = refs(&plan.pulls);
        if &got != want {
            diffs.push(Diff::lists("order", want, &got));
        }
    }
    if let Some(want) = s.expect.concurrency
        && want != plan.concurrency
    {
        diffs.push(Diff::new("concurrency", want, plan.concurrency));
    }
    for (n, (outcome, pressure, want)) in loaded.outcomes.iter().enumerate() {
        let got = policy
            .throttle(&request.node, outcome, pressure)
            .as_millis() as u64;
        if let Some(want) = want
            && *want != got
        {
            let what = format!("pulls[{n}] throttle ms ({})", outcome.reference);
            diffs.push(Diff::new(what, want, got));
        }
    }
    let fallbacks: Vec<String> = policy
        .fallbacks()
        .iter()
        .map(|f| f.hook.as_str().to_string())
        .collect();
    if fallbacks != s.expect.fallbacks {
        let causes: Vec<String> = policy.fallbacks().iter().map(|f| f.to_string()).collect();
        let diff = Diff::new("fallbacks", &s.expect.fallbacks, &fallbacks);
        diffs.push(match causes.is_empty() {
            true => diff,
            false => diff.with_note(causes.join("\n")),
        });
    }
    Outcome {
        name: s.name.clone(),
        path: loaded.path.clone(),
        diffs,
    }
}

/// Whether a hook name is one of the contract's (for `expect.fallbacks`).
pub fn is_hook(name: &str) -> bool {
    Hook::ALL.iter().any(|h| h.as_str() == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::Native;
    use pinset_policy_default::DefaultPolicy;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    const BASE: &str = r#"
name: worker
node: {name: w, allocatable: 100Gi}
images:
  - {name: "r/a@sha256:aa", layers: [{digest: l1, size: 1Gi}, {digest: l2, size: 1Gi}]}
  - {name: "r/b@sha256:bb", layers: [{digest: l2, size: 1Gi}]}
  - {name: "r/c@sha256:cc", present: true, size: 5Gi}
"#;

    #[test]
    fn shared_layers_map_to_one_index() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(&write(dir.path(), "s.yaml", BASE)).unwrap();
        let images = &loaded.request.images;
        assert_eq!(images.layer_sizes(), &[1 << 30, 1 << 30, 5 << 30]);
        assert_eq!(images.get(0).unwrap().layers, &[0, 1]);
        assert_eq!(images.get(1).unwrap().layers, &[1]);
        assert_eq!(images.get(1).unwrap().size_bytes, Some(1 << 30));
        assert_eq!(images.pull_bytes(images.absent()).known, 2 << 30);
        assert_eq!(
            images.get(0).unwrap().sets().collect::<Vec<_>>(),
            vec!["scenario"]
        );
    }

    #[test]
    fn a_successful_pull_moved_its_images_bytes_unless_said() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{BASE}pulls:\n  - {{image: \"r/a@sha256:aa\"}}\n  - {{image: \"r/c@sha256:cc\", bytes: 1Mi}}\n  - {{image: \"r/b@sha256:bb\", error: timeout}}\n"
        );
        let loaded = load(&write(dir.path(), "p.yaml", &text)).unwrap();
        let bytes: Vec<Option<u64>> = loaded.outcomes.iter().map(|o| o.0.bytes).collect();
        assert_eq!(bytes, [Some(2 << 30), Some(1 << 20), None]);
    }

    #[test]
    fn a_wrong_expectation_fails_with_a_diff() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{BASE}expect:\n  concurrency: 3\n  order: [\"r/b@sha256:bb\", \"r/a@sha256:aa\"]\n"
        );
        let loaded = load(&write(dir.path(), "s.yaml", &text)).unwrap();
        let mut g = Native(DefaultPolicy, Vec::new());
        let out = run(&loaded, &mut g);
        assert!(!out.passed());
        assert_eq!(out.diffs.len(), 2, "{:#?}", out.diffs);
        let order = out.diffs[0].to_string();
        assert!(order.starts_with("order:"), "{order}");
        assert!(
            order.contains(
                "first difference at position 0: expected r/b@sha256:bb, actual r/a@sha256:aa"
            ),
            "{order}"
        );
        let concurrency = out.diffs[1].to_string();
        assert!(concurrency.contains("- expected 3") && concurrency.contains("+ actual   5"));
        assert_eq!(
            (out.diffs[1].expected.clone(), out.diffs[1].actual.clone()),
            (3.into(), 5.into())
        );
    }

    #[test]
    fn an_expectation_naming_an_unknown_image_is_flagged() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "{BASE}expect:\n  order: [\"r/a@sha256:aa\", \"r/typo@sha256:00\", \"r/b@sha256:bb\"]\n"
        );
        let loaded = load(&write(dir.path(), "s.yaml", &text)).unwrap();
        let out = run(&loaded, &mut Native(DefaultPolicy, Vec::new()));
        let first = out.diffs[0].to_string();
        assert!(
            first.starts_with("expect.order: names image(s) the scenario's images do not list")
                && first.contains("r/typo@sha256:00"),
            "{first}"
        );
    }

    #[test]
    fn bad_input_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let typo = write(
            dir.path(),
            "typo.yaml",
            "name: x\nnode: {name: n, alocatable: 1Gi}\n",
        );
        let e = load(&typo).unwrap_err().to_string();
        assert!(e.contains("typo.yaml") && e.contains("alocatable"), "{e}");
        let dup = write(
            dir.path(),
            "dup.yaml",
            "name: x\nnode: {name: n}\nimages: [{name: a}, {name: a}]\n",
        );
        assert!(
            load(&dup)
                .unwrap_err()
                .to_string()
                .contains("image a is listed twice")
        );
        let size = write(
            dir.path(),
            "size.yaml",
            "name: x\nnode: {name: n, allocatable: 12Qi}\n",
        );
        assert!(load(&size).unwrap_err().to_string().contains("12Qi"));
        let empty = tempfile::tempdir().unwrap();
        assert!(collect(&[empty.path().into()]).unwrap().is_empty());
    }
}
