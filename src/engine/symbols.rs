//! Kernel address symbolization (kallsyms) through blazesym, one cached symbolizer.
use blazesym::symbolize::{
    source::{Kernel, Source},
    Input, Symbolized, Symbolizer,
};

/// Symbolizes kernel addresses; cheap to call repeatedly.
pub struct KernelSymbols {
    symbolizer: Symbolizer,
}

impl Default for KernelSymbols {
    fn default() -> Self {
        Self { symbolizer: Symbolizer::new() }
    }
}

impl KernelSymbols {
    /// `name+0xoff` for each address, `[unknown]` where kallsyms has nothing.
    pub fn names(&self, addrs: &[u64]) -> Vec<String> {
        let src = Source::Kernel(Kernel::default());
        match self.symbolizer.symbolize(&src, Input::AbsAddr(addrs)) {
            Ok(syms) => syms
                .into_iter()
                .map(|s| match s {
                    Symbolized::Sym(sym) => format!("{}+{:#x}", sym.name, sym.offset),
                    Symbolized::Unknown(_) => "[unknown]".to_string(),
                })
                .collect(),
            Err(_) => addrs.iter().map(|a| format!("{a:#x}")).collect(),
        }
    }
}
