//! Writing a [`Dump`] as a safetensors file (the `safetensors` crate): the metadata the
//! format states (see [`super`]) and one tensor per buffer, plus the step's tensors.
//!
//! It does not decide what the cache holds, and never computes a view: the `views` key is
//! what `layout.view(convention, field, layer)` returns, or its refusal.

use std::collections::HashMap;
use std::path::Path;

use kvlayout::{Convention, KvCacheLayout, ViewTarget};
use safetensors::tensor::{Dtype, TensorView};

use super::{buffer_name, Dump, FORMAT, FORMAT_VERSION};
use crate::CliError;

/// Conventions tried for a field's view, in order: the standard `[block, head, token, dim]`
/// view, else vLLM's paged-attention view (the x-split key `[block, head, dim / x, token, x]`).
const VIEW_CONVENTIONS: [Convention; 2] = [Convention::Standard, Convention::VllmPagedV1];

/// The `views` metadata: for every readable field in every layer, the view of the first
/// convention of [`VIEW_CONVENTIONS`] that has one, or why the standard one is refused.
fn views(layout: &KvCacheLayout) -> serde_json::Value {
    let mut out = Vec::new();
    for layer in 0..layout.geometry().num_layers {
        for field in layout.readable_fields() {
            let target = ViewTarget::Field(field);
            let found = VIEW_CONVENTIONS
                .iter()
                .find_map(|&c| layout.view(c, target, layer).ok().map(|v| (c, v)));
            let mut entry = serde_json::json!({"field": field.to_string(), "layer": layer});
            match found {
                Some((c, v)) => {
                    entry["convention"] = c.to_string().into();
                    if let (Some(entry), Ok(serde_json::Value::Object(view))) =
                        (entry.as_object_mut(), serde_json::to_value(&v))
                    {
                        entry.extend(view);
                    }
                }
                None => {
                    let why = layout.view(Convention::Standard, target, layer).err();
                    entry["convention"] = Convention::Standard.to_string().into();
                    entry["refused"] = why.map(|e| e.to_string()).unwrap_or_default().into();
                }
            }
            out.push(entry);
        }
    }
    serde_json::Value::Array(out)
}

fn le_bytes<T: Copy, const N: usize>(xs: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(|&x| to(x)).collect()
}

/// Writes `dump` to `path`; `writer` names the command (`fill --pattern coords`, ...).
pub(crate) fn write(dump: &Dump, path: &Path, writer: &str) -> Result<(), CliError> {
    let file_error = |detail: String| CliError::File {
        path: path.display().to_string(),
        detail,
    };
    let layout = &dump.layout;
    let mut meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("format_version".to_string(), FORMAT_VERSION.to_string()),
        (
            "writer".to_string(),
            format!("kvlayout {} ({writer})", env!("CARGO_PKG_VERSION")),
        ),
        ("layout".to_string(), layout.to_json()),
        ("views".to_string(), views(layout).to_string()),
        ("padding".to_string(), "zero".to_string()),
    ]);
    if let Some(p) = &dump.pattern {
        meta.insert("pattern".into(), p.clone());
    }
    // Owned bytes of the step's tensors, then views of every tensor.
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    if let Some(step) = &dump.step {
        let m = &step.meta;
        let json = serde_json::to_string(m).map_err(|e| file_error(e.to_string()))?;
        meta.insert("decode".into(), json);
        let shape = |s: &[u64]| s.iter().map(|&x| x as usize).collect::<Vec<_>>();
        owned.push((
            "block_table".into(),
            Dtype::I32,
            shape(&m.table_shape()),
            le_bytes(&step.block_table, i32::to_le_bytes),
        ));
        owned.push((
            "seq_lens".into(),
            Dtype::I32,
            vec![step.seq_lens.len()],
            le_bytes(&step.seq_lens, i32::to_le_bytes),
        ));
        owned.push((
            "query".into(),
            Dtype::F32,
            shape(&m.query_shape()),
            le_bytes(&step.query, f32::to_le_bytes),
        ));
        if let Some(out) = &step.output {
            owned.push((
                "output".into(),
                Dtype::F32,
                shape(&m.output_shape()),
                le_bytes(out, f32::to_le_bytes),
            ));
        }
    }
    let mut tensors: Vec<(String, TensorView<'_>)> = Vec::new();
    let view = |dtype, shape, data| {
        TensorView::new(dtype, shape, data).map_err(|e| file_error(format!("cannot write: {e}")))
    };
    for (i, bytes) in dump.buffers.iter().enumerate() {
        tensors.push((buffer_name(i), view(Dtype::U8, vec![bytes.len()], bytes)?));
    }
    for (name, dtype, shape, bytes) in &owned {
        tensors.push((name.clone(), view(*dtype, shape.clone(), bytes)?));
    }
    safetensors::serialize_to_file(tensors, Some(meta), path)
        .map_err(|e| file_error(format!("cannot write: {e}")))
}
