//! The versioned JSON form of a layout: `{"version": 2, "geometry": .., "content": .., ..}`.
//!
//! Version 2 names another engine's tensor placement `"kind": "tensor"`; version 1 named it
//! `"legacy"`. Both versions are read, and either name in either; version 2 is written.

use serde::{Deserialize, Serialize};

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::LayoutSpec;

/// Version written by this crate.
pub const JSON_VERSION: u32 = 2;

/// Versions this crate reads.
pub const JSON_VERSIONS_READ: [u32; 2] = [1, 2];

/// The on-disk document: a version number and the spec's parts. Unknown keys are refused
/// (a misspelt `page_size_padded` must not silently give a dense page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutDocument {
    /// Format version: one of [`JSON_VERSIONS_READ`].
    pub version: u32,
    /// Axis extents.
    pub geometry: crate::Geometry,
    /// Content row.
    pub content: crate::Content,
    /// Element type.
    pub dtype: crate::DType,
    /// Per-tensor scales.
    #[serde(default)]
    pub scales: crate::TensorScales,
    /// Placement.
    pub placement: crate::Placement,
}

impl LayoutDocument {
    fn spec(self) -> LayoutSpec {
        LayoutSpec {
            geometry: self.geometry,
            content: self.content,
            dtype: self.dtype,
            scales: self.scales,
            placement: self.placement,
        }
    }
}

impl TryFrom<LayoutDocument> for KvCacheLayout {
    type Error = LayoutError;
    fn try_from(doc: LayoutDocument) -> Result<Self> {
        if !JSON_VERSIONS_READ.contains(&doc.version) {
            return Err(LayoutError::Json(format!(
                "unsupported version {} (this build reads versions 1 and 2)",
                doc.version
            )));
        }
        KvCacheLayout::new(doc.spec())
    }
}

impl From<KvCacheLayout> for LayoutDocument {
    fn from(layout: KvCacheLayout) -> Self {
        let s = layout.spec().clone();
        LayoutDocument {
            version: JSON_VERSION,
            geometry: s.geometry,
            content: s.content,
            dtype: s.dtype,
            scales: s.scales,
            placement: s.placement,
        }
    }
}

impl Serialize for KvCacheLayout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        LayoutDocument::from(self.clone()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for KvCacheLayout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let doc = LayoutDocument::deserialize(d)?;
        KvCacheLayout::try_from(doc).map_err(serde::de::Error::custom)
    }
}

impl KvCacheLayout {
    /// Parses and validates the versioned JSON form.
    ///
    /// ```
    /// use kvlayout::KvCacheLayout;
    /// let a = kvlayout::preset("llama-3-8b")?;
    /// let b = KvCacheLayout::from_json(&a.to_json())?;
    /// assert_eq!(a, b);
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self> {
        let doc: LayoutDocument =
            serde_json::from_str(text).map_err(|e| LayoutError::Json(e.to_string()))?;
        KvCacheLayout::try_from(doc)
    }

    /// The versioned JSON form, pretty-printed.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&LayoutDocument::from(self.clone()))
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_and_aliases_accepted() {
        let l = crate::preset("llama-3-8b").unwrap();
        let json = l.to_json();
        assert_eq!(KvCacheLayout::from_json(&json).unwrap(), l);
        let typo = json.replace("\"base_offset\"", "\"base_ofset\"");
        assert!(
            matches!(KvCacheLayout::from_json(&typo), Err(LayoutError::Json(m)) if m.contains("base_ofset"))
        );
        let top = json.replacen("\"version\"", "\"extra\": 1, \"version\"", 1);
        assert!(KvCacheLayout::from_json(&top).is_err());
        let content = json.replace("\"head_size_v\"", "\"head_size_w\"");
        assert!(KvCacheLayout::from_json(&content).is_err());
        let nhd = json.replace("\"LBNHC\"", "\"NHD\"");
        assert_eq!(KvCacheLayout::from_json(&nhd).unwrap(), l);
    }

    /// Version 2 is written; a version 1 document, with `"legacy"`, is read; others refused.
    #[test]
    fn version_2_is_written_and_version_1_read() {
        let l: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-hnd"
            .parse()
            .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&l.to_json()).unwrap();
        assert_eq!(doc["version"], 2);
        assert_eq!(doc["placement"]["kind"], "tensor");
        let mut v1 = doc.clone();
        v1["version"] = 1.into();
        v1["placement"]["kind"] = "legacy".into();
        assert_eq!(KvCacheLayout::from_json(&v1.to_string()).unwrap(), l);
        let mut v3 = doc;
        v3["version"] = 3.into();
        assert_eq!(
            KvCacheLayout::from_json(&v3.to_string()),
            Err(LayoutError::Json(
                "unsupported version 3 (this build reads versions 1 and 2)".into()
            ))
        );
    }
}
