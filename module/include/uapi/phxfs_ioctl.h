/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * phxfs: user-space ABI of the /dev/phxfs_devN character devices.
 *
 * Compatible with the original Phoenix module: ioctl magic 0x88, MAP = 1,
 * UNMAP = 2, both _IOW with the same 56-byte structure.  See
 * docs/kernel-module.md for the semantics and the errnos.
 */
#ifndef _UAPI_PHXFS_IOCTL_H
#define _UAPI_PHXFS_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define PHXFS_IOCTL_MAGIC	0x88

/**
 * struct phxfs_ioctl_map - argument of PHXFS_IOCTL_MAP and PHXFS_IOCTL_UNMAP
 * @dev_id:	index of the device (N in /dev/phxfs_devN); must match the
 *		device the ioctl is issued on
 * @c_vaddr:	host virtual address inside an mmap() of the device
 * @c_size:	length of the host range in bytes
 * @n_vaddr:	device address (a GPU virtual address, or an emu address)
 * @n_size:	length of the device range; must equal @c_size
 * @end_addr:	reserved, ignored (the original clients leave it unset)
 * @sbuf_block:	reserved, ignored
 * @pad:	tail padding of the original packed, 8-aligned layout
 */
struct phxfs_ioctl_map {
	__u64 dev_id;
	__u64 c_vaddr;
	__u64 c_size;
	__u64 n_vaddr;
	__u64 n_size;
	__u64 end_addr;
	__u32 sbuf_block;
	__u32 pad;
};

#define PHXFS_IOCTL_MAP		_IOW(PHXFS_IOCTL_MAGIC, 1, struct phxfs_ioctl_map)
#define PHXFS_IOCTL_UNMAP	_IOW(PHXFS_IOCTL_MAGIC, 2, struct phxfs_ioctl_map)

/*
 * Device addresses of the emu backend: device N's memory (a PCI BAR or a
 * reserved RAM range) of size S is addressed as
 * [PHXFS_EMU_DEVADDR(N, 0), PHXFS_EMU_DEVADDR(N, S)).
 */
#define PHXFS_EMU_DEVADDR_BASE	0x100000000000ULL
#define PHXFS_EMU_DEVADDR_SHIFT	40
#define PHXFS_EMU_DEVADDR(n, off) \
	(PHXFS_EMU_DEVADDR_BASE + ((__u64)(n) << PHXFS_EMU_DEVADDR_SHIFT) + (off))

#endif /* _UAPI_PHXFS_IOCTL_H */
