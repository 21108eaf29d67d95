//! The `pinset` binary: `demo`, `plan` and `node` as a user runs them.

use crate::support;

use pinset_node::pin::crio;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::{pinset, workspace};

/// `pinset COMMAND --sets SETS` for the demo's nodes (`examples/demo/nodes.yaml`), with
/// `extra` flags (`--node-name`, `--no-sizing`, …): (exit code, stdout, stderr).
fn on_demo_nodes(command: &str, sets: &Path, extra: &[&str]) -> (i32, String, String) {
    let nodes = workspace().join("examples/demo/nodes.yaml");
    let mut args = vec![command, "--sets", sets.to_str().unwrap()];
    args.extend(["--node", nodes.to_str().unwrap()]);
    args.extend_from_slice(extra);
    pinset(&args)
}

#[test]
fn demo_runs_both_nodes_and_pins_everything() {
    let timelines = tempfile::tempdir().unwrap();
    let (code, out, err) = pinset(&["demo", "--timeline-dir", timelines.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    // One timeline per node: well-formed SVG, one lane per pull slot, one bar per pull, a
    // throttle pause after each pull of the control-plane node but the last.
    for (node, slots, pulls) in [("master-0", 1, 5), ("worker-0", 5, 11)] {
        let path = timelines.path().join(format!("{node}.timeline.svg"));
        support::assert_says(&out, &[&format!("timeline: {}", path.display())]);
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{node}: {e}"));
        let class = |n: &roxmltree::Node, c: &str| n.attribute("class") == Some(c);
        let lanes: Vec<roxmltree::Node> = doc.descendants().filter(|n| class(n, "lane")).collect();
        assert_eq!(lanes.len(), slots, "{node}: one lane per slot");
        let bars = doc.descendants().filter(|n| class(n, "pull")).count();
        assert_eq!(bars, pulls, "{node}: one bar per pull");
        let pauses = doc.descendants().filter(|n| class(n, "throttle")).count();
        if node == "master-0" {
            assert!(pauses >= pulls - 1, "{node}: {pauses} pauses");
        }
        let complete = support::timeline_bars(&path)
            .iter()
            .filter(|b| b.3 == "pull")
            .count();
        assert_eq!(complete, pulls, "{node}: the trace holds the same pulls");
    }
    support::assert_says(
        &out,
        &[
            "runtime reports 5 of 5 image(s) pinned",
            "runtime reports 11 of 11 image(s) pinned",
            "[crio.image]",
            "pinned_images = [",
        ],
    );
    let row = |node: &str| -> Vec<String> {
        let line = out
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{out}"));
        line.split_whitespace().map(String::from).collect()
    };
    // node, pulls, at once, max seen, …
    assert_eq!(&row("master-0")[1..4], ["5", "1", "1"]);
    assert_eq!(&row("worker-0")[1..4], ["11", "5", "5"]);
    // Into a pipe, one plain line per event: every pull, and the control plane's pauses.
    let lines = |prefix: &str| out.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(lines("  pulling "), 16, "{out}");
    assert_eq!(lines("  pulled  "), 16, "{out}");
    // The control plane pulls one at a time: a pause after each pull but the last.
    let master = out.split("== worker-0").next().unwrap();
    let pauses = master
        .lines()
        .filter(|l| l.starts_with("  pause   1s (throttle)"))
        .count();
    assert_eq!(pauses, 4, "{master}");
}

#[test]
fn plan_works_without_a_runtime() {
    let sets = workspace().join("examples/demo/sets.yaml");
    // One of the demo's nodes, offline, with `extra` flags.
    let plan_of = |node: &str, extra: &[&str]| {
        let flags = [&["--node-name", node, "--no-sizing"][..], extra].concat();
        on_demo_nodes("plan", &sets, &flags)
    };
    let plan = |extra: &[&str]| plan_of("master-0", extra);
    let (code, out, err) = plan(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("node master-0  pools master  policy"),
        "the scenario format's words, not Rust's debug output: {out}"
    );
    support::assert_says(
        &out,
        &[
            "admission: admit-all — ",
            "pulls: 5 of 5 image(s) (0 present), 0 B known bytes, 1 at once",
            "5 image(s) of unknown size not counted",
            "throttle after a pull (current pressure): 1s",
        ],
    );
    assert_eq!(out.matches("(size unknown)").count(), 5, "{out}");

    // The same plan as a document, in JSON and YAML.
    let as_doc = |format: &str| {
        let (code, out, err) = plan(&["-o", format]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let json: serde_json::Value = serde_json::from_str(&as_doc("json")).unwrap();
    let yaml: serde_json::Value = serde_saphyr::from_str(&as_doc("yaml")).unwrap();
    assert_eq!(json, yaml, "one document, two syntaxes");
    assert_eq!(json["node"], "master-0");
    assert_eq!(json["pools"], serde_json::json!(["master"]));
    assert_eq!(json["admission"]["verdict"], "admit-all");
    assert_eq!(json["images"], 5);
    assert_eq!(json["present"], 0);
    assert_eq!(json["concurrency"], 1);
    assert_eq!(json["throttleAfterPullMs"], 1000);
    let pulls = json["pulls"].as_array().unwrap();
    assert_eq!(pulls.len(), 5);
    assert!(
        pulls
            .iter()
            .all(|p| p["sizeBytes"].is_null() && p["image"].as_str().unwrap().contains("@sha256:"))
    );
    assert!(
        json["refused"].as_array().unwrap().is_empty()
            && json["fallbacks"].as_array().unwrap().is_empty()
    );
    // What the policy would do, drawn at a simulated pull rate: one lane (one pull at a time
    // on the control plane), a bar per pull, the 1 s throttle between them.
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("plan.svg");
    let (code, _, err) = plan(&["--timeline", svg.to_str().unwrap(), "--pull-rate-mib", "50"]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let count = |c: &str| {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(c))
            .count()
    };
    assert_eq!((count("lane"), count("pull")), (1, 5), "{text}");
    assert!(count("throttle") >= 4, "{text}");
    assert!(svg.with_extension("trace.json").exists());

    // The worker's policy asks five pulls at once; a rollout grant's cap of 2 is what the node
    // does, and the plan says so (text and document).
    let worker = |extra: &[&str]| plan_of("worker-0", extra);
    let (code, out, err) = worker(&["--max-pulls", "2"]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(
        &out,
        &[
            ", 2 at once",
            "capped by the rollout grant (max-pulls 2): the policy asked 5 at once",
        ],
    );
    let (_, out, _) = worker(&["--max-pulls", "2", "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            json["concurrency"].clone(),
            json["policyConcurrency"].clone()
        ),
        (2.into(), 5.into())
    );
    let (_, out, _) = worker(&["-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        json["policyConcurrency"].is_null() && json["concurrency"] == 5,
        "{json}"
    );
    let (code, _, err) = worker(&["--max-pulls", "0"]);
    assert_eq!(code, 2, "a cap outside 1..=64 is a usage error: {err}");

    let (code, _, err) = pinset(&["plan", "--pull-rate-mib", "0", "--sets", "x", "--node", "y"]);
    assert_eq!(code, 2, "a rate of 0 is a usage error: {err}");
    let (code, _, err) = pinset(&["plan", "-o", "xml", "--sets", "x", "--node", "y"]);
    assert_eq!(code, 2, "a bad -o is a usage error: {err}");
}

#[test]
fn node_pulls_and_pins_against_a_runtime_and_refuses_a_tag_by_name() {
    let images = support::digests("a", 3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let n = support::SimNode::start(&rt, &images, "", |_| {});
    n.write_set("apps", None, &images);
    let (dir, sets, dropins, sim) = (&n.dir, &n.sets, &n.dropins, &n.sim);
    // The node's arguments with another sets file.
    let args = |file: &Path| -> Vec<String> {
        let mut a = n.node_args();
        a[2] = file.to_str().unwrap().to_string();
        a
    };
    let set = |name: &str, refs: &[String]| support::set_yaml(name, None, refs);
    let run = |a: Vec<String>| pinset(&a.iter().map(String::as_str).collect::<Vec<_>>());

    let (code, out, err) = run(args(sets));
    assert_eq!(code, 0, "{out}\n{err}");
    support::assert_says(&out, &["node w1: 3 pulled, 0 failed"]);
    // No --pin: the runtime says it is CRI-O (CRI Version), so the drop-in is written.
    support::assert_says(
        &out,
        &[
            "pins: +3 −0 (drop-in written, CRI-O reloaded)",
            "set apps generation 1: done",
        ],
    );
    let pinned =
        crio::parse(&std::fs::read_to_string(dropins.join(crio::DROP_IN)).unwrap()).unwrap();
    assert_eq!(pinned, images);
    assert_eq!(sim.stats().calls("PullImage"), 3);

    let tagged = dir.path().join("tagged.yaml");
    std::fs::write(
        &tagged,
        format!(
            "{}---\n{}",
            set("apps", &images),
            set("latest", &["registry.test/a/x:latest".into()])
        ),
    )
    .unwrap();
    let (code, out, err) = run(args(&tagged));
    assert_eq!(code, 1, "{out}\n{err}");
    support::assert_says(
        &out,
        &[
            "set latest generation 1: FAILED",
            "registry.test/a/x:latest",
            "by digest",
        ],
    );
    assert!(
        out.contains("set apps generation 1: done"),
        "the valid set is unaffected: {out}"
    );
    assert_eq!(sim.stats().calls("PullImage"), 3, "nothing pulled twice");
}

#[test]
fn watch_restarts_on_a_changed_set_and_abandons_pulls_in_flight() {
    use pinset_cri_sim::Fault;
    use std::time::{Duration, Instant};
    let images = support::digests("w", 6);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let n = support::SimNode::start(&rt, &images, "", |sim| {
        for r in &images[..3] {
            sim.inject(r, [Fault::Hang]);
        }
    });
    let write_set = |generation: i64, refs: &[String]| n.write_set("apps", Some(generation), refs);
    write_set(1, &images[..3]);
    let (dropins, sim) = (&n.dropins, &n.sim);
    let mut child = Command::new(support::PINSET)
        .args(n.node_args())
        .arg("--watch")
        .env("PINSET_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for("3 hanging pulls", &|| sim.stats().in_flight == 3);
    // Generation 2 replaces the hanging images.
    write_set(2, &images[3..]);
    let drop_in = dropins.join(crio::DROP_IN);
    wait_for("generation 2 pinned", &|| {
        std::fs::read_to_string(&drop_in)
            .map(|s| crio::parse(&s).unwrap() == images[3..])
            .unwrap_or(false)
    });
    let stats = sim.stats();
    assert_eq!(
        stats.pulls.iter().filter(|p| p.abandoned).count(),
        3,
        "in-flight pulls of generation 1 abandoned"
    );
    assert_eq!(stats.in_flight, 0);
    support::reap(&mut child);
}

/// kubectl's exit codes: 0 ok, 1 failure, 2 usage; a dry run whose input is invalid fails.
#[test]
fn exit_codes_are_kubectls_and_a_dry_run_of_a_refusal_fails() {
    let dir = tempfile::tempdir().unwrap();
    let demo = workspace().join("examples/demo");
    // A tag is refused: `plan` is a dry run of that failure, so it fails.
    let tagged = dir.path().join("tagged.yaml");
    std::fs::write(
        &tagged,
        "kind: PinnedImageSet\nmetadata: {name: latest, labels: {machineconfiguration.openshift.io/role: master}}\nspec: {pinnedImages: [{name: registry.test/a/x:latest}]}\n",
    )
    .unwrap();
    let flags = ["--node-name", "master-0", "--no-sizing"];
    let (code, out, _) = on_demo_nodes("plan", &tagged, &flags);
    assert_eq!(code, 1, "{out}");
    support::assert_says(&out, &["set latest refused"]);
    // A runtime failure is 1 (a dead CRI socket); a usage error is 2.
    let sets = demo.join("sets.yaml");
    let dead = format!("unix://{}", dir.path().join("none.sock").display());
    let dead_cri = ["--cri", &dead, "--pin", "crio"];
    let (code, _, err) = on_demo_nodes("node", &sets, &[&flags[..], &dead_cri].concat());
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = pinset(&["policy", "info", "--policy-memory-mib", "0"]);
    assert_eq!(code, 2, "{err}");
    support::assert_says(&err, &["--policy-memory-mib"]);
    let (code, _, err) = pinset(&["controller", "--metrics-addr", "nonsense"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = pinset(&["policy", "info", "--log", "pinset=bogus"]);
    assert_eq!(code, 2, "{err}");
    support::assert_says(&err, &["'pinset=bogus' for '--log", "EnvFilter"]);
}

/// Completions, and `:PORT` parses (the flag is checked before anything runs).
#[test]
fn completions_are_printed_and_a_bare_port_parses() {
    let (code, out, _) = pinset(&["completion", "bash"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("_pinset()") && out.contains("policy"),
        "{out:.200}"
    );
    let (code, _, err) = pinset(&[
        "controller",
        "--metrics-addr",
        ":0",
        "--kubeconfig",
        "/nonexistent",
    ]);
    assert_eq!(code, 1, "a valid address, a missing kubeconfig: {err}");
    assert!(
        err.contains("/nonexistent") && !err.contains("--metrics-addr"),
        "{err}"
    );
}

/// `pinset policy info`: the module given as an argument (else the embedded default), each
/// contract it implements, its sha256 and what it imports, as text, JSON or YAML.
#[test]
fn policy_info_describes_each_contract_a_module_implements() {
    let default = support::policy_path("pinset_policy_default");
    let (code, out, err) = pinset(&["policy", "info", default.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(&out, &["pinset_policy_default.wasm", "sha256"]);
    // What it asks of the sandbox: the contracts' interfaces, and no WASI (it is built without
    // the standard library).
    let imports = out
        .lines()
        .find(|l| l.trim_start().starts_with("imports ("))
        .unwrap_or("");
    assert!(
        imports.contains("imports (3) ")
            && imports.contains("pinset:policy/types@0.1.0")
            && !imports.contains("wasi:"),
        "{out}"
    );
    // For scripts: each contract the module implements, its sha256 and imports.
    let (code, out, err) = pinset(&["policy", "info", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(info["module"], "embedded:default");
    assert_eq!(info["node"]["contract"], "pinset:policy/decisions@0.1.0");
    assert_eq!(info["node"]["name"], "default");
    assert_eq!(info["fleet"]["contract"], "pinset:fleet/rollout@0.2.1");
    assert_eq!(info["sha256"].as_str().map(str::len), Some(64));
    // A module of the node contract alone (and no WASI), as YAML.
    let floor = support::policy_path("pinset_test_policy_floor");
    let (code, out, err) = pinset(&["policy", "info", floor.to_str().unwrap(), "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    let info: serde_json::Value = serde_saphyr::from_str(&out).expect("one YAML document");
    assert_eq!(info["node"]["name"].as_str(), Some("floor"));
    assert!(info.get("fleet").is_none(), "{out}");
    let imports: Vec<&str> = info["imports"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|i| i.as_str())
        .collect();
    assert_eq!(
        imports,
        ["pinset:policy/host@0.1.0", "pinset:policy/types@0.1.0"]
    );
    // A module of the fleet contract alone.
    let zones = support::policy_path("pinset_policy_zone_by_zone");
    let (code, out, err) = pinset(&["policy", "info", zones.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("fleet  pinset:fleet/rollout@0.2.1 — zone-by-zone")
            && !out.contains("  node "),
        "{out}"
    );
}

/// A file that is no module says so in a line; a module built for a contract's next version is
/// told about its own contract: the node contract's error for a node module, the fleet
/// contract's for a fleet module.
#[test]
fn policy_info_names_a_non_module_and_a_module_of_another_version() {
    let sets = workspace().join("examples/demo/sets.yaml");
    let (code, _, err) = pinset(&["policy", "info", sets.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("not WebAssembly at all") && err.lines().count() == 1,
        "{err}"
    );
    for (stem, theirs, ours, not) in [
        (
            "pinset_test_policy_future_fleet",
            "pinset:fleet/rollout@0.3.0",
            "pinset:fleet/rollout@0.2.1",
            "pinset:policy/decisions",
        ),
        (
            "pinset_test_policy_future_contract",
            "pinset:policy/decisions@0.2.0",
            "pinset:policy/decisions@0.1.0",
            "pinset:fleet/rollout",
        ),
    ] {
        let module = support::policy_path(stem);
        let (code, _, err) = pinset(&["policy", "info", module.to_str().unwrap()]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(theirs) && err.contains(ours) && !err.contains(not),
            "{stem}: {err}"
        );
    }
}

/// kubectl's habits for input files: `FILE:LINE:COL: field.path: message`, said once; unknown
/// fields refused unless `--lenient`; an empty directory warned about; several Nodes need
/// `--node-name`; a missing file's cause said once.
#[test]
fn input_errors_name_file_line_and_field_once() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |sets: &Path, extra: &[&str]| {
        on_demo_nodes("plan", sets, &[&["--no-sizing"][..], extra].concat())
    };
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let digest = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";
    let broken = write(
        "broken.yaml",
        "kind: PinnedImageSet\nmetadata:\n  name: a\nspec:\n  pinnedImages: [\n",
    );
    let (code, _, err) = plan(&broken, &["--node-name", "master-0"]);
    assert_eq!(code, 1, "{err}");
    let at = format!("{}:", broken.display());
    assert!(
        err.starts_with(&format!("error: {at}")) && err.matches(&at).count() == 1,
        "{err}"
    );
    let line_col: Vec<&str> = err[("error: ".len() + at.len())..].splitn(3, ':').collect();
    assert!(
        line_col[0].parse::<usize>().is_ok() && line_col[1].parse::<usize>().is_ok(),
        "{err}"
    );

    let typo = format!(
        "kind: PinnedImageSet\nmetadata:\n  name: a\n  labels: {{machineconfiguration.openshift.io/role: master}}\nspec:\n  pinnedImages: [{{name: 'q.io/a@sha256:{digest}'}}]\n  pinnedImage: []\n"
    );
    let typo = write("typo.yaml", &typo);
    let (code, _, err) = plan(&typo, &["--node-name", "master-0"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.trim(),
        format!(
            "error: {}:7:3: spec.pinnedImage: unknown field",
            typo.display()
        )
    );
    let (code, out, err) = plan(&typo, &["--node-name", "master-0", "--lenient"]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(
        &err,
        &["7:3: spec.pinnedImage: unknown field (read because of --lenient)"],
    );
    support::assert_says(&out, &["admission: admit-all"]);

    let (code, _, err) = plan(&typo, &["--lenient"]);
    assert_eq!(code, 1);
    support::assert_says(
        &err,
        &["2 Nodes (master-0, worker-0): choose one with --node-name"],
    );

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, _, err) = plan(&empty, &["--node-name", "master-0"]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(
        &err,
        &[&format!(
            "--sets {}: no PinnedImageSet found",
            empty.display()
        )],
    );
    let (code, _, err) = pinset(&["policy", "test", empty.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    support::assert_says(
        &err,
        &[&format!("scenarios {}: no scenario file", empty.display())],
    );

    let flags = [
        "--node-name",
        "master-0",
        "--lenient",
        "--auth",
        "/nonexistent/config.json",
    ];
    let runtime = ["--cri", "unix:///nonexistent.sock", "--pin", "containerd"];
    let (code, _, err) = on_demo_nodes("node", &typo, &[&flags[..], &runtime].concat());
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err.matches("os error")
            .count()
            .max(err.matches("No such file").count()),
        1,
        "each cause once: {err}"
    );
}

/// Policies that print, panic, sleep through WASI, probe WASI, flood the log, forge log lines
/// or answer with a giant reason, through `pinset node` (the async path the agent runs): each is
/// contained — the process neither crashes nor stalls, output stays bounded, and the reference
/// decides where the policy failed.
#[test]
fn hostile_policies_cannot_crash_stall_or_flood_pinset_node() {
    let hostile = support::policy_path("pinset_test_policy_hostile");
    let images = support::digests("h", 3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    for mode in support::HOSTILE_MODES {
        let n = support::SimNode::start(
            &rt,
            &images,
            &format!("pinset.test/hostile: {mode}"),
            |_| {},
        );
        n.write_set("apps", None, &images);
        let started = std::time::Instant::now();
        let out = Command::new(support::PINSET)
            .args(n.node_args())
            .args(["--policy", hostile.to_str().unwrap()])
            .args(["--policy-deadline-ms", "50"])
            .env("PINSET_LOG", "info")
            .output()
            .unwrap();
        let took = started.elapsed();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let code = out.status.code();
        let ctx = format!(
            "mode {mode}: exit {code:?} in {took:?}\n{stdout}\n{}",
            tail(&stderr)
        );
        // The reference's worker policy throttles nothing: a few hooks at 50 ms each at most.
        assert!(took < Duration::from_secs(10), "{ctx}");
        assert!(
            stdout.len() < 64 << 10,
            "stdout {} bytes: {ctx}",
            stdout.len()
        );
        assert!(
            stderr.len() < 256 << 10,
            "stderr {} bytes: {ctx}",
            stderr.len()
        );
        assert!(
            !stderr
                .lines()
                .any(|l| l.starts_with("2026-12-01T00:00:00Z")),
            "a policy forged a log line: {ctx}"
        );
        let flood = stderr.lines().filter(|l| l.contains("yyyyyyyy")).count();
        assert!(
            flood <= pinset_policy::MAX_LOG_LINES as usize,
            "{flood} policy lines in one reconcile: {ctx}"
        );
        if mode == "log-flood" {
            assert!(flood > 0, "the first lines are kept: {ctx}");
        }
        if mode == "giant-reason" {
            // A rejection (valid) with a bounded reason: the set fails, naming it, once.
            assert_eq!(code, Some(1), "{ctx}");
            // Escaped: the policy's newlines do not start lines of their own.
            assert!(stdout.contains(r"not admitted: z\nz\nz"), "{ctx}");
            assert_eq!(
                stdout.matches("not admitted").count(),
                1,
                "said once: {ctx}"
            );
            assert_eq!(n.sim.stats().calls("PullImage"), 0, "{ctx}");
            continue;
        }
        assert_eq!(code, Some(0), "{ctx}");
        assert!(stdout.contains("node w1: 3 pulled, 0 failed"), "{ctx}");
        assert!(stdout.contains("set apps generation 1: done"), "{ctx}");
        match mode {
            "trap" => assert!(
                stdout.contains("policy fallback:") && stdout.contains("panicked"),
                "the panic is quoted: {ctx}"
            ),
            "sleep" => assert!(stdout.contains("may not wait"), "{ctx}"),
            _ => assert!(
                !stdout.contains("policy fallback:"),
                "printing is no failure: {ctx}"
            ),
        }
    }
}

/// An input without end — a device, a pipe fed forever — is refused at its kind's bound with
/// the bound named, in well under a second and without taking the machine's memory: objects,
/// configuration, scenarios, modules and standard input alike.
#[test]
fn inputs_without_end_are_refused_at_their_bound() {
    let sets = workspace().join("examples/demo/sets.yaml");
    let sets = sets.to_str().unwrap();
    let objects = "larger than 64 MiB, the most pinset reads from a file of Kubernetes objects";
    let config = "larger than 16 MiB, the most pinset reads from a configuration file";
    for (extra, sets, said) in [
        (
            &[][..],
            "/dev/zero",
            format!("/dev/zero: cannot read: {objects}"),
        ),
        (
            &["--registries", "/dev/zero"][..],
            sets,
            format!("/dev/zero: {config}"),
        ),
        (
            &["--policy", "/dev/zero"][..],
            sets,
            "policy module /dev/zero: over the limit of 16777216 bytes (--policy-max-module-mib)"
                .to_string(),
        ),
    ] {
        let args = [&["--node-name", "worker-0", "--no-sizing"][..], extra].concat();
        let (code, _, err) = on_demo_nodes("plan", Path::new(sets), &args);
        assert_eq!(code, 1, "{extra:?}: {err}");
        assert!(err.contains(&said), "{extra:?}: {err}");
    }
    let (code, _, err) = pinset(&["set", "from-manifests", "web", "/dev/zero"]);
    assert_eq!(
        (code, err.trim()),
        (1, &*format!("error: /dev/zero: {objects}"))
    );
    let (code, out, _) = pinset(&["policy", "test", "/dev/zero"]);
    assert_eq!(code, 1, "{out}");
    support::assert_says(
        &out,
        &["larger than 64 MiB, the most pinset reads from a scenario file"],
    );
    // Standard input from a producer that never stops.
    let mut yes = Command::new("yes")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(support::PINSET)
        .args(["set", "from-manifests", "web", "-"])
        .stdin(yes.stdout.take().unwrap())
        .output()
        .unwrap();
    let _ = yes.kill();
    let _ = yes.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    support::assert_says(&err, &[&format!("-: standard input: {objects}")]);
}

/// A long-running `pinset node --watch` compiles its policy in a child bounded by its
/// `--policy-compile-*` flags: a module too costly to compile is refused with the bound named.
#[test]
fn a_watching_node_refuses_a_module_too_costly_to_compile_naming_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("costly.wasm");
    std::fs::write(&module, support::costly_component(200_000)).unwrap();
    let sets = workspace().join("examples/demo/sets.yaml");
    let module = module.to_str().unwrap();
    for (flags, said) in [
        (
            &["--policy-compile-memory-mib", "32"][..],
            "compiling it needs more than 32 MiB of memory (--policy-compile-memory-mib)",
        ),
        // 1.8 s here unbounded: memory enough for it, and the deadline cuts it.
        (
            &[
                "--policy-compile-seconds",
                "1",
                "--policy-compile-memory-mib",
                "4096",
            ][..],
            "compiling it took longer than 1 s (--policy-compile-seconds)",
        ),
    ] {
        let mut args = vec!["--watch", "--node-name", "worker-0", "--policy", module];
        args.extend_from_slice(flags);
        args.extend(["--cri", "unix:///nonexistent/cri.sock"]);
        let (code, _, err) = on_demo_nodes("node", &sets, &args);
        assert_eq!(code, 1, "{err}");
        let want = format!("error: policy module {module}: too costly to compile: {said}");
        assert_eq!(err.trim(), want);
    }
}

/// The last lines of a long output.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `--log-format json`: every log line is one JSON object with the level, the message and the
/// event's fields; the reconcile's lines carry their node (span field).
#[test]
fn json_logs_parse_line_by_line() {
    let out = Command::new(support::PINSET)
        .args(["--log-format", "json", "demo"])
        .env("PINSET_LOG", "info,pinset_node=debug")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "no logs: {stderr}");
    for l in &lines {
        assert!(
            l["timestamp"].is_string() && l["level"].is_string() && l["message"].is_string(),
            "{l}"
        );
    }
    let nodes: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter_map(|l| l["span"]["node"].as_str().or(l["node"].as_str()))
        .collect();
    assert!(
        nodes.contains("master-0") && nodes.contains("worker-0"),
        "{nodes:?}\n{stderr}"
    );
}
