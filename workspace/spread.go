package workspace

import (
	"os"

	"golang.org/x/sys/unix"
)

// topDirFlag is FS_TOPDIR_FL of linux/fs.h, ext4's T attribute (chattr
// +T): the directory is the top of directory hierarchies, so ext4 places
// each new directory in it in a block group of its own choosing, as it
// does directories at the root of the file system.
const topDirFlag = 0x00020000

// spreadSubdirs marks dir, if it is a private directory of this user's (no
// write access for group or others), as a top of directory hierarchies
// where the file system has such a mark (ext4), and reports whether dir
// now has it. Elsewhere, and on shared directories, it changes nothing.
//
// Why: ext4 keeps a directory's files in its block group and puts a new
// directory in its parent's group. Workspaces made and removed under one
// base would all share one group, and ext4 without a journal skips every
// inode of a group freed in the last minute (six while its inode table
// block is unwritten) when it makes a file, looking each one up: a file costs more the more were removed there lately (up to
// a millisecond of CPU each, measured). Spread over the groups, each
// workspace's files pass few such inodes. The mark changes only where
// ext4 puts new directories; nothing reads it otherwise.
func spreadSubdirs(dir string) bool {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return false
	}
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return false
	}
	if flags&topDirFlag != 0 {
		return true
	}
	return unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|topDirFlag)) == nil
}
