//! Sets from where the images really are. A fixture release, built here and pushed to a real
//! registry as a payload is laid out — a base layer, `release-manifests/` with `image-references`
//! (an ImageStream naming images pushed beside it, one of them a multi-platform index) and
//! `release-metadata` — in two versions that share most images, the newer one's manifests in a
//! plain-tar layer over the older one's gzip layer. The registry mirrors a source that is dark:
//! `pinset set from-release` reads every release through the mirror and never contacts the
//! source; the delta, the multi-hop union, the split at 500 and `pinset plan --sets` on what it
//! prints; releases that are not releases, malformed, not tar, or served by a hostile registry
//! (a 2 GiB layer, a body that never ends): one clear error, nothing printed. And
//! `pinset set from-manifests` on rendered manifests and an operator bundle's CSV.

use crate::support::{self, Dark, GZIP_LAYER, TAR_LAYER, gzip, push_layers};

use pinset_registry::oci::{OCI_CONFIG, OCI_MANIFEST};
use pinset_registry::tar::write::archive;
use pinset_testkit::hostile::{Hostile, Misbehaviour};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `image-references` naming `components` (tag name, image), and `release-metadata`.
fn release_manifests(version: &str, previous: &[&str], components: &[(&str, String)]) -> Vec<u8> {
    let tags: Vec<serde_json::Value> = components
        .iter()
        .map(|(name, image)| {
            serde_json::json!({"name": name, "from": {"kind": "DockerImage", "name": image}})
        })
        .collect();
    let stream = serde_json::json!({
        "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
        "metadata": {"name": version, "creationTimestamp": null},
        "spec": {"lookupPolicy": {"local": false}, "tags": tags},
    });
    let metadata = serde_json::json!({
        "kind": "cincinnati-metadata-v0", "version": version, "previous": previous,
    });
    archive(&[
        (
            "release-manifests/image-references",
            &serde_json::to_vec(&stream).unwrap(),
        ),
        (
            "release-manifests/release-metadata",
            &serde_json::to_vec(&metadata).unwrap(),
        ),
        (
            "release-manifests/0000_50_operator.yaml",
            b"kind: Deployment\n",
        ),
    ])
}

/// Two releases on a mirror of a dark source, and what they hold.
struct Fixture {
    mirror: support::Registry,
    dark: Dark,
    hosts: tempfile::TempDir,
    /// The releases' digests: 4.17.2, 4.17.3.
    releases: [String; 2],
    /// The digest of an index of both, 4.17.3 for this platform (tag `index`).
    index: String,
    /// Component images by name, as the releases name them (through the dark source).
    images: BTreeMap<&'static str, String>,
}

impl Fixture {
    async fn start() -> Option<Fixture> {
        let mirror = support::Registry::start()?;
        let dark = Dark::start();
        let host = mirror.host.clone();
        let client = mirror.client();
        let mut images = BTreeMap::new();
        for (i, name) in ["etcd", "console", "installer", "console-4.17.3", "router"]
            .into_iter()
            .enumerate()
        {
            let layer = support::layer(100 + i as u64, 20_000 + 1000 * i);
            let (d, _) =
                support::push_image(&client, &host, "ocp/art", support::arch(), &[layer]).await;
            images.insert(name, format!("{}/ocp/art@{d}", dark.addr));
        }
        let other = if support::arch() == "amd64" {
            "arm64"
        } else {
            "amd64"
        };
        let mut entries = Vec::new();
        for (seed, arch) in [(120, support::arch()), (121, other)] {
            let (d, _) = support::push_image(
                &client,
                &host,
                "ocp/multi",
                arch,
                &[support::layer(seed, 9_000)],
            )
            .await;
            entries.push((arch, d, 0));
        }
        let index = support::push_index(&client, &host, "ocp/multi", &entries).await;
        images.insert("multi", format!("{}/ocp/multi@{index}", dark.addr));
        let pick = |names: &[&'static str]| -> Vec<(&'static str, String)> {
            names
                .iter()
                .map(|n| (n.trim_end_matches("-4.17.3"), images[n].clone()))
                .collect()
        };
        let base = gzip(&archive(&[(
            "usr/bin/cluster-version-operator",
            &support::random_bytes(7, 300_000),
        )]));
        let v1 = gzip(&release_manifests(
            "4.17.2",
            &["4.17.1"],
            &pick(&["etcd", "console", "installer", "multi"]),
        ));
        let v2 = release_manifests(
            "4.17.3",
            &["4.17.2"],
            &pick(&["etcd", "console-4.17.3", "installer", "multi", "router"]),
        );
        let r1 = [(GZIP_LAYER, base.clone()), (GZIP_LAYER, v1.clone())];
        let r2 = [(GZIP_LAYER, base), (GZIP_LAYER, v1), (TAR_LAYER, v2)];
        let releases = [
            push_layers(&client, &host, "ocp/release", "4.17.2", &r1).await,
            push_layers(&client, &host, "ocp/release", "4.17.3", &r2).await,
        ];
        // A multi-platform release: this platform's entry is 4.17.3, the other's 4.17.2.
        let mut platforms = Vec::new();
        for (arch, digest) in [(support::arch(), &releases[1]), (other, &releases[0])] {
            let size = support::manifest_size(&client, &host, "ocp/release", digest).await;
            platforms.push((arch, digest.clone(), size));
        }
        let index = support::push_index(&client, &host, "ocp/release", &platforms).await;
        let hosts = tempfile::tempdir().unwrap();
        let dir = hosts.path().join(&dark.addr);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("hosts.toml"),
            format!("server = \"http://{}\"\ncapabilities = [\"pull\"]\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n", dark.addr),
        )
        .unwrap();
        Some(Fixture {
            mirror,
            dark,
            hosts,
            releases,
            index,
            images,
        })
    }

    fn release(&self, version: &str) -> String {
        format!("{}/ocp/release:{version}", self.dark.addr)
    }

    fn by_digest(&self, which: usize) -> String {
        format!("{}/ocp/release@{}", self.dark.addr, self.releases[which])
    }

    /// `pinset ARGS… --registry-config-path HOSTS`.
    async fn pinset(&self, args: &[&str]) -> (i32, String, String) {
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push("--registry-config-path".into());
        args.push(self.hosts.path().display().to_string());
        run(args).await
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.hosts.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

async fn run(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::pinset(&args)
    })
    .await
    .unwrap()
}

/// The sets a printed document holds: (name, images, annotations). They load strictly, as
/// `plan --sets` reads them, with the same names and images.
fn sets_of(out: &str) -> Vec<(String, Vec<String>, BTreeMap<String, String>)> {
    let mut objects = pinset_k8s::objects::Objects::default();
    pinset_k8s::objects::parse(
        out,
        Path::new("-"),
        pinset_core::yaml::Fields::Strict,
        &mut objects,
    )
    .unwrap_or_else(|e| panic!("{e}\n{out}"));
    let mut sets = Vec::new();
    for doc in pinset_core::yaml::documents(out).unwrap() {
        match doc.value["items"].as_array() {
            Some(items) => sets.extend(items.iter().cloned()),
            None => sets.push(doc.value),
        }
    }
    let read: Vec<(String, Vec<String>, BTreeMap<String, String>)> = sets
        .iter()
        .map(|s| {
            let images = s["spec"]["pinnedImages"].as_array().unwrap();
            (
                s["metadata"]["name"].as_str().unwrap().to_string(),
                images
                    .iter()
                    .map(|i| i["name"].as_str().unwrap().to_string())
                    .collect::<Vec<_>>(),
                serde_json::from_value(s["metadata"]["annotations"].clone()).unwrap(),
            )
        })
        .collect();
    let loaded: Vec<(String, Vec<String>)> = objects
        .sets
        .into_iter()
        .map(|s| (s.name, s.images))
        .collect();
    let printed: Vec<(String, Vec<String>)> = read
        .iter()
        .map(|(n, i, _)| (n.clone(), i.clone()))
        .collect();
    assert_eq!(loaded, printed);
    read
}

fn source_tags(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    serde_json::from_str(&annotations["pinset.io/source-tags"]).unwrap()
}

/// A release read through the mirror: the release image and every image it references, by
/// digest, each once, with its component name; the source never contacted. `--since` keeps
/// what the upgrade pulls, several releases give their union, `--exclude` filters components;
/// `pinset plan --sets` sizes what was printed, through the mirror.
#[tokio::test]
async fn a_release_is_read_through_the_mirror_with_its_delta_and_upgrade_path() {
    let Some(f) = Fixture::start().await else {
        return;
    };
    let i = |n: &str| f.images[n].clone();
    let (code, out, err) = f
        .pinset(&["set", "from-release", &f.release("4.17.3")])
        .await;
    assert_eq!(code, 0, "{err}");
    let [(name, images, annotations)] = sets_of(&out).try_into().unwrap();
    assert_eq!(name, "release-4.17.3");
    let want = [
        f.by_digest(1),
        i("etcd"),
        i("console-4.17.3"),
        i("installer"),
        i("multi"),
        i("router"),
    ];
    assert_eq!(images, want, "{out}");
    let tags = source_tags(&annotations);
    assert_eq!(tags[&i("multi")], "multi");
    assert_eq!(tags[&i("console-4.17.3")], "console");
    assert_eq!(
        tags[&f.by_digest(1)],
        format!("release 4.17.3 ({})", f.release("4.17.3"))
    );
    assert!(
        annotations["pinset.io/source"].contains(&format!("{} (4.17.3)", f.by_digest(1))),
        "{annotations:?}"
    );

    // The multi-platform release: its index pinned (every node pulls its own platform), the
    // payload read from this platform's image.
    let (code, out, err) = f
        .pinset(&["set", "from-release", &f.release("index")])
        .await;
    assert_eq!(code, 0, "{err}");
    let [(_, images, _)] = sets_of(&out).try_into().unwrap();
    let index = format!("{}/ocp/release@{}", f.dark.addr, f.index);
    assert_eq!(images[0], index);
    assert_eq!(images[1..], want[1..], "this platform's release, 4.17.3");

    let since = ["set", "from-release", &f.release("4.17.3"), "--since"];
    let (code, out, err) = f
        .pinset(&[&since[..], &[&f.release("4.17.2")]].concat())
        .await;
    assert_eq!(code, 0, "{err}");
    let [(name, images, _)] = sets_of(&out).try_into().unwrap();
    assert_eq!(name, "release-4.17.3-since-4.17.2");
    assert_eq!(images, [f.by_digest(1), i("console-4.17.3"), i("router")]);
    support::assert_says(&err, &["3 of 6 image(s) are new"]);

    let path = [
        "set",
        "from-release",
        "--name",
        "upgrade",
        "--exclude",
        "install*",
        "--pool",
        "worker",
    ];
    let hops = [f.release("4.17.2"), f.by_digest(1)];
    let (code, out, err) = f.pinset(&[&path[..], &[&hops[0], &hops[1]]].concat()).await;
    assert_eq!(code, 0, "{err}");
    let [(name, images, _)] = sets_of(&out).try_into().unwrap();
    assert_eq!(name, "upgrade");
    let union = [
        f.by_digest(0),
        f.by_digest(1),
        i("etcd"),
        i("console"),
        i("multi"),
        i("console-4.17.3"),
        i("router"),
    ];
    assert_eq!(images, union, "each image once, installer left out");

    // What the upgrade pulls, planned on a node before anything is pulled.
    let set = f.file("delta.yaml", &{
        let (_, out, _) = f
            .pinset(&[&since[..], &[&f.release("4.17.2"), "--pool", "worker"]].concat())
            .await;
        out
    });
    let node = f.file("node.yaml", "kind: Node\nmetadata: {name: w, labels: {node-role.kubernetes.io/worker: ''}}\nstatus: {allocatable: {ephemeral-storage: 50Gi}, conditions: [{type: Ready, status: 'True'}]}\n");
    let plan = [
        "plan",
        "--sets",
        path_str(&set),
        "--node",
        path_str(&node),
        "-o",
        "json",
    ];
    let (code, out, err) = f.pinset(&plan).await;
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut sized: Vec<(&str, bool)> = plan["pulls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["sizedBy"].as_str().unwrap_or("-"),
                p["sizeBytes"].as_u64() > Some(0),
            )
        })
        .collect();
    sized.sort();
    let by = |repo: &str| (format!("{}/{repo}", f.mirror.host), true);
    let want = [by("ocp/art"), by("ocp/art"), by("ocp/release")];
    assert_eq!(
        sized,
        want.iter()
            .map(|(s, b)| (s.as_str(), *b))
            .collect::<Vec<_>>(),
        "{out}"
    );
    assert_eq!(f.dark.connections(), 0, "the source was never contacted");
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A release of 1,001 components: three sets of at most 500 (said), printed as a kubectl
/// `List`, and `pinset plan --sets` reads all three.
#[tokio::test]
async fn a_release_over_500_images_is_split_and_planned_whole() {
    let Some(mirror) = support::Registry::start() else {
        return;
    };
    let components: Vec<(String, String)> = (0..1001)
        .map(|n| {
            let image = format!("quay.io/ocp/art@sha256:{n:064x}");
            (format!("component-{n}"), image)
        })
        .collect();
    let named: Vec<(&str, String)> = components
        .iter()
        .map(|(n, i)| (n.as_str(), i.clone()))
        .collect();
    let layer = gzip(&release_manifests("4.18.0", &[], &named));
    push_layers(
        &mirror.client(),
        &mirror.host,
        "ocp/release",
        "4.18.0",
        &[(GZIP_LAYER, layer)],
    )
    .await;
    let release = format!("{}/ocp/release:4.18.0", mirror.host);
    let args = [
        "--insecure-registry",
        &mirror.host,
        "set",
        "from-release",
        &release,
    ];
    let extra = ["-o", "json", "--pool", "worker"];
    let (code, out, err) = run([&args[..], &extra[..]]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect())
    .await;
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["kind"], "List");
    let sets = sets_of(&out);
    let sizes: Vec<(&str, usize)> = sets.iter().map(|(n, i, _)| (n.as_str(), i.len())).collect();
    let want = [
        ("release-4.18.0-1", 500),
        ("release-4.18.0-2", 500),
        ("release-4.18.0-3", 2),
    ];
    assert_eq!(sizes, want);
    support::assert_says(
        &err,
        &[
            "set release-4.18.0: 1002 images, over the 500 a PinnedImageSet holds: split into release-4.18.0-1 (500), release-4.18.0-2 (500), release-4.18.0-3 (2)",
        ],
    );
    let (dir, file) = support::scratch_file("sets.json", &out);
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, "kind: Node\nmetadata: {name: w, labels: {node-role.kubernetes.io/worker: ''}}\nstatus: {allocatable: {ephemeral-storage: 500Gi}, conditions: [{type: Ready, status: 'True'}]}\n").unwrap();
    let plan = [
        "plan",
        "--sets",
        path_str(&file),
        "--node",
        path_str(&node),
        "--no-sizing",
        "-o",
        "json",
    ];
    let (code, out, err) = run(plan.iter().map(|s| s.to_string()).collect()).await;
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["sets"].as_array().map(Vec::len), Some(3), "{out}");
    assert_eq!(plan["pulls"].as_array().map(Vec::len), Some(1002));
}

/// What is not a release, or not one pinset can read, is one clear error naming it, with
/// nothing printed: an ordinary image, a malformed ImageStream, a layer that is not tar; from a
/// hostile registry, a 2 GiB layer (refused before a byte is read) and a layer whose body never
/// ends (cut at its declared size).
#[tokio::test]
async fn what_is_not_a_readable_release_is_one_clear_error_and_nothing_printed() {
    let Some(mirror) = support::Registry::start() else {
        return;
    };
    let host = mirror.host.clone();
    let plain = archive(&[("etc/hostname", b"x\n")]);
    let bad_stream = archive(&[(
        "release-manifests/image-references",
        br#"{"kind":"Deployment","spec":{"tags":[]}}"#,
    )]);
    let not_tar = gzip(&support::random_bytes(3, 100_000));
    for (tag, layers) in [
        ("plain", vec![(TAR_LAYER, plain)]),
        ("malformed", vec![(GZIP_LAYER, gzip(&bad_stream))]),
        ("not-tar", vec![(GZIP_LAYER, not_tar)]),
    ] {
        push_layers(&mirror.client(), &host, "ocp/release", tag, &layers).await;
    }
    let hostile = |size: u64, blob: Misbehaviour| {
        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
            "layers": [{"mediaType": TAR_LAYER, "digest": format!("sha256:{}", "d".repeat(64)), "size": size}],
        });
        let manifest = Misbehaviour::Serve {
            content_type: OCI_MANIFEST.into(),
            body: serde_json::to_vec(&manifest).unwrap(),
        };
        Hostile::start(Misbehaviour::Routes(vec![
            ("/manifests/".into(), manifest),
            ("/blobs/".into(), blob),
        ]))
    };
    let huge = hostile(2 << 30, Misbehaviour::HugeLength);
    let endless = hostile(1 << 20, Misbehaviour::EndlessBody);
    let cases = [
        (
            format!("{host}/ocp/release:plain"),
            "no layer holds release-manifests/image-references: not a release image".to_string(),
        ),
        (
            format!("{host}/ocp/release:malformed"),
            "release-manifests/image-references: kind \"Deployment\", not ImageStream".into(),
        ),
        (
            format!("{host}/ocp/release:not-tar"),
            "layer sha256:".into(),
        ),
        (
            format!("{}/ocp/release:huge", huge.addr),
            "2147483648 bytes, more than the 1073741824 pinset reads of a release layer".into(),
        ),
        (
            format!("{}/ocp/release:endless", endless.addr),
            format!("layer sha256:{}", "d".repeat(64)),
        ),
    ];
    for (release, said) in cases {
        let insecure = [
            "--insecure-registry",
            &host,
            "--insecure-registry",
            &huge.addr,
        ];
        let args = [
            &insecure[..],
            &[
                "--insecure-registry",
                &endless.addr,
                "set",
                "from-release",
                &release,
            ],
        ]
        .concat();
        let (code, out, err) = run(args.iter().map(|s| s.to_string()).collect()).await;
        assert_eq!((code, out.as_str()), (1, ""), "{release}: {err}");
        assert!(
            err.contains(&release) && err.contains(&said),
            "{release}: want {said:?} in {err}"
        );
        assert_eq!(
            err.matches("error: ").count(),
            2,
            "one error, and the count: {err}"
        );
    }
    let blobs = |h: &Hostile| {
        h.seen()
            .iter()
            .filter(|s| s.path.contains("/blobs/"))
            .count()
    };
    assert_eq!(blobs(&huge), 0, "a layer over the limit is not asked for");
}

/// A Deployment as a cluster takes it (a selector, its template's labels).
const WEB: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      initContainers: [{name: migrate, image: DARK/team/web:v1}]
      containers:
      - {name: web, image: DARK/team/web:v1}
      - {name: proxy, image: DARK/team/proxy:v2}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
";

/// Rendered manifests and an operator bundle's CSV, a directory and a file: every workload
/// image, tags resolved through the mirror, each image once with the objects that use it; other
/// kinds skipped with one line each. An image that cannot be resolved: exit 1 naming it, or a
/// warning with --skip-unresolvable.
#[tokio::test]
async fn manifests_give_every_workload_image_resolved_through_the_mirror() {
    let Some(f) = Fixture::start().await else {
        return;
    };
    let client = f.mirror.client();
    let host = f.mirror.host.clone();
    let mut pushed = BTreeMap::new();
    for (seed, repo, tag) in [(130, "team/web", "v1"), (131, "team/proxy", "v2")] {
        let (d, _) =
            support::push_image(&client, &host, repo, tag, &[support::layer(seed, 5_000)]).await;
        pushed.insert(repo, format!("{}/{repo}@{d}", f.dark.addr));
    }
    let dir = f.hosts.path().join("rendered");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("web.yaml"), WEB.replace("DARK", &f.dark.addr)).unwrap();
    let csv = serde_json::json!({
        "apiVersion": "operators.coreos.com/v1alpha1", "kind": "ClusterServiceVersion",
        "metadata": {"name": "etcd-operator.v1"},
        "spec": {
            "relatedImages": [{"name": "etcd", "image": f.images["etcd"]}],
            "install": {"strategy": "deployment", "spec": {"deployments": [{
                "name": "etcd-operator",
                "spec": {"template": {"spec": {"containers": [{"name": "op", "image": f.images["router"]}]}}}
            }]}}
        }
    });
    let bundle = f.file("csv.json", &csv.to_string());
    let args = [
        "set",
        "from-manifests",
        "apps",
        path_str(&dir),
        path_str(&bundle),
    ];
    let (code, out, err) = f.pinset(&args).await;
    assert_eq!(code, 0, "{err}");
    let [(_, images, annotations)] = sets_of(&out).try_into().unwrap();
    let want = [
        pushed["team/web"].clone(),
        pushed["team/proxy"].clone(),
        f.images["etcd"].clone(),
        f.images["router"].clone(),
    ];
    assert_eq!(images, want, "{out}");
    let tags = source_tags(&annotations);
    let web = format!("{}/team/web:v1", f.dark.addr);
    assert_eq!(
        tags[&want[0]],
        format!(
            "{web} (Deployment/web init container migrate), {web} (Deployment/web container web)"
        )
    );
    assert_eq!(
        tags[&want[2]],
        "ClusterServiceVersion/etcd-operator.v1 relatedImages etcd"
    );
    support::assert_says(&err, &["skipped: 1 ConfigMap"]);
    assert_eq!(f.dark.connections(), 0, "the source was never contacted");

    let gone = f.file("gone.yaml", &format!("kind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: c, image: {}/team/gone:v9}}]\n", f.dark.addr));
    let args = [
        "set",
        "from-manifests",
        "apps",
        path_str(&dir),
        path_str(&gone),
    ];
    let (code, out, err) = f.pinset(&args).await;
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    support::assert_says(
        &err,
        &[
            &format!("error: {}/team/gone:v9: ", f.dark.addr),
            "1 of 3 image(s) not resolved: no set printed",
        ],
    );
    let (code, out, err) = f
        .pinset(&[&args[..], &["--skip-unresolvable"]].concat())
        .await;
    assert_eq!(code, 0, "{err}");
    support::assert_says(&err, &[&format!("warning: {}/team/gone:v9: ", f.dark.addr)]);
    assert_eq!(sets_of(&out)[0].1, want[..2], "the rest, as before");
}
