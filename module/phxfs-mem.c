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
 * Lock order: mmap_lock, dev->lock, pv->lock, i_mmap_rwsem (inside
 * unmap_mapping_pages).  Backend pin/unpin run with none of ours held.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/pci-p2pdma.h>
#include <linux/pfn_t.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/version.h>

#include "phxfs.h"

static atomic_long_t phxfs_next_pgoff = ATOMIC_LONG_INIT(1);

static const struct vm_operations_struct phxfs_vm_ops;

static struct page *phxfs_page(phys_addr_t phys)
{
	return pfn_to_page(PHYS_PFN(phys));
}

/* device pages */

int phxfs_pages_init(struct phxfs_dev *dev)
{
	int nid = dev->pdev ? dev_to_node(&dev->pdev->dev) : NUMA_NO_NODE;
	void *addr;

#ifdef CONFIG_PCI_P2PDMA
	/*
	 * Where the kernel has P2PDMA and phxfs drives the PCI device, the
	 * BAR is registered with the P2PDMA core (so that DMA mapping knows
	 * these are peer pages) and the whole pool is taken, so no other
	 * P2PDMA user is handed these pages.  Not available in the kernels
	 * this is tested with (Debian 6.1 has CONFIG_PCI_P2PDMA off).
	 */
	if (dev->pdev && dev->bar >= 0) {
		int ret;

		ret = pci_p2pdma_add_resource(dev->pdev, dev->bar, dev->size, 0);
		if (ret)
			return ret;
		dev->p2p_kaddr = pci_alloc_p2pmem(dev->pdev, dev->size);
		if (!dev->p2p_kaddr)
			return -ENOMEM;
		dev->p2pdma = true;
		dev->ref_base = page_ref_count(phxfs_page(dev->start));
		return 0;
	}
#endif
	dev->pgmap.type = MEMORY_DEVICE_GENERIC;
	dev->pgmap.range.start = dev->start;
	dev->pgmap.range.end = dev->start + dev->size - 1;
	dev->pgmap.nr_range = 1;
	addr = memremap_pages(&dev->pgmap, nid);
	if (IS_ERR(addr))
		return PTR_ERR(addr);
	dev->ref_base = page_ref_count(phxfs_page(dev->start));
	return 0;
}

void phxfs_pages_exit(struct phxfs_dev *dev)
{
#ifdef CONFIG_PCI_P2PDMA
	if (dev->p2pdma) {
		/* the P2PDMA resource itself goes with the driver binding */
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

/**
 * phxfs_reg_drain - wait until no I/O holds pages of a registration
 * @reg: a registration whose PTEs are gone (so no new pin can start)
 *
 * The backend calls this before it gives the memory back to its owner.
 */
void phxfs_reg_drain(struct phxfs_reg *reg)
{
	phxfs_wait_idle(phxfs_reg_busy_cb, reg, reg->dev->index);
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

static void phxfs_reg_release(struct phxfs_reg *reg)
{
	struct phxfs_dev *dev = reg->dev;

	if (phxfs_backend.unpin)
		phxfs_backend.unpin(reg);
	atomic_long_dec(&dev->nr_regs);
	atomic64_sub(reg->size, &dev->mapped_bytes);
	kfree(reg);
}

/**
 * phxfs_reg_revoke - the device memory of a registration is going away
 * @reg: the registration
 *
 * Called by a backend when the vendor takes the memory back (for nvidia,
 * from the free callback).  Marks the registration dead (faults on it get
 * SIGBUS, I/O on it EFAULT), zaps its PTEs in every VMA and waits for I/O
 * in flight.  The registration itself stays until UNMAP or munmap.
 */
void phxfs_reg_revoke(struct phxfs_reg *reg)
{
	mutex_lock(&reg->pv->lock);
	reg->dead = true;
	mutex_unlock(&reg->pv->lock);
	phxfs_reg_zap(reg);
	phxfs_reg_drain(reg);
}

/**
 * phxfs_dev_revoke_range - revoke registrations overlapping a device range
 * @dev: the device
 * @devaddr: start of the device range
 * @size: its length
 *
 * Returns the number of registrations revoked.
 */
int phxfs_dev_revoke_range(struct phxfs_dev *dev, u64 devaddr, u64 size)
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
			phxfs_reg_drain(reg);
			n++;
		}
		mutex_unlock(&pv->lock);
	}
	mutex_unlock(&dev->lock);
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

static void phxfs_vma_release(struct kref *kref)
{
	struct phxfs_vma *pv = container_of(kref, struct phxfs_vma, kref);
	struct phxfs_dev *dev = pv->dev;
	struct phxfs_reg *reg, *tmp;
	LIST_HEAD(dying);

	mutex_lock(&dev->lock);
	list_del(&pv->node);
	mutex_unlock(&dev->lock);

	mutex_lock(&pv->lock);
	list_splice_init(&pv->regs, &dying);
	list_for_each_entry(reg, &dying, node)
		reg->dead = true;
	mutex_unlock(&pv->lock);

	/* the VMAs are gone, and with them every PTE */
	list_for_each_entry_safe(reg, tmp, &dying, node) {
		list_del(&reg->node);
		phxfs_reg_release(reg);
	}

	fput(pv->file);
	phxfs_dev_put(dev);
	kfree(pv);
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

int phxfs_mmap(struct phxfs_dev *dev, struct file *file,
	       struct vm_area_struct *vma)
{
	unsigned long pages = vma_pages(vma);
	struct phxfs_vma *pv;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff)
		return -EINVAL;

	pv = kzalloc(sizeof(*pv), GFP_KERNEL);
	if (!pv)
		return -ENOMEM;
	kref_init(&pv->kref);
	mutex_init(&pv->lock);
	INIT_LIST_HEAD(&pv->regs);
	pv->dev = dev;
	pv->file = file;
	pv->mapping = file->f_mapping;

	mutex_lock(&dev->lock);
	if (dev->dead) {
		mutex_unlock(&dev->lock);
		kfree(pv);
		return -ENODEV;
	}
	kref_get(&dev->kref);
	get_file(file);
	list_add(&pv->node, &dev->vmas);
	mutex_unlock(&dev->lock);

	/* a file offset range of its own: see the top of this file */
	vma->vm_pgoff = atomic_long_add_return(pages, &phxfs_next_pgoff) - pages;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_MIXEDMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_MIXEDMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_ops = &phxfs_vm_ops;
	vma->vm_private_data = pv;
	return 0;
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

int phxfs_map(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req)
{
	struct mm_struct *mm = current->mm;
	u64 uaddr = req->c_vaddr, size = req->c_size, devaddr = req->n_vaddr;
	struct vm_area_struct *vma;
	struct phxfs_reg *reg, *r;
	struct phxfs_vma *pv;
	int ret;

	if (!size || size != req->n_size || !PAGE_ALIGNED(uaddr) ||
	    !PAGE_ALIGNED(size) || !IS_ALIGNED(devaddr, phxfs_backend.align) ||
	    !IS_ALIGNED(size, phxfs_backend.align) ||
	    uaddr + size < uaddr || devaddr + size < devaddr)
		return -EINVAL;

	reg = kzalloc(sizeof(*reg), GFP_KERNEL);
	if (!reg)
		return -ENOMEM;
	INIT_LIST_HEAD(&reg->node);
	reg->dev = dev;
	reg->uaddr = uaddr;
	reg->size = size;
	reg->devaddr = devaddr;

	/* find the VMA, then pin with no lock held, then look again */
	mmap_read_lock(mm);
	pv = phxfs_find_vma(dev, &vma, uaddr, size);
	if (pv)
		reg->pgoff = vma->vm_pgoff + ((uaddr - vma->vm_start) >> PAGE_SHIFT);
	mmap_read_unlock(mm);
	if (!pv) {
		ret = -EINVAL;
		goto err_free;
	}
	reg->pv = pv;

	ret = phxfs_backend.pin(dev, reg);
	if (ret)
		goto err_put_vma;
	atomic_long_inc(&dev->nr_regs);
	atomic64_add(size, &dev->mapped_bytes);

	ret = mmap_read_lock_killable(mm);
	if (ret)
		goto err_release;
	vma = vma_lookup(mm, uaddr);
	if (!vma || vma->vm_private_data != pv ||
	    size > vma->vm_end - uaddr) {
		ret = -EINVAL;	/* unmapped or replaced meanwhile */
		goto err_unlock_mm;
	}

	mutex_lock(&pv->lock);
	if (READ_ONCE(dev->dead)) {
		ret = -ENODEV;
		goto err_unlock_pv;
	}
	if (reg->dead) {
		ret = -ENXIO;	/* revoked by the vendor while pinning */
		goto err_unlock_pv;
	}
	list_for_each_entry(r, &pv->regs, node) {
		if (uaddr < r->uaddr + r->size && r->uaddr < uaddr + size) {
			ret = -EBUSY;
			goto err_unlock_pv;
		}
	}
	list_add_tail(&reg->node, &pv->regs);
	ret = phxfs_insert_range(vma, reg);
	if (ret) {
		list_del_init(&reg->node);
		reg->dead = true;
		mutex_unlock(&pv->lock);
		phxfs_reg_zap(reg);
		goto err_unlock_mm;
	}
	mutex_unlock(&pv->lock);
	mmap_read_unlock(mm);
	phxfs_vma_put(pv);
	return 0;

err_unlock_pv:
	reg->dead = true;
	mutex_unlock(&pv->lock);
err_unlock_mm:
	mmap_read_unlock(mm);
err_release:
	phxfs_reg_release(reg);
	phxfs_vma_put(pv);
	return ret;

err_put_vma:
	phxfs_vma_put(pv);
err_free:
	kfree(reg);
	return ret;
}

int phxfs_unmap(struct phxfs_dev *dev, const struct phxfs_ioctl_map *req)
{
	struct mm_struct *mm = current->mm;
	u64 uaddr = req->c_vaddr, size = req->c_size;
	struct vm_area_struct *vma;
	struct phxfs_reg *reg = NULL, *r;
	struct phxfs_vma *pv;

	mmap_read_lock(mm);
	pv = phxfs_find_vma(dev, &vma, uaddr, size);
	if (!pv) {
		mmap_read_unlock(mm);
		return -EINVAL;
	}
	mutex_lock(&pv->lock);
	list_for_each_entry(r, &pv->regs, node) {
		if (r->uaddr == uaddr && r->size == size &&
		    (!req->n_vaddr || req->n_vaddr == r->devaddr)) {
			reg = r;
			break;
		}
	}
	if (reg) {
		list_del_init(&reg->node);
		reg->dead = true;
	}
	mutex_unlock(&pv->lock);
	if (reg)
		phxfs_reg_zap(reg);
	mmap_read_unlock(mm);

	if (reg)
		phxfs_reg_release(reg);
	phxfs_vma_put(pv);
	return reg ? 0 : -EINVAL;
}
