//! A small tmpfs for a node's JetStream store, to fill the disk on purpose and free it again;
//! unmounted on Drop, and leftovers of dead test processes unmounted by [`sweep`].

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// Mount points are `<tmp>/<PREFIX><pid>-...`.
const PREFIX: &str = "jetsched-disk-";

/// A mounted tmpfs of a fixed size.
#[derive(Debug)]
pub struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `megabytes` MiB on a new directory.
    pub fn mount(megabytes: u64) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir()
            .context("mount point")?;
        let path = dir.keep();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(&path)
            .status()
            .context("run mount")?;
        if !status.success() {
            let _ = std::fs::remove_dir(&path);
            bail!("mount a {megabytes} MiB tmpfs on {}: {status}", path.display());
        }
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a filler file until the disk is full; returns the bytes written.
    pub fn fill(&self) -> anyhow::Result<u64> {
        let mut file = std::fs::File::create(self.filler()).context("create the filler")?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(error) if error.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(error) => return Err(error).context("write the filler"),
            }
        }
        let _ = file.sync_all();
        Ok(written)
    }

    /// Removes the filler file.
    pub fn free(&self) -> anyhow::Result<()> {
        std::fs::remove_file(self.filler()).context("remove the filler")
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        unmount(&self.path);
    }
}

fn unmount(path: &Path) {
    let _ = Command::new("umount").arg("-l").arg(path).status();
    let _ = std::fs::remove_dir_all(path);
}

/// Unmounts the small disks of test processes that no longer run.
pub(crate) fn sweep() {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else { return };
    for point in mounts.lines().filter_map(|line| line.split_whitespace().nth(1)) {
        let path = Path::new(point);
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if let Some(pid) = crate::netns::owner(name, PREFIX)
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            unmount(path);
        }
    }
}
