//! Files pinset writes (the node's policy cache here; the CRI-O drop-in in the node crate):
//! atomically, so that a reader — or a restart after a crash — sees the old file or the new one.

use std::path::Path;

/// Write `content` to `path` so that readers see the old or the new file, never a mix (a
/// temporary file beside it, synced, renamed over it, the directory synced); on an error the
/// temporary file is removed and `path` is as it was.
pub fn write_atomic(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(content)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
