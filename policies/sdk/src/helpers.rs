//! Arithmetic and lookups that most policies need.

use crate::prelude::*;

use crate::types::{Image, Images, NodeFacts};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Labels that make a node a control-plane node.
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/control-plane",
];

/// Prefix of the role labels (`node-role.kubernetes.io/<role>`).
pub const ROLE_LABEL_PREFIX: &str = "node-role.kubernetes.io/";

/// Whether a node with these label keys is a control-plane node.
pub fn is_control_plane<'a>(label_keys: impl IntoIterator<Item = &'a str>) -> bool {
    label_keys
        .into_iter()
        .any(|k| CONTROL_PLANE_LABELS.contains(&k))
}

impl NodeFacts {
    /// The value of label `key`, if the node has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The node's roles from its `node-role.kubernetes.io/<role>` labels.
    pub fn roles(&self) -> impl Iterator<Item = &str> {
        self.labels
            .iter()
            .filter_map(|(k, _)| k.strip_prefix(ROLE_LABEL_PREFIX))
    }

    pub fn has_role(&self, role: &str) -> bool {
        self.roles().any(|r| r == role)
    }

    /// `control_plane` on a control-plane node, `other` elsewhere: the reference's split of its
    /// concurrency and throttle.
    pub fn by_role<T>(&self, control_plane: T, other: T) -> T {
        if self.control_plane {
            control_plane
        } else {
            other
        }
    }
}

/// Bytes a set of images would bring onto the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PullBytes {
    /// Compressed bytes of the distinct layers of the absent images of known size.
    pub known: u64,
    /// Absent images whose size is unknown (not counted in `known`).
    pub unknown_images: u32,
    /// Absent images considered.
    pub images: u32,
}

impl Images {
    /// Indices of the images that are not present.
    pub fn absent(&self) -> impl Iterator<Item = u32> + '_ {
        self.present
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == 0)
            .map(|(i, _)| i as u32)
    }

    /// Compressed bytes that pulling the absent images among `indices` brings, a layer shared by
    /// several of them counted once. Indices out of range and present images are skipped.
    pub fn pull_bytes(&self, indices: impl IntoIterator<Item = u32>) -> PullBytes {
        let mut seen = vec![false; self.layer_sizes.len()];
        let mut out = PullBytes::default();
        // Only the columns the sum needs are read (no reference or set lookups per image).
        for idx in indices {
            let i = idx as usize;
            if self.present.get(i) != Some(&0) {
                continue;
            }
            out.images += 1;
            if self.size_known.get(i) != Some(&1) {
                out.unknown_images += 1;
                continue;
            }
            let bytes = self.mark_layers(self.layers_of(i), &mut seen);
            out.known = out.known.saturating_add(bytes);
        }
        out
    }

    /// Bytes of `image`'s layers not yet marked in `seen`, marking them. For a policy that admits
    /// images one by one (see `admit-what-fits`). `seen` must have `layer_sizes().len()` entries.
    pub fn new_layer_bytes(&self, image: &Image<'_>, seen: &mut [bool]) -> u64 {
        self.mark_layers(image.layers, seen)
    }

    /// Sum of the sizes of `layers` not yet marked in `seen`, marking them.
    fn mark_layers(&self, layers: &[u32], seen: &mut [bool]) -> u64 {
        let mut bytes = 0u64;
        for &layer in layers {
            let l = layer as usize;
            if l < seen.len() && !seen[l] {
                seen[l] = true;
                bytes = bytes.saturating_add(self.layer_sizes.get(l).copied().unwrap_or(0));
            }
        }
        bytes
    }
}

/// `0..images.len()`: the order the images were given in.
pub fn identity_order(images: &Images) -> Vec<u32> {
    (0..images.len() as u32).collect()
}

/// Human-readable bytes in binary units, e.g. `1.5 GiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_layers_count_once_and_present_images_not_at_all() {
        let mut t = Images::new();
        let l: Vec<u32> = [10, 20, 5, 100].iter().map(|&s| t.add_layer(s)).collect();
        t.push("a", ["s1"], false, Some(30), &[l[0], l[1]]);
        t.push("b", ["s1", "s2"], false, Some(25), &[l[1], l[2]]);
        t.push("c", ["s2"], true, Some(100), &[l[3]]);
        t.push("d", [], false, None, &[]);
        let all = t.pull_bytes(0..4);
        assert_eq!(
            all,
            PullBytes {
                known: 35,
                unknown_images: 1,
                images: 3
            }
        );
        assert_eq!(t.pull_bytes([1]).known, 25);
        assert_eq!(t.pull_bytes([7]).images, 0, "out of range is skipped");
        assert_eq!(t.absent().collect::<Vec<_>>(), vec![0, 1, 3]);
    }

    #[test]
    fn pull_bytes_agrees_with_the_per_image_view() {
        let mut t = Images::new();
        let layers: Vec<u32> = (1..=6).map(|s| t.add_layer(s * 1000)).collect();
        for i in 0..24u32 {
            let own = [layers[(i % 6) as usize], layers[((i * 5 + 1) % 6) as usize]];
            let size = (i % 5 != 0).then_some(1);
            let own: &[u32] = if size.is_some() { &own } else { &[] };
            t.push(&format!("r{i}"), ["s"], i % 3 == 0, size, own);
        }
        // By the view: absent images of known size, their layers marked once.
        let by_view = |indices: &[u32]| {
            let mut seen = vec![false; t.layer_sizes().len()];
            let mut out = PullBytes::default();
            for image in indices.iter().filter_map(|&i| t.get(i as usize)) {
                if image.present {
                    continue;
                }
                out.images += 1;
                match image.size_bytes {
                    Some(_) => out.known += t.new_layer_bytes(&image, &mut seen),
                    None => out.unknown_images += 1,
                }
            }
            out
        };
        let subsets: [&[u32]; 4] = [
            &[],
            &[1, 2, 4, 99],
            &[5, 5, 7, 8, 23],
            &[0, 3, 6, 10, 11, 13],
        ];
        for indices in subsets {
            assert_eq!(
                t.pull_bytes(indices.iter().copied()),
                by_view(indices),
                "{indices:?}"
            );
        }
        let all: Vec<u32> = (0..24).collect();
        assert_eq!(t.pull_bytes(t.absent()), by_view(&all));
    }

    #[test]
    fn malformed_image_columns_read_short_never_panic() {
        let t = Images::from_columns(crate::types::Columns {
            references: "ab".into(),
            // Past the end, then backwards.
            reference_starts: vec![0, 9, 1],
            present: vec![0, 0],
            size_known: vec![1, 1],
            size_bytes: vec![1, 1],
            layer_starts: vec![0, 5, 2],
            layer_ids: vec![0, 1, 7],
            layer_sizes: vec![10, 20],
            set_starts: vec![0],
            set_ids: vec![],
            set_names: vec![],
        });
        let first = t.get(0).unwrap();
        assert_eq!((first.reference, first.layers), ("ab", &[0, 1, 7][..]));
        let second = t.get(1).unwrap();
        assert_eq!((second.reference, second.layers), ("", &[][..]));
        assert_eq!(second.sets().count(), 0);
        // Layer 7 has no size: it counts nothing.
        assert_eq!(t.pull_bytes(0..2).known, 30);
    }

    #[test]
    fn columns_read_back_per_image() {
        let mut t = Images::new();
        let l = t.add_layer(7);
        t.push("reg/a@sha256:00", ["x", "y"], true, Some(7), &[l]);
        t.push("reg/b@sha256:11", ["y"], false, None, &[]);
        let b = t.get(1).unwrap();
        assert_eq!(
            (b.index, b.reference, b.present, b.size_bytes),
            (1, "reg/b@sha256:11", false, None)
        );
        assert_eq!(b.sets().collect::<Vec<_>>(), vec!["y"]);
        let a = t.get(0).unwrap();
        assert_eq!(a.sets().collect::<Vec<_>>(), vec!["x", "y"]);
        assert_eq!(a.layers, &[0]);
        assert!(t.get(2).is_none());
        let sub = t.subset(&[1, 0]);
        assert_eq!(
            sub.iter().map(|i| i.reference).collect::<Vec<_>>(),
            vec!["reg/b@sha256:11", "reg/a@sha256:00"]
        );
        assert_eq!(sub.layer_sizes(), &[7]);
        assert_eq!(Images::from_columns(t.columns().into()), t);
    }

    #[test]
    fn control_plane_and_roles() {
        assert!(is_control_plane(["node-role.kubernetes.io/master"]));
        assert!(is_control_plane([
            "a",
            "node-role.kubernetes.io/control-plane"
        ]));
        assert!(!is_control_plane(["node-role.kubernetes.io/worker"]));
        let node = NodeFacts {
            labels: vec![
                ("node-role.kubernetes.io/infra".into(), "".into()),
                ("zone".into(), "a".into()),
            ],
            ..Default::default()
        };
        assert!(node.has_role("infra"));
        assert!(!node.has_role("zone"));
        assert_eq!(node.label("zone"), Some("a"));
    }

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 * GIB / 2), "1.5 GiB");
        assert_eq!(fmt_bytes(16 * GIB), "16.0 GiB");
    }
}
