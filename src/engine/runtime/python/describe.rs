//! CPython's description of itself: `_Py_DebugOffsets`, the block at the
//! start of `_PyRuntime` (3.13 on; its own ELF section `.PyRuntime` from
//! 3.14) that gives, per structure a profiler or debugger reads, its size
//! and the offsets of its fields, as the running interpreter lays them out.
//!
//! The block's own layout (which structures, which fields, in what order)
//! is its format; each minor version so far has changed it. A format is a
//! list of field names here ([`FORMATS`]); reading one is positional (8
//! bytes a field after a 24-byte head: the cookie, the version, the
//! free-threading flag). An interpreter is read with the format of its
//! version, or, when it is newer than every format known, with the newest
//! one if the block passes every check of a described layout: each offset
//! inside its structure, and the fixed points of the object model (the
//! object header, `bytes`' and `str`'s heads) where they must be. A block
//! that passes no format is not read; no offset is ever guessed.
use std::collections::HashMap;

use crate::engine::process::mem::le;

/// The cookie at the block's start.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// A format of the block: the minor version that introduced it and its
/// fields after the head, in order, in parts (`struct.field`; a
/// structure's first field is its `size`).
pub struct Format {
    /// CPython 3.`minor`.
    pub minor: u32,
    /// The fields, 8 bytes each from byte 24, in parts.
    pub parts: &'static [&'static [&'static str]],
}

impl Format {
    /// The fields in order.
    pub fn fields(&self) -> Vec<&'static str> {
        self.parts.iter().flat_map(|p| p.iter().copied()).collect()
    }
}

const RUNTIME: [&str; 3] = ["runtime_state.size", "runtime_state.finalizing", "runtime_state.interpreters_head"];
const FRAME_13: [&str; 6] = [
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
];
const CODE_13: [&str; 10] = [
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
];
const SEQUENCES: [&str; 6] = [
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
];
const OBJECTS: [&str; 11] = [
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
];
const SET: [&str; 4] = ["set_object.size", "set_object.used", "set_object.table", "set_object.mask"];
const INTERP_13: [&str; 13] = [
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
];
const TAIL_14: [&str; 12] = [
    "gen_object.size",
    "gen_object.gi_name",
    "gen_object.gi_iframe",
    "gen_object.gi_frame_state",
    "llist_node.next",
    "llist_node.prev",
    "debugger_support.eval_breaker",
    "debugger_support.remote_debugger_support",
    "debugger_support.remote_debugging_enabled",
    "debugger_support.debugger_pending_call",
    "debugger_support.debugger_script_path",
    "debugger_support.debugger_script_path_size",
];

/// The formats known, oldest first.
pub static FORMATS: &[Format] = &[
    Format {
        minor: 13,
        parts: &[&RUNTIME, &INTERP_13, &THREAD_13, &FRAME_13, &CODE_13, &TYPES_13, &SEQUENCES, &OBJECTS, &UNICODE_13],
    },
    Format {
        minor: 14,
        parts: &[
            &RUNTIME,
            &INTERP_14,
            &THREAD_13,
            &FRAME_13,
            &FRAME_14,
            &CODE_13,
            &CODE_14,
            &TYPES_13,
            &SEQUENCES,
            &SET,
            &OBJECTS,
            &UNICODE_13,
            &TAIL_14,
        ],
    },
    Format {
        minor: 15,
        parts: &[
            &RUNTIME,
            &INTERP_14,
            &THREAD_15,
            &FRAME_13,
            &FRAME_14,
            &CODE_13,
            &CODE_14,
            &TYPES_13,
            &TYPES_15,
            &SEQUENCES,
            &SET,
            &OBJECTS,
            &UNICODE_15,
            &TAIL_14,
        ],
    },
];

const INTERP_14: [&str; 16] = [
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.threads_main",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "interpreter_state.code_object_generation",
    "interpreter_state.tlbc_generation",
];
const THREAD_13: [&str; 9] = [
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
];
const THREAD_15: [&str; 17] = [
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.base_frame",
    "thread_state.last_profiled_frame",
    "thread_state.last_profiled_frame_seq",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "thread_state.holds_gil",
    "thread_state.gil_requested",
    "thread_state.current_exception",
    "thread_state.exc_state",
    "err_stackitem.exc_value",
];
const FRAME_14: [&str; 2] = ["interpreter_frame.stackpointer", "interpreter_frame.tlbc_index"];
const CODE_14: [&str; 1] = ["code_object.co_tlbc"];
const TYPES_13: [&str; 6] = [
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
];
const TYPES_15: [&str; 4] = [
    "type_object.tp_basicsize",
    "type_object.tp_dictoffset",
    "heap_type_object.size",
    "heap_type_object.ht_cached_keys",
];
const UNICODE_13: [&str; 6] = [
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
];
const UNICODE_15: [&str; 10] = [
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "unicode_object.compactunicodeobject_size",
    "gc.size",
    "gc.collecting",
    "gc.frame",
    "gc.generation_stats_size",
    "gc.generation_stats",
];

/// Bytes of the block to read: the largest format's, with room to spare.
pub const READ_BYTES: usize = 2048;

/// A block read with a format: each field's value.
#[derive(Debug, Clone)]
pub struct Described {
    /// `PY_VERSION_HEX`.
    pub version: u64,
    /// Whether the build is free-threaded (no GIL).
    pub free_threaded: bool,
    /// The format's minor version.
    pub format: u32,
    values: HashMap<&'static str, u64>,
}

impl Described {
    /// A field's value (0 for one the format does not have).
    pub fn get(&self, name: &str) -> u64 {
        self.values.get(name).copied().unwrap_or(0)
    }

    /// Whether the format has the field.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// (major, minor, micro) of the version.
    pub fn version(&self) -> (u64, u64, u64) {
        (self.version >> 24, (self.version >> 16) & 0xff, (self.version >> 8) & 0xff)
    }
}

/// The head of a block: cookie, version and free-threading flag, before
/// any format is known (None: not a block).
pub fn head(b: &[u8]) -> Option<(u64, bool)> {
    (b.len() >= 24 && &b[..8] == COOKIE).then(|| (le::<8>(b, 8), le::<8>(b, 16) != 0))
}

/// Reads block `b` with format `f`; Err names the first check that failed.
pub fn read(b: &[u8], f: &Format) -> Result<Described, String> {
    let (version, free_threaded) = head(b).ok_or("no _Py_DebugOffsets cookie")?;
    let fields = f.fields();
    if b.len() < 24 + 8 * fields.len() {
        return Err("the block is cut short".into());
    }
    let values: HashMap<&'static str, u64> =
        fields.iter().enumerate().map(|(i, n)| (*n, le::<8>(b, 24 + 8 * i))).collect();
    let d = Described { version, free_threaded, format: f.minor, values };
    check(&d)?;
    Ok(d)
}

/// The checks of a described layout: every offset inside its structure
/// (a structure is at most 1 MiB, but the runtime state), and the object
/// model's fixed points.
fn check(d: &Described) -> Result<(), String> {
    for (name, &v) in &d.values {
        let Some((s, field)) = name.split_once('.') else { continue };
        if field == "size" || field.ends_with("_size") || !d.has(&format!("{s}.size")) {
            continue;
        }
        let size = d.get(&format!("{s}.size"));
        let max = if s == "runtime_state" { 64 << 20 } else { 1 << 20 };
        if size == 0 || size > max || v >= size {
            return Err(format!("{name} is {v}, past its structure's {size} bytes"));
        }
    }
    // The object header (16 bytes, the type at 8: a build with the GIL;
    // a free-threaded one's is 32, the type at 24), bytes' and str's heads.
    let fixed: [(&str, u64); 6] = [
        ("bytes_object.ob_size", 16),
        ("bytes_object.ob_sval", 32),
        ("unicode_object.length", 16),
        ("tuple_object.ob_size", 16),
        ("list_object.ob_size", 16),
        ("pyobject.size", if d.free_threaded { 32 } else { 16 }),
    ];
    for (name, want) in fixed {
        if d.get(name) != want {
            return Err(format!("{name} is {}, not {want}", d.get(name)));
        }
    }
    let ascii = d.get("unicode_object.asciiobject_size");
    if !(24..=64).contains(&ascii) || ascii % 8 != 0 {
        return Err(format!("unicode_object.asciiobject_size is {ascii}"));
    }
    if d.has("llist_node.prev") && (d.get("llist_node.next"), d.get("llist_node.prev")) != (0, 8) {
        return Err("llist_node is not {next, prev}".into());
    }
    if d.has("debugger_support.debugger_script_path_size") && d.get("debugger_support.debugger_script_path_size") != 512
    {
        return Err("debugger_script_path_size is not 512".into());
    }
    Ok(())
}

/// Reads block `b` of CPython 3.`minor`: with its own format when known,
/// else (a newer version) with the newest format, if it passes. Returns
/// the reading and whether its version is one the formats were made from.
pub fn describe(b: &[u8], minor: u32) -> Result<(Described, bool), String> {
    let newest = FORMATS.last().expect("formats");
    match FORMATS.iter().find(|f| f.minor == minor) {
        Some(f) => read(b, f).map(|d| (d, true)),
        None if minor > newest.minor => read(b, newest)
            .map(|d| (d, false))
            .map_err(|e| format!("it describes itself as no version sonde knows does ({e})")),
        None => Err(format!("3.{minor} carries no _Py_DebugOffsets")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of format `f` whose fields hold `value(name)`.
    fn block(f: &Format, version: u64, value: impl Fn(&str) -> u64) -> Vec<u8> {
        let mut b = vec![0u8; READ_BYTES];
        b[..8].copy_from_slice(COOKIE);
        b[8..16].copy_from_slice(&version.to_le_bytes());
        for (i, n) in f.fields().iter().enumerate() {
            b[24 + 8 * i..32 + 8 * i].copy_from_slice(&value(n).to_le_bytes());
        }
        b
    }

    fn plausible(n: &str) -> u64 {
        match n {
            "bytes_object.ob_size" | "unicode_object.length" | "tuple_object.ob_size" | "list_object.ob_size" => 16,
            "pyobject.size" => 16,
            "bytes_object.ob_sval" => 32,
            "unicode_object.asciiobject_size" => 40,
            "llist_node.next" => 0,
            "llist_node.prev" => 8,
            "debugger_support.debugger_script_path_size" => 512,
            n if n.ends_with(".size") => 4096,
            _ => 8,
        }
    }

    #[test]
    fn formats_have_the_sizes_their_interpreters_declare() {
        // sizeof(_Py_DebugOffsets) in CPython 3.13.0, 3.14.10 and 3.15.2.
        let sizes: Vec<(u32, usize)> = FORMATS.iter().map(|f| (f.minor, 24 + 8 * f.fields().len())).collect();
        assert_eq!(sizes, [(13, 584), (14, 760), (15, 888)]);
        // Each has the fields sonde reads, at the places the interpreters put them.
        let at = |f: &Format, n: &str| 24 + 8 * f.fields().iter().position(|x| *x == n).unwrap();
        assert_eq!(at(&FORMATS[0], "thread_state.current_frame"), 184);
        assert_eq!(at(&FORMATS[1], "interpreter_frame.owner"), 288);
        assert_eq!(at(&FORMATS[1], "set_object.mask"), 520);
        assert_eq!(at(&FORMATS[2], "thread_state.native_thread_id"), 248);
        assert_eq!(at(&FORMATS[2], "code_object.co_code_adaptive"), 448);
        assert_eq!(at(&FORMATS[2], "unicode_object.asciiobject_size"), 736);
    }

    #[test]
    fn a_newer_version_is_read_with_the_newest_format_only_if_it_checks() {
        let f = FORMATS.last().unwrap();
        let ok = block(f, 0x0310_00f0, plausible);
        let (d, tested) = describe(&ok, 16).unwrap();
        assert!(!tested);
        assert_eq!(d.version(), (3, 16, 0));
        // A field inserted early moves every later one by a word: the
        // fixed points no longer hold.
        let mut shifted = ok.clone();
        shifted.copy_within(64..800, 72);
        assert!(describe(&shifted, 16).is_err());
        // An offset past its structure.
        let bad = block(f, 0x0310_00f0, |n| if n == "thread_state.current_frame" { 1 << 30 } else { plausible(n) });
        assert!(describe(&bad, 16).unwrap_err().contains("current_frame"));
        // A free-threaded build's object header.
        let mut ft = block(f, 0x030f_02f0, |n| if n == "pyobject.size" { 32 } else { plausible(n) });
        ft[16] = 1;
        assert!(describe(&ft, 15).unwrap().0.free_threaded);
        // No cookie, a known version's own format, and an old version.
        assert!(describe(&ok[8..], 15).is_err());
        assert!(describe(&block(&FORMATS[1], 0x030e_0af0, plausible), 14).unwrap().1);
        assert!(describe(&ok, 12).is_err());
    }
}
