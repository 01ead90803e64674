// SPDX-License-Identifier: GPL-2.0
/*
 * phxfs emu backend: memory that stands in for GPU memory.
 *
 * Either the shared-memory BAR of a QEMU ivshmem-plain device (vendor
 * 0x1af4, device 0x1110, BAR 2), which phxfs drives as a PCI driver, or a
 * reserved physical RAM range named with the emu_ram= parameter (boot the
 * kernel with memmap=SIZE$START to keep it out of the page allocator).
 *
 * Device address of byte OFF of device N: PHXFS_EMU_DEVADDR(N, OFF).
 * Every process names the same memory with the same address and there is
 * no allocator, so pinning checks bounds and the core keeps owners apart
 * (shared_devaddr: a MAP overlapping another user's pinned registration
 * fails with EACCES).  The memory never goes away under a registration
 * except through the "revoke" test attribute, which runs the same
 * revocation path as a vendor's free callback.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ioport.h>
#include <linux/module.h>
#include <linux/pci.h>

#include "phxfs.h"

#define PHXFS_EMU_PCI_VENDOR	0x1af4
#define PHXFS_EMU_PCI_DEVICE	0x1110
#define PHXFS_EMU_BAR		2

static char *emu_ram;
module_param(emu_ram, charp, 0444);
MODULE_PARM_DESC(emu_ram, "reserved RAM used as device memory: SIZE@START (e.g. 64M@0x50000000)");

static struct phxfs_dev *emu_ram_dev;
static struct resource *emu_ram_res;

static u64 emu_base(struct phxfs_dev *dev)
{
	return PHXFS_EMU_DEVADDR(dev->index, 0);
}

static int emu_pin(struct phxfs_dev *dev, struct phxfs_reg *reg)
{
	u64 base = emu_base(dev);

	if (reg->devaddr < base || reg->devaddr - base > dev->size ||
	    reg->size > dev->size - (reg->devaddr - base))
		return -ERANGE;
	return 0;
}

static phys_addr_t emu_phys(struct phxfs_reg *reg, u64 off)
{
	return reg->dev->start + (reg->devaddr - emu_base(reg->dev)) + off;
}

static ssize_t devaddr_base_show(struct device *d,
				 struct device_attribute *attr, char *buf)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);

	return sysfs_emit(buf, "%#llx\n", emu_base(dev));
}
static DEVICE_ATTR_RO(devaddr_base);

/* Test hook: "DEVADDR SIZE" revokes the registrations overlapping it. */
static ssize_t revoke_store(struct device *d, struct device_attribute *attr,
			    const char *buf, size_t count)
{
	struct phxfs_dev *dev = dev_get_drvdata(d);
	u64 devaddr, size;

	if (sscanf(buf, "%llx %llx", &devaddr, &size) != 2 || !size)
		return -EINVAL;
	phxfs_dev_revoke_range(dev, devaddr, size);
	return count;
}
static DEVICE_ATTR_WO(revoke);

static struct attribute *emu_attrs[] = {
	&dev_attr_devaddr_base.attr,
	&dev_attr_revoke.attr,
	NULL,
};

static const struct attribute_group emu_attr_group = {
	.attrs = emu_attrs,
};

static int emu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct phxfs_dev *dev;
	int ret;

	ret = pci_enable_device_mem(pdev);
	if (ret)
		return ret;
	ret = pci_request_region(pdev, PHXFS_EMU_BAR, "phxfs");
	if (ret)
		goto err_disable;
	if (!(pci_resource_flags(pdev, PHXFS_EMU_BAR) & IORESOURCE_MEM) ||
	    !pci_resource_len(pdev, PHXFS_EMU_BAR)) {
		ret = -ENODEV;
		goto err_release;
	}

	dev = phxfs_dev_create(pdev, PHXFS_EMU_BAR,
			       pci_resource_start(pdev, PHXFS_EMU_BAR),
			       pci_resource_len(pdev, PHXFS_EMU_BAR), NULL);
	if (IS_ERR(dev)) {
		ret = PTR_ERR(dev);
		goto err_release;
	}
	pci_set_drvdata(pdev, dev);
	return 0;

err_release:
	pci_release_region(pdev, PHXFS_EMU_BAR);
err_disable:
	pci_disable_device(pdev);
	return ret;
}

static void emu_remove(struct pci_dev *pdev)
{
	phxfs_dev_destroy(pci_get_drvdata(pdev));
	pci_release_region(pdev, PHXFS_EMU_BAR);
	pci_disable_device(pdev);
}

static const struct pci_device_id emu_pci_ids[] = {
	{ PCI_DEVICE(PHXFS_EMU_PCI_VENDOR, PHXFS_EMU_PCI_DEVICE) },
	{ }
};
MODULE_DEVICE_TABLE(pci, emu_pci_ids);

static struct pci_driver emu_pci_driver = {
	.name = "phxfs_emu",
	.id_table = emu_pci_ids,
	.probe = emu_probe,
	.remove = emu_remove,
};

static int emu_ram_init(void)
{
	phys_addr_t start;
	u64 size;
	char *p;
	int ret;

	size = memparse(emu_ram, &p);
	if (*p != '@')
		return -EINVAL;
	start = memparse(p + 1, &p);
	if (*p || !size)
		return -EINVAL;

	emu_ram_res = request_mem_region(start, size, "phxfs emu_ram");
	if (!emu_ram_res)
		return -EBUSY;
	emu_ram_dev = phxfs_dev_create(NULL, -1, start, size, NULL);
	if (IS_ERR(emu_ram_dev)) {
		ret = PTR_ERR(emu_ram_dev);
		emu_ram_dev = NULL;
		goto err_release;
	}
	return 0;

err_release:
	release_mem_region(start, size);
	emu_ram_res = NULL;
	return ret;
}

static void emu_ram_exit(void)
{
	if (!emu_ram_dev)
		return;
	phxfs_dev_destroy(emu_ram_dev);
	release_mem_region(emu_ram_res->start, resource_size(emu_ram_res));
	emu_ram_dev = NULL;
	emu_ram_res = NULL;
}

static int emu_init(void)
{
	int ret;

	/* PCI first, so that the BARs get the lowest indexes */
	ret = pci_register_driver(&emu_pci_driver);
	if (ret)
		return ret;
	if (emu_ram) {
		ret = emu_ram_init();
		if (ret) {
			pr_err("emu_ram=%s: %d\n", emu_ram, ret);
			goto err_pci;
		}
	}
	return 0;

err_pci:
	pci_unregister_driver(&emu_pci_driver);
	return ret;
}

static void emu_exit(void)
{
	emu_ram_exit();
	pci_unregister_driver(&emu_pci_driver);
}

const struct phxfs_backend_ops phxfs_backend = {
	.name = "emu",
	.align = PAGE_SIZE,
	.shared_devaddr = true,
	.init = emu_init,
	.exit = emu_exit,
	.pin = emu_pin,
	.phys = emu_phys,
	.attr_group = &emu_attr_group,
};
