//! The versioned JSON form of a layout: `{"version": 1, "geometry": .., "content": .., ..}`.

use serde::{Deserialize, Serialize};

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::spec::LayoutSpec;

/// Version written by this crate and the only one it reads.
pub const JSON_VERSION: u32 = 1;

/// The on-disk document: a version number and the spec, flattened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutDocument {
    /// Format version; must be [`JSON_VERSION`].
    pub version: u32,
    /// The layout.
    #[serde(flatten)]
    pub spec: LayoutSpec,
}

impl TryFrom<LayoutDocument> for KvCacheLayout {
    type Error = LayoutError;
    fn try_from(doc: LayoutDocument) -> Result<Self> {
        if doc.version != JSON_VERSION {
            return Err(LayoutError::Json(format!(
                "unsupported version {} (this build reads version {JSON_VERSION})",
                doc.version
            )));
        }
        KvCacheLayout::new(doc.spec)
    }
}

impl From<KvCacheLayout> for LayoutDocument {
    fn from(layout: KvCacheLayout) -> Self {
        LayoutDocument {
            version: JSON_VERSION,
            spec: layout.spec().clone(),
        }
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
