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
 * paths owns the page table: the first to claim it (an atomic bit each in
 * a state the callback's own reference keeps alive), so it is never freed
 * twice and the loser touches nothing the winner frees.
 *
 * Ownership is the driver's: with p2p_token and va_space 0,
 * nvidia_p2p_get_pages() looks the GPU virtual address up among the CUDA
 * contexts of the calling process only, so a MAP can pin nothing but the
 * caller's own GPU memory (or memory it imported with CUDA IPC).  Two
 * processes may use the same address for different memory, so the core
 * compares no device addresses here (shared_devaddr false).
 *
 * The nv-p2p functions are looked up at load time (symbol_get), so the
 * module builds without the driver's sources (include/nv-p2p-decl.h).
 * Compiled here; untested on hardware.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/refcount.h>
#include <linux/slab.h>

#include "include/nv-p2p-decl.h"
#include "phxfs.h"

#define NV_GPU_PAGE_SHIFT	16
#define NV_GPU_PAGE_SIZE	(1ULL << NV_GPU_PAGE_SHIFT)
#define NV_BAR			1

/*
 * nv_reg.claims: who came first owns the page table.  The unpin path also
 * sets NV_CLAIM_CALLBACK once the callback can no longer start.
 */
#define NV_CLAIM_UNPIN		BIT(0)
#define NV_CLAIM_CALLBACK	BIT(1)

/*
 * The nv-p2p state of one registration; the free callback's data.
 *
 * It lives as long as the callback can run, without relying on
 * nvidia_p2p_put_pages() waiting for a callback in flight: it holds two
 * references, the registration's (dropped by unpin) and the callback's
 * (dropped by the callback when it returns, or by the unpin path once
 * nvidia_p2p_put_pages() has returned 0 before the callback started: the
 * driver never starts the callback after that).  The callback reads
 * nothing but @claims before it knows it owns the page table; only the
 * owner reads @pt or @reg.
 */
struct nv_reg {
	struct phxfs_reg *reg;
	struct nvidia_p2p_page_table *pt;
	atomic_t claims;		/* NV_CLAIM_* */
	refcount_t ref;
	bool valid;			/* @pt passed nv_check_pages() */
	struct completion checked;	/* nv_pin is done reading @pt */
	struct completion freed;	/* the callback owned and freed @pt */
};

static typeof(&nvidia_p2p_get_pages) nv_get_pages;
static typeof(&nvidia_p2p_put_pages) nv_put_pages;
static typeof(&nvidia_p2p_free_page_table) nv_free_page_table;

static struct phxfs_dev *nv_devs[PHXFS_MAX_DEVS];
static int nv_ndevs;

static void nv_put(struct nv_reg *nv)
{
	if (refcount_dec_and_test(&nv->ref))
		kfree(nv);
}

/* Claim the page table for the unpin path: true if the callback has not. */
static bool nv_claim_unpin(struct nv_reg *nv)
{
	return !(atomic_fetch_or(NV_CLAIM_UNPIN, &nv->claims) &
		 NV_CLAIM_CALLBACK);
}

/*
 * The callback owns the page table: revoke the registration (alive until
 * @freed completes: its unpin waits for that) and free the table.  A table
 * that failed the checks never had PTEs; it is not read again.  (Assumes
 * the driver does not call the callback from within get_pages.)
 */
static void nv_revoke(struct nv_reg *nv)
{
	wait_for_completion(&nv->checked);
	if (nv->valid)
		phxfs_reg_revoke(nv->reg);
	nv_free_page_table(nv->pt);
	complete(&nv->freed);
}

/**
 * nv_free_callback - nvidia.ko takes pinned GPU memory back
 * @data: the registration's struct nv_reg
 *
 * Decides ownership first, with one atomic operation on state that its
 * own reference keeps alive; only if it won does it touch the page table
 * or the registration.  Either way it then drops its reference.
 */
static void nv_free_callback(void *data)
{
	struct nv_reg *nv = data;

	if (!(atomic_fetch_or(NV_CLAIM_CALLBACK, &nv->claims) & NV_CLAIM_UNPIN))
		nv_revoke(nv);
	nv_put(nv);
}

/*
 * Give the pages back (@owned: nv_claim_unpin() won) or wait until the
 * callback has, then drop the registration's reference.
 */
static void nv_release(struct nv_reg *nv, bool owned)
{
	int old, ret;

	if (!owned) {
		wait_for_completion(&nv->freed);
		goto out_put;
	}
	ret = nv_put_pages(0, 0, nv->reg->devaddr, nv->pt);
	if (ret) {
		/* still pinned as far as we know: the callback may come */
		pr_warn("phxfs_dev%d: nvidia_p2p_put_pages: %d\n",
			nv->reg->dev->index, ret);
		goto out_put;
	}
	/* the callback can no longer start: drop its reference unless it ran */
	old = atomic_fetch_or(NV_CLAIM_CALLBACK, &nv->claims);
	if (!(old & NV_CLAIM_CALLBACK))
		nv_put(nv);
out_put:
	nv_put(nv);
}

/* @pt must describe @size bytes of this GPU's BAR1 in 64 KiB pages. */
static int nv_check_pages(struct phxfs_dev *dev, u64 size,
			  const struct nvidia_p2p_page_table *pt)
{
	u32 i;

	if (NVIDIA_P2P_VERSION_MAJOR(pt->version) > PHXFS_NV_P2P_PAGE_TABLE_MAJOR ||
	    pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    (u64)pt->entries << NV_GPU_PAGE_SHIFT != size) {
		pr_err("phxfs_dev%d: unexpected nv-p2p page table (version %#x, page size %u, %u entries)\n",
		       dev->index, pt->version, pt->page_size, pt->entries);
		return -EOPNOTSUPP;
	}
	/* the memory must be this GPU's: its pages are what phxfs maps */
	for (i = 0; i < pt->entries; i++) {
		u64 phys = pt->pages[i]->physical_address;

		if (phys < dev->start || phys - dev->start >= dev->size ||
		    dev->size - (phys - dev->start) < NV_GPU_PAGE_SIZE)
			return -EXDEV;
	}
	return 0;
}

/* Allocate the state of @reg and pin its GPU range. */
static struct nv_reg *nv_get(struct phxfs_reg *reg)
{
	struct nv_reg *nv;
	int ret;

	nv = kzalloc(sizeof(*nv), GFP_KERNEL);
	if (!nv)
		return ERR_PTR(-ENOMEM);
	nv->reg = reg;
	atomic_set(&nv->claims, 0);
	refcount_set(&nv->ref, 2);	/* the registration's, the callback's */
	init_completion(&nv->checked);
	init_completion(&nv->freed);
	reg->backend_data = nv;		/* for nv_phys(), once valid */

	ret = nv_get_pages(0, 0, reg->devaddr, reg->size, &nv->pt,
			   nv_free_callback, nv);
	if (ret)
		goto err_free;
	return nv;

err_free:
	reg->backend_data = NULL;
	kfree(nv);	/* nothing pinned: no callback will come */
	return ERR_PTR(ret);
}

static int nv_pin(struct phxfs_dev *dev, struct phxfs_reg *reg)
{
	struct nv_reg *nv;
	int ret;

	nv = nv_get(reg);
	if (IS_ERR(nv))
		return PTR_ERR(nv);
	/* a callback that wins meanwhile waits for this before freeing pt */
	ret = nv_check_pages(dev, reg->size, nv->pt);
	nv->valid = !ret;
	complete_all(&nv->checked);
	if (ret)
		goto err_release;
	return 0;

err_release:
	nv_release(nv, nv_claim_unpin(nv));
	reg->backend_data = NULL;
	return ret;
}

static phys_addr_t nv_phys(struct phxfs_reg *reg, u64 off)
{
	struct nv_reg *nv = reg->backend_data;

	return nv->pt->pages[off >> NV_GPU_PAGE_SHIFT]->physical_address +
	       (off & (NV_GPU_PAGE_SIZE - 1));
}

static bool nv_claim(struct phxfs_reg *reg)
{
	return nv_claim_unpin(reg->backend_data);
}

/* The core has drained the pages if @owned. */
static void nv_unpin(struct phxfs_reg *reg, bool owned)
{
	nv_release(reg->backend_data, owned);
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

static bool nv_is_gpu(struct pci_dev *pdev)
{
	unsigned int class = pdev->class >> 8;

	if (pdev->vendor != PCI_VENDOR_ID_NVIDIA)
		return false;
	return class == PCI_CLASS_DISPLAY_VGA || class == PCI_CLASS_DISPLAY_3D;
}

/*
 * Make every NVIDIA GPU a phxfs device.  for_each_pci_dev() holds a
 * reference on the device of the current iteration: leaving the loop
 * early (break, return) must drop it.
 */
static int nv_add_gpus(void)
{
	struct pci_dev *pdev = NULL;
	struct phxfs_dev *dev;

	for_each_pci_dev(pdev) {
		if (!nv_is_gpu(pdev))
			continue;
		if (nv_ndevs == PHXFS_MAX_DEVS) {
			pr_warn("more than %d GPUs: %s and later left out\n",
				PHXFS_MAX_DEVS, pci_name(pdev));
			pci_dev_put(pdev);
			break;
		}
		/* nvidia.ko owns the GPU: phxfs only adds pages over BAR1 */
		dev = phxfs_dev_create(pdev, -1,
				       pci_resource_start(pdev, NV_BAR),
				       pci_resource_len(pdev, NV_BAR), NULL);
		if (IS_ERR(dev)) {
			pr_err("%s: BAR1: %ld\n", pci_name(pdev), PTR_ERR(dev));
			pci_dev_put(pdev);
			return PTR_ERR(dev);
		}
		nv_devs[nv_ndevs++] = dev;
	}
	return 0;
}

static int nv_init(void)
{
	int ret;

	nv_get_pages = symbol_get(nvidia_p2p_get_pages);
	nv_put_pages = symbol_get(nvidia_p2p_put_pages);
	nv_free_page_table = symbol_get(nvidia_p2p_free_page_table);
	if (!nv_get_pages || !nv_put_pages || !nv_free_page_table) {
		pr_err("nvidia_p2p_* not found: is nvidia.ko loaded?\n");
		ret = -ENOENT;
		goto err_symbols;
	}

	ret = nv_add_gpus();
	if (ret)
		goto err_devs;
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
	/* the driver resolves the address among the caller's own contexts */
	.shared_devaddr = false,
	.init = nv_init,
	.exit = nv_exit,
	.pin = nv_pin,
	.phys = nv_phys,
	.claim = nv_claim,
	.unpin = nv_unpin,
};
