//! Writing files so that a crash leaves the old one or the new one, never
//! half of one; reading the lists the controller writes.

use std::path::Path;

use crate::error::{Context, Error};

/// Writes a file readable by no one else from its first byte (it may hold
/// passwords), then moves it into place.
pub fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("cairn-tmp");
    let _ = std::fs::remove_file(&temporary);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, path))
        .and_then(|()| sync_parent(path))
        .context(|| format!("writing {}", path.display()))
}

/// Makes a rename or a new entry in `path`'s folder durable.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(parent) if parent.as_os_str().is_empty() => std::fs::File::open(".")?.sync_all(),
        Some(parent) => std::fs::File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// The cluster's pods as the controller lists them in the members file, one
/// a line; `None` without the file.
pub fn members(path: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}
