//! A small host file system for tests of a full disk under a thin image: a tmpfs of a few
//! MiB that the test mounts (root only), grows when the test frees room, and unmounts when
//! dropped. The chip above it has room; the host does not.

use std::path::PathBuf;
use std::process::Command;

/// A tmpfs mounted at a fresh directory, unmounted on drop.
pub struct SmallHost(PathBuf);

impl SmallHost {
    /// A tmpfs of `mib` MiB, named after `name` and this process; `None` where it cannot be
    /// mounted (not root). A test then says so and skips, unless `BITMEND_REQUIRE_FUSE` asks
    /// for every mount test, which [`SmallHost::or_skip`] checks.
    pub fn mount(name: &str, mib: u32) -> Option<SmallHost> {
        let dir = std::env::temp_dir().join(format!("bitmend-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let size = format!("size={mib}m");
        let ok = Command::new("mount").args(["-t", "tmpfs", "-o", &size, "tmpfs"]).arg(&dir).status();
        if !ok.is_ok_and(|s| s.success()) {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallHost(dir))
    }

    /// [`mount`](Self::mount), or `None` after saying why the test skips (a panic where
    /// `BITMEND_REQUIRE_FUSE` is set: there every mount test must run).
    pub fn or_skip(name: &str, mib: u32) -> Option<SmallHost> {
        let host = SmallHost::mount(name, mib);
        if host.is_none() {
            assert!(
                std::env::var_os("BITMEND_REQUIRE_FUSE").is_none(),
                "mount tests required, but a tmpfs could not be mounted (needs root)"
            );
            eprintln!("skipped: mounting a small tmpfs needs root");
        }
        host
    }

    /// Gives the host room again (what an operator freeing the disk does).
    pub fn grow(&self, mib: u32) {
        let opts = format!("remount,size={mib}m");
        let s = Command::new("mount").args(["-o", &opts]).arg(&self.0).status().expect("mount runs");
        assert!(s.success(), "remount {} with {opts}", self.0.display());
    }

    /// A path in the host.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for SmallHost {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}
