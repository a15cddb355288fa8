//! Network namespaces as `--netns` names them (the labs' and tests' own
//! namespaces are in `lab::netns`).

/// The inode number that identifies a network namespace, from what a user
/// typed for `--netns`: a path to a namespace file (`/run/netns/NAME`,
/// `/proc/PID/ns/net`), a name under /run/netns, or the inode number itself.
pub fn netns_inode(arg: &str) -> anyhow::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(n) = arg.parse::<u32>() {
        return Ok(n);
    }
    let named = format!("/run/netns/{arg}");
    let path = if std::path::Path::new(arg).exists() || arg.contains('/') { arg } else { named.as_str() };
    let bad = |why: String| {
        super::error::usage(format!(
            "--netns {arg}: {why}; give /run/netns/NAME, /proc/PID/ns/net, a name from `ip netns list` or the inode from `lsns -t net`"
        ))
    };
    let md = std::fs::metadata(path).map_err(|e| bad(format!("{path}: {e}")))?;
    // Namespace files live on nsfs; any other file's inode would match nothing.
    let c = std::ffi::CString::new(path).map_err(|_| bad("contains a NUL byte".into()))?;
    // SAFETY: statfs is plain old data; all-zero is a valid value, and the kernel fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and st a properly sized out-parameter.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    const NSFS_MAGIC: i64 = 0x6e73_6673;
    if r != 0 || st.f_type as i64 != NSFS_MAGIC {
        return Err(bad(format!("{path} is not a namespace file")));
    }
    Ok(md.ino() as u32)
}
