//! A tar stream read as it arrives, keeping only the files asked for. A layer of a release
//! payload is hundreds of MiB of tar; pinset wants two small files of it. [`TarFiles`] is fed
//! the stream in chunks of any size (it is a [`std::io::Write`], so a decompressor writes into
//! it), keeps the content of the wanted paths — each within its cap — and notes the whiteouts
//! it passes; the rest of the stream is counted and dropped.
//!
//! The format read is POSIX ustar with its extensions as image layers use them: pax extended
//! headers (`path`, `size`), GNU long names, and base-256 sizes. Every header's checksum is
//! checked, so a stream that is not a tar is refused at its first header.

use std::collections::BTreeMap;
use std::io::Write;

const BLOCK: usize = 512;
/// The largest pax header or GNU long name read (real ones are a few hundred bytes).
const META_MAX: u64 = 64 * 1024;

/// Why a stream is not a tar pinset reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TarError {
    #[error("not a tar archive: the header at byte {offset} {why}")]
    Header { offset: u64, why: String },
    #[error("{path} is larger than {max} bytes, the most pinset reads of it")]
    TooLarge { path: String, max: u64 },
    #[error("the tar archive ends inside {what}")]
    Truncated { what: String },
}

/// Where the stream is.
enum State {
    /// Collecting a header block.
    Header,
    /// In an entry's data: `left` bytes of it, then `pad` bytes to the next block.
    Data { entry: Entry, left: u64, pad: u64 },
    /// Two zero blocks seen: the archive is over (anything after is ignored).
    End,
}

/// What an entry's data is for.
enum Entry {
    Skip,
    Keep {
        path: String,
        data: Vec<u8>,
    },
    /// A pax extended header (`x`) or a GNU long name (`L`): read, then applied to the next
    /// header.
    Meta {
        kind: u8,
        data: Vec<u8>,
    },
}

/// A tar stream's wanted files, read as the stream is written in.
pub struct TarFiles {
    /// Path → the most bytes kept of it.
    wanted: BTreeMap<String, u64>,
    found: BTreeMap<String, Vec<u8>>,
    whiteouts: Vec<String>,
    state: State,
    header: Vec<u8>,
    /// Where the header being collected starts in the stream.
    header_at: u64,
    zero_blocks: u8,
    offset: u64,
    /// The path a pax header or a GNU long name set for the next entry.
    next_path: Option<String>,
    next_size: Option<u64>,
    error: Option<TarError>,
}

impl TarFiles {
    /// A reader keeping each of `wanted` (paths without a leading `./` or `/`), each within
    /// its cap in bytes.
    pub fn new(wanted: impl IntoIterator<Item = (String, u64)>) -> TarFiles {
        TarFiles {
            wanted: wanted.into_iter().collect(),
            found: BTreeMap::new(),
            whiteouts: Vec::new(),
            state: State::Header,
            header: Vec::with_capacity(BLOCK),
            header_at: 0,
            zero_blocks: 0,
            offset: 0,
            next_path: None,
            next_size: None,
            error: None,
        }
    }

    /// Feed the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), TarError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        while !bytes.is_empty() {
            let used = match self.step(bytes) {
                Ok(used) => used,
                Err(e) => {
                    self.error = Some(e.clone());
                    return Err(e);
                }
            };
            self.offset += used as u64;
            bytes = &bytes[used..];
        }
        Ok(())
    }

    /// The wanted files found and the whiteouts passed, once the stream is over: an archive
    /// cut inside an entry is an error.
    pub fn finish(self) -> Result<Found, TarError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        match self.state {
            State::Data { entry, .. } => Err(TarError::Truncated {
                what: match entry {
                    Entry::Keep { path, .. } => path,
                    _ => "an entry".into(),
                },
            }),
            State::Header if !self.header.is_empty() => Err(TarError::Truncated {
                what: "a header".into(),
            }),
            _ => Ok(Found {
                files: self.found,
                whiteouts: self.whiteouts,
            }),
        }
    }

    /// Take what `bytes` has for the current state; how many bytes were used.
    fn step(&mut self, bytes: &[u8]) -> Result<usize, TarError> {
        match &mut self.state {
            State::End => Ok(bytes.len()),
            State::Header => {
                if self.header.is_empty() {
                    self.header_at = self.offset;
                }
                let take = (BLOCK - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                if self.header.len() == BLOCK {
                    let block = std::mem::take(&mut self.header);
                    self.on_header(&block)?;
                }
                Ok(take)
            }
            State::Data { entry, left, pad } => {
                let take = (*left + *pad).min(bytes.len() as u64) as usize;
                let data = take.min(*left as usize);
                keep(entry, &bytes[..data], &self.wanted)?;
                *left -= data as u64;
                *pad -= (take - data) as u64;
                if *left == 0 && *pad == 0 {
                    self.entry_done();
                }
                Ok(take)
            }
        }
    }

    /// An entry's data is read: keep a wanted file, apply a pax header or a long name.
    fn entry_done(&mut self) {
        let State::Data { entry, .. } = std::mem::replace(&mut self.state, State::Header) else {
            return;
        };
        match entry {
            Entry::Keep { path, data } => {
                self.found.insert(path, data);
            }
            Entry::Meta { kind: b'L', data } => {
                let name = String::from_utf8_lossy(&data);
                self.next_path = Some(name.trim_end_matches('\0').to_string());
            }
            Entry::Meta { data, .. } => self.apply_pax(&data),
            Entry::Skip => {}
        }
    }

    /// A pax extended header's records (`LEN key=value\n`): `path` and `size` are used.
    fn apply_pax(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some(space) = rest.iter().position(|&b| b == b' ') {
            let Some(len) = std::str::from_utf8(&rest[..space])
                .ok()
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n > space && n <= rest.len())
            else {
                return;
            };
            let record = &rest[space + 1..len];
            let record = record.strip_suffix(b"\n").unwrap_or(record);
            if let Some(eq) = record.iter().position(|&b| b == b'=') {
                let value = String::from_utf8_lossy(&record[eq + 1..]).to_string();
                match &record[..eq] {
                    b"path" => self.next_path = Some(value),
                    b"size" => self.next_size = value.parse().ok(),
                    _ => {}
                }
            }
            rest = &rest[len..];
        }
    }

    fn on_header(&mut self, block: &[u8]) -> Result<(), TarError> {
        if block.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            if self.zero_blocks == 2 {
                self.state = State::End;
            }
            return Ok(());
        }
        self.zero_blocks = 0;
        let header = Header::parse(block, self.header_at)?;
        let size = self.next_size.take().unwrap_or(header.size);
        let path = normal(&self.next_path.take().unwrap_or(header.path));
        let entry = match header.kind {
            b'x' | b'L' if size > META_MAX => {
                return Err(TarError::TooLarge {
                    path: format!("an extended header before {path}"),
                    max: META_MAX,
                });
            }
            b'x' | b'L' => Entry::Meta {
                kind: header.kind,
                data: Vec::new(),
            },
            b'0' | b'\0' | b'7' if self.wanted.contains_key(&path) => Entry::Keep {
                path,
                data: Vec::new(),
            },
            _ => {
                if whiteout(&path) {
                    self.whiteouts.push(path);
                }
                Entry::Skip
            }
        };
        // Only regular files and extended headers carry data pinset reads the size of; links,
        // directories and devices have none whatever the field says.
        let size = match header.kind {
            b'0' | b'\0' | b'7' | b'x' | b'L' | b'g' | b'K' => size,
            _ => 0,
        };
        self.state = State::Data {
            entry,
            left: size,
            pad: (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64,
        };
        if size == 0 {
            self.entry_done();
        }
        Ok(())
    }
}

impl Write for TarFiles {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.feed(buf).map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a tar stream held of what was asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub files: BTreeMap<String, Vec<u8>>,
    /// Whiteout entries (`dir/.wh.name`, `dir/.wh..wh..opq`): what this layer deletes below it.
    pub whiteouts: Vec<String>,
}

impl Found {
    /// Whether this layer deletes `path` from the layers below it.
    pub fn hides(&self, path: &str) -> bool {
        self.whiteouts.iter().any(|w| {
            let (dir, name) = w.rsplit_once('/').unwrap_or(("", w.as_str()));
            let prefix = if dir.is_empty() {
                String::new()
            } else {
                format!("{dir}/")
            };
            match name {
                ".wh..wh..opq" => path.starts_with(&prefix),
                _ => {
                    let gone = format!("{prefix}{}", &name[4..]);
                    path == gone || path.starts_with(&format!("{gone}/"))
                }
            }
        })
    }
}

fn keep(entry: &mut Entry, bytes: &[u8], wanted: &BTreeMap<String, u64>) -> Result<(), TarError> {
    let (data, max, path) = match entry {
        Entry::Skip => return Ok(()),
        Entry::Keep { path, data } => (data, wanted.get(path).copied().unwrap_or(0), path.clone()),
        Entry::Meta { data, .. } => (data, META_MAX, "an extended header".into()),
    };
    if data.len() as u64 + bytes.len() as u64 > max {
        return Err(TarError::TooLarge { path, max });
    }
    data.extend_from_slice(bytes);
    Ok(())
}

fn whiteout(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with(".wh."))
}

/// A path as layers write it (`./a/b`, `/a/b`, `a/b/`) made plain (`a/b`).
fn normal(path: &str) -> String {
    let p = path.trim_start_matches("./").trim_start_matches('/');
    p.trim_end_matches('/').to_string()
}

/// One header block's fields pinset uses.
struct Header {
    path: String,
    size: u64,
    kind: u8,
}

impl Header {
    fn parse(block: &[u8], offset: u64) -> Result<Header, TarError> {
        let bad = |why: &str| TarError::Header {
            offset,
            why: why.to_string(),
        };
        let stored = octal(&block[148..156]).ok_or_else(|| bad("has no checksum"))?;
        let sum: u64 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    b as u64
                }
            })
            .sum();
        if stored != sum {
            return Err(bad("fails its checksum"));
        }
        let size = number(&block[124..136]).ok_or_else(|| bad("has no size"))?;
        let name = text(&block[0..100]);
        let path = if &block[257..262] == b"ustar" && block[345] != 0 {
            format!("{}/{name}", text(&block[345..500]))
        } else {
            name
        };
        Ok(Header {
            path,
            size,
            kind: block[156],
        })
    }
}

fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).to_string()
}

/// A numeric field: octal text, or base-256 (first byte 0x80) for large values.
fn number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut n: u64 = (field[0] & 0x7f) as u64;
        for &b in &field[1..] {
            n = n.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(n);
    }
    octal(field)
}

fn octal(field: &[u8]) -> Option<u64> {
    let digits = std::str::from_utf8(field).ok()?;
    let digits = digits.trim_matches(|c: char| c == '\0' || c == ' ');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// Tar streams for tests (here and in the test suite's fixture releases).
pub mod write {
    /// One ustar header for `path` of `size` bytes of kind `kind`.
    pub fn header(path: &str, size: u64, kind: u8) -> [u8; 512] {
        let mut h = [0u8; 512];
        let name = path.as_bytes();
        h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    /// A tar archive of `files` (path, content), regular files, ended by two zero blocks.
    pub fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, data) in files {
            out.extend_from_slice(&header(path, data.len() as u64, b'0'));
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(512) * 512, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> TarFiles {
        TarFiles::new([("release-manifests/image-references".to_string(), 1000)])
    }

    /// Fed in every chunk size, the wanted file is kept whole and nothing else is.
    #[test]
    fn a_wanted_file_is_kept_whatever_the_chunks() {
        let refs: &[u8] = b"{\"kind\":\"ImageStream\"}";
        let tar = write::archive(&[
            ("./usr/bin/cvo", &[7u8; 3000]),
            ("./release-manifests/image-references", refs),
            ("release-manifests/.wh.0000_50_old.yaml", b""),
        ]);
        for chunk in [1, 7, 511, 512, 513, 4096, tar.len()] {
            let mut files = wanted();
            for piece in tar.chunks(chunk) {
                files.feed(piece).unwrap();
            }
            let found = files.finish().unwrap();
            assert_eq!(
                found.files.get("release-manifests/image-references"),
                Some(&refs.to_vec()),
                "chunk {chunk}"
            );
            assert_eq!(found.files.len(), 1);
            assert_eq!(found.whiteouts, ["release-manifests/.wh.0000_50_old.yaml"]);
        }
    }

    #[test]
    fn a_stream_that_is_not_a_tar_is_refused_at_its_first_header() {
        let mut files = wanted();
        let e = files.feed(&[b'x'; 2048]).unwrap_err();
        assert!(matches!(e, TarError::Header { offset: 0, .. }), "{e}");
        assert!(files.feed(b"more").is_err(), "the error stays");
    }

    #[test]
    fn a_wanted_file_past_its_cap_and_a_cut_archive_are_errors() {
        let big = write::archive(&[("release-manifests/image-references", &[b'a'; 1001])]);
        let e = wanted().feed(&big).unwrap_err();
        assert!(matches!(e, TarError::TooLarge { max: 1000, .. }), "{e}");
        let tar = write::archive(&[("release-manifests/image-references", &[b'a'; 900])]);
        let mut files = wanted();
        files.feed(&tar[..700]).unwrap();
        let e = files.finish().unwrap_err();
        assert!(
            e.to_string()
                .contains("ends inside release-manifests/image-references")
        );
    }

    /// A pax `path` record and a GNU long name name the entry after them.
    #[test]
    fn long_names_come_from_pax_and_gnu_headers() {
        let record = pax_record("path", "release-manifests/image-references");
        let mut pax = write::header("PaxHeaders/x", record.len() as u64, b'x').to_vec();
        pax.extend_from_slice(record.as_bytes());
        pax.resize(1024, 0);
        pax.extend_from_slice(&write::header("short", 2, b'0'));
        pax.extend_from_slice(b"ok");
        pax.resize(2048, 0);
        let long = "release-manifests/image-references";
        pax.extend_from_slice(&write::header("././@LongLink", long.len() as u64, b'L'));
        pax.extend_from_slice(long.as_bytes());
        pax.resize(3072, 0);
        pax.extend_from_slice(&write::header("cut", 3, b'0'));
        pax.extend_from_slice(b"two");
        pax.resize(4096 + 1024, 0);
        let mut files = wanted();
        files.feed(&pax).unwrap();
        let found = files.finish().unwrap();
        assert_eq!(
            found.files["release-manifests/image-references"], b"two",
            "the later entry of the same path wins, as on a file system"
        );
    }

    /// A pax record: its length counts itself.
    fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }

    #[test]
    fn whiteouts_hide_files_and_opaque_directories_their_contents() {
        let found = Found {
            files: BTreeMap::new(),
            whiteouts: vec!["release-manifests/.wh.image-references".into()],
        };
        assert!(found.hides("release-manifests/image-references"));
        assert!(!found.hides("release-manifests/release-metadata"));
        let opaque = Found {
            files: BTreeMap::new(),
            whiteouts: vec!["release-manifests/.wh..wh..opq".into()],
        };
        assert!(opaque.hides("release-manifests/release-metadata"));
        let dir = Found {
            files: BTreeMap::new(),
            whiteouts: vec![".wh.release-manifests".into()],
        };
        assert!(dir.hides("release-manifests/image-references"));
    }

    #[test]
    fn sizes_are_read_in_octal_and_base_256() {
        assert_eq!(number(b"00000001750\0"), Some(1000));
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[8..].copy_from_slice(&(2u32 << 30).to_be_bytes());
        assert_eq!(number(&big), Some(2 << 30));
    }
}
