package fusefs

import "fmt"

// Backing file systems by statfs f_type: their names, and whether other
// machines can change them (then a local fanotify mark sees only this
// machine's changes, and cache=auto revalidates instead of watching).

type fsKind struct {
	name    string
	network bool
}

// fsKinds: the f_type magic numbers of linux/magic.h and of the cluster
// file systems that keep theirs in their own sources.
var fsKinds = map[int64]fsKind{
	0xEF53:     {"ext4", false}, // ext2, ext3 and ext4 share it
	0x58465342: {"xfs", false},
	0x9123683E: {"btrfs", false},
	0x01021994: {"tmpfs", false},
	0x2FC12FC1: {"zfs", false},
	0xF2F52010: {"f2fs", false},
	0x794C7630: {"overlayfs", false},
	0x4D44:     {"vfat", false},
	0x2011BAB0: {"exfat", false},
	0x5346544E: {"ntfs", false},
	0x7366746E: {"ntfs3", false},
	0x3153464A: {"jfs", false},
	0x52654973: {"reiserfs", false},
	0x858458F6: {"ramfs", false},
	0x9FA0:     {"proc", false},
	0x62656572: {"sysfs", false},

	0x6969:     {"nfs", true},
	0xFF534D42: {"cifs", true},
	0xFE534D42: {"smb2", true},
	0x517B:     {"smb", true},
	0x00C36400: {"ceph", true},
	0x0BD00BD0: {"lustre", true},
	0x65735546: {"fuse", true}, // any FUSE file system (sshfs, s3fs, virtiofs, JuiceFS, ...)
	0x01021997: {"9p", true},
	0x5346414F: {"afs", true},
	0x6B414653: {"kafs", true},
	0x01161970: {"gfs2", true},
	0x7461636F: {"ocfs2", true},
	0x47504653: {"gpfs", true},
	0x19830326: {"beegfs", true},
	0x13661366: {"orangefs", true},
	0xAAD7AAEA: {"panfs", true},
	0x73757245: {"coda", true},
	0x564C:     {"ncp", true},
}

// fsKindOf names a statfs f_type and says whether it is shared with other
// machines. An unknown local type is watched like any other.
func fsKindOf(fType int64) fsKind {
	if k, ok := fsKinds[fType]; ok {
		return k
	}
	return fsKind{name: fmt.Sprintf("fs 0x%x", uint64(fType)), network: false}
}
