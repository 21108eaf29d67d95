//! What a fleet policy reads: the pool's nodes as columns (`nodes` of `wit/fleet/fleet.wit`),
//! one node at a time through a borrowed [`Node`]. The host builds the columns once from its
//! records ([`RolloutRequest`]); in the sandbox they arrive as they were sent, with no
//! allocation per node or string.

use crate::prelude::*;

use crate::fleet::{FleetNode, FleetPool, NodeProgress, Phase, RolloutRequest, Target};
use crate::types::row;

/// A fleet policy's question: the pool, its target, and every node of the pool sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    pub pool: FleetPool,
    pub target: Target,
    pub nodes: Nodes,
}

impl Rollout {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.pool
            .annotations
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Nodes in `phase`.
    pub fn count(&self, phase: Phase) -> usize {
        self.nodes.phase.iter().filter(|p| **p == phase).count()
    }

    /// Indices of the nodes that are ready, not granted and not at the target, in name order:
    /// the candidates for a grant.
    pub fn candidates(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.ready && !n.granted && n.phase == Phase::Waiting)
            .map(|n| n.index)
    }
}

impl From<&RolloutRequest> for Rollout {
    fn from(r: &RolloutRequest) -> Self {
        Self {
            pool: r.pool.clone(),
            target: r.target.clone(),
            nodes: Nodes::from_records(&r.nodes),
        }
    }
}

/// The columns of `record nodes` (`wit/fleet/fleet.wit`), listed once in the contract's order
/// as `rust_name: OwnedType => BorrowedType, "wit-name";`, in two groups around the `phase`
/// column (the one whose type differs between the SDK, [`Phase`], and the contract's generated
/// enum): `$callback! { [ARGS] { before… } { after… } }`. The SDK's [`Nodes`], the guest glue
/// that moves the contract's record into it and the host's lowering are generated from it.
#[doc(hidden)]
#[macro_export]
macro_rules! node_columns {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            {
                strings: String => str, "strings";
                string_starts: Vec<u32> => [u32], "string-starts";
                names: Vec<u32> => [u32], "names";
                label_starts: Vec<u32> => [u32], "label-starts";
                label_keys: Vec<u32> => [u32], "label-keys";
                label_values: Vec<u32> => [u32], "label-values";
                ready: Vec<u8> => [u8], "ready";
                granted: Vec<u8> => [u8], "granted";
            }
            {
                images_done: Vec<u64> => [u64], "images-done";
                images_total: Vec<u64> => [u64], "images-total";
                bytes_done: Vec<u64> => [u64], "bytes-done";
                bytes_total: Vec<u64> => [u64], "bytes-total";
                pulling: Vec<u8> => [u8], "pulling";
                pulling_for_ms: Vec<u64> => [u64], "pulling-for-ms";
                set_starts: Vec<u32> => [u32], "set-starts";
                set_names: Vec<u32> => [u32], "set-names";
                desired_generations: Vec<i64> => [i64], "desired-generations";
                current_known: Vec<u8> => [u8], "current-known";
                current_generations: Vec<i64> => [i64], "current-generations";
                failed_known: Vec<u8> => [u8], "failed-known";
                failed_generations: Vec<i64> => [i64], "failed-generations";
                error_known: Vec<u8> => [u8], "error-known";
                errors: Vec<u32> => [u32], "errors";
            }
        }
    };
}

/// [`Nodes`] from [`node_columns!`].
macro_rules! nodes_struct {
    ([] { $($a:ident: $ao:ty => $ab:ty, $aw:literal;)* } { $($b:ident: $bo:ty => $bb:ty, $bw:literal;)* }) => {
        /// The pool's nodes as columns: entry `i` of each per-node column describes node `i`;
        /// strings are indices into one table; labels and sets are compressed-sparse-row (see
        /// the contract). Read them through [`Nodes::get`] and [`Nodes::iter`]; the columns
        /// themselves are the contract's wire form, public for the host's and the guest glue's
        /// sake only.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Nodes {
            $(#[doc(hidden)] pub $a: $ao,)*
            #[doc(hidden)]
            pub phase: Vec<Phase>,
            $(#[doc(hidden)] pub $b: $bo,)*
        }

        impl Nodes {
            /// Every column empty (row-start columns included: see `Default`).
            fn empty_columns() -> Self {
                Nodes {
                    $($a: Default::default(),)*
                    phase: Vec::new(),
                    $($b: Default::default(),)*
                }
            }
        }
    };
}

node_columns!(nodes_struct);

impl Default for Nodes {
    /// No node: every column empty, the row-start columns at their first offset.
    fn default() -> Self {
        Self {
            string_starts: vec![0],
            label_starts: vec![0],
            set_starts: vec![0],
            ..Self::empty_columns()
        }
    }
}

/// `(known, value)` of an optional column entry: 0 stands in when there is none.
fn known<T: Default>(v: Option<T>) -> (u8, T) {
    v.map_or((0, T::default()), |v| (1, v))
}

impl Nodes {
    /// The columns of `records`, in their order. Every column is sized once up front, and a
    /// label or set name equal to the one at the same position of the previous node is stored
    /// once: a pool's nodes mostly share their label keys, zones and sets.
    pub fn from_records(records: &[FleetNode]) -> Self {
        let labels: usize = records.iter().map(|n| n.labels.len()).sum();
        let sets: usize = records.iter().map(|n| n.sets.len()).sum();
        let text: usize = records.iter().map(|n| n.name.len()).sum::<usize>() + 64 * labels;
        let mut c = Nodes::with_capacity(records.len(), labels, sets, text);
        for n in records {
            c.push(n);
        }
        c
    }

    fn with_capacity(nodes: usize, labels: usize, sets: usize, text: usize) -> Self {
        let mut c = Nodes {
            strings: String::with_capacity(text),
            string_starts: Vec::with_capacity(nodes + 2 * labels + 2 * sets + 1),
            label_keys: Vec::with_capacity(labels),
            label_values: Vec::with_capacity(labels),
            set_names: Vec::with_capacity(sets),
            desired_generations: Vec::with_capacity(sets),
            current_known: Vec::with_capacity(sets),
            current_generations: Vec::with_capacity(sets),
            failed_known: Vec::with_capacity(sets),
            failed_generations: Vec::with_capacity(sets),
            error_known: Vec::with_capacity(sets),
            errors: Vec::with_capacity(sets),
            ..Nodes::default()
        };
        c.string_starts.push(0);
        for col in [&mut c.label_starts, &mut c.set_starts, &mut c.names] {
            col.reserve(nodes + 1);
        }
        for col in [&mut c.ready, &mut c.granted, &mut c.pulling] {
            col.reserve(nodes);
        }
        c.phase.reserve(nodes);
        for col in [
            &mut c.images_done,
            &mut c.images_total,
            &mut c.bytes_done,
            &mut c.bytes_total,
            &mut c.pulling_for_ms,
        ] {
            col.reserve(nodes);
        }
        c
    }

    fn text(&mut self, s: &str) -> u32 {
        self.strings.push_str(s);
        self.string_starts.push(self.strings.len() as u32);
        self.string_starts.len() as u32 - 2
    }

    /// `s`'s index: `reuse` when the string there is `s`, else `s` added.
    fn text_or(&mut self, s: &str, reuse: Option<u32>) -> u32 {
        match reuse {
            Some(j) if self.string(j) == s => j,
            _ => self.text(s),
        }
    }

    /// The entries of the last node appended in a compressed-sparse-row column of `len` entries
    /// (none before the first).
    fn last_row(starts: &[u32], len: usize) -> core::ops::Range<usize> {
        row(starts, starts.len().saturating_sub(2), len)
    }

    /// Append one node; the node appended before it lends its strings.
    fn push(&mut self, n: &FleetNode) {
        let name = self.text(&n.name);
        self.names.push(name);
        let previous_labels = Self::last_row(&self.label_starts, self.label_keys.len());
        let (first_label, labels_before) = (previous_labels.start, previous_labels.len());
        for (k, (key, value)) in n.labels.iter().enumerate() {
            let at = |col: &[u32]| (k < labels_before).then(|| col[first_label + k]);
            let key = self.text_or(key, at(&self.label_keys));
            let value = self.text_or(value, at(&self.label_values));
            self.label_keys.push(key);
            self.label_values.push(value);
        }
        self.label_starts.push(self.label_keys.len() as u32);
        self.ready.push(n.ready.into());
        self.granted.push(n.granted.into());
        self.phase.push(n.phase);
        let p = &n.progress;
        self.images_done.push(p.images_done);
        self.images_total.push(p.images_total);
        self.bytes_done.push(p.bytes_done);
        self.bytes_total.push(p.bytes_total);
        let (pulling, ms) = known(p.pulling_for_ms);
        self.pulling.push(pulling);
        self.pulling_for_ms.push(ms);
        let previous_sets = Self::last_row(&self.set_starts, self.set_names.len());
        let (first_set, sets_before) = (previous_sets.start, previous_sets.len());
        for (k, s) in n.sets.iter().enumerate() {
            let reuse = (k < sets_before).then(|| self.set_names[first_set + k]);
            let name = self.text_or(&s.name, reuse);
            self.push_set(name, s);
        }
        self.set_starts.push(self.set_names.len() as u32);
    }

    fn push_set(&mut self, name: u32, s: &crate::fleet::SetState) {
        self.set_names.push(name);
        self.desired_generations.push(s.desired_generation);
        let (k, g) = known(s.current_generation);
        self.current_known.push(k);
        self.current_generations.push(g);
        let (k, g) = known(s.last_failed_generation);
        self.failed_known.push(k);
        self.failed_generations.push(g);
        let error = s.last_failed_error.as_deref().map(|e| self.text(e));
        let (k, e) = known(error);
        self.error_known.push(k);
        self.errors.push(e);
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// String `j` of the table ("" when out of range).
    fn string(&self, j: u32) -> &str {
        let j = j as usize;
        if j >= self.string_starts.len().saturating_sub(1) {
            return "";
        }
        self.strings
            .get(row(&self.string_starts, j, self.strings.len()))
            .unwrap_or("")
    }

    pub fn get(&self, i: usize) -> Option<Node<'_>> {
        let name = *self.names.get(i)?;
        let u64_at = |col: &[u64]| col.get(i).copied().unwrap_or(0);
        Some(Node {
            index: i as u32,
            name: self.string(name),
            ready: self.ready.get(i) == Some(&1),
            granted: self.granted.get(i) == Some(&1),
            phase: self.phase.get(i).copied().unwrap_or_default(),
            progress: NodeProgress {
                images_done: u64_at(&self.images_done),
                images_total: u64_at(&self.images_total),
                bytes_done: u64_at(&self.bytes_done),
                bytes_total: u64_at(&self.bytes_total),
                pulling_for_ms: (self.pulling.get(i) == Some(&1))
                    .then(|| u64_at(&self.pulling_for_ms)),
            },
            nodes: self,
        })
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Node<'_>> + '_ {
        (0..self.len()).map(move |i| self.get(i).expect("in range"))
    }
}

/// One node of the pool, read in place from [`Nodes`].
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// Position in [`Rollout::nodes`]: what a [`crate::Grant`] names.
    pub index: u32,
    pub name: &'a str,
    /// Reports Ready (and its agent reports at all).
    pub ready: bool,
    /// Holds a grant for the target.
    pub granted: bool,
    pub phase: Phase,
    pub progress: NodeProgress,
    nodes: &'a Nodes,
}

/// One set as a node reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSet<'a> {
    pub name: &'a str,
    pub desired_generation: i64,
    pub current_generation: Option<i64>,
    pub last_failed_generation: Option<i64>,
    pub last_failed_error: Option<&'a str>,
}

impl<'a> Node<'a> {
    /// The node's labels as (key, value), sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let c = self.nodes;
        let len = c.label_keys.len().min(c.label_values.len());
        row(&c.label_starts, self.index as usize, len)
            .map(move |k| (c.string(c.label_keys[k]), c.string(c.label_values[k])))
    }

    pub fn label(&self, key: &str) -> Option<&'a str> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The sets the node reports.
    pub fn sets(&self) -> impl Iterator<Item = NodeSet<'a>> + 'a {
        let c = self.nodes;
        let flag = |col: &[u8], k: usize| col.get(k) == Some(&1);
        row(&c.set_starts, self.index as usize, c.set_names.len()).map(move |k| NodeSet {
            name: c.string(c.set_names[k]),
            desired_generation: c.desired_generations.get(k).copied().unwrap_or(0),
            current_generation: flag(&c.current_known, k)
                .then(|| c.current_generations.get(k).copied().unwrap_or(0)),
            last_failed_generation: flag(&c.failed_known, k)
                .then(|| c.failed_generations.get(k).copied().unwrap_or(0)),
            last_failed_error: flag(&c.error_known, k)
                .then(|| c.string(c.errors.get(k).copied().unwrap_or(u32::MAX))),
        })
    }

    /// Granted and still at work towards the target: pulling, or failed and retrying.
    pub fn in_flight(&self) -> bool {
        crate::fleet::in_flight(self.granted, self.phase)
    }

    /// Counts against the pool's ceiling ([`crate::fleet::holds_slot`]).
    pub fn holds_slot(&self) -> bool {
        crate::fleet::holds_slot(self.granted, self.phase, self.ready)
    }

    /// The error of the first target set that failed on this node, if any.
    pub fn error(&self) -> Option<&'a str> {
        self.sets().find_map(|s| s.last_failed_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::SetState;

    fn node(name: &str, zone: &str, error: Option<&str>) -> FleetNode {
        FleetNode {
            name: name.into(),
            labels: vec![
                ("role".into(), "worker".into()),
                ("zone".into(), zone.into()),
            ],
            ready: true,
            phase: Phase::Failed,
            progress: NodeProgress {
                images_done: 3,
                pulling_for_ms: Some(1_500),
                ..Default::default()
            },
            sets: vec![SetState {
                name: "base".into(),
                desired_generation: 2,
                current_generation: Some(1),
                last_failed_generation: error.map(|_| 2),
                last_failed_error: error.map(String::from),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn each_node_reads_back_as_it_was_given() {
        let records = [
            node("a", "z1", None),
            node("b-ü", "z2", Some("denied")),
            FleetNode {
                name: "c".into(),
                ..Default::default()
            },
        ];
        let nodes = Nodes::from_records(&records);
        assert_eq!(nodes.len(), 3);
        // a, role, worker, zone, z1, base, b-ü, z2, denied, c: b's label keys, `worker` and its
        // set's name are the previous node's.
        assert_eq!(nodes.string_starts.len() - 1, 10, "{:?}", nodes.strings);
        let b = nodes.get(1).unwrap();
        assert_eq!(
            (b.index, b.name, b.ready, b.granted),
            (1, "b-ü", true, false)
        );
        assert_eq!((b.phase, b.progress), (Phase::Failed, records[1].progress));
        assert_eq!(b.label("zone"), Some("z2"));
        assert_eq!(b.label("rack"), None);
        assert_eq!(b.error(), Some("denied"));
        let set = b.sets().next().unwrap();
        assert_eq!(
            (set.name, set.current_generation, set.last_failed_generation),
            ("base", Some(1), Some(2))
        );
        assert_eq!(nodes.get(0).unwrap().error(), None);
        let c = nodes.get(2).unwrap();
        assert_eq!((c.labels().count(), c.sets().count()), (0, 0));
        assert_eq!(c.progress.pulling_for_ms, None);
        assert!(nodes.get(3).is_none());
        let names: Vec<&str> = nodes.iter().map(|n| n.name).collect();
        assert_eq!(names, ["a", "b-ü", "c"]);
    }

    #[test]
    fn malformed_columns_read_as_empty_never_panic() {
        let mut nodes = Nodes::from_records(&[node("a", "z1", Some("x"))]);
        nodes.label_starts = vec![0, 99];
        nodes.set_starts = vec![5, 1];
        nodes.names = vec![u32::MAX];
        nodes.errors = vec![u32::MAX];
        let a = nodes.get(0).unwrap();
        assert_eq!(a.name, "");
        assert_eq!(a.labels().count(), 2, "clamped to the label columns");
        assert_eq!(a.sets().count(), 0);
    }
}
