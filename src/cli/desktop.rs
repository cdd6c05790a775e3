//! `smolchat install-desktop-entry`: makes the app launchable from the desktop's menu, with
//! the icon, without a package manager.

use std::path::{Path, PathBuf};

use clap::Args;

const ICON_PNG: &[u8] = include_bytes!("../../assets/icon.png");
const DESKTOP_TEMPLATE: &str = include_str!("../../assets/smolchat.desktop");

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where XDG data lives; defaults to $XDG_DATA_HOME or ~/.local/share.
    #[arg(long)]
    data_home: Option<PathBuf>,
}

pub fn run(args: InstallArgs) -> Result<(), String> {
    let data_home = match args.data_home {
        Some(dir) => dir,
        None => directories::BaseDirs::new()
            .map(|dirs| dirs.data_local_dir().to_path_buf())
            .ok_or("cannot find the home folder; pass --data-home")?,
    };
    let exe = std::env::current_exe()
        .map_err(|err| format!("cannot find the smolchat executable: {err}"))?;
    let (desktop, icon) = install(&data_home, &exe)?;
    println!("installed {}", desktop.display());
    println!("installed {}", icon.display());
    Ok(())
}

/// Writes the .desktop file (pointing at `exe` by absolute path, so it works outside PATH)
/// and the icon under `data_home`.
pub fn install(data_home: &Path, exe: &Path) -> Result<(PathBuf, PathBuf), String> {
    let icon = data_home.join("icons/hicolor/256x256/apps/smolchat.png");
    let desktop = data_home.join("applications/smolchat.desktop");
    let exec = format!("Exec=\"{}\"", exe.display());
    let entry: String = DESKTOP_TEMPLATE
        .lines()
        .map(|line| match line {
            "Exec=smolchat" => exec.clone(),
            "Icon=smolchat" => format!("Icon={}", icon.display()),
            other => other.to_string(),
        })
        .map(|line| line + "\n")
        .collect();
    for (path, bytes) in [(&icon, ICON_PNG), (&desktop, entry.as_bytes())] {
        crate::atomic_file::write_atomic(path, bytes)
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    }
    Ok((desktop, icon))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_entry_with_absolute_exec_and_icon() {
        let dir = tempfile::tempdir().unwrap();
        let (desktop, icon) = install(dir.path(), Path::new("/opt/smol chat/smolchat")).unwrap();
        let entry = std::fs::read_to_string(desktop).unwrap();
        assert!(entry.contains("Exec=\"/opt/smol chat/smolchat\"\n"));
        assert!(entry.contains(&format!("Icon={}\n", icon.display())));
        assert_eq!(std::fs::read(icon).unwrap(), ICON_PNG);
    }
}
