//! The reference of the scenario formats `pinset policy test` reads — every field, what it is,
//! its unit and default — as one table per format, rendered into `docs/scenarios.md`
//! (`pinset policy test --reference`). Tests keep the table and the types one: every field the
//! types accept is in the table and every row is a field they accept (read from the types'
//! own `Deserialize`), and the page in `docs/` is the table's rendering.

/// One field of a scenario file.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// `node.allocatable`, `images[].layers[].size`.
    pub path: &'static str,
    /// What it holds, with its unit: `quantity (bytes: 16Gi, 500Mi, 1000)`, `milliseconds`…
    pub kind: &'static str,
    /// `required`, or the value when it is left out.
    pub default: &'static str,
    pub about: &'static str,
}

const fn f(
    path: &'static str,
    kind: &'static str,
    default: &'static str,
    about: &'static str,
) -> Field {
    Field {
        path,
        kind,
        default,
        about,
    }
}

const BYTES: &str = "quantity of bytes (`16Gi`, `500Mi`, `1G`, `1000`)";
const PERCENT: &str = "number, percent (PSI `some avg10`)";

/// The node scenario: a node, its disk, its images, pulls, and the decisions expected.
pub const NODE: &[Field] = &[
    f(
        "name",
        "text",
        "required",
        "What the scenario shows; printed by `policy test`.",
    ),
    f("description", "text", "none", "Longer words for readers."),
    f("node.name", "text", "required", "The node's name."),
    f(
        "node.labels",
        "map of text to text",
        "{}",
        "The node's labels (`node-role.kubernetes.io/master: \"\"`).",
    ),
    f(
        "node.pools",
        "list of pool names",
        "the pools the labels select",
        "The pools whose sets the node takes.",
    ),
    f("node.ready", "boolean", "true", "The node is Ready."),
    f(
        "node.diskPressure",
        "boolean",
        "false",
        "The node has the DiskPressure condition.",
    ),
    f(
        "node.allocatable",
        BYTES,
        "unknown",
        "Allocatable ephemeral storage.",
    ),
    f(
        "disk.capacity",
        BYTES,
        "unknown",
        "The image filesystem's size, as the runtime reports it.",
    ),
    f(
        "disk.used",
        BYTES,
        "unknown",
        "Bytes used on the image filesystem.",
    ),
    f(
        "disk.available",
        BYTES,
        "unknown",
        "Bytes free on the image filesystem.",
    ),
    f(
        "images[].name",
        "image reference by digest",
        "required",
        "The image (`registry/repo@sha256:…`).",
    ),
    f(
        "images[].sets",
        "list of set names",
        "[scenario]",
        "The PinnedImageSets that list it.",
    ),
    f(
        "images[].present",
        "boolean",
        "false",
        "Already in the runtime's store.",
    ),
    f(
        "images[].size",
        BYTES,
        "unknown (or the layers' sum)",
        "The image's size; neither this nor `layers`: unknown.",
    ),
    f(
        "images[].layers[].digest",
        "text",
        "required",
        "A layer; one digest shared by images is one layer (counted once).",
    ),
    f(
        "images[].layers[].size",
        BYTES,
        "required",
        "The layer's size.",
    ),
    f(
        "pulls[].image",
        "image reference",
        "the first image",
        "The image the pull was of.",
    ),
    f(
        "pulls[].error",
        "text",
        "none (the pull succeeded)",
        "Why the pull failed.",
    ),
    f(
        "pulls[].bytes",
        BYTES,
        "the image's size when the pull succeeded, else none",
        "Bytes the pull moved.",
    ),
    f(
        "pulls[].durationMs",
        "milliseconds",
        "0",
        "How long the pull took.",
    ),
    f(
        "pulls[].remaining",
        "count",
        "0",
        "Pulls still to do after this one.",
    ),
    f(
        "pulls[].pressure.io",
        PERCENT,
        "unknown",
        "I/O pressure after the pull.",
    ),
    f(
        "pulls[].pressure.cpu",
        PERCENT,
        "unknown",
        "CPU pressure after the pull.",
    ),
    f(
        "pulls[].pressure.memory",
        PERCENT,
        "unknown",
        "Memory pressure after the pull.",
    ),
    f(
        "pulls[].expectThrottleMs",
        "milliseconds",
        "not checked",
        "The pause `throttle` must answer after this pull.",
    ),
    f(
        "expect.admission.verdict",
        "`admit-all`, `admit-some` or `reject`",
        "required",
        "The admission expected.",
    ),
    f(
        "expect.admission.images",
        "list of image references",
        "not checked",
        "For `admit-some`: the images admitted.",
    ),
    f(
        "expect.admission.reasonContains",
        "text",
        "not checked",
        "Words the admission's reason must contain.",
    ),
    f(
        "expect.order",
        "list of image references",
        "not checked",
        "The pull order of the admitted, absent images.",
    ),
    f(
        "expect.concurrency",
        "count, 1..=64",
        "not checked",
        "Pulls at once.",
    ),
    f(
        "expect.fallbacks",
        "list of hooks (`admit`, `order`, `concurrency`, `throttle`, `info`)",
        "[] (none may fall back)",
        "Hooks expected to fall back to the reference.",
    ),
];

/// The fleet scenario: a pool's nodes in given states, and the grant expected.
pub const FLEET: &[Field] = &[
    f("name", "text", "required", "What the scenario shows."),
    f("description", "text", "none", "Longer words for readers."),
    f("fleet.pool.name", "text", "required", "The pool."),
    f(
        "fleet.pool.annotations",
        "map of text to text",
        "{}",
        "The pool's annotations (`pinset.io/rollout-max-pulling`, `pinset.io/rollout-paused`).",
    ),
    f(
        "fleet.target[].name",
        "text",
        "required",
        "A set of the target.",
    ),
    f(
        "fleet.target[].generation",
        "integer",
        "required",
        "Its generation.",
    ),
    f("fleet.target[].images", "count", "0", "Its images."),
    f(
        "fleet.nodes[].name",
        "text",
        "required",
        "A node of the pool.",
    ),
    f(
        "fleet.nodes[].labels",
        "map of text to text",
        "{}",
        "Its labels (zones, roles).",
    ),
    f(
        "fleet.nodes[].ready",
        "boolean",
        "true",
        "The node is Ready.",
    ),
    f(
        "fleet.nodes[].granted",
        "boolean",
        "true when its phase is pulling, else false",
        "It holds a grant for the target.",
    ),
    f(
        "fleet.nodes[].phase",
        "`waiting`, `pulling`, `done` or `failed`",
        "waiting",
        "Where it stands against the target.",
    ),
    f(
        "fleet.nodes[].error",
        "text",
        "none",
        "Why it failed (phase `failed`).",
    ),
    f(
        "expect.grant",
        "list of node names",
        "not checked",
        "The nodes granted now.",
    ),
    f(
        "expect.maxPulls",
        "count",
        "not checked",
        "The concurrency the grant sets.",
    ),
    f(
        "expect.reasonContains",
        "text",
        "not checked",
        "Words the grant's reason must contain.",
    ),
    f(
        "expect.fallback",
        "boolean",
        "not checked",
        "The fleet hook falls back to the reference.",
    ),
];

/// The page: both tables, with an example of each format.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Scenario reference\n\n\
         Generated by `pinset policy test --reference` from the scenario types (a test keeps \
         the two one). `pinset policy test SCENARIO.yaml|DIR…` reads both formats: a file \
         with a top-level `fleet:` is a fleet scenario. Fields are strict: an unknown one is \
         an error at FILE:LINE:COL.\n\n## Node scenarios\n\n```yaml\n",
    );
    out.push_str(NODE_EXAMPLE);
    out.push_str("```\n\n");
    table(&mut out, NODE);
    out.push_str("\n## Fleet scenarios\n\n```yaml\n");
    out.push_str(FLEET_EXAMPLE);
    out.push_str("```\n\n");
    table(&mut out, FLEET);
    out
}

fn table(out: &mut String, fields: &[Field]) {
    out.push_str("| field | what, and its unit | when left out | meaning |\n|---|---|---|---|\n");
    for f in fields {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.path, f.kind, f.default, f.about
        ));
    }
}

/// A node scenario with every section (it passes with the embedded default).
pub const NODE_EXAMPLE: &str = r#"name: a worker with room pulls five at a time
node:
  name: worker-1
  labels: {node-role.kubernetes.io/worker: ""}
  allocatable: 200Gi
disk: {capacity: 300Gi, used: 20Gi, available: 280Gi}
images:
  - {name: "registry.example.internal/apps/api@sha256:0000000000000000000000000000000000000000000000000000000000000001", size: 3Gi}
  - name: "registry.example.internal/apps/web@sha256:0000000000000000000000000000000000000000000000000000000000000002"
    layers: [{digest: "sha256:aa", size: 600Mi}, {digest: "sha256:bb", size: 400Mi}]
pulls:
  - {image: "registry.example.internal/apps/api@sha256:0000000000000000000000000000000000000000000000000000000000000001", durationMs: 30000, pressure: {io: 5}, expectThrottleMs: 1000}
expect:
  admission: {verdict: admit-all, reasonContains: usable}
  order:
    - "registry.example.internal/apps/api@sha256:0000000000000000000000000000000000000000000000000000000000000001"
    - "registry.example.internal/apps/web@sha256:0000000000000000000000000000000000000000000000000000000000000002"
  concurrency: 5
"#;

/// A fleet scenario (it passes with the embedded default).
pub const FLEET_EXAMPLE: &str = r#"name: the canary goes first
fleet:
  pool: {name: worker}
  target: [{name: apps, generation: 2, images: 3}]
  nodes:
    - {name: w-0}
    - {name: w-1}
expect:
  grant: [w-0]
  reasonContains: canary
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::{self, Deserializer, Visitor};
    use std::collections::BTreeSet;

    /// Reads a type's field names from its own `Deserialize`: the derive asks for a struct and
    /// names its fields; nothing is deserialized.
    struct Names(Vec<&'static str>);

    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> Deserializer<'de> for &mut Names {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = fields.to_vec();
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    fn fields<T: for<'de> serde::Deserialize<'de>>() -> Vec<&'static str> {
        let mut names = Names(Vec::new());
        let _ = T::deserialize(&mut names);
        names.0
    }

    /// Every path the types accept: a struct's fields under `prefix`, nested structs (and lists
    /// of them, `[]`) followed through `nested`.
    fn paths(
        prefix: &str,
        names: Vec<&'static str>,
        nested: &[(&str, Vec<&'static str>)],
    ) -> Vec<String> {
        let mut out = Vec::new();
        for n in names {
            let here = format!("{prefix}{n}");
            let list = format!("{here}[]");
            match nested.iter().find(|(at, _)| *at == here || *at == list) {
                Some((at, inner)) => out.extend(paths(&format!("{at}."), inner.clone(), nested)),
                None => out.push(here),
            }
        }
        out
    }

    fn table_paths(t: &[Field]) -> BTreeSet<String> {
        t.iter().map(|f| f.path.to_string()).collect()
    }

    #[test]
    fn the_node_table_is_every_field_of_the_node_types() {
        use crate::scenario::*;
        let nested = [
            ("node", fields::<NodeSpec>()),
            ("disk", fields::<DiskSpec>()),
            ("images[]", fields::<ImageSpec>()),
            ("images[].layers[]", fields::<LayerSpec>()),
            ("pulls[]", fields::<PullSpec>()),
            ("pulls[].pressure", fields::<PressureSpec>()),
            ("expect", fields::<Expect>()),
            ("expect.admission", fields::<ExpectAdmission>()),
        ];
        let typed: BTreeSet<String> = paths("", fields::<Scenario>(), &nested)
            .into_iter()
            .collect();
        assert_eq!(typed, table_paths(NODE));
    }

    #[test]
    fn the_fleet_table_is_every_field_of_the_fleet_types() {
        use crate::fleet_scenario::*;
        let nested = [
            ("fleet", fields::<FleetSpec>()),
            ("fleet.pool", fields::<PoolSpec>()),
            ("fleet.target[]", fields::<TargetSpec>()),
            ("fleet.nodes[]", fields::<NodeSpec>()),
            ("expect", fields::<FleetExpect>()),
        ];
        let typed: BTreeSet<String> = paths("", fields::<FleetScenario>(), &nested)
            .into_iter()
            .collect();
        assert_eq!(typed, table_paths(FLEET));
    }

    #[test]
    fn the_page_in_docs_is_the_tables_rendering() {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenarios.md");
        let written = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            written == markdown(),
            "{} is stale: regenerate it with `pinset policy test --reference > docs/scenarios.md`",
            page.display()
        );
    }
}
