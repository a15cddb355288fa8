//! STUB (replaced by the http branch).
#![allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct WebConfig;
impl WebConfig {
    pub fn load(_p: &std::path::Path) -> anyhow::Result<Self> {
        Ok(Self)
    }
    pub fn tls(&self) -> bool {
        false
    }
}
