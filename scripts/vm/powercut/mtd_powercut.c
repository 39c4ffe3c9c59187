// SPDX-License-Identifier: GPL-2.0
/*
 * mtd_powercut: the power of an MTD chip cut, for a test. While the module is loaded, every
 * program, erase and bad-block mark sent to MTD device `index` reports success and changes
 * nothing: the chip keeps what the last operation before the cut left, as when the power goes
 * between two operations, while the file system above carries on unaware (as it would for
 * the moment it takes the power to fail) and can be unmounted without a retry loop. Unloading
 * the module gives the chip back; the next mount then sees what a reboot would.
 *
 * Used by scripts/vm/peers.sh to cut the power the same way under bitmend, JFFS2 and UBIFS,
 * in a VM whose simulated chip (nandsim) lives in the VM's RAM and would not survive a
 * power-off of the VM.
 */
#include <linux/err.h>
#include <linux/module.h>
#include <linux/mtd/mtd.h>

static int index;
module_param(index, int, 0444);
MODULE_PARM_DESC(index, "the MTD device whose power is cut (default 0)");

static struct mtd_info *part, *mtd;
static typeof(mtd->_erase) saved_erase;
static typeof(mtd->_write) saved_write;
static typeof(mtd->_write_oob) saved_write_oob;
static typeof(mtd->_writev) saved_writev;
static typeof(mtd->_block_markbad) saved_block_markbad;
static atomic_t dropped = ATOMIC_INIT(0);

static int cut_erase(struct mtd_info *m, struct erase_info *instr)
{
	atomic_inc(&dropped);
	return 0;
}

static int cut_write(struct mtd_info *m, loff_t to, size_t len, size_t *retlen,
		     const u_char *buf)
{
	atomic_inc(&dropped);
	*retlen = len;
	return 0;
}

static int cut_write_oob(struct mtd_info *m, loff_t to, struct mtd_oob_ops *ops)
{
	atomic_inc(&dropped);
	ops->retlen = ops->datbuf ? ops->len : 0;
	ops->oobretlen = ops->oobbuf ? ops->ooblen : 0;
	return 0;
}

static int cut_writev(struct mtd_info *m, const struct kvec *vecs, unsigned long count,
		      loff_t to, size_t *retlen)
{
	size_t len = 0;
	unsigned long i;

	for (i = 0; i < count; i++)
		len += vecs[i].iov_len;
	atomic_inc(&dropped);
	*retlen = len;
	return 0;
}

static int cut_block_markbad(struct mtd_info *m, loff_t ofs)
{
	atomic_inc(&dropped);
	return 0;
}

static int __init powercut_init(void)
{
	part = get_mtd_device(NULL, index);
	if (IS_ERR(part))
		return PTR_ERR(part);
	/* A partition (nandsim always makes one) has no hooks of its own: the MTD core calls
	 * those of its master. */
	mtd = mtd_get_master(part);
	saved_erase = mtd->_erase;
	saved_write = mtd->_write;
	saved_write_oob = mtd->_write_oob;
	saved_writev = mtd->_writev;
	saved_block_markbad = mtd->_block_markbad;
	/* Only what the driver has: a NULL hook means "not supported" to the MTD core. */
	if (saved_erase)
		WRITE_ONCE(mtd->_erase, cut_erase);
	if (saved_write)
		WRITE_ONCE(mtd->_write, cut_write);
	if (saved_write_oob)
		WRITE_ONCE(mtd->_write_oob, cut_write_oob);
	if (saved_writev)
		WRITE_ONCE(mtd->_writev, cut_writev);
	if (saved_block_markbad)
		WRITE_ONCE(mtd->_block_markbad, cut_block_markbad);
	pr_info("mtd_powercut: mtd%d cut\n", index);
	return 0;
}

static void __exit powercut_exit(void)
{
	WRITE_ONCE(mtd->_erase, saved_erase);
	WRITE_ONCE(mtd->_write, saved_write);
	WRITE_ONCE(mtd->_write_oob, saved_write_oob);
	WRITE_ONCE(mtd->_writev, saved_writev);
	WRITE_ONCE(mtd->_block_markbad, saved_block_markbad);
	put_mtd_device(part);
	pr_info("mtd_powercut: mtd%d back, %d operations dropped\n", index, atomic_read(&dropped));
}

module_init(powercut_init);
module_exit(powercut_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Cut the power of an MTD chip, for tests");
