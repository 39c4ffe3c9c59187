#!/usr/bin/env python3
"""Builds the guest's initramfs (a gzipped newc cpio): busybox, kernel modules with their
dependencies in load order, and init.sh. Python alone, so the host needs no cpio or kmod.

    initrd.py KERNEL_TREE BUSYBOX OUT MODULE...

KERNEL_TREE is an unpacked linux-image package (lib/modules/VERSION/kernel/...)."""
import gzip
import os
import re
import sys


def module_paths(tree):
    """Every module of the tree by name (dashes as underscores, as the kernel names them)."""
    paths = {}
    for d, _, files in os.walk(os.path.join(tree, "lib", "modules")):
        for f in files:
            if f.endswith(".ko"):
                paths[f[:-3].replace("-", "_")] = os.path.join(d, f)
    return paths


def load_order(paths, wanted):
    """The modules asked for and what they depend on (their .modinfo `depends=`), each after
    its dependencies."""
    order = []

    def visit(name):
        if name in order:
            return
        if name not in paths:
            sys.exit(f"initrd.py: no module {name} in the kernel package")
        found = re.search(rb"depends=([^\x00]*)\x00", open(paths[name], "rb").read())
        for dep in (found.group(1).decode().split(",") if found else []):
            if dep:
                visit(dep.replace("-", "_"))
        order.append(name)

    for name in wanted:
        visit(name.replace("-", "_"))
    return order


def cpio(entries):
    """newc archive of (name, mode, bytes) entries."""
    out = bytearray()

    def pad():
        out.extend(b"\0" * (-len(out) % 4))

    for ino, (name, mode, body) in enumerate(entries + [("TRAILER!!!", 0, b"")], start=1):
        fields = (ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(name) + 1, 0)
        out += b"070701" + "".join(f"{f:08X}" for f in fields).encode() + name.encode() + b"\0"
        pad()
        out += body
        pad()
    return bytes(out)


def main():
    tree, busybox, out, *wanted = sys.argv[1:]
    paths = module_paths(tree)
    order = load_order(paths, wanted)
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [(d, 0o040755, b"") for d in
               ["bin", "dev", "proc", "sys", "tmp", "etc", "lib", "lib/modules", "hostroot"]]
    entries.append(("bin/busybox", 0o100755, open(busybox, "rb").read()))
    entries.append(("bin/sh", 0o120777, b"busybox"))
    entries += [(f"lib/modules/{m}.ko", 0o100644, open(paths[m], "rb").read()) for m in order]
    entries.append(("etc/modules", 0o100644, ("\n".join(order) + "\n").encode()))
    entries.append(("init", 0o100755, open(os.path.join(here, "init.sh"), "rb").read()))
    with open(out, "wb") as f:
        f.write(gzip.compress(cpio(entries), 1))


if __name__ == "__main__":
    main()
