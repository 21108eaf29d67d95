//! Local inputs — files and standard input — read within a bound of bytes.
//!
//! Every file pinset reads (objects, manifests, configuration, keys, modules, its own caches)
//! and its standard input go through here. A length is not a bound: a device (`/dev/zero`), a
//! FIFO or a pipe fed without end, and `/proc` files all report 0, and a mistaken path may name
//! gigabytes. So the read itself stops one byte past the limit, and the input is refused with an
//! error of kind [`io::ErrorKind::FileTooLarge`] saying the limit, before it takes the node's
//! memory. The error carries no path: callers already name the input in their own errors.

use std::io::{self, Read};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// The most pinset reads from one kind of input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The kind of input, as the refusal names it (`a configuration file`).
    pub what: &'static str,
    pub max_bytes: u64,
}

impl Limit {
    pub const fn new(what: &'static str, max_bytes: u64) -> Self {
        Limit { what, max_bytes }
    }
}

/// Kubernetes objects: PinnedImageSets, pools, Nodes, rendered manifests and bundles (the
/// `helm template` of a large chart is a few MiB; the API server takes 3 MiB per object).
pub const OBJECTS: Limit = Limit::new("a file of Kubernetes objects", 64 * MIB);

/// Configuration: the registries file, credentials, mirrors, policy configuration, keys, the
/// CRI-O pin drop-in (about 1 MiB for 10 000 pinned images), a saved benchmark run.
pub const CONFIG: Limit = Limit::new("a configuration file", 16 * MIB);

/// Policy scenarios (`pinset policy test`).
pub const SCENARIO: Limit = Limit::new("a scenario file", 64 * MIB);

/// A policy module, within its `--policy-max-module-mib`.
pub const fn module(max_bytes: u64) -> Limit {
    Limit::new("a policy module", max_bytes)
}

/// An input's size as a refusal says it: `17825792 bytes, ` when known, nothing when the read
/// stopped at the bound (a device, a pipe or a growing file: what it holds is unknown).
pub fn size_said(size: Option<u64>) -> String {
    size.map_or(String::new(), |s| format!("{s} bytes, "))
}

/// The bytes of the file at `path`, refused past `limit`.
pub fn bytes(path: &Path, limit: Limit) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > limit.max_bytes {
        return Err(too_large(limit, Some(len)));
    }
    read_sized(file, limit, len)
}

/// The text of the file at `path`, refused past `limit` or when it is not UTF-8.
pub fn text(path: &Path, limit: Limit) -> io::Result<String> {
    utf8(bytes(path, limit)?)
}

/// What `reader` gives until its end, refused past `limit`.
pub fn read(reader: impl Read, limit: Limit) -> io::Result<Vec<u8>> {
    read_sized(reader, limit, 0)
}

/// Standard input as text, refused past `limit` or when it is not UTF-8.
pub fn stdin_text(limit: Limit) -> io::Result<String> {
    utf8(read(io::stdin().lock(), limit)?)
}

/// Reads through a `take` one byte past the limit: reaching it says "more", whatever the
/// input claimed. `hint` (a regular file's length) only sizes the buffer.
fn read_sized(reader: impl Read, limit: Limit, hint: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(hint.min(limit.max_bytes) as usize);
    reader.take(limit.max_bytes + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit.max_bytes {
        return Err(too_large(limit, None));
    }
    Ok(out)
}

fn utf8(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

/// Why an input was refused: its bound, and its size when the file said one (a device, a pipe
/// or a file grown while read says none that holds). Carried inside the `io::Error`;
/// [`refused`] finds it.
#[derive(Debug)]
pub struct TooLarge {
    pub limit: Limit,
    pub size: Option<u64>,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = self.limit.max_bytes;
        match max.is_multiple_of(MIB) {
            true => write!(f, "larger than {} MiB", max / MIB)?,
            false => write!(f, "larger than {max} bytes")?,
        }
        write!(f, ", the most pinset reads from {}", self.limit.what)
    }
}

impl std::error::Error for TooLarge {}

/// The refusal inside `e`, when `e` is one of this module's.
pub fn refused(e: &io::Error) -> Option<&TooLarge> {
    e.get_ref()?.downcast_ref::<TooLarge>()
}

fn too_large(limit: Limit, size: Option<u64>) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, TooLarge { limit, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limit = Limit::new("a test input", 8);

    #[test]
    fn an_input_within_its_limit_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "12345678").unwrap();
        assert_eq!(text(&path, SMALL).unwrap(), "12345678");
        assert_eq!(read(&b"abc"[..], SMALL).unwrap(), b"abc");
    }

    #[test]
    fn a_file_over_its_limit_is_refused_naming_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "123456789").unwrap();
        let e = bytes(&path, SMALL).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            e.to_string(),
            "larger than 8 bytes, the most pinset reads from a test input"
        );
        assert_eq!(refused(&e).map(|r| r.size), Some(Some(9)));
        assert_eq!(bytes(&path, Limit::new("x", MIB)).unwrap().len(), 9);
    }

    /// `/dev/zero` reports a length of 0 and never ends: the read stops at the limit.
    #[test]
    fn an_input_without_end_stops_at_its_limit() {
        let e = bytes(Path::new("/dev/zero"), Limit::new("a device", MIB)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("larger than 1 MiB"), "{e}");
        assert_eq!(
            refused(&e).map(|r| r.size),
            Some(None),
            "a device says no size"
        );
        let e = read(io::repeat(b'a'), SMALL).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn text_that_is_not_utf8_is_refused() {
        let e = utf8(vec![b'a', 0xff]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("not UTF-8 text"), "{e}");
    }

    #[test]
    fn a_missing_file_keeps_its_kind() {
        let e = text(Path::new("/nonexistent/pinset"), SMALL).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
