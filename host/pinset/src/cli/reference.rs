//! The command-line reference, from the argument parser itself: every command and subcommand
//! with its flags, defaults and environment variables, as Markdown (`docs/cli.md`, written by
//! the hidden `pinset reference`; a test fails when the page is stale).

/// The page for `root` (pinset's parser).
pub fn markdown(root: clap::Command) -> String {
    // The page says which variable a flag reads, never the value it has where it is generated.
    let mut root = root.mut_args(|a| a.hide_env_values(true)).term_width(100);
    root.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from pinset's own argument parser (`pinset reference > docs/cli.md`; a test \
         keeps this page current). Every command also answers `--help`; `pinset completion \
         SHELL` prints a completion script.\n",
    );
    walk(&mut root, "pinset", &mut out);
    out
}

fn walk(cmd: &mut clap::Command, path: &str, out: &mut String) {
    let help = cmd.render_long_help().to_string();
    let help: Vec<&str> = help.lines().map(str::trim_end).collect();
    out.push_str(&format!(
        "\n## `{path}`\n\n```text\n{}\n```\n",
        help.join("\n").trim_end()
    ));
    let names: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        if let Some(sub) = cmd.find_subcommand_mut(&name) {
            walk(sub, &format!("{path} {name}"), out);
        }
    }
}

/// The pages `pinset reference PAGE` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Page {
    /// Every command and flag (docs/cli.md).
    #[default]
    Cli,
    /// Every field of the CustomResourceDefinitions pinset serves, with its rules
    /// (docs/reference/crds.md).
    Crds,
    /// Every Prometheus metric the agent and the controller serve (docs/reference/metrics.md).
    Metrics,
    /// Every kind of Event the agent and the controller record (docs/reference/events.md).
    Events,
}

/// The CRD reference: each kind's fields from its schema — type, bounds, rules, description.
pub fn crds_markdown() -> String {
    let mut out = String::from(
        "# CustomResourceDefinitions reference\n\n\
         Generated from the schemas pinset serves (`pinset reference crds > \
         docs/reference/crds.md`; `pinset crds` prints the CRDs themselves; a test keeps this \
         page current). A field's rules are the API server's: a write that breaks one is \
         refused with its message.\n",
    );
    for crd in pinset_k8s::api::crds() {
        let Some(version) = crd.spec.versions.iter().find(|v| v.storage) else {
            continue;
        };
        let names = &crd.spec.names;
        out.push_str(&format!(
            "\n## {} (`{}/{}`, {})\n\n| field | type | rules | description |\n|---|---|---|---|\n",
            names.kind,
            crd.spec.group,
            version.name,
            if crd.spec.scope == "Cluster" {
                "cluster-scoped"
            } else {
                "namespaced"
            },
        ));
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .unwrap_or_default();
        for field in ["spec", "status"] {
            if let Some(s) = schema.pointer(&format!("/properties/{field}")) {
                fields(s, field, &mut out);
            }
        }
    }
    out
}

/// One row per field under `schema` (at `path`), depth first.
fn fields(schema: &serde_json::Value, path: &str, out: &mut String) {
    out.push_str(&format!(
        "| `{path}` | {} | {} | {} |\n",
        type_of(schema),
        cell(&rules(schema).join("; ")),
        cell(first_sentence(schema["description"].as_str().unwrap_or(""))),
    ));
    if let Some(props) = schema["properties"].as_object() {
        for (name, s) in props {
            fields(s, &format!("{path}.{name}"), out);
        }
    }
    if let Some(props) = schema["items"]["properties"].as_object() {
        for (name, s) in props {
            fields(s, &format!("{path}[].{name}"), out);
        }
    }
}

fn type_of(schema: &serde_json::Value) -> String {
    let t =
        schema["type"]
            .as_str()
            .unwrap_or(if schema.get("x-kubernetes-int-or-string").is_some() {
                "int or string"
            } else {
                "any"
            });
    match (t, schema["items"]["type"].as_str()) {
        ("array", Some(item)) => format!("array of {item}"),
        _ => t.to_string(),
    }
}

/// The schema's bounds and CEL rules, as a reader needs them.
fn rules(schema: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for (key, word) in [
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ] {
        if let Some(v) = schema.get(key) {
            out.push(format!("{word} {v}"));
        }
    }
    if let Some(p) = schema["pattern"].as_str() {
        out.push(format!("pattern `{p}`"));
    }
    if let Some(values) = schema["enum"].as_array() {
        let v: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        out.push(format!("one of {}", v.join(", ")));
    }
    if let Some(keys) = schema["x-kubernetes-list-map-keys"].as_array() {
        let k: Vec<&str> = keys.iter().filter_map(|k| k.as_str()).collect();
        out.push(format!("a map keyed by {}", k.join(", ")));
    }
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let message = rule["message"]
            .as_str()
            .or(rule["rule"].as_str())
            .unwrap_or("");
        out.push(format!("“{message}”"));
    }
    out
}

fn first_sentence(text: &str) -> &str {
    let text = text.trim();
    match text.find(". ") {
        Some(end) => &text[..=end],
        None => text,
    }
}

/// Text for a table cell: one line, no column break.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

/// The metrics reference: each metric's name, type and help, from the registry pinset serves.
pub fn metrics_markdown() -> String {
    let metrics = pinset_k8s::metrics::Metrics::new();
    let mut out = String::from(
        "# Metrics reference\n\n\
         Generated from the registry the agent and the controller serve on `--metrics-addr` \
         (`/metrics`, Prometheus text format; `pinset reference metrics > \
         docs/reference/metrics.md`; a test keeps this page current). Each metric's labels are \
         named in its help.\n\n| metric | type | help |\n|---|---|---|\n",
    );
    for d in metrics.descriptors() {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            d.name,
            d.kind,
            cell(&d.help)
        ));
    }
    out
}

/// The Events reference: every kind of Event, from the one table the agent and the controller
/// record from.
pub fn events_markdown() -> String {
    let mut out = String::from(
        "# Events reference\n\n\
         Generated from the table the agent and the controller record from (`pinset reference \
         events > docs/reference/events.md`; a test keeps this page current). Events are \
         `events.k8s.io/v1`, reported by `pinset-agent` (instance: the node) or \
         `pinset-controller`: `kubectl get events --field-selector regarding.name=NAME`, or \
         `kubectl describe` the object. Recording is best effort: a failure never stops the \
         work.\n\n| reason | type | action | regarding | when |\n|---|---|---|---|---|\n",
    );
    for k in pinset_k8s::events::ALL {
        let kind = if k.warning { "Warning" } else { "Normal" };
        out.push_str(&format!(
            "| `{}` | {kind} | {} | {} | {} |\n",
            k.reason,
            k.action,
            k.regarding,
            cell(k.when)
        ));
    }
    out
}

/// Man pages from the parser, one per visible command — `pinset.1`, `pinset-plan.1`,
/// `pinset-policy-test.1`, … — written into `dir` (created when missing); the paths written.
pub fn man_pages(
    command: clap::Command,
    dir: &std::path::Path,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut command = command;
    command.build();
    let mut written = Vec::new();
    man_page(&command, dir, &mut written)?;
    Ok(written)
}

/// `command`'s page as `NAME.1`, NAME its display name once built (`pinset-policy-test`), then
/// its visible subcommands' pages.
fn man_page(
    command: &clap::Command,
    dir: &std::path::Path,
    written: &mut Vec<std::path::PathBuf>,
) -> std::io::Result<()> {
    let name = command.get_display_name().unwrap_or(command.get_name());
    let mut roff = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut roff)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, roff)?;
    written.push(path);
    // clap's own `help` subcommand is `-h` on each page already.
    let visible = |c: &&clap::Command| !c.is_hide_set() && c.get_name() != "help";
    for sub in command.get_subcommands().filter(visible) {
        man_page(sub, dir, written)?;
    }
    Ok(())
}
