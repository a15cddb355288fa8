//! Answers to the few questions sonde asks of vmlinux BTF before it loads
//! a program (is there a type of this name, does a struct have a member,
//! how many arguments does a tracepoint pass), read straight from the raw
//! format (Documentation/bpf/btf.rst). libbpf parses and checks the whole
//! 6 MB file for CO-RE when the programs load; parsing it a second time
//! for these questions cost every tool ~5 ms of its start (a tenth of a
//! whole `retrans --count` run), most of it reading the file 4 KB a system
//! call. This maps it where the kernel allows (Linux 6.16+; else reads it
//! whole), walks its type headers once, and answers each question with one
//! linear scan.
//!
//! The file is the kernel's own (`/sys/kernel/btf/vmlinux`), but nothing
//! is trusted: every offset is bounds-checked, and a malformed file gives
//! no answers, never a panic.

/// `BTF_KIND_*` (include/uapi/linux/btf.h).
#[allow(missing_docs)]
pub mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

const MAGIC: u16 = 0xeb9f;
/// `struct btf_type`: name_off, info, size or type.
const TYPE_HDR: usize = 12;

/// vmlinux BTF, its types indexed by id.
pub struct BtfNames {
    data: Data,
    /// Byte offset of the type section and the string section in `data`.
    types: usize,
    strs: std::ops::Range<usize>,
    /// `offs[id - 1]`: the offset of type `id` in the type section.
    offs: Vec<u32>,
}

/// The file's bytes: mapped, or read.
enum Data {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Mapped(m) => m,
            Data::Read(v) => v,
        }
    }
}

/// One type's header.
#[derive(Debug, Clone, Copy)]
pub struct Type {
    /// Its id (1-based).
    pub id: u32,
    /// Its `kind::*`.
    pub kind: u32,
    /// Members, values or arguments, by kind.
    pub vlen: u32,
    /// `size` or `type`, by kind.
    pub size_or_type: u32,
    name_off: u32,
    off: usize,
}

impl BtfNames {
    /// Reads `path` (vmlinux BTF); None if it is missing or malformed.
    pub fn read(path: &str) -> Option<BtfNames> {
        use std::io::Read;
        let f = std::fs::File::open(path).ok()?;
        // SAFETY: a private read-only mapping of the kernel's BTF, which
        // never changes while it runs; every read below is bounds-checked.
        if let Ok(m) = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&f) } {
            return BtfNames::index(Data::Mapped(m));
        }
        // 64 MB: several times a large distribution kernel's BTF.
        let len = f.metadata().map(|m| m.len() as usize).unwrap_or(0).min(64 << 20);
        let mut data = Vec::with_capacity(len);
        f.take(64 << 20).read_to_end(&mut data).ok()?;
        BtfNames::parse(data)
    }

    /// Indexes raw BTF bytes; None if the header or a type is malformed.
    pub fn parse(data: Vec<u8>) -> Option<BtfNames> {
        BtfNames::index(Data::Read(data))
    }

    fn index(data: Data) -> Option<BtfNames> {
        let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
        if u16_at(0)? != MAGIC || *data.get(2)? != 1 {
            return None;
        }
        let hdr = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types = hdr.checked_add(type_off)?;
        let types_end = types.checked_add(type_len)?;
        let strs = hdr.checked_add(str_off)?..hdr.checked_add(str_off)?.checked_add(str_len)?;
        if types_end > data.len() || strs.end > data.len() {
            return None;
        }
        let mut offs = Vec::with_capacity(type_len / 24);
        let mut o = 0usize;
        while o < type_len {
            if o + TYPE_HDR > type_len {
                return None;
            }
            let info = u32_at(types + o + 4)?;
            let (k, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match k {
                kind::INT | kind::VAR | kind::DECL_TAG => 4,
                kind::ARRAY => 12,
                kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen,
                kind::ENUM | kind::FUNC_PROTO => 8 * vlen,
                kind::PTR
                | kind::FWD
                | kind::TYPEDEF
                | kind::VOLATILE
                | kind::CONST
                | kind::RESTRICT
                | kind::FUNC
                | kind::FLOAT
                | kind::TYPE_TAG => 0,
                // A kind newer than this reader: its size is unknown.
                _ => return None,
            };
            offs.push(u32::try_from(o).ok()?);
            o += TYPE_HDR + extra;
        }
        // The last type's members must end with the section.
        if o != type_len {
            return None;
        }
        Some(BtfNames { data, types, strs, offs })
    }

    fn u32_at(&self, o: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.data.get(o..o + 4)?.try_into().ok()?))
    }

    /// The string at `off` in the string section ("" when out of range).
    fn str_at(&self, off: u32) -> &[u8] {
        let s = &self.data[self.strs.clone()];
        let rest = s.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// Type `id` (1-based; 0 is void).
    pub fn get(&self, id: u32) -> Option<Type> {
        let off = self.types + *self.offs.get((id as usize).checked_sub(1)?)? as usize;
        let info = self.u32_at(off + 4)?;
        Some(Type {
            id,
            kind: (info >> 24) & 0x1f,
            vlen: info & 0xffff,
            size_or_type: self.u32_at(off + 8)?,
            name_off: self.u32_at(off)?,
            off,
        })
    }

    /// A type's name ("" when anonymous).
    pub fn name(&self, t: &Type) -> &[u8] {
        self.str_at(t.name_off)
    }

    /// The first type named `name`, of kind `kind` if given.
    pub fn find(&self, name: &str, kind: Option<u32>) -> Option<Type> {
        (1..=self.offs.len() as u32)
            .filter_map(|id| self.get(id))
            .find(|t| kind.is_none_or(|k| k == t.kind) && self.name(t) == name.as_bytes())
    }

    /// The value of enumerator `name` of an enum (None for another kind or
    /// a name it lacks).
    pub fn enum_value(&self, t: &Type, name: &str) -> Option<i64> {
        if t.kind != kind::ENUM {
            return None;
        }
        let base = t.off + TYPE_HDR;
        (0..t.vlen as usize).find_map(|i| {
            (self.str_at(self.u32_at(base + 8 * i)?) == name.as_bytes())
                .then(|| self.u32_at(base + 8 * i + 4).map(|v| i64::from(v as i32)))
                .flatten()
        })
    }

    /// Names of a struct's or union's direct members.
    pub fn members<'a>(&'a self, t: &Type) -> impl Iterator<Item = &'a [u8]> + 'a {
        let n = if matches!(t.kind, kind::STRUCT | kind::UNION) { t.vlen as usize } else { 0 };
        let base = t.off + TYPE_HDR;
        (0..n).filter_map(move |i| Some(self.str_at(self.u32_at(base + 12 * i)?)))
    }

    /// The type `t` refers to (pointer, typedef, modifiers, function).
    pub fn next(&self, t: &Type) -> Option<Type> {
        match t.kind {
            kind::PTR
            | kind::TYPEDEF
            | kind::VOLATILE
            | kind::CONST
            | kind::RESTRICT
            | kind::TYPE_TAG
            | kind::FUNC
            | kind::VAR => self.get(t.size_or_type),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (raw type records) and `strs` (a string
    /// section starting with the empty name).
    fn blob(types: &[u8], strs: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, strs.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(types);
        b.extend_from_slice(strs);
        b
    }

    fn ty(name_off: u32, kind: u32, vlen: u32, size_or_type: u32, extra: &[u32]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [name_off, kind << 24 | vlen, size_or_type].iter().chain(extra) {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v
    }

    /// `int`; `struct s { int a; int b; }`; `typedef void (*f)(int, int)`
    /// as a tracepoint's btf_trace_ typedef: the walk, members and a
    /// function prototype's arguments, from a blob built here.
    #[test]
    fn reads_names_members_and_prototypes() {
        let strs = b"\0int\0s\0a\0b\0btf_trace_x\0";
        let mut t = ty(1, kind::INT, 0, 4, &[32]); // 1: int
        t.extend(ty(5, kind::STRUCT, 2, 8, &[7, 1, 0, 9, 1, 32])); // 2: struct s
        t.extend(ty(0, kind::FUNC_PROTO, 2, 0, &[0, 1, 0, 1])); // 3: void (int, int)
        t.extend(ty(0, kind::PTR, 0, 3, &[])); // 4: pointer to 3
        t.extend(ty(11, kind::TYPEDEF, 0, 4, &[])); // 5: btf_trace_x
        let b = BtfNames::parse(blob(&t, strs)).expect("parses");
        let s = b.find("s", Some(kind::STRUCT)).expect("struct s");
        assert_eq!(s.id, 2);
        assert_eq!(b.members(&s).collect::<Vec<_>>(), [b"a", b"b"]);
        assert!(b.find("s", Some(kind::UNION)).is_none());
        assert!(b.find("nope", None).is_none());
        let td = b.find("btf_trace_x", None).expect("typedef");
        let proto = b.next(&b.next(&td).unwrap()).unwrap();
        assert_eq!((proto.kind, proto.vlen), (kind::FUNC_PROTO, 2));
    }

    /// Truncated, unknown kinds and a wrong magic give nothing, no panic.
    #[test]
    fn malformed_blobs_give_no_answers() {
        let strs = b"\0s\0";
        let good = ty(1, kind::STRUCT, 1, 4, &[1, 0, 0]);
        let b = blob(&good, strs);
        assert!(BtfNames::parse(b.clone()).is_some());
        for cut in 0..b.len() {
            let _ = BtfNames::parse(b[..cut].to_vec());
        }
        // A member count past the end of the type section.
        assert!(BtfNames::parse(blob(&ty(1, kind::STRUCT, 9, 4, &[1, 0, 0]), strs)).is_none());
        assert!(BtfNames::parse(blob(&ty(1, 31, 0, 4, &[]), strs)).is_none());
        let mut bad = b.clone();
        bad[0] = 0;
        assert!(BtfNames::parse(bad).is_none());
        // A name offset past the strings reads as anonymous.
        let far = BtfNames::parse(blob(&ty(999, kind::STRUCT, 0, 4, &[]), strs)).unwrap();
        assert_eq!(far.name(&far.get(1).unwrap()), b"");
    }

    /// This kernel's vmlinux BTF against libbpf's reading of it (the
    /// oracle): every type's kind and name agree, and the questions
    /// features.rs asks get libbpf's answers.
    #[test]
    fn agrees_with_libbpf_on_this_kernels_btf() {
        use libbpf_rs::btf::{Btf, BtfType};
        let (Some(mine), Ok(theirs)) = (BtfNames::read(crate::engine::features::VMLINUX_BTF), Btf::from_vmlinux())
        else {
            panic!("this kernel has vmlinux BTF (/sys/kernel/btf/vmlinux)");
        };
        let mut n = 0;
        for id in 1.. {
            let Some(t) = theirs.type_by_id::<BtfType>(id.into()) else { break };
            let m = mine.get(id).unwrap_or_else(|| panic!("type {id} missing"));
            assert_eq!(m.kind, t.kind() as u32, "type {id}");
            let name = t.name().map(|c| std::os::unix::ffi::OsStrExt::as_bytes(c).to_vec()).unwrap_or_default();
            assert_eq!(mine.name(&m), &name[..], "type {id}");
            n += 1;
        }
        assert_eq!(n, mine.offs.len(), "type count");
        assert!(n > 10_000, "{n} types");
        // The questions features.rs asks.
        for name in ["bpf_sk_storage_get_tracing", "btf_trace_tcp_retransmit_skb", "sock", "no_such_type_here"] {
            let theirs = theirs.type_by_name::<BtfType>(name).map(|t| u32::from(t.type_id()));
            assert_eq!(mine.find(name, None).map(|t| t.id), theirs, "{name}");
        }
        let members = |b: &BtfNames| b.find("sock", Some(kind::STRUCT)).map(|s| b.members(&s).count());
        let n_theirs = theirs.type_by_name::<libbpf_rs::btf::types::Struct<'_>>("sock").map(|s| s.iter().count());
        assert_eq!(members(&mine), n_theirs);
    }
}
