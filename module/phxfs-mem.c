// SPDX-License-Identifier: GPL-2.0
/*
 * phxfs: device pages, the mmap'd VMAs and the MAP/UNMAP registrations.
 *
 * mmap() of /dev/phxfs_devN creates an empty VMA (VM_MIXEDMAP, never
 * copied on fork, never split, moved or expanded).  MAP pins a device
 * range through the backend and inserts its ZONE_DEVICE pages into part of
 * that VMA, so that O_DIRECT I/O on the VMA is DMA to or from the device.
 * UNMAP, munmap/exit (vm_ops->close) and a vendor revocation zap the PTEs.
 *
 * Every mmap() gets its own range of file page offsets, so the PTEs of one
 * registration can be zapped with unmap_mapping_pages() from any context
 * (a vendor free callback holds no mmap_lock) in every VMA that maps it.
 *
 * Before the pages of a registration are given back, phxfs waits until
 * no I/O in flight holds them (it "drains" them).  I/O pins pages with
 * GUP, which may take mmap_lock and fault on the next page (taking
 * pv->lock) while it holds pins on earlier ones: a drain therefore never
 * runs with mmap_lock, dev->lock or pv->lock held.  UNMAP and revocations
 * drain after dropping them; vm_ops->close, which runs under mmap_lock,
 * releases what is idle at once and leaves the rest to a worker.
 *
 * Lock order: mmap_lock, dev->lock, pv->lock, i_mmap_rwsem (inside
 * unmap_mapping_pages).  Backend pin/unpin run with none of ours held
 * (unpin under mmap_lock when called from close).  A drain reads page
 * refcounts inside an SRCU read section, so that device removal cannot
 * free the struct pages under it.
 *
 * Owners: a registration belongs to the effective uid that MAPped it.
 * Where a device address names the same memory for every process (emu),
 * a MAP whose device range overlaps a pinned registration of another
 * owner fails with EACCES unless the caller has CAP_SYS_RAWIO: opening
 * the device (group phxfs) lets a process map device memory, not other
 * users' (see phxfs_reg_add_pinned()).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/delay.h>
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/pci-p2pdma.h>
#include <linux/pfn_t.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/srcu.h>
#include <linux/version.h>
#include <linux/workqueue.h>

#include "phxfs.h"

static atomic_long_t phxfs_next_pgoff = ATOMIC_LONG_INIT(1);

/* read side: a look at page refcounts; write side: phxfs_pages_exit() */
DEFINE_STATIC_SRCU(phxfs_pages_srcu);

/* releases the registrations that were busy when their VMA was closed */
static struct workqueue_struct *phxfs_wq;

static const struct vm_operations_struct phxfs_vm_ops;

static struct page *phxfs_page(phys_addr_t phys)
{
	return pfn_to_page(PHYS_PFN(phys));
}

int phxfs_mem_init(void)
{
	phxfs_wq = alloc_workqueue("phxfs_release", 0, 0);
	return phxfs_wq ? 0 : -ENOMEM;
}

/* Only once no file is open: a queued release holds its VMA's file. */
void phxfs_mem_exit(void)
{
	destroy_workqueue(phxfs_wq);
}

/* device pages */

#ifdef CONFIG_PCI_P2PDMA
/*
 * Where the kernel has P2PDMA and phxfs drives the PCI device, the BAR is
 * registered with the P2PDMA core (so that DMA mapping knows these are
 * peer pages) and the whole pool is taken, so no other P2PDMA user is
 * handed these pages.  Not available in the kernels this is tested with
 * (Debian 6.1 has CONFIG_PCI_P2PDMA off).  The P2PDMA resource itself goes
 * with the driver binding (devres).
 */
static int phxfs_pages_init_p2pdma(struct phxfs_dev *dev)
{
	int ret;

	ret = pci_p2pdma_add_resource(dev->pdev, dev->bar, dev->size, 0);
	if (ret)
		return ret;
	dev->p2p_kaddr = pci_alloc_p2pmem(dev->pdev, dev->size);
	if (!dev->p2p_kaddr)
		return -ENOMEM;
	dev->p2pdma = true;
	return 0;
}
#endif

static int phxfs_pages_init_generic(struct phxfs_dev *dev)
{
	int nid = dev->pdev ? dev_to_node(&dev->pdev->dev) : NUMA_NO_NODE;
	void *addr;

	dev->pgmap.type = MEMORY_DEVICE_GENERIC;
	dev->pgmap.range.start = dev->start;
	dev->pgmap.range.end = dev->start + dev->size - 1;
	dev->pgmap.nr_range = 1;
	addr = memremap_pages(&dev->pgmap, nid);
	return PTR_ERR_OR_ZERO(addr);
}

/**
 * phxfs_pages_init - give a device's memory struct pages
 * @dev: the device; @dev->start and @dev->size name the memory
 *
 * Creates ZONE_DEVICE pages over the memory: through the PCI P2PDMA core
 * where the kernel has it and phxfs is the PCI driver owning @dev->bar,
 * else with memremap_pages(MEMORY_DEVICE_GENERIC).  Records the refcount
 * an unused page has (@dev->ref_base): a page counts as held by I/O while
 * its refcount is above it.
 *
 * Return: 0, or a negative errno from the page creation.
 */
int phxfs_pages_init(struct phxfs_dev *dev)
{
	int ret;

#ifdef CONFIG_PCI_P2PDMA
	if (dev->pdev && dev->bar >= 0)
		ret = phxfs_pages_init_p2pdma(dev);
	else
#endif
		ret = phxfs_pages_init_generic(dev);
	if (ret)
		return ret;
	dev->ref_base = page_ref_count(phxfs_page(dev->start));
	return 0;
}

/**
 * phxfs_pages_exit - release the struct pages of a device
 * @dev: the device, with no PTE left and no I/O holding its pages
 *
 * Waits for drains still looking at the pages (they find @dev->pages_gone
 * set afterwards and look no more) before the pages go.
 */
void phxfs_pages_exit(struct phxfs_dev *dev)
{
	WRITE_ONCE(dev->pages_gone, true);
	synchronize_srcu(&phxfs_pages_srcu);
#ifdef CONFIG_PCI_P2PDMA
	if (dev->p2pdma) {
		pci_free_p2pmem(dev->pdev, dev->p2p_kaddr, dev->size);
		dev->p2pdma = false;
		return;
	}
#endif
	memunmap_pages(&dev->pgmap);
}

/* transient pins: O_DIRECT I/O holds page references while in flight */

static bool phxfs_phys_busy(struct phxfs_dev *dev, phys_addr_t phys)
{
	return page_ref_count(phxfs_page(phys)) > dev->ref_base;
}

/* Call inside phxfs_pages_srcu with the pages there. */
static bool phxfs_reg_busy(struct phxfs_reg *reg)
{
	u64 off;

	for (off = 0; off < reg->size; off += PAGE_SIZE) {
		phys_addr_t phys = phxfs_backend.phys(reg, off);

		if (phys >= reg->dev->start &&
		    phys - reg->dev->start < reg->dev->size &&
		    phxfs_phys_busy(reg->dev, phys))
			return true;
		if (!(off & (SZ_64M - 1)))
			cond_resched();
	}
	return false;
}

static bool phxfs_dev_busy(struct phxfs_dev *dev)
{
	u64 off;

	for (off = 0; off < dev->size; off += PAGE_SIZE) {
		if (phxfs_phys_busy(dev, dev->start + off))
			return true;
		if (!(off & (SZ_64M - 1)))
			cond_resched();
	}
	return false;
}

static void phxfs_wait_idle(bool (*busy)(void *), void *arg, int index)
{
	unsigned long warn = jiffies + 10 * HZ;

	while (busy(arg)) {
		if (time_after(jiffies, warn)) {
			pr_warn("phxfs_dev%d: waiting for in-flight I/O to release device pages\n",
				index);
			warn = jiffies + 60 * HZ;
		}
		msleep(1);
	}
}

static bool phxfs_reg_busy_cb(void *arg)
{
	return phxfs_reg_busy(arg);
}

static bool phxfs_dev_busy_cb(void *arg)
{
	return phxfs_dev_busy(arg);
}

/* Whether no I/O holds pages of @reg now (true once the pages are gone). */
static bool phxfs_reg_idle(struct phxfs_reg *reg)
{
	bool idle;
	int idx;

	idx = srcu_read_lock(&phxfs_pages_srcu);
	idle = READ_ONCE(reg->dev->pages_gone) || !phxfs_reg_busy(reg);
	srcu_read_unlock(&phxfs_pages_srcu, idx);
	return idle;
}

/**
 * phxfs_reg_drain - wait until no I/O holds pages of a registration
 * @reg: a registration whose PTEs are gone (so no new pin can start)
 *
 * Context: process context, none of mmap_lock, dev->lock, pv->lock held
 * (the I/O may need them to finish).  Returns at once when the device's
 * pages are gone: device removal waited for all of them.
 */
static void phxfs_reg_drain(struct phxfs_reg *reg)
{
	int idx;

	idx = srcu_read_lock(&phxfs_pages_srcu);
	if (!READ_ONCE(reg->dev->pages_gone))
		phxfs_wait_idle(phxfs_reg_busy_cb, reg, reg->dev->index);
	srcu_read_unlock(&phxfs_pages_srcu, idx);
}

/* PTEs */

static vm_fault_t phxfs_insert(struct vm_area_struct *vma,
			       struct phxfs_reg *reg, u64 off)
{
	struct phxfs_dev *dev = reg->dev;
	unsigned long addr = reg->uaddr + off;
	phys_addr_t phys = phxfs_backend.phys(reg, off);

	if (phys < dev->start || phys - dev->start >= dev->size)
		return VM_FAULT_SIGBUS;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 15, 0)
	/*
	 * Devmap PTEs are gone; ZONE_DEVICE pages are refcounted like other
	 * pages and inserted as such.  Not compiled in the tested kernels.
	 */
	switch (vm_insert_page(vma, addr, phxfs_page(phys))) {
	case 0:
	case -EBUSY:
		return VM_FAULT_NOPAGE;
	case -ENOMEM:
		return VM_FAULT_OOM;
	default:
		return VM_FAULT_SIGBUS;
	}
#else
	return vmf_insert_mixed(vma, addr, phys_to_pfn_t(phys, PFN_DEV | PFN_MAP));
#endif
}

static int phxfs_insert_range(struct vm_area_struct *vma, struct phxfs_reg *reg)
{
	u64 off;

	for (off = 0; off < reg->size; off += PAGE_SIZE) {
		vm_fault_t vf = phxfs_insert(vma, reg, off);

		if (vf & VM_FAULT_OOM)
			return -ENOMEM;
		if (vf != VM_FAULT_NOPAGE)
			return -EFAULT;
		if (!((off + PAGE_SIZE) & (SZ_2M - 1))) {
			if (fatal_signal_pending(current))
				return -EINTR;
			cond_resched();
		}
	}
	return 0;
}

static void phxfs_reg_zap(struct phxfs_reg *reg)
{
	unmap_mapping_pages(reg->pv->mapping, reg->pgoff,
			    reg->size >> PAGE_SHIFT, false);
}

/* registrations */

static struct phxfs_reg *phxfs_reg_alloc(struct phxfs_dev *dev,
					 const struct phxfs_ioctl_map *req)
{
	struct phxfs_reg *reg;

	reg = kzalloc(sizeof(*reg), GFP_KERNEL);
	if (!reg)
		return NULL;
	kref_init(&reg->kref);
	INIT_LIST_HEAD(&reg->node);
	INIT_LIST_HEAD(&reg->revoke_node);
	INIT_LIST_HEAD(&reg->pin_node);
	reg->owner = current_euid();
	reg->dev = dev;
	reg->uaddr = req->c_vaddr;
	reg->size = req->c_size;
	reg->devaddr = req->n_vaddr;
	return reg;
}

static void phxfs_reg_free(struct kref *kref)
{
	kfree(container_of(kref, struct phxfs_reg, kref));
}

static void phxfs_reg_put(struct phxfs_reg *reg)
{
	kref_put(&reg->kref, phxfs_reg_free);
}

/* owners */

/* Do two registrations of one device share device memory? */
static bool phxfs_regs_overlap(const struct phxfs_reg *a,
			       const struct phxfs_reg *b)
{
	return a->devaddr < b->devaddr + b->size &&
	       b->devaddr < a->devaddr + a->size;
}

/*
 * Whether @reg would share device memory with a pinned registration of
 * another owner.  Called with dev->lock held.
 */
static bool phxfs_reg_conflicts(struct phxfs_reg *reg)
{
	struct phxfs_reg *r;

	if (!phxfs_backend.shared_devaddr)
		return false;
	list_for_each_entry(r, &reg->dev->pinned, pin_node) {
		if (!uid_eq(r->owner, reg->owner) && phxfs_regs_overlap(r, reg))
			return true;
	}
	return false;
}

/**
 * phxfs_reg_add_pinned - admit a pinned registration among its device's
 * @reg: a registration whose device memory the backend has just pinned
 *
 * Refuses @reg if it overlaps a registration of another owner that is
 * still pinned (live, revoked, or unmapped with I/O still holding its
 * pages), unless the caller has CAP_SYS_RAWIO, the capability for access
 * to raw device memory (/dev/mem, /proc/bus/pci mmap): a root daemon may
 * map its clients' memory, group members only their own.  The check and
 * the insertion into dev->pinned are one step under dev->lock, so two
 * MAPs of different owners cannot both pass.  capable() runs only on a
 * conflict, so that only an attempt on another owner's memory is audited.
 *
 * Context: process context, no phxfs lock held.
 * Return: 0, or -EACCES.
 */
static int phxfs_reg_add_pinned(struct phxfs_reg *reg)
{
	struct phxfs_dev *dev = reg->dev;
	int ret = 0;

	mutex_lock(&dev->lock);
	if (phxfs_reg_conflicts(reg) && !capable(CAP_SYS_RAWIO)) {
		ret = -EACCES;
		goto out_unlock;
	}
	list_add_tail(&reg->pin_node, &dev->pinned);
out_unlock:
	mutex_unlock(&dev->lock);
	return ret;
}

/* The memory of @reg is given back: other owners may map it. */
static void phxfs_reg_del_pinned(struct phxfs_reg *reg)
{
	struct phxfs_dev *dev = reg->dev;

	mutex_lock(&dev->lock);
	list_del_init(&reg->pin_node);
	mutex_unlock(&dev->lock);
}

/* Decide who gives the pages back: us, or the vendor's revocation. */
static void phxfs_reg_claim(struct phxfs_reg *reg)
{
	reg->owned = !phxfs_backend.claim || phxfs_backend.claim(reg);
}

/* Pin @reg's device memory and admit it among the device's registrations. */
static int phxfs_reg_pin(struct phxfs_reg *reg)
{
	struct phxfs_dev *dev = reg->dev;
	int ret;

	ret = phxfs_backend.pin(dev, reg);
	if (ret)
		return ret;
	ret = phxfs_reg_add_pinned(reg);
	if (ret)
		goto err_unpin;
	atomic_long_inc(&dev->nr_regs);
	atomic64_add(reg->size, &dev->mapped_bytes);
	return 0;

err_unpin:
	/* no PTE was ever inserted: nothing to drain */
	phxfs_reg_claim(reg);
	if (phxfs_backend.unpin)
		phxfs_backend.unpin(reg, reg->owned);
	return ret;
}

/*
 * Give the pages of a claimed registration back: wait for I/O still
 * holding them if they are ours (a revocation waits for its own), then
 * let the backend release them.  No lock of ours may be held; mmap_lock
 * only when the registration is known to be idle.
 */
static void phxfs_reg_unpin(struct phxfs_reg *reg)
{
	struct phxfs_dev *dev = reg->dev;

	if (reg->owned)
		phxfs_reg_drain(reg);
	if (phxfs_backend.unpin)
		phxfs_backend.unpin(reg, reg->owned);
	phxfs_reg_del_pinned(reg);
	atomic_long_dec(&dev->nr_regs);
	atomic64_sub(reg->size, &dev->mapped_bytes);
}

/* A pinned registration with no PTE left goes: claim, drain, unpin. */
static void phxfs_reg_release(struct phxfs_reg *reg)
{
	phxfs_reg_claim(reg);
	phxfs_reg_unpin(reg);
}

/**
 * phxfs_reg_revoke - the device memory of a registration is going away
 * @reg: the registration
 *
 * Called by a backend when the vendor takes the memory back (for nvidia,
 * from the free callback that won the claim).  Marks the registration
 * dead (faults on it get SIGBUS, I/O on it EFAULT), zaps its PTEs in every
 * VMA and, with no lock held, waits for I/O in flight.  The registration
 * itself stays until UNMAP or munmap.
 */
void phxfs_reg_revoke(struct phxfs_reg *reg)
{
	mutex_lock(&reg->pv->lock);
	reg->dead = true;
	mutex_unlock(&reg->pv->lock);
	phxfs_reg_zap(reg);
	phxfs_reg_drain(reg);
}

/*
 * Mark the live registrations overlapping [devaddr, devaddr + size) dead,
 * zap them and move them, each with a reference, to @revoked.
 */
static int phxfs_dev_collect_range(struct phxfs_dev *dev, u64 devaddr,
				   u64 size, struct list_head *revoked)
{
	struct phxfs_vma *pv;
	struct phxfs_reg *reg;
	int n = 0;

	mutex_lock(&dev->lock);
	list_for_each_entry(pv, &dev->vmas, node) {
		mutex_lock(&pv->lock);
		list_for_each_entry(reg, &pv->regs, node) {
			if (reg->dead || reg->devaddr >= devaddr + size ||
			    devaddr >= reg->devaddr + reg->size)
				continue;
			reg->dead = true;
			phxfs_reg_zap(reg);
			kref_get(&reg->kref);
			list_add_tail(&reg->revoke_node, revoked);
			n++;
		}
		mutex_unlock(&pv->lock);
	}
	mutex_unlock(&dev->lock);
	return n;
}

/**
 * phxfs_dev_revoke_range - revoke registrations overlapping a device range
 * @dev: the device
 * @devaddr: start of the device range
 * @size: its length
 *
 * Marks the live registrations overlapping the range dead and zaps their
 * PTEs under dev->lock and the VMAs' locks, then drops the locks and waits
 * for I/O in flight on them: a GUP that pinned some of their pages and
 * faults on the next one gets its answer (SIGBUS) instead of waiting for
 * a lock held by the waiter.  Registrations already dead are left to
 * whoever killed them.  Each is kept alive by a reference while waited
 * for (an UNMAP may release it meanwhile); the backend's phys() must
 * therefore not depend on state its unpin frees (emu: arithmetic).
 *
 * Context: process context, no phxfs lock held.
 * Return: the number of registrations revoked.
 */
int phxfs_dev_revoke_range(struct phxfs_dev *dev, u64 devaddr, u64 size)
{
	struct phxfs_reg *reg, *tmp;
	LIST_HEAD(revoked);
	int n;

	n = phxfs_dev_collect_range(dev, devaddr, size, &revoked);
	list_for_each_entry_safe(reg, tmp, &revoked, revoke_node) {
		phxfs_reg_drain(reg);
		list_del(&reg->revoke_node);
		phxfs_reg_put(reg);
	}
	return n;
}

/**
 * phxfs_dev_kill - stop all use of a device's pages
 * @dev: the device, already invisible to open()
 *
 * New mmaps and MAPs fail with ENODEV, every registration is revoked and
 * I/O in flight is waited for; afterwards the pages may be released.
 */
void phxfs_dev_kill(struct phxfs_dev *dev)
{
	struct phxfs_vma *pv;
	struct phxfs_reg *reg;

	mutex_lock(&dev->lock);
	dev->dead = true;
	list_for_each_entry(pv, &dev->vmas, node) {
		mutex_lock(&pv->lock);
		list_for_each_entry(reg, &pv->regs, node) {
			if (reg->dead)
				continue;
			reg->dead = true;
			phxfs_reg_zap(reg);
		}
		mutex_unlock(&pv->lock);
	}
	mutex_unlock(&dev->lock);
	phxfs_wait_idle(phxfs_dev_busy_cb, dev, dev->index);
}

/* VMAs */

static void phxfs_vma_free(struct phxfs_vma *pv)
{
	struct phxfs_dev *dev = pv->dev;

	fput(pv->file);
	phxfs_dev_put(dev);
	kfree(pv);
}

/* No longer findable from the device; every registration dead. */
static void phxfs_vma_unlink(struct phxfs_vma *pv)
{
	struct phxfs_dev *dev = pv->dev;
	struct phxfs_reg *reg;

	mutex_lock(&dev->lock);
	list_del(&pv->node);
	mutex_unlock(&dev->lock);

	mutex_lock(&pv->lock);
	list_for_each_entry(reg, &pv->regs, node)
		reg->dead = true;
	mutex_unlock(&pv->lock);
}

/* The worker: waits for the I/O that close could not wait for. */
static void phxfs_vma_release_work(struct work_struct *work)
{
	struct phxfs_vma *pv = container_of(work, struct phxfs_vma,
					    release_work);
	struct phxfs_reg *reg, *tmp;

	list_for_each_entry_safe(reg, tmp, &pv->regs, node) {
		list_del(&reg->node);
		phxfs_reg_unpin(reg);
		phxfs_reg_put(reg);
	}
	phxfs_vma_free(pv);
}

/*
 * Claim every registration of an unlinked VMA and release those that are
 * ours and idle (they cannot become busy: no PTE is left).  Returns
 * whether none is left.  Waits for nothing: may run under mmap_lock.
 */
static bool phxfs_vma_release_idle(struct phxfs_vma *pv)
{
	struct phxfs_reg *reg, *tmp;

	list_for_each_entry_safe(reg, tmp, &pv->regs, node) {
		phxfs_reg_claim(reg);
		if (!reg->owned || !phxfs_reg_idle(reg))
			continue;
		list_del(&reg->node);
		phxfs_reg_unpin(reg);
		phxfs_reg_put(reg);
	}
	return list_empty(&pv->regs);
}

/*
 * The last VMA is gone (munmap, exit; vm_ops->close, under mmap_lock), or
 * an ioctl dropped the last reference after that.  Registrations that I/O
 * still holds, or that a revocation owns, are released by a worker, so
 * that close never waits for I/O (which may need mmap_lock to finish).
 */
static void phxfs_vma_release(struct kref *kref)
{
	struct phxfs_vma *pv = container_of(kref, struct phxfs_vma, kref);

	phxfs_vma_unlink(pv);
	if (phxfs_vma_release_idle(pv)) {
		phxfs_vma_free(pv);
		return;
	}
	INIT_WORK(&pv->release_work, phxfs_vma_release_work);
	queue_work(phxfs_wq, &pv->release_work);
}

static void phxfs_vma_put(struct phxfs_vma *pv)
{
	kref_put(&pv->kref, phxfs_vma_release);
}

static void phxfs_vm_open(struct vm_area_struct *vma)
{
	struct phxfs_vma *pv = vma->vm_private_data;

	/* only reached if someone forced a copy (MADV_DOFORK): share pv */
	kref_get(&pv->kref);
}

static void phxfs_vm_close(struct vm_area_struct *vma)
{
	phxfs_vma_put(vma->vm_private_data);
}

static int phxfs_vm_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

static int phxfs_vm_mremap(struct vm_area_struct *vma)
{
	return -EINVAL;
}

static vm_fault_t phxfs_vm_fault(struct vm_fault *vmf)
{
	struct phxfs_vma *pv = vmf->vma->vm_private_data;
	unsigned long addr = vmf->address & PAGE_MASK;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	struct phxfs_reg *reg;

	mutex_lock(&pv->lock);
	list_for_each_entry(reg, &pv->regs, node) {
		if (reg->dead || addr < reg->uaddr ||
		    addr - reg->uaddr >= reg->size)
			continue;
		ret = phxfs_insert(vmf->vma, reg, addr - reg->uaddr);
		break;
	}
	mutex_unlock(&pv->lock);
	return ret;
}

static const struct vm_operations_struct phxfs_vm_ops = {
	.open = phxfs_vm_open,
	.close = phxfs_vm_close,
	.may_split = phxfs_vm_may_split,
	.mremap = phxfs_vm_mremap,
	.fault = phxfs_vm_fault,
};

static struct phxfs_vma *phxfs_vma_alloc(struct phxfs_dev *dev,
					 struct file *file)
{
	struct phxfs_vma *pv;

	pv = kzalloc(sizeof(*pv), GFP_KERNEL);
	if (!pv)
		return NULL;
	kref_init(&pv->kref);
	mutex_init(&pv->lock);
	INIT_LIST_HEAD(&pv->regs);
	pv->dev = dev;
	pv->file = file;
	pv->mapping = file->f_mapping;
	return pv;
}

/* Make @pv findable from @dev; it then holds @dev and its file. */
static int phxfs_vma_link(struct phxfs_dev *dev, struct phxfs_vma *pv)
{
	int ret = 0;

	mutex_lock(&dev->lock);
	if (dev->dead) {
		ret = -ENODEV;
		goto out_unlock;
	}
	kref_get(&dev->kref);
	get_file(pv->file);
	list_add(&pv->node, &dev->vmas);
out_unlock:
	mutex_unlock(&dev->lock);
	return ret;
}

/**
 * phxfs_mmap - set up an mmap() of a phxfs device
 * @dev: the device
 * @file: the open device file
 * @vma: the new VMA; must be MAP_SHARED at file offset 0
 *
 * Creates an empty VMA for MAP to insert device pages into: VM_MIXEDMAP,
 * never copied on fork (VM_DONTCOPY), never grown (VM_DONTEXPAND), left
 * out of core dumps (VM_DONTDUMP); vm_ops refuse splitting and moving it.
 * The VMA's private data holds references on @dev and @file until its
 * last registration is released.  The VMA gets a file offset range of its
 * own, so that unmap_mapping_pages() finds exactly its PTEs.
 *
 * Context: mmap_lock held for writing.
 * Return: 0, -EINVAL (not MAP_SHARED, or a non-zero offset), -ENOMEM, or
 * -ENODEV when the device is being removed.
 */
int phxfs_mmap(struct phxfs_dev *dev, struct file *file,
	       struct vm_area_struct *vma)
{
	unsigned long pages = vma_pages(vma);
	struct phxfs_vma *pv;
	int ret;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff)
		return -EINVAL;

	pv = phxfs_vma_alloc(dev, file);
	if (!pv)
		return -ENOMEM;
	ret = phxfs_vma_link(dev, pv);
	if (ret)
		goto err_free;

	vma->vm_pgoff = atomic_long_add_return(pages, &phxfs_next_pgoff) - pages;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_MIXEDMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_MIXEDMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_ops = &phxfs_vm_ops;
	vma->vm_private_data = pv;
	return 0;

err_free:
	kfree(pv);
	return ret;
}

/*
 * Find the phxfs VMA of @dev containing [uaddr, uaddr + size) and take a
 * reference on its private data.  Called with mmap_lock held.
 */
static struct phxfs_vma *phxfs_find_vma(struct phxfs_dev *dev,
					struct vm_area_struct **vmap,
					u64 uaddr, u64 size)
{
	struct vm_area_struct *vma = vma_lookup(current->mm, uaddr);
	struct phxfs_vma *pv;

	if (!vma || vma->vm_ops != &phxfs_vm_ops || size > vma->vm_end - uaddr)
		return NULL;
	pv = vma->vm_private_data;
	if (pv->dev != dev)
		return NULL;
	kref_get(&pv->kref);
	*vmap = vma;
	return pv;
}

static int phxfs_map_check(const struct phxfs_ioctl_map *req)
{
	u64 uaddr = req->c_vaddr, size = req->c_size, devaddr = req->n_vaddr;

	if (!size || size != req->n_size || !PAGE_ALIGNED(uaddr) ||
	    !PAGE_ALIGNED(size) || !IS_ALIGNED(devaddr, phxfs_backend.align) ||
	    !IS_ALIGNED(size, phxfs_backend.align) ||
	    uaddr + size < uaddr || devaddr + size < devaddr)
		return -EINVAL;
	return 0;
}

/* Find the VMA of @reg's host range: sets reg->pv (a reference), pgoff. */
static int phxfs_reg_find_vma(struct phxfs_reg *reg)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;

	mmap_read_lock(mm);
	reg->pv = phxfs_find_vma(reg->dev, &vma, reg->uaddr, reg->size);
	if (reg->pv)
		reg->pgoff = vma->vm_pgoff +
			     ((reg->uaddr - vma->vm_start) >> PAGE_SHIFT);
	mmap_read_unlock(mm);
	return reg->pv ? 0 : -EINVAL;
}

/* The VMA of reg->pv, if it still covers the host range (mmap_lock held). */
static struct vm_area_struct *phxfs_reg_vma(struct phxfs_reg *reg)
{
	struct vm_area_struct *vma = vma_lookup(current->mm, reg->uaddr);

	if (!vma || vma->vm_ops != &phxfs_vm_ops ||
	    vma->vm_private_data != reg->pv ||
	    reg->size > vma->vm_end - reg->uaddr)
		return NULL;
	return vma;
}

/* May @reg join its VMA?  Called with pv->lock held. */
static int phxfs_reg_may_link(struct phxfs_reg *reg)
{
	struct phxfs_reg *r;

	if (READ_ONCE(reg->dev->dead))
		return -ENODEV;
	if (reg->dead)
		return -ENXIO;	/* revoked by the vendor while pinning */
	list_for_each_entry(r, &reg->pv->regs, node) {
		if (reg->uaddr < r->uaddr + r->size &&
		    r->uaddr < reg->uaddr + reg->size)
			return -EBUSY;
	}
	return 0;
}

/*
 * Add a pinned registration to its VMA and insert its pages.  Called with
 * mmap_lock held.  On failure the registration is dead, in no list and
 * has no PTE.
 */
static int phxfs_reg_link(struct vm_area_struct *vma, struct phxfs_reg *reg)
{
	struct phxfs_vma *pv = reg->pv;
	int ret;

	mutex_lock(&pv->lock);
	ret = phxfs_reg_may_link(reg);
	if (ret)
		goto err_dead;
	list_add_tail(&reg->node, &pv->regs);
	ret = phxfs_insert_range(vma, reg);
	if (ret)
		goto err_unlink;
	mutex_unlock(&pv->lock);
	return 0;

err_unlink:
	list_del_init(&reg->node);
	phxfs_reg_zap(reg);
err_dead:
	reg->dead = true;
	mutex_unlock(&pv->lock);
	return ret;
}

/**
 * phxfs_map - MAP: pin device memory and insert its pages into a VMA
 * @dev: the device the ioctl was issued on
 * @req: the ioctl argument: host range [c_vaddr, c_vaddr + c_size),
 *	 device range [n_vaddr, n_vaddr + n_size)
 *
 * Checks @req, finds the phxfs VMA of @dev that holds the host range,
 * pins the device range through the backend with no lock held and
 * admits it among the device's pinned registrations (refused if it
 * overlaps another owner's, see phxfs_reg_add_pinned()), then, under
 * mmap_lock and the VMA's lock, checks that the VMA is still there,
 * that the device is not being removed, that the vendor did not revoke
 * the memory meanwhile and that no registration of the VMA overlaps, and
 * inserts a PTE for every page.  On failure everything is undone in
 * reverse order (a pinned range is drained and unpinned).
 *
 * Context: process context; takes mmap_lock; may sleep.
 * Return: 0 or a negative errno: -EINVAL (bad @req, or no such VMA),
 * -EACCES (another owner's device memory), -EBUSY (host range overlap), -ENODEV (device going away), -ENXIO (revoked while
 * pinning), -ENOMEM, -EINTR (fatal signal while inserting), -EFAULT (a
 * page outside the device), or the backend's pin error.
 */
int phxfs_map(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct phxfs_reg *reg;
	struct phxfs_vma *pv;
	int ret;

	ret = phxfs_map_check(req);
	if (ret)
		return ret;
	reg = phxfs_reg_alloc(dev, req);
	if (!reg)
		return -ENOMEM;

	/* find the VMA, then pin with no lock held, then look again */
	ret = phxfs_reg_find_vma(reg);
	if (ret)
		goto err_put_reg;
	pv = reg->pv;	/* once linked, @reg may go (UNMAP) before we return */
	ret = phxfs_reg_pin(reg);
	if (ret)
		goto err_put_vma;
	ret = mmap_read_lock_killable(mm);
	if (ret)
		goto err_unpin;
	vma = phxfs_reg_vma(reg);
	if (!vma) {
		ret = -EINVAL;	/* unmapped or replaced meanwhile */
		goto err_unlock_mm;
	}
	ret = phxfs_reg_link(vma, reg);
	if (ret)
		goto err_unlock_mm;
	mmap_read_unlock(mm);
	phxfs_vma_put(pv);
	return 0;

err_unlock_mm:
	mmap_read_unlock(mm);
err_unpin:
	phxfs_reg_release(reg);
err_put_vma:
	phxfs_vma_put(pv);
err_put_reg:
	phxfs_reg_put(reg);
	return ret;
}

/*
 * Take the registration @req names out of @pv: unlinked, dead, its PTEs
 * zapped.  Called with mmap_lock held.  Returns NULL if there is none.
 */
static struct phxfs_reg *phxfs_reg_take(struct phxfs_vma *pv,
					const struct phxfs_ioctl_map *req)
{
	struct phxfs_reg *r;

	mutex_lock(&pv->lock);
	list_for_each_entry(r, &pv->regs, node) {
		if (r->uaddr == req->c_vaddr && r->size == req->c_size &&
		    (!req->n_vaddr || req->n_vaddr == r->devaddr))
			goto found;
	}
	mutex_unlock(&pv->lock);
	return NULL;

found:
	list_del_init(&r->node);
	r->dead = true;
	mutex_unlock(&pv->lock);
	phxfs_reg_zap(r);
	return r;
}

/**
 * phxfs_unmap - UNMAP: remove a registration and give its memory back
 * @dev: the device the ioctl was issued on
 * @req: the ioctl argument: c_vaddr and c_size exactly as mapped; n_vaddr
 *	 0 or the registration's device address
 *
 * Takes the registration out of its VMA and zaps its PTEs (so no new I/O
 * can pin its pages), drops mmap_lock, waits until no I/O in flight holds
 * its pages any more (logging while it waits), and has the backend unpin
 * them.  A revoked registration is released the same way; its wait was
 * the revocation's.
 *
 * Context: process context; takes mmap_lock; may sleep for as long as
 * I/O holds the pages.
 * Return: 0, or -EINVAL when @req names no registration of a phxfs VMA
 * of @dev.
 */
int phxfs_unmap(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct phxfs_reg *reg;
	struct phxfs_vma *pv;
	int ret = -EINVAL;

	mmap_read_lock(mm);
	pv = phxfs_find_vma(dev, &vma, req->c_vaddr, req->c_size);
	if (!pv)
		goto out_unlock;
	reg = phxfs_reg_take(pv, req);
	mmap_read_unlock(mm);

	if (reg) {
		/* no lock held: the I/O may need mmap_lock to finish */
		phxfs_reg_release(reg);
		phxfs_reg_put(reg);
		ret = 0;
	}
	phxfs_vma_put(pv);
	return ret;

out_unlock:
	mmap_read_unlock(mm);
	return ret;
}
