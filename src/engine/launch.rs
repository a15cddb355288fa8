//! `-- CMD ARGS`: a stack tool starts the program it is to watch, as perf,
//! py-spy and async-profiler do. The command is forked at once and held
//! before its `exec` until the tool has loaded and attached everything and
//! set its filters to the child's pid (which the kernel half then follows
//! into every process the command forks), so it is watched from its first
//! instruction; the run ends when it and its children have exited.
use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use super::error::usage;

/// A command started and held before its `exec`.
#[derive(Debug)]
pub struct Launched {
    /// The child's pid (the command's, once released).
    pub pid: u32,
    /// Written to release the child.
    go: Option<OwnedFd>,
    /// Carries the `exec` failure (errno), or nothing when it succeeded
    /// (closed on exec).
    status: OwnedFd,
    /// The command, for messages.
    pub what: String,
    /// Its exit status, once reaped.
    exited: Option<i32>,
}

fn pipe(cloexec: bool) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: pipe2 fills the two descriptors of a valid array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks `cmd` (looked up on PATH as a shell would), holding it before its
/// `exec` until [`Launched::release`]. A command that cannot be started is
/// a usage error.
pub fn spawn(cmd: &[String]) -> anyhow::Result<Launched> {
    // For messages: a command line can be long (up to ARG_MAX).
    let mut what = cmd.join(" ");
    if what.chars().count() > 120 {
        what = what.chars().take(117).collect::<String>() + "...";
    }
    let Some(first) = cmd.first() else { return Err(usage("-- needs a command to run after it")) };
    let args: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| usage(format!("-- {what}: an argument holds a NUL byte")))?;
    if !first.contains('/') && which(first).is_none() {
        return Err(usage(format!("-- {first}: no such command on PATH; give its path")));
    }
    if first.contains('/') && !executable(std::path::Path::new(first)) {
        return Err(usage(format!("-- {first}: not an executable file; give the command's path")));
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let (go_r, go_w) = pipe(true)?;
    let (st_r, st_w) = pipe(true)?;
    let (go_fd, st_fd) = (go_r.as_raw_fd(), st_w.as_raw_fd());
    // The child's copies of the parent's ends, closed in the child: its
    // read of `go` must see EOF once the parent's end is closed.
    let (go_w_fd, st_r_fd) = (go_w.as_raw_fd(), st_r.as_raw_fd());
    // SAFETY: an all-zero sigset_t is valid storage for sigemptyset.
    let mut none: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: initialises the set just made.
    unsafe { libc::sigemptyset(&mut none) };
    // SAFETY: the child runs only async-signal-safe calls (close, read,
    // signal, sigprocmask, execvp, write, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        // SAFETY: as above; the child never returns from this block.
        unsafe {
            libc::close(go_w_fd);
            libc::close(st_r_fd);
            let mut b = [0u8; 1];
            // Released (a byte) or abandoned (EOF: the tool failed).
            if libc::read(go_fd, b.as_mut_ptr().cast(), 1) != 1 {
                libc::_exit(127);
            }
            // As from a shell: SIGPIPE ends it (Rust ignores it in sonde,
            // and an ignored signal stays ignored across exec), and no
            // signal blocked.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execvp(argv[0], argv.as_ptr());
            let e = *libc::__errno_location();
            libc::write(st_fd, (&e as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    drop(go_r);
    drop(st_w);
    Ok(Launched { pid: pid as u32, go: Some(go_w), status: st_r, what, exited: None })
}

/// The path of `name` on PATH, if any.
fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| executable(p))
}

/// Whether `p` is a file someone may execute.
fn executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Launched {
    /// Lets the child `exec` the command; an error when the `exec` failed.
    pub fn release(&mut self) -> anyhow::Result<()> {
        if let Some(go) = self.go.take() {
            // SAFETY: writing one byte from a valid buffer to an open pipe.
            let n = unsafe { libc::write(go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            if n != 1 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        let mut e = [0u8; 4];
        // SAFETY: reading into a valid buffer: EOF (0) once exec closed the
        // pipe, or the errno the child wrote.
        let n = unsafe { libc::read(self.status.as_raw_fd(), e.as_mut_ptr().cast(), 4) };
        if n == 4 {
            self.reap(true);
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(e));
            return Err(usage(format!("-- {}: {err}", self.what)));
        }
        Ok(())
    }

    /// Reaps the child if it has exited (waits for it with `block`);
    /// whether it has.
    pub fn reap(&mut self, block: bool) -> bool {
        if self.exited.is_some() {
            return true;
        }
        let mut st = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(self.pid as i32, &mut st, if block { 0 } else { libc::WNOHANG }) };
        if r == self.pid as i32 {
            self.exited = Some(if libc::WIFEXITED(st) { libc::WEXITSTATUS(st) } else { 128 + libc::WTERMSIG(st) });
            return true;
        }
        r < 0
    }

    /// How the command ended, once reaped: its exit status (128 + the
    /// signal that ended it).
    pub fn status(&self) -> Option<i32> {
        self.exited
    }
}

impl Drop for Launched {
    /// A command never released (the tool failed before it ran) ends with
    /// the pipe closed; a running one is left to run.
    fn drop(&mut self) {
        if self.go.take().is_some() {
            self.reap(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_only_once_released_and_its_status_is_kept() {
        let dir = std::env::temp_dir().join(format!("sonde-launch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("ran");
        let mut l = spawn(&["sh".into(), "-c".into(), format!("touch {} && exit 3", mark.display())]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!mark.exists(), "held before exec");
        l.release().unwrap();
        assert!(l.reap(true));
        assert_eq!(l.status(), Some(3));
        assert!(mark.exists());
        // A command that does not exist: said before anything runs.
        assert!(spawn(&["no-such-command-sonde".into()]).is_err());
        assert!(spawn(&[dir.join("missing").display().to_string()]).is_err());
        // An exec the kernel refuses (an argument over MAX_ARG_STRLEN):
        // said when released.
        let mut l = spawn(&["true".into(), "x".repeat(200_000)]).unwrap();
        let e = l.release().unwrap_err().to_string();
        assert!(e.contains("Argument list too long"), "{e}");
        // Never released: the child goes away when the handle does.
        let l = spawn(&["sleep".into(), "30".into()]).unwrap();
        let pid = l.pid;
        drop(l);
        assert!(!super::super::process_alive(pid));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
