//! The contract's records as plain Rust values (mirrors `wit/policy.wit`).

use crate::prelude::*;

/// The fields of the node contract's records that the host lowers into a policy (`record
/// node-facts`, `disk-facts`, `pressure` and `pull-outcome` in `wit/policy.wit`), each record
/// listed once in the contract's order as `rust_name: OwnedType => BorrowedType, "wit-name";`
/// (as [`image_columns!`] lists the images' columns). Generated from each list: the SDK's struct
/// ([`NodeFacts`], [`DiskFacts`], [`Pressure`], [`PullOutcome`]), the guest glue that moves the
/// contract's record into it, and the host's lowering of it into a policy's memory; both sides
/// check at compile time that their bindings of the WIT have exactly these fields, of these
/// types. Adding a node fact is a change to the WIT, to this list, and to the one place on the
/// host that fills it (`host/node/src/facts.rs`): see docs/ARCHITECTURE.md, "A contract field in
/// one place". `$callback` is a macro of the caller's, given `[ARGS] name: Owned => Borrowed,
/// "wit-name"; …`.
#[doc(hidden)]
#[macro_export]
macro_rules! node_facts_fields {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            name: String => str, "name";
            /// (key, value) pairs sorted by key.
            labels: Vec<(String, String)> => [(String, String)], "labels";
            /// Pools of the node, primary first.
            pools: Vec<String> => [String], "pools";
            control_plane: bool => bool, "control-plane";
            ready: bool => bool, "ready";
            disk_pressure: bool => bool, "disk-pressure";
            allocatable_ephemeral_bytes: Option<u64> => Option<u64>, "allocatable-ephemeral-bytes";
        }
    };
}

/// `record disk-facts`, listed once (see [`node_facts_fields!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! disk_facts_fields {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            capacity_bytes: Option<u64> => Option<u64>, "capacity-bytes";
            used_bytes: Option<u64> => Option<u64>, "used-bytes";
            available_bytes: Option<u64> => Option<u64>, "available-bytes";
        }
    };
}

/// `record pressure`, listed once (see [`node_facts_fields!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! pressure_fields {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            io: Option<f32> => Option<f32>, "io";
            cpu: Option<f32> => Option<f32>, "cpu";
            memory: Option<f32> => Option<f32>, "memory";
        }
    };
}

/// `record pull-outcome`, listed once (see [`node_facts_fields!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! pull_outcome_fields {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            reference: String => str, "reference";
            /// None on success.
            error: Option<String> => Option<String>, "error";
            bytes: Option<u64> => Option<u64>, "bytes";
            duration_ms: u64 => u64, "duration-ms";
            remaining: u32 => u32, "remaining";
        }
    };
}

/// A record's SDK struct, from its list.
macro_rules! record_struct {
    ([$ty:ident, $doc:literal $(, $derive:ident)*]
     $($(#[$m:meta])* $name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {
        #[doc = $doc]
        #[derive(Clone, Debug, Default, PartialEq $(, $derive)*)]
        pub struct $ty {
            $($(#[$m])* pub $name: $owned,)*
        }
    };
}

crate::node_facts_fields!(
    record_struct,
    NodeFacts,
    "Facts about the node the reconcile runs on."
);
crate::disk_facts_fields!(
    record_struct,
    DiskFacts,
    "The filesystem holding the runtime's images."
);
crate::pressure_fields!(
    record_struct,
    Pressure,
    "Pressure stall information, `some avg10` in percent.",
    Copy
);
crate::pull_outcome_fields!(record_struct, PullOutcome, "The pull that just finished.");

/// Entries `from .. to` of a compressed-sparse-row column for row `i`, clamped to `len`: a
/// malformed column yields empty or shortened rows, never a panic.
pub(crate) fn row(starts: &[u32], i: usize, len: usize) -> core::ops::Range<usize> {
    let from = (starts.get(i).copied().unwrap_or(0) as usize).min(len);
    let to = (starts.get(i + 1).copied().unwrap_or(0) as usize).clamp(from, len);
    from..to
}

impl Default for Images {
    /// No image: every column empty, the row-start columns at their first offset.
    fn default() -> Self {
        Self {
            reference_starts: vec![0],
            layer_starts: vec![0],
            set_starts: vec![0],
            ..Self::empty_columns()
        }
    }
}

/// One image, borrowed from [`Images`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Image<'a> {
    /// Position in the [`Images`] it was read from.
    pub index: u32,
    pub reference: &'a str,
    pub present: bool,
    /// Compressed size for the node's platform (sum of its layers), when known.
    pub size_bytes: Option<u64>,
    /// Indices into [`Images::layer_sizes`]; empty when the size is unknown.
    pub layers: &'a [u32],
    set_ids: &'a [u32],
    set_names: &'a [String],
}

impl<'a> Image<'a> {
    /// The PinnedImageSets that want this image, in the order they were given.
    pub fn sets(&self) -> impl Iterator<Item = &'a str> + 'a {
        let names = self.set_names;
        self.set_ids
            .iter()
            .filter_map(move |&s| names.get(s as usize).map(String::as_str))
    }
}

/// The columns of `record images` (`wit/policy.wit`), listed once in the contract's order as
/// `rust_name: OwnedType => BorrowedType, "wit-name";`. Every place that spells the columns out —
/// the SDK's owned and borrowed views ([`Images::from_columns`], [`Images::columns`]), the guest
/// glue that moves the contract's record into an [`Images`], and the host's lowering of an
/// [`Images`] into a policy's memory — is generated from this list: `$callback` is a macro of the
/// caller's, given `[ARGS] name: Owned => Borrowed, "wit-name"; …`. Adding a column is a change
/// to the WIT, to this list, and to the code that fills ([`Images::push`]) and reads it.
#[doc(hidden)]
#[macro_export]
macro_rules! image_columns {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { [$($arg),*]
            references: String => str, "references";
            reference_starts: Vec<u32> => [u32], "reference-starts";
            present: Vec<u8> => [u8], "present";
            size_known: Vec<u8> => [u8], "size-known";
            size_bytes: Vec<u64> => [u64], "size-bytes";
            layer_starts: Vec<u32> => [u32], "layer-starts";
            layer_ids: Vec<u32> => [u32], "layer-ids";
            layer_sizes: Vec<u64> => [u64], "layer-sizes";
            set_starts: Vec<u32> => [u32], "set-starts";
            set_ids: Vec<u32> => [u32], "set-ids";
            set_names: Vec<String> => [String], "set-names";
        }
    };
}

/// [`Images`] and the SDK's views of its columns, from [`image_columns!`](crate::image_columns).
macro_rules! column_views {
    ([] $($name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {
        /// The images wanted on the node, stored as columns exactly as they cross the sandbox
        /// boundary (`record images` in `wit/policy.wit`). Build with [`Images::push`]; read
        /// with [`Images::get`] and [`Images::iter`], which borrow in place.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Images {
            $(pub(crate) $name: $owned,)*
        }

        /// The columns of [`Images`], owned, as the contract defines them (the Wasm glue).
        #[doc(hidden)]
        pub struct Columns {
            $(pub $name: $owned,)*
        }

        /// The columns of [`Images`], borrowed (see [`Images::columns`]).
        #[doc(hidden)]
        #[derive(Clone, Copy, Debug)]
        pub struct ColumnRefs<'a> {
            $(pub $name: &'a $borrowed,)*
        }

        /// An owned copy of borrowed columns (the round-trip test of `from_columns`).
        #[cfg(test)]
        impl From<ColumnRefs<'_>> for Columns {
            fn from(c: ColumnRefs<'_>) -> Self {
                Columns {
                    $($name: alloc::borrow::ToOwned::to_owned(c.$name),)*
                }
            }
        }

        impl Images {
            /// Every column empty (row-start columns included: see `Default`).
            fn empty_columns() -> Self {
                Images {
                    $($name: Default::default(),)*
                }
            }

            #[doc(hidden)]
            pub fn from_columns(c: Columns) -> Self {
                Images {
                    $($name: c.$name,)*
                }
            }

            /// The columns, borrowed: what the host lowers into a policy's memory without
            /// copying them first.
            #[doc(hidden)]
            pub fn columns(&self) -> ColumnRefs<'_> {
                ColumnRefs {
                    $($name: &self.$name,)*
                }
            }
        }
    };
}

image_columns!(column_views);

impl Images {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append an image. `layers` index [`Images::layer_sizes`] (see [`Images::add_layer`]).
    pub fn push<'s>(
        &mut self,
        reference: &str,
        sets: impl IntoIterator<Item = &'s str>,
        present: bool,
        size_bytes: Option<u64>,
        layers: &[u32],
    ) -> u32 {
        let index = self.len() as u32;
        self.references.push_str(reference);
        self.reference_starts.push(self.references.len() as u32);
        self.present.push(present as u8);
        self.size_known.push(size_bytes.is_some() as u8);
        self.size_bytes.push(size_bytes.unwrap_or(0));
        self.layer_ids.extend_from_slice(layers);
        self.layer_starts.push(self.layer_ids.len() as u32);
        for set in sets {
            let id = match self.set_names.iter().position(|n| n == set) {
                Some(id) => id,
                None => {
                    self.set_names.push(set.to_string());
                    self.set_names.len() - 1
                }
            };
            self.set_ids.push(id as u32);
        }
        self.set_starts.push(self.set_ids.len() as u32);
        index
    }

    /// Register a layer of `size` bytes; returns its index for [`Images::push`].
    pub fn add_layer(&mut self, size: u64) -> u32 {
        self.layer_sizes.push(size);
        (self.layer_sizes.len() - 1) as u32
    }

    pub fn len(&self) -> usize {
        self.present.len()
    }

    pub fn is_empty(&self) -> bool {
        self.present.is_empty()
    }

    /// Compressed size in bytes of each distinct layer.
    pub fn layer_sizes(&self) -> &[u64] {
        &self.layer_sizes
    }

    pub fn get(&self, i: usize) -> Option<Image<'_>> {
        if i >= self.len() {
            return None;
        }
        let reference = row(&self.reference_starts, i, self.references.len());
        let sets = row(&self.set_starts, i, self.set_ids.len());
        Some(Image {
            index: i as u32,
            // A range that splits a character (a malformed column) reads as no reference.
            reference: self.references.get(reference).unwrap_or(""),
            present: self.present[i] != 0,
            size_bytes: (self.size_known.get(i) == Some(&1)).then(|| self.size_bytes[i]),
            layers: self.layers_of(i),
            set_ids: &self.set_ids[sets],
            set_names: &self.set_names,
        })
    }

    /// The layer indices of image `i` (none when `i` is out of range).
    pub(crate) fn layers_of(&self, i: usize) -> &[u32] {
        &self.layer_ids[row(&self.layer_starts, i, self.layer_ids.len())]
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Image<'_>> + '_ {
        (0..self.len()).map(move |i| self.get(i).expect("in range"))
    }

    /// The images at `indices`, in that order, sharing this table's layer indices.
    pub fn subset(&self, indices: &[u32]) -> Images {
        let mut out = Images {
            layer_sizes: self.layer_sizes.clone(),
            ..Images::default()
        };
        for image in indices.iter().filter_map(|&i| self.get(i as usize)) {
            out.push(
                image.reference,
                image.sets(),
                image.present,
                image.size_bytes,
                image.layers,
            );
        }
        out
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionRequest {
    pub node: NodeFacts,
    pub disk: DiskFacts,
    /// Every image of every set of the node, in the sets' order, duplicates removed.
    pub images: Images,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    AdmitAll,
    /// Indices into [`AdmissionRequest::images`].
    AdmitSome(Vec<u32>),
    Reject,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub verdict: Verdict,
    pub reason: String,
}

impl Admission {
    pub fn admit_all(reason: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::AdmitAll,
            reason: reason.into(),
        }
    }
    pub fn admit_some(images: Vec<u32>, reason: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::AdmitSome(images),
            reason: reason.into(),
        }
    }
    pub fn reject(reason: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Reject,
            reason: reason.into(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
    pub description: String,
}

impl PolicyInfo {
    pub fn new(name: &str, version: &str, description: &str) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            description: description.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}
