//! Disconnected sites: the image's own registry is dark (a loopback port that accepts and never
//! answers) or blocked, and a second real registry mirrors its images — one under the same
//! path, one remapped. containerd pulls through its `hosts.toml` (real CRI pulls) while pinset
//! sizes through the same file, found from the runtime; the same sizing through a
//! `registries.conf` with a drop-in; `pinset set from-images` and `pinset plan` through the
//! mirror. The source's connections and access log prove it was never asked.

use crate::support::{self, Dark};

use pinset_core::desired::{self, PinnedImageSet, ROLE_LABEL};
use pinset_core::reference::ImageRef;
use pinset_core::status::NodeStatus;
use pinset_node::facts;
use pinset_registry::mirrors::MirrorSource;
use pinset_registry::size::{Cached, RegistrySizer, Sizer};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Two images on `mirror`: `team/a` under its own path, `team/b` under `remap/` — with their
/// digests and compressed sizes.
struct Mirrored {
    a: (String, u64),
    b: (String, u64),
}

async fn mirror_images(mirror: &support::Registry) -> Mirrored {
    let client = mirror.client();
    let (la, lb) = (support::layer(31, 210_000), support::layer(32, 90_000));
    let push = |repo: &'static str, layer: Vec<u8>| {
        let client = client.clone();
        let host = mirror.host.clone();
        async move {
            let size = layer.len() as u64;
            let (digest, _) =
                support::push_image(&client, &host, repo, support::arch(), &[layer]).await;
            (digest, size)
        }
    };
    Mirrored {
        a: push("team/a", la).await,
        b: push("remap/team/b", lb).await,
    }
}

fn set(images: &[String]) -> PinnedImageSet {
    PinnedImageSet::for_role("release", "worker", images)
}

/// containerd pulls through its hosts.toml; pinset, told nothing but the CRI socket, reads the
/// same file (the runtime reports where it is), sizes every image through the mirror with the
/// bytes pushed, and pins the set. The dark source never sees a connection.
#[tokio::test]
async fn containerd_pulls_and_pinset_sizes_through_the_hosts_toml_mirror() {
    let Some(mirror) = support::Registry::start() else {
        return;
    };
    let dark = Dark::start();
    let images = mirror_images(&mirror).await;
    let hosts = format!(
        "server = \"http://{dark}\"\n\n[host.\"http://{m}\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"http://{m}/v2/remap\"]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n",
        dark = dark.addr,
        m = mirror.host
    );
    let Some(containerd) = support::Containerd::start_with_hosts(&[(&dark.addr, &hosts)], None)
    else {
        return;
    };
    let config = pinset_node::NodeConfig::new(containerd.endpoint());
    let reconciler = config.connect().await.unwrap();
    let refs = [
        format!("{}/team/a@{}", dark.addr, images.a.0),
        format!("{}/team/b@{}", dark.addr, images.b.0),
    ];
    let node = support::node("worker");
    let d = desired::desired(&node, &desired::standard_pools(), &[set(&refs)]);
    let facts = reconciler.facts(&d, &node).await.unwrap();
    assert!(facts.sizing.left.is_empty(), "{:?}", facts.sizing.left);
    let sized: Vec<(u64, String)> = facts
        .sizing
        .sizes
        .iter()
        .map(|s| {
            let s = s.as_ref().expect("sized");
            (s.total(), s.endpoint.clone().unwrap())
        })
        .collect();
    assert_eq!(
        sized,
        [
            (images.a.1, format!("{}/team/a", mirror.host)),
            (images.b.1, format!("{}/v2/remap/team/b", mirror.host)),
        ]
    );
    let mut status = NodeStatus::default();
    let report = support::reconcile_default(&reconciler, &d, &node, &mut status, None)
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", containerd.log()));
    assert!(
        report.outcome.failed.is_empty(),
        "{:?}",
        report.outcome.failed
    );
    for reference in &refs {
        let image = reconciler.cri().image_status(reference).await.unwrap();
        assert!(
            image.is_some_and(|i| i.pinned),
            "{reference} pulled and pinned"
        );
    }
    assert_eq!(status.sizing, None);
    assert_eq!(dark.connections(), 0, "the source was never contacted");
}

/// CRI-O's way: a `registries.conf` whose drop-in replaces the source's entry — the source
/// blocked, digest-only mirrors in order: one that answers another manifest than the digest asked
/// for (refused, never used), the mirror under the same path, the mirror remapped.
#[tokio::test]
async fn sizing_follows_registries_conf_and_its_dropin_and_never_asks_a_blocked_source() {
    let (Some(source), Some(mirror)) = (support::Registry::start(), support::Registry::start())
    else {
        return;
    };
    let liar = support::answering(
        "200 OK",
        "application/vnd.oci.image.manifest.v1+json",
        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504","size":1}]}"#,
    );
    let images = mirror_images(&mirror).await;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("registries.conf");
    let src = &source.host;
    std::fs::write(
        &conf,
        format!("[[registry]]\nprefix = \"{src}/team\"\nlocation = \"{src}/team\"\n[[registry.mirror]]\nlocation = \"{liar}/team\"\ninsecure = true\n"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("registries.conf.d")).unwrap();
    std::fs::write(
        dir.path().join("registries.conf.d/50-site.conf"),
        format!(
            "[[registry]]\nprefix = \"{src}/team\"\nlocation = \"{src}/team\"\nblocked = true\nmirror-by-digest-only = true\n\n[[registry.mirror]]\nlocation = \"{liar}/team\"\ninsecure = true\n\n[[registry.mirror]]\nlocation = \"{m}/team\"\ninsecure = true\n\n[[registry.mirror]]\nlocation = \"{m}/remap/team\"\ninsecure = true\n",
            m = mirror.host
        ),
    )
    .unwrap();
    let sizer = RegistrySizer::new(Vec::new(), Arc::default())
        .with_mirrors(MirrorSource::RegistriesConf(conf));
    sizer.refresh().unwrap();
    let before = source.requests().len();
    let size = |repo: &str, digest: &str| {
        let image = ImageRef::parse(&format!("{src}/team/{repo}@{digest}")).unwrap();
        let sizer = &sizer;
        async move { sizer.size(&image).await }
    };
    let a = size("a", &images.a.0).await.unwrap();
    let b = size("b", &images.b.0).await.unwrap();
    assert_eq!((a.total(), b.total()), (images.a.1, images.b.1));
    assert_eq!(a.endpoint.unwrap(), format!("{}/team/a", mirror.host));
    assert_eq!(b.endpoint.unwrap(), format!("{}/remap/team/b", mirror.host));
    // An image only the lying mirror answers for: refused, and the blocked source not asked.
    let e = size("c", &support::sha256(b"c")).await.unwrap_err();
    assert!(e.why.contains("the manifest's digest is"), "{e}");
    assert!(!e.why.contains(&format!("{src}/v2")), "{e}");
    assert_eq!(source.requests().len(), before, "{}", source.log());
    assert!(
        !mirror.requests().is_empty(),
        "the mirror's access log shows the sizing"
    );
}

/// The source is dark and nothing mirrors it: the images are said unsized once for the
/// registry, within the sizing budget, and the next round does not wait on it again.
#[tokio::test]
async fn a_dark_registry_costs_one_budget_and_is_said_once() {
    let dark = Dark::start();
    let images: Vec<String> = (0..40)
        .map(|i| format!("{}/team/x{i}@{}", dark.addr, support::sha256(&[i])))
        .collect();
    let node = support::node("worker");
    let d = desired::desired(&node, &desired::standard_pools(), &[set(&images)]);
    let budget = Duration::from_secs(2);
    let sizer = Arc::new(
        Cached::new(RegistrySizer::new(vec![dark.addr.clone()], Arc::default()))
            .with_budget(budget),
    );
    let absent = vec![false; images.len()];
    let started = Instant::now();
    let first = facts::sizes(Some(&sizer), &d, &absent).await;
    let took = started.elapsed();
    assert!(took >= budget && took < budget * 3, "{took:?}");
    assert!(first.sizes.iter().all(Option::is_none));
    assert_eq!(first.left.len(), 1, "{:?}", first.left);
    assert_eq!(first.left[0].registry, dark.addr);
    assert_eq!(first.left[0].images, 40);
    assert!(
        first.left[0].cause.contains("sizing budget"),
        "{:?}",
        first.left
    );
    let started = Instant::now();
    let second = facts::sizes(Some(&sizer), &d, &absent).await;
    assert!(started.elapsed() < budget, "skipped while dark");
    assert!(
        second.left[0].cause.contains("skipped"),
        "{:?}",
        second.left
    );
}

/// `pinset set from-images` resolves tags through the mirror (the source is dark, and may not
/// resolve tags): a tag to its manifest, a multi-platform tag to its index; the set it prints loads strictly and `pinset
/// plan` sizes it through the mirror, saying so. An unknown tag: exit 1, nothing on stdout.
#[tokio::test]
async fn set_from_images_resolves_tags_through_the_mirror() {
    let Some(mirror) = support::Registry::start() else {
        return;
    };
    let dark = Dark::start();
    let client = mirror.client();
    let arch = support::arch();
    let index = support::push_two_platforms(
        &client,
        &mirror.host,
        "team/multi",
        support::layer(41, 50_000),
        support::layer(42, 60_000),
    )
    .await;
    let images = mirror_images(&mirror).await;
    let hosts = tempfile::tempdir().unwrap();
    let host_dir = hosts.path().join(&dark.addr);
    std::fs::create_dir(&host_dir).unwrap();
    std::fs::write(
        host_dir.join("hosts.toml"),
        // The source may serve digests, never resolve tags: a tag the mirror lacks is not
        // looked for there.
        format!("server = \"http://{}\"\ncapabilities = [\"pull\"]\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n", dark.addr, mirror.host),
    )
    .unwrap();
    let hosts_flag = hosts.path().to_str().unwrap().to_string();
    let tagged_a = format!("{}/team/a:{arch}", dark.addr);
    let tagged_multi = format!("{}/team/multi:index", dark.addr);
    let args = |images: &[&str]| {
        let mut a: Vec<String> = [
            "set",
            "from-images",
            "release",
            "--pool",
            "worker",
            "--registry-config-path",
            &hosts_flag,
        ]
        .map(String::from)
        .to_vec();
        a.extend(images.iter().map(|s| s.to_string()));
        a
    };
    let (code, out, err) = support::pinset_blocking(args(&[&tagged_a, &tagged_multi])).await;
    assert_eq!(code, 0, "{err}");
    let set_file = hosts.path().join("set.yaml");
    std::fs::write(&set_file, &out).unwrap();
    let loaded = pinset_k8s::objects::load(
        std::slice::from_ref(&set_file),
        pinset_core::yaml::Fields::Strict,
    )
    .unwrap();
    assert_eq!(loaded.sets.len(), 1, "{out}");
    let set = &loaded.sets[0];
    assert_eq!(
        set.labels.get(ROLE_LABEL).map(String::as_str),
        Some("worker")
    );
    assert_eq!(
        set.images,
        [
            format!("{}/team/a@{}", dark.addr, images.a.0),
            format!("{}/team/multi@{index}", dark.addr),
        ],
        "{out}"
    );
    support::assert_says(&out, &[&tagged_a, "pinset.io/source-tags"]);

    let node = hosts.path().join("node.yaml");
    std::fs::write(&node, support::worker_yaml("")).unwrap();
    let through_mirrors = ["--registry-config-path", hosts_flag.as_str()];
    let plan = support::plan_json(&set_file, &node, &through_mirrors).await;
    let sized_by: Vec<&str> = plan["pulls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sizedBy"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(
        sized_by,
        [
            format!("{}/team/a", mirror.host),
            format!("{}/team/multi", mirror.host)
        ],
        "{out}"
    );
    assert_eq!(plan["pulls"][0]["sizeBytes"].as_u64(), Some(images.a.1));
    assert_eq!(dark.connections(), 0, "the source was never contacted");

    // A registries.conf that cannot be read: said at FILE:LINE, sized without mirrors (the dark
    // source then costs the budget), the plan still made.
    let bad = hosts.path().join("registries.conf");
    std::fs::write(
        &bad,
        "[[registry]]\nlocation = \"quay.io\"\nblocked = \"yes\"\n",
    )
    .unwrap();
    let conf = [
        "--registries-conf",
        bad.to_str().unwrap(),
        "--sizing-budget",
        "1",
    ];
    let plan = support::plan_json(&set_file, &node, &conf).await;
    let error = plan["mirrors"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!("{}:3: ", bad.display())),
        "{out}"
    );
    assert_eq!(plan["unsizedImages"][0]["images"], 2, "{out}");
    let contacted = dark.connections();
    assert!(contacted > 0, "without mirrors, the source is asked");

    let unknown = format!("{}/team/a:no-such-tag", dark.addr);
    let (code, out, err) = support::pinset_blocking(args(&[&tagged_a, &unknown])).await;
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "nothing printed: {out}");
    support::assert_says(&err, &[&format!("error: {unknown}: "), "404"]);
    assert_eq!(
        dark.connections(),
        contacted,
        "a tag is never resolved at the source"
    );
}
