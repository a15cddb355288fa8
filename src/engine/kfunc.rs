//! Kernel functions: which ones a glob names, and one BPF program attached to
//! many of them. fentry/fexit needs one program per function (the verifier
//! checks each against its function's BTF prototype), so the loaded template
//! program's instructions (map references already resolved by libbpf) are
//! loaded again per function, as retsnoop does. kprobes take one program for
//! all: kprobe.multi with a cookie per function where the kernel has it, else
//! one perf-event kprobe per function. Every attachment is a file descriptor:
//! closing it (or the process dying) detaches it.
use std::{
    ffi::CString,
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
};

use libbpf_rs::{Link, Program};

use super::error::usage;

/// Functions in `available_filter_functions` (those ftrace can hook, so fentry
/// and kprobes can too) matching `pat`, in the file's order, each once. A
/// module's functions are listed with `[module]` after the name; fentry finds
/// no prototype for them in vmlinux's BTF, kprobes attach by name.
pub fn matching(tracefs: &Path, pat: &str) -> anyhow::Result<Vec<String>> {
    let g = glob::Pattern::new(pat).map_err(|e| usage(format!("kernel function '{pat}': {e}")))?;
    let path = tracefs.join("available_filter_functions");
    let text =
        std::fs::read_to_string(&path).map_err(|e| super::error::env(format!("reading {}: {e}", path.display())))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for name in text.lines().filter_map(|l| l.split_whitespace().next()) {
        // Entries ftrace could not place are listed under this prefix.
        if !name.starts_with("__ftrace_invalid_address__") && g.matches(name) && seen.insert(name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// The kernel's own BTF, for the type ids fentry programs attach by.
pub struct VmlinuxBtf(*mut libbpf_sys::btf);

impl VmlinuxBtf {
    /// Loads /sys/kernel/btf/vmlinux.
    pub fn load() -> anyhow::Result<Self> {
        // SAFETY: returns an owned btf or an error pointer.
        let p = unsafe { libbpf_sys::btf__load_vmlinux_btf() };
        if p.is_null() || (p as isize) < 0 && (p as isize) > -4096 {
            anyhow::bail!("cannot read the kernel's BTF (/sys/kernel/btf/vmlinux)");
        }
        Ok(Self(p))
    }

    /// The BTF id of function `name`, if the kernel describes it.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        let c = CString::new(name).ok()?;
        // SAFETY: a valid btf and a NUL-terminated name.
        let id = unsafe { libbpf_sys::btf__find_by_name_kind(self.0, c.as_ptr(), libbpf_sys::BTF_KIND_FUNC) };
        (id > 0).then_some(id as u32)
    }

    /// How many arguments function `name` takes, from its BTF prototype.
    pub fn func_args(&self, name: &str) -> Option<u32> {
        let id = self.func_id(name)?;
        // SAFETY: ids from this btf; the returned types live as long as it.
        unsafe {
            let f = libbpf_sys::btf__type_by_id(self.0, id).as_ref()?;
            let proto = libbpf_sys::btf__type_by_id(self.0, f.__bindgen_anon_1.type_).as_ref()?;
            Some(proto.info & 0xffff)
        }
    }
}

impl Drop for VmlinuxBtf {
    fn drop(&mut self) {
        // SAFETY: owned since load().
        unsafe { libbpf_sys::btf__free(self.0) };
    }
}

/// What keeps a probe attached: a libbpf link or a raw link fd.
pub enum Attachment {
    /// A libbpf-managed link.
    Lib(Link),
    /// A link created here (fentry clones).
    Fd(OwnedFd),
}

/// A loaded program's BTF and one function record per subprogram, with the
/// offsets of its instructions as libbpf hands them over (`insns()`), so that a
/// copy is verified as the original was: each global function once.
struct FuncInfo {
    btf: OwnedFd,
    recs: Vec<libbpf_sys::bpf_func_info>,
}

impl FuncInfo {
    /// The kernel keeps the program's function records (their type ids in
    /// order) but reports them at offsets in its rewritten code; the
    /// subprograms start, in the same order, at instruction 0 and at every
    /// target of a call or function reference in `insns`. None when the
    /// program has no BTF or the counts disagree.
    fn of(prog: &Program, insns: &[libbpf_sys::bpf_insn]) -> Option<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        let fd = prog.as_fd().as_raw_fd();
        let mut info = libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: info is sized by len and owned here.
        if unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) } != 0 || info.nr_func_info == 0 {
            return None;
        }
        let n = info.nr_func_info as usize;
        let mut recs = vec![libbpf_sys::bpf_func_info::default(); n];
        let mut again = libbpf_sys::bpf_prog_info {
            nr_func_info: n as u32,
            func_info_rec_size: std::mem::size_of::<libbpf_sys::bpf_func_info>() as u32,
            func_info: recs.as_mut_ptr() as u64,
            ..Default::default()
        };
        let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
        // SAFETY: the kernel writes at most nr_func_info records of the given size into recs.
        if unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut again, &mut len) } != 0 {
            return None;
        }
        let mut starts = vec![0u32];
        let mut i = 0usize;
        while i < insns.len() {
            let ins = &insns[i];
            let call = ins.code == (libbpf_sys::BPF_JMP | libbpf_sys::BPF_CALL) as u8
                && ins.src_reg() == libbpf_sys::BPF_PSEUDO_CALL as u8;
            let ld_func = ins.code == (libbpf_sys::BPF_LD | libbpf_sys::BPF_IMM | libbpf_sys::BPF_DW) as u8
                && ins.src_reg() == libbpf_sys::BPF_PSEUDO_FUNC as u8;
            if call || ld_func {
                starts.push((i as i64 + ins.imm as i64 + 1) as u32);
            }
            i += if ins.code == (libbpf_sys::BPF_LD | libbpf_sys::BPF_IMM | libbpf_sys::BPF_DW) as u8 { 2 } else { 1 };
        }
        starts.sort_unstable();
        starts.dedup();
        if starts.len() != n {
            return None;
        }
        for (r, s) in recs.iter_mut().zip(starts) {
            r.insn_off = s;
        }
        // SAFETY: returns a new fd we own, or a negative error.
        let btf = unsafe { libbpf_sys::bpf_btf_get_fd_by_id(info.btf_id) };
        // SAFETY: a new fd we own.
        (btf >= 0).then(|| Self { btf: unsafe { OwnedFd::from_raw_fd(btf) }, recs })
    }
}

/// Loads `insns` (the loaded `template`'s instructions, perhaps patched) as
/// a new program of `prog_type`, with the template's function records:
/// without them every global function (the stack walk) would be verified
/// inline at each call, which takes minutes and then exceeds the verifier's
/// budget. `attach` is the expected attach type and BTF id (0, 0: none).
/// An error names `what` and the verifier's last line.
fn load_copy(
    template: &Program,
    insns: &[libbpf_sys::bpf_insn],
    prog_type: u32,
    attach: (u32, u32),
    name: &std::ffi::CStr,
    what: &str,
) -> anyhow::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let mut log = vec![0u8; 64 * 1024];
    let mut opts = libbpf_sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_prog_load_opts>() as _,
        expected_attach_type: attach.0,
        attach_btf_id: attach.1,
        log_buf: log.as_mut_ptr().cast(),
        log_size: log.len() as u32,
        log_level: 0,
        ..Default::default()
    };
    let funcs = FuncInfo::of(template, insns);
    if let Some(f) = &funcs {
        opts.prog_btf_fd = f.btf.as_raw_fd() as u32;
        opts.func_info = f.recs.as_ptr().cast();
        opts.func_info_cnt = f.recs.len() as u32;
        opts.func_info_rec_size = std::mem::size_of::<libbpf_sys::bpf_func_info>() as u32;
    }
    // SAFETY: insns outlive the call; opts is sized and its buffer valid.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(
            prog_type,
            name.as_ptr(),
            c"Dual BSD/GPL".as_ptr(), // as funclatency.bpf.c declares
            insns.as_ptr(),
            insns.len() as _,
            &mut opts,
        )
    };
    if fd < 0 {
        let err = std::io::Error::from_raw_os_error(-fd);
        let msg = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
            .lines()
            .last()
            .unwrap_or("")
            .to_string();
        anyhow::bail!("loading {what}: {err}{}", if msg.is_empty() { String::new() } else { format!(" ({msg})") });
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads `template` (a loaded fentry or fexit program) again for function
/// `btf_id` and links it with `cookie`. The program fd is closed once the
/// link holds it.
pub fn fentry_clone(template: &Program, exit: bool, btf_id: u32, cookie: u64) -> anyhow::Result<Attachment> {
    use std::os::fd::AsRawFd;
    let insns = template.insns();
    let (attach, kind) =
        if exit { (libbpf_sys::BPF_TRACE_FEXIT, "fexit") } else { (libbpf_sys::BPF_TRACE_FENTRY, "fentry") };
    let name = if exit { c"fl_kexit" } else { c"fl_kentry" };
    let what = format!("an {kind} program");
    let prog = load_copy(template, insns, libbpf_sys::BPF_PROG_TYPE_TRACING, (attach, btf_id), name, &what)?;
    let mut lopts = libbpf_sys::bpf_link_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
        ..Default::default()
    };
    lopts.__bindgen_anon_1.tracing.cookie = cookie;
    // SAFETY: a valid program fd and sized options.
    let l = unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), 0, attach, &lopts) };
    if l < 0 {
        anyhow::bail!("attaching an {kind} program: {}", std::io::Error::from_raw_os_error(-l));
    }
    // SAFETY: a new fd we own.
    Ok(Attachment::Fd(unsafe { OwnedFd::from_raw_fd(l) }))
}

/// Where a copy of a probe program is attached on kernels without attach
/// cookies (see [`indexed_clone`]).
pub enum PerfProbe<'a> {
    /// A uprobe at `offset` of `path`, in process `pid` (-1: every process).
    Uprobe {
        /// The ELF file.
        path: &'a Path,
        /// File offset of the function.
        offset: u64,
        /// Process, or -1.
        pid: i32,
    },
    /// A kprobe on a kernel function.
    Kprobe(&'a str),
    /// A tracepoint: category and name (`syscalls`, `sys_enter_read`).
    Tracepoint(&'a str, &'a str),
}

/// Kernels before 5.15 have no `bpf_get_attach_cookie`, which tells a probe
/// program which target it times. There, each target gets its own copy of
/// the loaded `template` (a kprobe, uprobe or tracepoint program whose one
/// `r = magic` instruction stands for the target) with that immediate set to
/// `index`, attached to a perf event opened for `probe` (a return probe when
/// `ret`). The perf event fd is the attachment: closing it, or the process
/// dying, detaches it.
pub fn indexed_clone(
    template: &Program,
    magic: i32,
    index: u32,
    probe: &PerfProbe<'_>,
    ret: bool,
) -> anyhow::Result<Attachment> {
    use std::os::fd::AsRawFd;
    let mut insns = template.insns().to_vec();
    let mov_k = (libbpf_sys::BPF_ALU64 | libbpf_sys::BPF_MOV | libbpf_sys::BPF_K) as u8;
    let at: Vec<usize> = (0..insns.len()).filter(|&i| insns[i].code == mov_k && insns[i].imm == magic).collect();
    let [at] = at[..] else {
        anyhow::bail!("the probe program has {} target-index instructions, not one", at.len());
    };
    insns[at].imm = index as i32;
    let prog_type = template.prog_type() as u32;
    let prog = load_copy(template, &insns, prog_type, (0, 0), c"fl_indexed", "a copy of the probe program")?;
    let pfd = super::perf::open_probe(probe, ret)?;
    // SAFETY: ioctls on our own perf event fd with a program fd we own.
    unsafe {
        if libc::ioctl(pfd.as_raw_fd(), super::perf::IOC_SET_BPF as _, prog.as_raw_fd()) < 0 {
            return Err(anyhow::Error::new(std::io::Error::last_os_error()).context("attaching to the perf event"));
        }
        if libc::ioctl(pfd.as_raw_fd(), super::perf::IOC_ENABLE as _, 0) < 0 {
            return Err(anyhow::Error::new(std::io::Error::last_os_error()).context("enabling the perf event"));
        }
    }
    // The perf event holds the program now.
    drop(prog);
    Ok(Attachment::Fd(pfd))
}
