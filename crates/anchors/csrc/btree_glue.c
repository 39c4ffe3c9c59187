/*
 * A flat C interface to PMDK's example B-tree (btree_map.c, shipped by Debian's
 * libpmemobj-dev under /usr/share/doc and compiled from there by build.rs), for
 * `bitmend bench heap`: create a map in a pool's root object, insert a key with a value
 * copied into a new object in the same transaction, look a key up.
 */
#include <string.h>
#include <libpmemobj.h>
#include "btree_map.h"

struct value {
	const void *data;
	size_t len;
};

static void
value_init(PMEMobjpool *pop, void *ptr, void *arg)
{
	const struct value *v = arg;
	pmemobj_memcpy_persist(pop, ptr, v->data, v->len);
}

int
bitmend_btree_create(PMEMobjpool *pop, PMEMoid *slot)
{
	return btree_map_create(pop, (TOID(struct btree_map) *)slot, NULL);
}

int
bitmend_btree_insert(PMEMobjpool *pop, PMEMoid map, uint64_t key, const void *data, size_t len)
{
	TOID(struct btree_map) m;
	TOID_ASSIGN(m, map);
	struct value v = { data, len };
	return btree_map_insert_new(pop, m, key, len, 1, value_init, &v);
}

const void *
bitmend_btree_get(PMEMobjpool *pop, PMEMoid map, uint64_t key)
{
	TOID(struct btree_map) m;
	TOID_ASSIGN(m, map);
	PMEMoid v = btree_map_get(pop, m, key);
	return OID_IS_NULL(v) ? NULL : pmemobj_direct(v);
}
