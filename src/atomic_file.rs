//! Replacing a file so that readers see either the old or the new contents, never a mix:
//! a kill -9 or power loss mid-write must not corrupt a saved conversation, the settings or
//! a hub cache ref. The one writer that the store and the hub cache share.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Writes `bytes` to a temporary file in the same folder (so the rename cannot cross file
/// systems), flushes it to disk, then renames it over `path` and syncs the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent folder"))?;
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = dir.join(temp_name);
    let result = (|| {
        let mut file = File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
        return result;
    }
    // Persists the rename itself; not every platform can open a folder, hence best effort.
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Copies a file that could not be read to `{name}.damaged` beside it, before the app
/// writes over it: what the user had is never lost unread. Says where the copy went, or why
/// there is none, for the message that reports the damage.
pub fn keep_damaged_copy(path: &Path) -> String {
    let mut name = path.as_os_str().to_owned();
    name.push(".damaged");
    let damaged = std::path::PathBuf::from(name);
    match fs::copy(path, &damaged) {
        Ok(_) => format!("the file as it was is kept as {}", damaged.display()),
        Err(err) => format!("it could not be kept as {}: {err}", damaged.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_contents_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
