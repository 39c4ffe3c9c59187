#!/bin/sh
# The guest's init (PID 1 of the VM that scripts/vm/run.sh boots): load the modules, load
# nandsim at the geometry the kernel command line asks for, mount the host's root read-only
# at /hostroot with writable places of its own (tmpfs) and the repository read-write at its
# own path, then run the script chrooted into the host's tree, so that every tool the host
# has (bitmend's build, mtd-utils, fio) is there. Its exit status is printed as "VM-EXIT: N"
# for run.sh, and the VM powers off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
arg() { sed -n "s/.*vm\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
for m in $(cat /etc/modules); do
  case "$m" in
    nandsim) [ -n "$(arg nandsim)" ] && { insmod /lib/modules/nandsim.ko $(arg nandsim | tr ',' ' ') || echo "VM: nandsim refused $(arg nandsim)"; } ;;
    *) insmod /lib/modules/$m.ko 2>/dev/null ;;
  esac
done
r=/hostroot
v9="trans=virtio,version=9p2000.L,msize=524288"
mount -t 9p -o $v9,ro hostroot $r || { echo "VM-EXIT: 125"; reboot -f; }
mount -t proc proc $r/proc
mount -t sysfs sys $r/sys
mount -t devtmpfs dev $r/dev
for d in tmp run dev/shm; do mkdir -p $r/$d; mount -t tmpfs "$d" $r/$d; done
# The modules and busybox (the host may have no insmod), where a script can load nandsim
# again with other parameters (its fault knobs).
mkdir -p $r/run/vm-modules && cp /lib/modules/*.ko /bin/busybox $r/run/vm-modules/
mkdir -p $r$(arg workdir) 2>/dev/null
mount -t 9p -o $v9,rw work $r$(arg workdir)
chroot $r /bin/bash -c "cd $(arg workdir) && export HOME=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/root/.cargo/bin && exec bash $(arg script | tr ',' ' ')"
echo "VM-EXIT: $?"
reboot -f
