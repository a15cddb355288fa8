//! The running kernel's drop reasons, by name and number, from its BTF
//! (`enum skb_drop_reason`, and the subsystems' own enums in their modules'
//! BTF): the numbers change from one kernel to the next, so no table is
//! compiled in.
use std::collections::BTreeMap;

use libbpf_rs::btf::{types::Enum, Btf};

/// The prefix the kernel's reason names carry.
const PREFIX: &str = "SKB_DROP_REASON_";
/// A subsystem reason's number is its subsystem's shifted left by this.
const SUBSYS_SHIFT: u32 = 16;

/// Where a subsystem's reasons are named: (subsystem enum value name, its
/// module, the module's enum, the prefix of its names).
const SUBSYSTEMS: &[(&str, &str, &str, &str)] = &[
    ("SKB_DROP_REASON_SUBSYS_OPENVSWITCH", "openvswitch", "ovs_drop_reason", "OVS_DROP_"),
    ("SKB_DROP_REASON_SUBSYS_MAC80211_UNUSABLE", "mac80211", "mac80211_drop_reason", "RX_DROP_U_"),
    ("SKB_DROP_REASON_SUBSYS_MAC80211_MONITOR", "mac80211", "mac80211_drop_reason", "RX_DROP_M_"),
];

/// What a QDISC_DROP by the built-in noop qdisc (an inactive queue) adds to
/// its reason's name.
pub const NOOP_SUFFIX: &str = "/noop";

/// The reasons this kernel names.
#[derive(Debug, Clone, Default)]
pub struct Reasons {
    /// Whether the kernel passes a reason at all (5.17+).
    pub known: bool,
    by_value: BTreeMap<u32, String>,
    by_name: BTreeMap<String, u32>,
}

impl Reasons {
    /// Reads the reasons from `/sys/kernel/btf/vmlinux` (and the modules'
    /// BTF for subsystems' reasons, where those modules are loaded).
    pub fn load() -> Reasons {
        let Ok(btf) = Btf::from_vmlinux() else { return Reasons::default() };
        let mut r = Reasons::default();
        let Some(core) = btf.type_by_name::<Enum<'_>>("skb_drop_reason") else { return r };
        r.known = true;
        for m in core.iter() {
            let Some(name) = m.name.and_then(|n| n.to_str()) else { continue };
            let short = name.strip_prefix(PREFIX).unwrap_or_else(|| name.strip_prefix("SKB_").unwrap_or(name));
            if matches!(short, "MAX" | "SUBSYS_MASK") {
                continue;
            }
            r.insert(m.value as u32, short.to_string());
        }
        // Subsystems: their reasons are `subsys << 16 | code`, named in the
        // module that drops them.
        if let Some(sub) = btf.type_by_name::<Enum<'_>>("skb_drop_reason_subsys") {
            for m in sub.iter() {
                let (Some(name), v) = (m.name.and_then(|n| n.to_str()), m.value as u32) else { continue };
                let Some(&(_, module, enum_name, prefix)) = SUBSYSTEMS.iter().find(|s| s.0 == name) else { continue };
                if v == 0 {
                    continue;
                }
                let sub_short = name.strip_prefix("SKB_DROP_REASON_SUBSYS_").unwrap_or(name);
                for (n, val) in module_enum(module, enum_name) {
                    let n = n.as_str();
                    // Values carry the subsystem already, or are codes.
                    let full = if val >> SUBSYS_SHIFT == 0 { (v << SUBSYS_SHIFT) | val } else { val };
                    if full >> SUBSYS_SHIFT != v {
                        continue;
                    }
                    r.insert(full, format!("{sub_short}/{}", n.strip_prefix(prefix).unwrap_or(n)));
                }
            }
        }
        r
    }

    fn insert(&mut self, v: u32, name: String) {
        self.by_name.entry(name.clone()).or_insert(v);
        self.by_value.entry(v).or_insert(name);
    }

    /// A reason's name; a number the kernel does not name (a subsystem
    /// whose module's BTF is not loaded) as SUBSYS/CODE in hex.
    pub fn name(&self, v: u32) -> String {
        if v == super::NO_REASON {
            return "UNKNOWN".into();
        }
        if v & super::NOOP != 0 {
            return format!("{}{NOOP_SUFFIX}", self.name(v & !super::NOOP));
        }
        match self.by_value.get(&v) {
            Some(n) => n.clone(),
            None if v >> SUBSYS_SHIFT != 0 => format!("SUBSYS{}/{:#x}", v >> SUBSYS_SHIFT, v & 0xffff),
            None => format!("REASON_{v}"),
        }
    }

    /// The number of a reason named `name` (with or without the kernel's
    /// prefix, any case).
    pub fn value(&self, name: &str) -> Option<u32> {
        let up = name.to_ascii_uppercase();
        let short = up.strip_prefix(PREFIX).unwrap_or(&up);
        self.by_name.get(short).copied()
    }

    /// The reasons' names, in the kernel's order.
    pub fn names(&self) -> Vec<&str> {
        self.by_value.values().map(String::as_str).filter(|n| !matches!(*n, "NOT_DROPPED_YET" | "CONSUMED")).collect()
    }
}

/// The members of enum `name` in a loaded module's BTF (split on top of
/// the kernel's, which libbpf-rs does not parse): empty when the module is
/// not loaded or has no such enum.
fn module_enum(module: &str, name: &str) -> Vec<(String, u32)> {
    use std::ffi::{CStr, CString};
    let (Ok(path), Ok(cname)) = (CString::new(format!("/sys/kernel/btf/{module}")), CString::new(name)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // SAFETY: libbpf's BTF calls on pointers it returned, checked for
    // errors before use and freed once; enum members are read within the
    // type's vlen, as the kernel's BTF layout lays them out after the type.
    unsafe {
        let base = libbpf_sys::btf__load_vmlinux_btf();
        if libbpf_sys::libbpf_get_error(base as *const _) != 0 || base.is_null() {
            return out;
        }
        let btf = libbpf_sys::btf__parse_split(path.as_ptr(), base);
        if !btf.is_null() && libbpf_sys::libbpf_get_error(btf as *const _) == 0 {
            let id = libbpf_sys::btf__find_by_name_kind(btf, cname.as_ptr(), libbpf_sys::BTF_KIND_ENUM);
            if id > 0 {
                let t = libbpf_sys::btf__type_by_id(btf, id as u32);
                if !t.is_null() {
                    let vlen = ((*t).info & 0xffff) as usize;
                    let members = (t as *const u8).add(std::mem::size_of::<libbpf_sys::btf_type>())
                        as *const libbpf_sys::btf_enum;
                    for i in 0..vlen.min(4096) {
                        let m = &*members.add(i);
                        let n = libbpf_sys::btf__name_by_offset(btf, m.name_off);
                        if !n.is_null() {
                            out.push((CStr::from_ptr(n).to_string_lossy().into_owned(), m.val as u32));
                        }
                    }
                }
            }
            libbpf_sys::btf__free(btf);
        }
        libbpf_sys::btf__free(base);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_running_kernels() {
        let r = Reasons::load();
        assert!(r.known, "this kernel (6.18) has drop reasons");
        let ns = r.value("NO_SOCKET").expect("NO_SOCKET");
        assert_eq!(r.name(ns), "NO_SOCKET");
        assert_eq!(r.value("skb_drop_reason_no_socket"), Some(ns));
        assert!(r.names().contains(&"SOCKET_RCVBUFF") && !r.names().contains(&"CONSUMED"));
        assert_eq!(r.name(super::super::NO_REASON), "UNKNOWN");
        assert!(r.name(7 << 16 | 3).starts_with("SUBSYS7/"));
    }
}
