//! pprof output (`.pb.gz`): the profile.proto messages (github.com/google/pprof,
//! proto/profile.proto) declared with prost's derive, so no protoc is needed.
//! Read by `go tool pprof`.
use std::{collections::HashMap, io::Write, path::Path};

use anyhow::Context;
use prost::Message;

use super::stacks::{FrameKind, Stack};

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    time_nanos: i64,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    period: i64,
    #[prost(int64, repeated, tag = "13")]
    comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
    #[prost(int64, tag = "3")]
    num: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(int64, tag = "6")]
    build_id: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
    #[prost(bool, tag = "8")]
    has_filenames: bool,
    #[prost(bool, tag = "9")]
    has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
    #[prost(int64, tag = "2")]
    line: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// Interned strings; index 0 is "" as pprof requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// What a stack's count means.
#[derive(Debug, Clone, Copy)]
pub enum Weight {
    /// Samples, each `period_ns` of CPU (1e9 / Hz): values `samples/count`
    /// and `cpu/nanoseconds`.
    Samples {
        /// CPU nanoseconds per sample.
        period_ns: i64,
    },
    /// Microseconds of something (`name`, e.g. off-CPU time): one value
    /// `name/nanoseconds`.
    Micros {
        /// The sample type's name.
        name: &'static str,
    },
}

/// What a pprof file says about the run besides the stacks.
pub struct Meta<'a> {
    /// What counts are.
    pub weight: Weight,
    /// Wall-clock start, ns since the epoch.
    pub time_nanos: i64,
    /// Length of the run.
    pub duration_nanos: i64,
    /// Build IDs (hex) by module path.
    pub build_ids: &'a HashMap<String, String>,
    /// A line for `go tool pprof -comments`.
    pub comment: String,
}

/// Encodes `stacks` as a gzipped pprof profile with `samples/count` and
/// `cpu/nanoseconds` values; one function per (name, file), one location per
/// (module, function, line), pid and process name as labels.
pub fn encode(stacks: &[Stack], meta: &Meta<'_>) -> Vec<u8> {
    let mut st = Strings::default();
    st.id("");
    let mut p = Profile { time_nanos: meta.time_nanos, duration_nanos: meta.duration_nanos, ..Default::default() };
    let main = match meta.weight {
        Weight::Samples { period_ns } => {
            p.sample_type = vec![
                ValueType { r#type: st.id("samples"), unit: st.id("count") },
                ValueType { r#type: st.id("cpu"), unit: st.id("nanoseconds") },
            ];
            p.period = period_ns;
            "cpu"
        }
        Weight::Micros { name } => {
            p.sample_type = vec![ValueType { r#type: st.id(name), unit: st.id("nanoseconds") }];
            p.period = 1000;
            name
        }
    };
    p.period_type = Some(ValueType { r#type: st.id(main), unit: st.id("nanoseconds") });
    p.comment.push(st.id(&meta.comment));
    p.default_sample_type = st.id(main);
    let mut mappings: HashMap<String, u64> = HashMap::new();
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut locations: HashMap<(u64, u64, i64), u64> = HashMap::new();
    let (k_pid, k_proc, k_tid) = (st.id("pid"), st.id("process"), st.id("tid"));
    // pprof names the profile after its first mapping: make that the
    // programs' own executables.
    let mut add_mapping = |module: &str, p: &mut Profile, st: &mut Strings| -> u64 {
        if let Some(&id) = mappings.get(module) {
            return id;
        }
        let id = mappings.len() as u64 + 1;
        let build_id = meta.build_ids.get(module).cloned().unwrap_or_default();
        p.mapping.push(Mapping {
            id,
            filename: st.id(module),
            build_id: st.id(&build_id),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        mappings.insert(module.to_string(), id);
        id
    };
    for s in stacks {
        let user = || s.frames.iter().filter(|f| matches!(f.kind, FrameKind::User | FrameKind::Go));
        // The executable: the file named like the process (comm is cut at
        // 15 bytes), else the outermost user frame's.
        let base = |m: &str| m.rsplit('/').next().unwrap_or(m).to_string();
        let exe =
            user().find(|f| !s.process.is_empty() && base(&f.module).starts_with(&s.process)).or_else(|| user().next());
        if let Some(f) = exe {
            add_mapping(&f.module, &mut p, &mut st);
        }
    }
    for s in stacks {
        let mut ids = Vec::with_capacity(s.frames.len());
        // pprof wants the leaf first.
        for f in s.frames.iter().rev() {
            let module = match f.kind {
                FrameKind::Kernel => "[kernel.kallsyms]".to_string(),
                _ => f.module.to_string(),
            };
            let mid = add_mapping(&module, &mut p, &mut st);
            let file = f.file.clone().unwrap_or_default();
            let next_f = functions.len() as u64 + 1;
            let fid = *functions.entry((f.name.clone(), file.clone())).or_insert_with(|| {
                let name = st.id(&f.name);
                p.function.push(Function { id: next_f, name, system_name: name, filename: st.id(&file) });
                next_f
            });
            let line = f.line.unwrap_or(0) as i64;
            let next_l = locations.len() as u64 + 1;
            let lid = *locations.entry((mid, fid, line)).or_insert_with(|| {
                p.location.push(Location { id: next_l, mapping_id: mid, line: vec![Line { function_id: fid, line }] });
                next_l
            });
            ids.push(lid);
        }
        let mut label = vec![
            Label { key: k_pid, num: s.pid as i64, ..Default::default() },
            Label { key: k_proc, str: st.id(&s.process), ..Default::default() },
        ];
        if s.tid != 0 {
            label.push(Label { key: k_tid, num: s.tid as i64, ..Default::default() });
        }
        let value = match meta.weight {
            Weight::Samples { period_ns } => vec![s.count as i64, s.count as i64 * period_ns],
            Weight::Micros { .. } => vec![s.count as i64 * 1000],
        };
        p.sample.push(Sample { location_id: ids, value, label });
    }
    p.string_table = st.table;
    p.encode_to_vec()
}

/// Writes `stacks` to `path` as a gzipped pprof profile.
pub fn write(path: &Path, stacks: &[Stack], meta: &Meta<'_>) -> anyhow::Result<()> {
    let raw = encode(stacks, meta);
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    gz.write_all(&raw)?;
    gz.finish().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
