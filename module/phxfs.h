/* SPDX-License-Identifier: GPL-2.0 */
/*
 * phxfs: internal interfaces between the core (character devices, mmap,
 * registrations) and the vendor backend chosen at build time.
 */
#ifndef _PHXFS_H
#define _PHXFS_H

#include <linux/device.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/memremap.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/workqueue.h>

#include "include/uapi/phxfs_ioctl.h"

#define PHXFS_MAX_DEVS	16

/*
 * One device: a range of physical device memory (a GPU BAR, a stand-in
 * BAR, or reserved RAM) with struct pages from memremap_pages().
 */
struct phxfs_dev {
	struct kref kref;
	int index;			/* minor number, N in phxfs_devN */
	struct device *device;		/* the class device */
	struct pci_dev *pdev;		/* NULL for reserved RAM */
	int bar;			/* BAR of pdev phxfs owns, else -1 */
	phys_addr_t start;		/* device memory, physical */
	u64 size;

	bool p2pdma;			/* pages from the PCI P2PDMA core */
	void *p2p_kaddr;		/* the whole p2pdma pool, when p2pdma */
	struct dev_pagemap pgmap;	/* pages from memremap_pages() */
	int ref_base;			/* page refcount with no user pin */

	struct mutex lock;		/* protects dead, vmas, pinned */
	bool dead;			/* device going away: no new maps */
	bool pages_gone;		/* struct pages released (SRCU) */
	struct list_head vmas;		/* struct phxfs_vma.node */
	struct list_head pinned;	/* struct phxfs_reg.pin_node */

	atomic_long_t nr_regs;		/* live registrations */
	atomic64_t mapped_bytes;	/* bytes of live registrations */

	void *backend_data;
};

/* The private data of one mmap() of a device (shared by VMA copies). */
struct phxfs_vma {
	struct kref kref;		/* one per VMA that points here */
	struct phxfs_dev *dev;		/* holds a reference */
	struct file *file;		/* holds a reference */
	struct address_space *mapping;	/* where unmap_mapping_pages() looks */
	struct mutex lock;		/* protects regs and reg->dead */
	struct list_head regs;		/* struct phxfs_reg.node */
	struct list_head node;		/* in dev->vmas */
	struct work_struct release_work; /* releases busy regs after close */
};

/*
 * One MAP: device memory inserted into a range of a phxfs VMA.  Whoever
 * holds it in a list (pv->regs, then whoever unlinked it) holds a
 * reference; a revoker holds one more while it waits for I/O on it with
 * no lock held.  From pin to unpin it is on dev->pinned, where MAPs of
 * other owners find it (phxfs_reg_pin()).
 */
struct phxfs_reg {
	struct kref kref;
	struct list_head node;		/* in pv->regs */
	struct list_head revoke_node;	/* in a revoker's list */
	struct list_head pin_node;	/* in dev->pinned while pinned */
	kuid_t owner;			/* effective uid of the MAP caller */
	struct phxfs_vma *pv;
	struct phxfs_dev *dev;
	unsigned long uaddr;		/* host range */
	u64 size;
	u64 devaddr;			/* device range */
	pgoff_t pgoff;			/* file page offset of uaddr */
	bool dead;			/* revoked or unmapped: no new PTEs */
	bool owned;			/* claimed for the unpin path */
	void *backend_data;
};

/*
 * A vendor backend.  pin/claim/unpin are called without any phxfs lock
 * held (claim and unpin may run under mmap_lock, from munmap).
 *
 * A registration goes away in three steps, after its last PTE is gone:
 * claim decides who gives the pages back, the unpin path or the vendor's
 * revocation (which then waits for I/O itself, see phxfs_reg_revoke());
 * if the unpin path owns them the core waits until no I/O in flight holds
 * them; then unpin gives them back (@owned: what claim returned) or waits
 * until the revocation has.  phys is only called while the registration
 * is live or claimed for the unpin path.
 */
struct phxfs_backend_ops {
	const char *name;
	u64 align;			/* device address and size alignment */
	/*
	 * A device address names the same memory for every process (emu),
	 * so the core refuses a MAP overlapping another owner's pinned
	 * range.  False where pin takes only memory the calling process
	 * owns by the vendor's rules (nvidia: nvidia_p2p_get_pages()
	 * resolves the address among the caller's own CUDA contexts).
	 */
	bool shared_devaddr;
	int (*init)(void);
	void (*exit)(void);
	int (*pin)(struct phxfs_dev *dev, struct phxfs_reg *reg);
	/* physical address of byte @off (page aligned) of a pinned range */
	phys_addr_t (*phys)(struct phxfs_reg *reg, u64 off);
	/* NULL: the pages are always the unpin path's */
	bool (*claim)(struct phxfs_reg *reg);
	/* NULL: nothing to release */
	void (*unpin)(struct phxfs_reg *reg, bool owned);
	const struct attribute_group *attr_group;	/* may be NULL */
};

extern const struct phxfs_backend_ops phxfs_backend;

/* core: devices */
struct phxfs_dev *phxfs_dev_create(struct pci_dev *pdev, int bar,
				   phys_addr_t start, u64 size,
				   void *backend_data);
void phxfs_dev_destroy(struct phxfs_dev *dev);
void phxfs_dev_put(struct phxfs_dev *dev);

/* core: memory (phxfs-mem.c) */
int phxfs_mem_init(void);
void phxfs_mem_exit(void);
int phxfs_pages_init(struct phxfs_dev *dev);
void phxfs_pages_exit(struct phxfs_dev *dev);
int phxfs_mmap(struct phxfs_dev *dev, struct file *file,
	       struct vm_area_struct *vma);
int phxfs_map(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req);
int phxfs_unmap(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req);
void phxfs_reg_revoke(struct phxfs_reg *reg);
int phxfs_dev_revoke_range(struct phxfs_dev *dev, u64 devaddr, u64 size);
void phxfs_dev_kill(struct phxfs_dev *dev);

#endif /* _PHXFS_H */
