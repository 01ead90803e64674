// SPDX-License-Identifier: GPL-2.0
/*
 * phxfs nvidia backend: GPU memory pinned with the nv-p2p API of nvidia.ko.
 *
 * Every NVIDIA display/3D controller becomes a phxfs device whose struct
 * pages cover its BAR1 (where pinned GPU memory appears).  MAP pins the
 * GPU virtual range with nvidia_p2p_get_pages() and inserts the pages of
 * the physical addresses it returns; UNMAP/munmap unpins with
 * nvidia_p2p_put_pages().  When the driver frees pinned memory (cudaFree,
 * process exit) it calls the free callback, which revokes the registration
 * (PTEs zapped, registration dead, I/O in flight waited for) and frees the
 * page table with nvidia_p2p_free_page_table().  Exactly one of the two
 * paths owns the page table, decided by an atomic state, so it is never
 * freed twice.
 *
 * The nv-p2p functions are looked up at load time (symbol_get), so the
 * module builds without the driver's sources (include/nv-p2p-decl.h).
 * Compiled here; untested on hardware.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>

#include "include/nv-p2p-decl.h"
#include "phxfs.h"

#define NV_GPU_PAGE_SHIFT	16
#define NV_GPU_PAGE_SIZE	(1ULL << NV_GPU_PAGE_SHIFT)
#define NV_BAR			1

enum {
	NV_PINNED,	/* the page table is live; nobody has claimed it */
	NV_RELEASING,	/* the unpin path owns it: nvidia_p2p_put_pages() */
	NV_REVOKED,	/* the free callback owns it: free_page_table() */
};

struct nv_reg {
	struct nvidia_p2p_page_table *pt;
	atomic_t state;
	struct completion revoked;	/* the callback is done with the reg */
};

static typeof(&nvidia_p2p_get_pages) nv_get_pages;
static typeof(&nvidia_p2p_put_pages) nv_put_pages;
static typeof(&nvidia_p2p_free_page_table) nv_free_page_table;

static struct phxfs_dev *nv_devs[PHXFS_MAX_DEVS];
static int nv_ndevs;

static void nv_free_callback(void *data)
{
	struct phxfs_reg *reg = data;
	struct nv_reg *nv = reg->backend_data;

	/* the unpin path won: nvidia_p2p_put_pages() is dealing with it */
	if (atomic_cmpxchg(&nv->state, NV_PINNED, NV_REVOKED) != NV_PINNED)
		return;
	phxfs_reg_revoke(reg);
	nv_free_page_table(nv->pt);
	complete(&nv->revoked);
}

static int nv_pin(struct phxfs_dev *dev, struct phxfs_reg *reg)
{
	struct nvidia_p2p_page_table *pt;
	struct nv_reg *nv;
	u32 i;
	int ret;

	nv = kzalloc(sizeof(*nv), GFP_KERNEL);
	if (!nv)
		return -ENOMEM;
	atomic_set(&nv->state, NV_PINNED);
	init_completion(&nv->revoked);
	reg->backend_data = nv;

	ret = nv_get_pages(0, 0, reg->devaddr, reg->size, &nv->pt,
			   nv_free_callback, reg);
	if (ret)
		goto err_free;

	pt = nv->pt;
	if (NVIDIA_P2P_VERSION_MAJOR(pt->version) > PHXFS_NV_P2P_PAGE_TABLE_MAJOR ||
	    pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    (u64)pt->entries << NV_GPU_PAGE_SHIFT != reg->size) {
		pr_err("phxfs_dev%d: unexpected nv-p2p page table (version %#x, page size %u, %u entries)\n",
		       dev->index, pt->version, pt->page_size, pt->entries);
		ret = -EOPNOTSUPP;
		goto err_unpin;
	}
	/* the memory must be this GPU's: its pages are what phxfs maps */
	for (i = 0; i < pt->entries; i++) {
		u64 phys = pt->pages[i]->physical_address;

		if (phys < dev->start || phys - dev->start >= dev->size ||
		    dev->size - (phys - dev->start) < NV_GPU_PAGE_SIZE) {
			ret = -EXDEV;
			goto err_unpin;
		}
	}
	return 0;

err_unpin:
	if (atomic_cmpxchg(&nv->state, NV_PINNED, NV_RELEASING) == NV_PINNED)
		nv_put_pages(0, 0, reg->devaddr, nv->pt);
	else
		wait_for_completion(&nv->revoked);
err_free:
	reg->backend_data = NULL;
	kfree(nv);
	return ret;
}

static phys_addr_t nv_phys(struct phxfs_reg *reg, u64 off)
{
	struct nv_reg *nv = reg->backend_data;

	return nv->pt->pages[off >> NV_GPU_PAGE_SHIFT]->physical_address +
	       (off & (NV_GPU_PAGE_SIZE - 1));
}

static void nv_unpin(struct phxfs_reg *reg)
{
	struct nv_reg *nv = reg->backend_data;
	int ret;

	if (atomic_cmpxchg(&nv->state, NV_PINNED, NV_RELEASING) == NV_PINNED) {
		/* no PTE is left; wait for I/O still using the pages */
		phxfs_reg_drain(reg);
		ret = nv_put_pages(0, 0, reg->devaddr, nv->pt);
		if (ret)
			pr_warn("phxfs_dev%d: nvidia_p2p_put_pages: %d\n",
				reg->dev->index, ret);
	} else {
		/* the free callback owns the page table and frees it */
		wait_for_completion(&nv->revoked);
	}
	kfree(nv);
}

static void nv_put_symbols(void)
{
	if (nv_get_pages)
		symbol_put(nvidia_p2p_get_pages);
	if (nv_put_pages)
		symbol_put(nvidia_p2p_put_pages);
	if (nv_free_page_table)
		symbol_put(nvidia_p2p_free_page_table);
	nv_get_pages = NULL;
	nv_put_pages = NULL;
	nv_free_page_table = NULL;
}

static void nv_exit(void)
{
	while (nv_ndevs > 0)
		phxfs_dev_destroy(nv_devs[--nv_ndevs]);
	nv_put_symbols();
}

static int nv_init(void)
{
	struct pci_dev *pdev = NULL;
	struct phxfs_dev *dev;
	int ret;

	nv_get_pages = symbol_get(nvidia_p2p_get_pages);
	nv_put_pages = symbol_get(nvidia_p2p_put_pages);
	nv_free_page_table = symbol_get(nvidia_p2p_free_page_table);
	if (!nv_get_pages || !nv_put_pages || !nv_free_page_table) {
		pr_err("nvidia_p2p_* not found: is nvidia.ko loaded?\n");
		ret = -ENOENT;
		goto err_symbols;
	}

	for_each_pci_dev(pdev) {
		unsigned int class = pdev->class >> 8;

		if (pdev->vendor != PCI_VENDOR_ID_NVIDIA ||
		    (class != PCI_CLASS_DISPLAY_VGA &&
		     class != PCI_CLASS_DISPLAY_3D))
			continue;
		if (nv_ndevs == PHXFS_MAX_DEVS)
			break;
		/* nvidia.ko owns the GPU: phxfs only adds pages over BAR1 */
		dev = phxfs_dev_create(pdev, -1,
				       pci_resource_start(pdev, NV_BAR),
				       pci_resource_len(pdev, NV_BAR), NULL);
		if (IS_ERR(dev)) {
			ret = PTR_ERR(dev);
			pr_err("%s: BAR1: %d\n", pci_name(pdev), ret);
			pci_dev_put(pdev);
			goto err_devs;
		}
		nv_devs[nv_ndevs++] = dev;
	}
	if (!nv_ndevs)
		pr_warn("no NVIDIA GPU found\n");
	return 0;

err_devs:
	while (nv_ndevs > 0)
		phxfs_dev_destroy(nv_devs[--nv_ndevs]);
err_symbols:
	nv_put_symbols();
	return ret;
}

const struct phxfs_backend_ops phxfs_backend = {
	.name = "nvidia",
	.align = NV_GPU_PAGE_SIZE,
	.init = nv_init,
	.exit = nv_exit,
	.pin = nv_pin,
	.phys = nv_phys,
	.unpin = nv_unpin,
};
