//! `mount.bitmend`: what mount(8) runs for `mount -t bitmend DEVICE DIR -o OPTIONS`, and for
//! an /etc/fstab line of type `bitmend`. It is this binary under that name (a link beside it,
//! `scripts/install.sh` makes one), its arguments turned into `bitmend mount`'s.
//!
//! mount(8) calls `mount.bitmend SPEC DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]`. Each option
//! `name=value` becomes `--name value` and each `name` becomes `--name` (underscores read as
//! dashes: `commit_interval=10s` is `--commit-interval 10s`); the options every file system
//! is given (`defaults`, `rw`, `auto`, `nofail`, `_netdev`, `x-systemd.*`, ...) are for mount(8)
//! and systemd and are passed over.

use std::ffi::OsString;
use std::path::Path;

/// Options mount(8), fstab and systemd give every file system, which `bitmend mount` has no
/// flag for and needs none.
const FOR_MOUNT_ITSELF: &[&str] = &[
    "defaults",
    "rw",
    "auto",
    "noauto",
    "nofail",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "_netdev",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "async",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "lazytime",
    "nolazytime",
    "loud",
    "silent",
];

/// Whether this process was started as `mount.bitmend`.
pub fn invoked_as_helper(argv0: &OsString) -> bool {
    Path::new(argv0).file_name().is_some_and(|n| n == "mount.bitmend")
}

/// `bitmend mount`'s arguments for a `mount.bitmend` command line, or why it cannot be one.
/// `-f` (fake) gives None: there is nothing to do.
pub fn translate(argv: &[OsString]) -> Result<Option<Vec<OsString>>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => options.push(it.next().ok_or("-o needs a list of options")?.clone()),
            Some("-t") | Some("-N") => {
                it.next();
            }
            Some(flags) if flags.starts_with('-') && flags.len() > 1 => {
                for f in flags[1..].chars() {
                    match f {
                        'f' => fake = true,
                        's' | 'n' | 'v' | 'r' | 'w' => {}
                        other => return Err(format!("unknown flag -{other}")),
                    }
                }
                if flags.contains('r') {
                    return Err("read-only mounts are not supported: bitmend mounts read-write".into());
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [spec, dir] = positional.as_slice() else {
        return Err("usage: mount.bitmend DEVICE-OR-IMAGE DIRECTORY [-o OPTIONS]".into());
    };
    let mut out: Vec<OsString> = vec!["bitmend".into(), "mount".into(), spec.clone(), dir.clone()];
    for list in &options {
        let list = list.to_str().ok_or("options must be UTF-8")?;
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            out.extend(option(opt)?);
        }
    }
    Ok((!fake).then_some(out))
}

/// One `-o` option as `bitmend mount` flags (none for the options mount(8) keeps).
fn option(opt: &str) -> Result<Vec<OsString>, String> {
    let (name, value) = match opt.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (opt, None),
    };
    if FOR_MOUNT_ITSELF.contains(&name) || name.starts_with("x-") || name == "comment" {
        return Ok(vec![]);
    }
    if name == "ro" {
        return Err("read-only mounts are not supported: bitmend mounts read-write".into());
    }
    let flag = format!("--{}", name.replace('_', "-"));
    Ok(match value {
        Some(v) => vec![flag.into(), v.into()],
        None => vec![flag.into()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<OsString> {
        s.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn options_become_flags_and_mounts_own_are_passed_over() {
        let got = translate(&args(
            "/sbin/mount.bitmend /dev/mtd2 /data -o rw,nofail,x-systemd.device-timeout=5,commit_interval=10s,allow_other",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(got, args("bitmend mount /dev/mtd2 /data --commit-interval 10s --allow-other"));
    }

    #[test]
    fn flags_types_and_fake_mounts() {
        let got = translate(&args("mount.bitmend -sv /dev/mtd2 /data -t bitmend -o nvram=none")).unwrap();
        assert_eq!(got.unwrap(), args("bitmend mount /dev/mtd2 /data --nvram none"));
        assert_eq!(translate(&args("mount.bitmend -f /dev/mtd2 /data")).unwrap(), None);
    }

    #[test]
    fn read_only_and_malformed_lines_are_refused() {
        assert!(translate(&args("mount.bitmend /dev/mtd2 /data -o ro")).is_err());
        assert!(translate(&args("mount.bitmend -r /dev/mtd2 /data")).is_err());
        assert!(translate(&args("mount.bitmend /dev/mtd2")).is_err());
        assert!(translate(&args("mount.bitmend /dev/mtd2 /data -o")).is_err());
        assert!(translate(&args("mount.bitmend -q /dev/mtd2 /data")).is_err());
    }

    #[test]
    fn only_that_name_is_the_helper() {
        assert!(invoked_as_helper(&"/usr/sbin/mount.bitmend".into()));
        assert!(!invoked_as_helper(&"/usr/bin/bitmend".into()));
    }
}
