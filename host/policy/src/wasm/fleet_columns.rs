//! A rollout request as the fleet contract passes it: the pool's nodes as columns, every
//! string once in a table (`wit/fleet/fleet.wit`, record `nodes`).

use super::fleet_bindings::pinset::fleet::types as fw;
use foldhash::HashMap;
use pinset_policy_sdk as sdk;

/// The contract's form of `r`.
pub(super) fn request(r: &sdk::RolloutRequest) -> fw::RolloutRequest {
    fw::RolloutRequest {
        pool: fw::Pool {
            name: r.pool.name.clone(),
            annotations: r.pool.annotations.clone(),
            max_pulling: r.pool.max_pulling,
        },
        target: fw::Target {
            sets: r
                .target
                .sets
                .iter()
                .map(|s| fw::TargetSet {
                    name: s.name.clone(),
                    generation: s.generation,
                    images: s.images,
                    bytes: s.bytes,
                })
                .collect(),
            images: r.target.images,
            bytes: r.target.bytes,
        },
        nodes: nodes(&r.nodes),
    }
}

/// The string table: each distinct string once, in the order first met.
struct Strings<'a> {
    index: HashMap<&'a str, u32>,
    text: String,
    starts: Vec<u32>,
}

impl<'a> Strings<'a> {
    fn new() -> Self {
        Self {
            index: HashMap::default(),
            text: String::new(),
            starts: vec![0],
        }
    }

    /// The index of `s`, added when new: for strings many nodes share (label keys and values,
    /// set names, errors).
    fn id(&mut self, s: &'a str) -> u32 {
        if let Some(&id) = self.index.get(s) {
            return id;
        }
        let id = self.push(s);
        self.index.insert(s, id);
        id
    }

    /// A string no other entry shares (a node's name): added without a lookup.
    fn push(&mut self, s: &str) -> u32 {
        self.text.push_str(s);
        self.starts.push(self.text.len() as u32);
        self.starts.len() as u32 - 2
    }
}

fn phase(p: sdk::Phase) -> fw::Phase {
    match p {
        sdk::Phase::Waiting => fw::Phase::Waiting,
        sdk::Phase::Pulling => fw::Phase::Pulling,
        sdk::Phase::Done => fw::Phase::Done,
        sdk::Phase::Failed => fw::Phase::Failed,
    }
}

/// `(known, value)` of an optional column entry: 0 stands in when there is none.
fn known<T: Default>(v: Option<T>) -> (u8, T) {
    v.map_or((0, T::default()), |v| (1, v))
}

fn nodes(nodes: &[sdk::FleetNode]) -> fw::Nodes {
    let mut strings = Strings::new();
    let mut c = empty(nodes.len());
    for n in nodes {
        c.names.push(strings.push(&n.name));
        for (k, v) in &n.labels {
            c.label_keys.push(strings.id(k));
            c.label_values.push(strings.id(v));
        }
        c.label_starts.push(c.label_keys.len() as u32);
        c.ready.push(n.ready.into());
        c.granted.push(n.granted.into());
        c.phase.push(phase(n.phase));
        let p = &n.progress;
        c.images_done.push(p.images_done);
        c.images_total.push(p.images_total);
        c.bytes_done.push(p.bytes_done);
        c.bytes_total.push(p.bytes_total);
        let (pulling, ms) = known(p.pulling_for_ms);
        c.pulling.push(pulling);
        c.pulling_for_ms.push(ms);
        for s in &n.sets {
            c.set_names.push(strings.id(&s.name));
            c.desired_generations.push(s.desired_generation);
            let (k, g) = known(s.current_generation);
            c.current_known.push(k);
            c.current_generations.push(g);
            let (k, g) = known(s.last_failed_generation);
            c.failed_known.push(k);
            c.failed_generations.push(g);
            let (k, e) = known(s.last_failed_error.as_deref().map(|e| strings.id(e)));
            c.error_known.push(k);
            c.errors.push(e);
        }
        c.set_starts.push(c.set_names.len() as u32);
    }
    c.strings = strings.text;
    c.string_starts = strings.starts;
    c
}

/// Columns for `n` nodes, the `starts` columns holding their leading 0.
fn empty(n: usize) -> fw::Nodes {
    fw::Nodes {
        strings: String::new(),
        string_starts: Vec::new(),
        names: Vec::with_capacity(n),
        label_starts: vec![0],
        label_keys: Vec::new(),
        label_values: Vec::new(),
        ready: Vec::with_capacity(n),
        granted: Vec::with_capacity(n),
        phase: Vec::with_capacity(n),
        images_done: Vec::with_capacity(n),
        images_total: Vec::with_capacity(n),
        bytes_done: Vec::with_capacity(n),
        bytes_total: Vec::with_capacity(n),
        pulling: Vec::with_capacity(n),
        pulling_for_ms: Vec::with_capacity(n),
        set_starts: vec![0],
        set_names: Vec::new(),
        desired_generations: Vec::new(),
        current_known: Vec::new(),
        current_generations: Vec::new(),
        failed_known: Vec::new(),
        failed_generations: Vec::new(),
        error_known: Vec::new(),
        errors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_strings_are_stored_once_and_rows_delimit_each_node() {
        let node = |name: &str, zone: &str, error: Option<&str>| sdk::FleetNode {
            name: name.into(),
            labels: vec![("zone".into(), zone.into())],
            sets: vec![sdk::SetState {
                name: "base".into(),
                desired_generation: 2,
                current_generation: Some(1),
                last_failed_generation: error.map(|_| 2),
                last_failed_error: error.map(String::from),
            }],
            ..Default::default()
        };
        let c = nodes(&[
            node("a", "z1", None),
            node("b", "z1", Some("denied")),
            sdk::FleetNode {
                name: "c".into(),
                ..Default::default()
            },
        ]);
        let table: Vec<&str> = c
            .string_starts
            .windows(2)
            .map(|w| &c.strings[w[0] as usize..w[1] as usize])
            .collect();
        assert_eq!(table, ["a", "zone", "z1", "base", "b", "denied", "c"]);
        assert_eq!(c.names, [0, 4, 6]);
        assert_eq!(c.label_starts, [0, 1, 2, 2]);
        assert_eq!((c.label_keys, c.label_values), (vec![1, 1], vec![2, 2]));
        assert_eq!(c.set_starts, [0, 1, 2, 2]);
        assert_eq!((c.error_known, c.errors), (vec![0, 1], vec![0, 5]));
        assert_eq!(c.current_generations, [1, 1]);
    }
}
