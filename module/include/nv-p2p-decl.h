/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Declarations of the part of NVIDIA's peer-to-peer kernel API (the
 * nvidia_p2p_* functions exported by nvidia.ko) that the phxfs nvidia
 * backend uses.  Written for phxfs from the documented API so that the
 * backend compiles without the driver's sources; declarations only.
 *
 * Only the leading members of struct nvidia_p2p_page_table are read
 * (version, page_size, pages, entries); their offsets are the same in every
 * page-table version the driver has shipped.  The functions are looked up
 * at run time with symbol_get(), so phxfs loads without nvidia.ko.
 */
#ifndef _PHXFS_NV_P2P_DECL_H
#define _PHXFS_NV_P2P_DECL_H

#include <linux/types.h>

#define NVIDIA_P2P_VERSION_MAJOR(v)	(((v) >> 16) & 0xffff)
#define NVIDIA_P2P_VERSION_MINOR(v)	((v) & 0xffff)

/* The page-table layout phxfs was written against (major 2). */
#define PHXFS_NV_P2P_PAGE_TABLE_MAJOR	2

enum {
	NVIDIA_P2P_PAGE_SIZE_4KB = 0,
	NVIDIA_P2P_PAGE_SIZE_64KB = 1,
	NVIDIA_P2P_PAGE_SIZE_128KB = 2,
};

struct nvidia_p2p_page {
	u64 physical_address;
	union {
		struct {
			u32 wreqmb_h;
			u32 rreqmb_h;
			u32 rreqmb_0;
			u32 reserved[3];
		} fermi;
	} registers;
};

struct nvidia_p2p_page_table {
	u32 version;
	u32 page_size;			/* NVIDIA_P2P_PAGE_SIZE_* */
	struct nvidia_p2p_page **pages;
	u32 entries;
	u8 *gpu_uuid;
	/* later versions append members; phxfs never reads past here */
};

/*
 * Pin the GPU memory [virtual_address, virtual_address + length) (both
 * 64 KiB aligned) of the calling process and describe it in *page_table.
 * free_callback(data) is called by the driver when the memory goes away
 * while still pinned (cudaFree, process exit); the callback must then
 * release the table with nvidia_p2p_free_page_table() and must not call
 * nvidia_p2p_put_pages().
 */
int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 u64 length, struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);

/* Unpin memory pinned by nvidia_p2p_get_pages() and free its page table. */
int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table);

/* Free a page table from within the free callback. */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);

#endif /* _PHXFS_NV_P2P_DECL_H */
