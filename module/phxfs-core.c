// SPDX-License-Identifier: GPL-2.0
/*
 * phxfs: character devices /dev/phxfs_devN over accelerator memory.
 *
 * One char device per device (the minor is the index), a sysfs directory
 * per device (/sys/class/phxfs/phxfs_devN) naming its PCI address, and the
 * MAP/UNMAP ioctls of the original Phoenix module.  The memory side lives
 * in phxfs-mem.c, the vendor side in <vendor>-backend.c.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "phxfs.h"

static dev_t phxfs_devt;
static struct cdev phxfs_cdev;
static struct class *phxfs_class;

static DEFINE_MUTEX(phxfs_table_lock);
static struct phxfs_dev *phxfs_table[PHXFS_MAX_DEVS];

static void phxfs_dev_release(struct kref *kref)
{
	struct phxfs_dev *dev = container_of(kref, struct phxfs_dev, kref);

	pci_dev_put(dev->pdev);
	kfree(dev);
}

void phxfs_dev_put(struct phxfs_dev *dev)
{
	kref_put(&dev->kref, phxfs_dev_release);
}

/* sysfs: /sys/class/phxfs/phxfs_devN/ */

static ssize_t pci_address_show(struct device *d, struct device_attribute *attr,
				char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%s\n", dev->pdev ? pci_name(dev->pdev) : "none");
}
static DEVICE_ATTR_RO(pci_address);

static ssize_t backend_show(struct device *d, struct device_attribute *attr,
			    char *buf)
{
	return sysfs_emit(buf, "%s\n", phxfs_backend.name);
}
static DEVICE_ATTR_RO(backend);

static ssize_t mem_size_show(struct device *d, struct device_attribute *attr,
			     char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%llu\n", dev->size);
}
static DEVICE_ATTR_RO(mem_size);

static ssize_t page_type_show(struct device *d, struct device_attribute *attr,
			      char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%s\n", dev->p2pdma ? "p2pdma" : "generic");
}
static DEVICE_ATTR_RO(page_type);

static ssize_t registrations_show(struct device *d,
				  struct device_attribute *attr, char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%ld\n", atomic_long_read(&dev->nr_regs));
}
static DEVICE_ATTR_RO(registrations);

static ssize_t mapped_bytes_show(struct device *d,
				 struct device_attribute *attr, char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%lld\n",
			  (long long)atomic64_read(&dev->mapped_bytes));
}
static DEVICE_ATTR_RO(mapped_bytes);

static struct attribute *phxfs_dev_attrs[] = {
	&dev_attr_pci_address.attr,
	&dev_attr_backend.attr,
	&dev_attr_mem_size.attr,
	&dev_attr_page_type.attr,
	&dev_attr_registrations.attr,
	&dev_attr_mapped_bytes.attr,
	NULL,
};

static const struct attribute_group phxfs_dev_group = {
	.attrs = phxfs_dev_attrs,
};

static const struct attribute_group *phxfs_dev_groups[] = {
	&phxfs_dev_group,
	NULL,	/* the backend's group, filled in at init */
	NULL,
};

/**
 * phxfs_dev_create - make a range of device memory a phxfs device
 * @pdev:	the PCI device the memory belongs to, or NULL
 * @bar:	the BAR of @pdev holding the memory when phxfs is @pdev's
 *		driver, else -1 (phxfs then leaves @pdev's resources alone)
 * @start:	physical start of the memory
 * @size:	its size
 * @backend_data: private data of the backend
 *
 * Creates the struct pages (memremap_pages, or the PCI P2PDMA core where
 * phxfs owns @pdev and the kernel has it) and /dev/phxfs_devN, N being the
 * lowest free index.
 *
 * Return: the device, or an ERR_PTR().
 */
struct phxfs_dev *phxfs_dev_create(struct pci_dev *pdev, int bar,
				   phys_addr_t start, u64 size,
				   void *backend_data)
{
	struct phxfs_dev *dev;
	int index;
	int ret;

	if (!size || !PAGE_ALIGNED(start) || !PAGE_ALIGNED(size))
		return ERR_PTR(-EINVAL);

	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return ERR_PTR(-ENOMEM);
	kref_init(&dev->kref);
	mutex_init(&dev->lock);
	INIT_LIST_HEAD(&dev->vmas);
	INIT_LIST_HEAD(&dev->pinned);
	dev->pdev = pci_dev_get(pdev);
	dev->bar = bar;
	dev->start = start;
	dev->size = size;
	dev->backend_data = backend_data;

	mutex_lock(&phxfs_table_lock);
	for (index = 0; index < PHXFS_MAX_DEVS; index++)
		if (!phxfs_table[index])
			break;
	if (index == PHXFS_MAX_DEVS) {
		ret = -ENOSPC;
		goto err_unlock;
	}
	dev->index = index;

	ret = phxfs_pages_init(dev);
	if (ret)
		goto err_unlock;

	dev->device = device_create_with_groups(phxfs_class,
						pdev ? &pdev->dev : NULL,
						MKDEV(MAJOR(phxfs_devt), index),
						dev, phxfs_dev_groups,
						"phxfs_dev%d", index);
	if (IS_ERR(dev->device)) {
		ret = PTR_ERR(dev->device);
		goto err_pages;
	}
	phxfs_table[index] = dev;
	mutex_unlock(&phxfs_table_lock);

	pr_info("phxfs_dev%d: %s memory %pa size %#llx (%s pages, %s)\n",
		index, phxfs_backend.name, &dev->start, dev->size,
		dev->p2pdma ? "p2pdma" : "generic",
		pdev ? pci_name(pdev) : "reserved RAM");
	return dev;

err_pages:
	phxfs_pages_exit(dev);
err_unlock:
	mutex_unlock(&phxfs_table_lock);
	phxfs_dev_put(dev);
	return ERR_PTR(ret);
}

/**
 * phxfs_dev_destroy - remove a device
 * @dev: the device
 *
 * No new open or mmap succeeds afterwards; every registration is revoked
 * (its PTEs zapped), in-flight I/O into the memory is waited for and the
 * struct pages are released.  Open files keep the structure until closed.
 */
void phxfs_dev_destroy(struct phxfs_dev *dev)
{
	mutex_lock(&phxfs_table_lock);
	phxfs_table[dev->index] = NULL;
	mutex_unlock(&phxfs_table_lock);

	device_destroy(phxfs_class, MKDEV(MAJOR(phxfs_devt), dev->index));
	phxfs_dev_kill(dev);
	phxfs_pages_exit(dev);
	pr_info("phxfs_dev%d: removed\n", dev->index);
	phxfs_dev_put(dev);
}

/* file operations */

static int phxfs_open(struct inode *inode, struct file *file)
{
	unsigned int minor = iminor(inode);
	struct phxfs_dev *dev = NULL;

	mutex_lock(&phxfs_table_lock);
	if (minor < PHXFS_MAX_DEVS)
		dev = phxfs_table[minor];
	if (dev)
		kref_get(&dev->kref);
	mutex_unlock(&phxfs_table_lock);
	if (!dev)
		return -ENODEV;

	file->private_data = dev;
	return 0;
}

static int phxfs_release(struct inode *inode, struct file *file)
{
	phxfs_dev_put(file->private_data);
	return 0;
}

static int phxfs_file_mmap(struct file *file, struct vm_area_struct *vma)
{
	return phxfs_mmap(file->private_data, file, vma);
}

static long phxfs_ioctl(struct file *file, unsigned int cmd,
			unsigned long arg)
{
	struct phxfs_dev *dev = file->private_data;
	struct phxfs_ioctl_map req;

	if (cmd != PHXFS_IOCTL_MAP && cmd != PHXFS_IOCTL_UNMAP)
		return -ENOTTY;
	if (copy_from_user(&req, (void __user *)arg, sizeof(req)))
		return -EFAULT;
	if (req.dev_id != dev->index)
		return -EINVAL;

	if (cmd == PHXFS_IOCTL_MAP)
		return phxfs_map(dev, &req);
	return phxfs_unmap(dev, &req);
}

static const struct file_operations phxfs_fops = {
	.owner = THIS_MODULE,
	.open = phxfs_open,
	.release = phxfs_release,
	.mmap = phxfs_file_mmap,
	.unlocked_ioctl = phxfs_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

static char *phxfs_devnode(
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
			   const struct device *d,
#else
			   struct device *d,
#endif
			   umode_t *mode)
{
	if (mode)
		*mode = 0600;
	return NULL;
}

static int __init phxfs_init(void)
{
	int ret;

	BUILD_BUG_ON(sizeof(struct phxfs_ioctl_map) != 56);
	phxfs_dev_groups[1] = phxfs_backend.attr_group;

	ret = phxfs_mem_init();
	if (ret)
		return ret;

	ret = alloc_chrdev_region(&phxfs_devt, 0, PHXFS_MAX_DEVS, "phxfs");
	if (ret)
		goto err_mem;

	cdev_init(&phxfs_cdev, &phxfs_fops);
	phxfs_cdev.owner = THIS_MODULE;
	ret = cdev_add(&phxfs_cdev, phxfs_devt, PHXFS_MAX_DEVS);
	if (ret)
		goto err_region;

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	phxfs_class = class_create("phxfs");
#else
	phxfs_class = class_create(THIS_MODULE, "phxfs");
#endif
	if (IS_ERR(phxfs_class)) {
		ret = PTR_ERR(phxfs_class);
		goto err_cdev;
	}
	phxfs_class->devnode = phxfs_devnode;

	ret = phxfs_backend.init();
	if (ret)
		goto err_class;

	pr_info("loaded (backend %s, major %d)\n", phxfs_backend.name,
		MAJOR(phxfs_devt));
	return 0;

err_class:
	class_destroy(phxfs_class);
err_cdev:
	cdev_del(&phxfs_cdev);
err_region:
	unregister_chrdev_region(phxfs_devt, PHXFS_MAX_DEVS);
err_mem:
	phxfs_mem_exit();
	return ret;
}

static void __exit phxfs_exit(void)
{
	phxfs_backend.exit();
	class_destroy(phxfs_class);
	cdev_del(&phxfs_cdev);
	unregister_chrdev_region(phxfs_devt, PHXFS_MAX_DEVS);
	phxfs_mem_exit();
	pr_info("unloaded\n");
}

module_init(phxfs_init);
module_exit(phxfs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("phxfs: storage to accelerator memory direct I/O");
