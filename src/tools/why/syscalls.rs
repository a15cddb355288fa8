//! The system calls a thread can block in, by this architecture's numbers:
//! what each waits on (the kernel half's `sys_kind`) and its name.

/// What a system call waits on (enum why_sys in why.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Reading or receiving on the descriptor in argument 0.
    FdRead = 1,
    /// Writing or sending on the descriptor in argument 0.
    FdWrite = 2,
    /// connect().
    Connect = 3,
    /// accept(): waiting for a connection.
    Accept = 4,
    /// A sleep.
    Sleep = 5,
    /// poll, ppoll (nothing to watch: a sleep).
    Poll = 6,
    /// select, pselect6 (nothing to watch: a sleep).
    Select = 7,
    /// epoll_wait and its kin.
    Epoll = 8,
    /// futex, futex_waitv.
    Futex = 9,
    /// io_uring_enter.
    IoUring = 10,
    /// fsync and its kin.
    Fsync = 11,
    /// System V and POSIX message queues, semaphores.
    Ipc = 12,
    /// wait4, waitid.
    Wait = 13,
}

macro_rules! table {
    ($($name:ident => $kind:expr),* $(,)?) => {
        &[$((libc::$name as i64, stringify!($name), $kind)),*]
    };
}

use Kind::*;

/// (number, `SYS_name`, kind) of every blocking system call both
/// architectures have.
const COMMON: &[(i64, &str, Option<Kind>)] = table! {
    SYS_read => Some(FdRead), SYS_readv => Some(FdRead), SYS_pread64 => Some(FdRead),
    SYS_preadv => Some(FdRead), SYS_preadv2 => Some(FdRead), SYS_recvfrom => Some(FdRead),
    SYS_recvmsg => Some(FdRead), SYS_recvmmsg => Some(FdRead),
    SYS_write => Some(FdWrite), SYS_writev => Some(FdWrite), SYS_pwrite64 => Some(FdWrite),
    SYS_pwritev => Some(FdWrite), SYS_pwritev2 => Some(FdWrite), SYS_sendto => Some(FdWrite),
    SYS_sendmsg => Some(FdWrite), SYS_sendmmsg => Some(FdWrite), SYS_sendfile => Some(FdWrite),
    SYS_splice => None, SYS_tee => None, SYS_vmsplice => Some(FdWrite),
    SYS_connect => Some(Connect), SYS_accept4 => Some(Accept),
    SYS_nanosleep => Some(Sleep), SYS_clock_nanosleep => Some(Sleep),
    SYS_ppoll => Some(Poll), SYS_pselect6 => Some(Select),
    SYS_epoll_pwait => Some(Epoll), SYS_epoll_pwait2 => Some(Epoll),
    SYS_futex => Some(Futex), SYS_futex_waitv => Some(Futex),
    SYS_io_uring_enter => Some(IoUring), SYS_io_getevents => None,
    SYS_fsync => Some(Fsync), SYS_fdatasync => Some(Fsync), SYS_sync_file_range => Some(Fsync),
    SYS_sync => None, SYS_syncfs => None,
    SYS_msgrcv => Some(Ipc), SYS_msgsnd => Some(Ipc), SYS_mq_timedreceive => Some(Ipc),
    SYS_mq_timedsend => Some(Ipc), SYS_semop => Some(Ipc), SYS_semtimedop => Some(Ipc),
    SYS_wait4 => Some(Wait), SYS_waitid => Some(Wait),
    SYS_rt_sigtimedwait => None, SYS_rt_sigsuspend => None,
    SYS_flock => None, SYS_fcntl => None, SYS_openat => None, SYS_close => None,
    SYS_exit_group => None, SYS_exit => None, SYS_execve => None, SYS_clone => None,
    SYS_mmap => None, SYS_munmap => None, SYS_madvise => None, SYS_mprotect => None,
    SYS_ioctl => None, SYS_getdents64 => None, SYS_statx => None, SYS_fstat => None,
    SYS_unlinkat => None, SYS_renameat2 => None, SYS_ftruncate => None, SYS_fallocate => None,
    SYS_sched_yield => None, SYS_ptrace => None, SYS_shutdown => None, SYS_bpf => None,
    SYS_perf_event_open => None, SYS_finit_module => None, SYS_mount => None, SYS_umount2 => None,
};

/// Those only x86-64 has (arm64 has their newer forms only).
#[cfg(target_arch = "x86_64")]
const ARCH: &[(i64, &str, Option<Kind>)] = table! {
    SYS_poll => Some(Poll), SYS_select => Some(Select), SYS_epoll_wait => Some(Epoll),
    SYS_accept => Some(Accept), SYS_pause => Some(Sleep), SYS_open => None, SYS_stat => None,
    SYS_unlink => None, SYS_rename => None, SYS_fork => None, SYS_vfork => None, SYS_getdents => None,
};

#[cfg(not(target_arch = "x86_64"))]
const ARCH: &[(i64, &str, Option<Kind>)] = &[];

/// (number, kind) for the kernel half's `sys_kind`, each below `n`.
pub fn kinds(n: usize) -> impl Iterator<Item = (usize, u8)> {
    COMMON.iter().chain(ARCH).filter_map(move |&(nr, _, k)| {
        let nr = usize::try_from(nr).ok().filter(|&nr| nr < n)?;
        Some((nr, k? as u8))
    })
}

/// The name of system call `nr` on this architecture ("read",
/// "fadvise64"), or "system call NR" for a number it does not have.
pub fn name(nr: u32) -> String {
    usize::try_from(nr)
        .ok()
        .and_then(syscalls::Sysno::new)
        .map_or_else(|| format!("system call {nr}"), |s| s.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every number is below the kernel half's table size and given once.
    #[test]
    fn numbers_fit_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for (nr, name, _) in COMMON.iter().chain(ARCH) {
            assert!((0..512).contains(nr), "{name} = {nr}");
            assert!(seen.insert(*nr), "{name} = {nr} twice");
        }
        assert_eq!(name(libc::SYS_futex as u32), "futex");
        for (nr, n, _) in COMMON.iter().chain(ARCH) {
            assert_eq!(format!("SYS_{}", name(*nr as u32)), *n);
        }
        assert_eq!(name(libc::SYS_fadvise64 as u32), "fadvise64");
        assert_eq!(name(4000), "system call 4000");
        assert_eq!(kinds(512).find(|k| k.0 == libc::SYS_read as usize), Some((libc::SYS_read as usize, 1)));
    }
}
