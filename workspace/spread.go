package workspace

import (
	"errors"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// topDirFlag is FS_TOPDIR_FL of linux/fs.h, ext4's T attribute (chattr
// +T): the directory is the top of directory hierarchies, so ext4 places
// each new directory in it in a block group of its own choosing, as it
// does directories at the root of the file system.
const topDirFlag = 0x00020000

// spreadSubdirs marks dir as a top of directory hierarchies where the file
// system has such a mark (ext4), if dir is a work dir of this user's own:
// owned by the effective user, writable by no one else, and either of
// mode 0700 (as the pool makes a missing base) or still empty (a directory
// made to be the work dir). Elsewhere, and on any other directory (a
// home, /var, a shared one), it changes nothing. The flags the directory
// had are kept. It fails silently: the mark only saves work.
//
// Why (on ext4 without a journal; with one it only changes placement):
// ext4 keeps a directory's files in its block group and puts a new
// directory in its parent's group. Workspaces made and removed under one
// base would all share one group, and ext4 without a journal skips every
// inode of a group freed in the last minute (six while its inode table
// block is unwritten) when it makes a file, looking each one up: a file
// costs more the more were removed there lately (up to a millisecond of
// CPU each, measured). Spread over the groups, each workspace's files
// pass few such inodes. The mark changes only where ext4 puts new
// directories; nothing reads it otherwise.
func spreadSubdirs(dir string) {
	// The pool passes base with its links resolved: O_NOFOLLOW only
	// refuses one swapped in since.
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return
	}
	if fi.Mode().Perm() != 0o700 {
		if _, err := f.Readdirnames(1); !errors.Is(err, io.EOF) {
			return // not empty: a directory with a life of its own
		}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		flags, err := unix.IoctlGetUint32(int(fd), unix.FS_IOC_GETFLAGS)
		if err == nil && flags&topDirFlag == 0 {
			_ = unix.IoctlSetPointerInt(int(fd), unix.FS_IOC_SETFLAGS, int(flags|topDirFlag))
		}
	})
}
