//! Strict reading of a dump: the metadata's layout is the statement, and every tensor is
//! checked against it. The first disagreement is the error, in this order:
//!
//! 1. the file: at least the 8 bytes of the header length; a header of at most
//!    [`HEADER_LIMIT`] bytes that the file holds; a header the `safetensors` crate accepts
//!    (UTF-8 JSON, contiguous offsets, each tensor's bytes its shape times its dtype); tensor
//!    data that ends exactly at the end of the file;
//! 2. the metadata: `format`, `format_version`, `writer`, then `layout` (a valid layout) and
//!    `decode` (a valid step over that layout), where present;
//! 3. the tensors: `buffer0`, `buffer1`, ... in order (present, `U8`, shape `[extent.end]`),
//!    then the step's tensors (`block_table`, `seq_lens`, `query`, `output`), then any tensor
//!    the layout and the step do not account for.
//!
//! Every size is checked against the file's length before anything of that size is
//! allocated, and the header is read with a bounded size. The file's shapes never define
//! anything: they are compared with what the layout says. It does not check the step's
//! values (block ids, lengths): the decode op does.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use kvlayout::ops::decode_widths;
use kvlayout::KvCacheLayout;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};

use super::{buffer_name, Dump, Step, StepMeta, FORMAT, FORMAT_VERSION, STEP_TENSORS};
use crate::CliError;

/// Largest header this reader accepts, in bytes (a dump's header is kilobytes: the layout,
/// and a view per field and layer).
pub(crate) const HEADER_LIMIT: u64 = 16 << 20;

/// One tensor the layout (and the step) account for.
struct Expected {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    /// What states the shape, for the message.
    why: String,
    optional: bool,
}

/// Reads and checks the dump at `path`.
pub(crate) fn read(path: &Path) -> Result<Dump, CliError> {
    let bad = |detail: String| CliError::File {
        path: path.display().to_string(),
        detail,
    };
    let io = |e: std::io::Error| bad(format!("cannot read: {e}"));
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let (header_len, meta) = read_header(&mut file, file_len).map_err(&bad)?;
    let dump_meta = meta
        .metadata()
        .as_ref()
        .ok_or_else(|| bad("the header has no __metadata__: not a kvlayout dump".into()))?;
    let (layout, step_meta) = check_metadata(dump_meta).map_err(&bad)?;
    let expected = expected_tensors(&layout, step_meta.as_ref());
    let infos = meta.tensors();
    check_tensors(&expected, &infos).map_err(&bad)?;

    let data_start = 8 + header_len;
    let mut data: HashMap<&str, Vec<u8>> = HashMap::new();
    for e in &expected {
        let Some(info) = infos.get(&e.name) else {
            continue;
        };
        let (begin, end) = info.data_offsets;
        let len = end - begin;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| bad(format!("cannot allocate {len} bytes for tensor {}", e.name)))?;
        bytes.resize(len, 0);
        file.seek(SeekFrom::Start(data_start + begin as u64))
            .map_err(io)?;
        file.read_exact(&mut bytes).map_err(io)?;
        data.insert(&e.name, bytes);
    }
    let buffers = (0..layout.num_buffers())
        .map(|i| data.remove(buffer_name(i).as_str()).unwrap_or_default())
        .collect();
    let step = step_meta.map(|meta| {
        let mut take = |name: &str| data.remove(name);
        Step {
            block_table: i32s(&take("block_table").unwrap_or_default()),
            seq_lens: i32s(&take("seq_lens").unwrap_or_default()),
            query: f32s(&take("query").unwrap_or_default()),
            output: take("output").map(|b| f32s(&b)),
            meta,
        }
    });
    Ok(Dump {
        layout,
        buffers,
        pattern: dump_meta.get("pattern").cloned(),
        step,
    })
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads the header length and the header (bounded), parses it with the `safetensors`
/// crate, and checks that the tensor data ends at the end of the file.
fn read_header(file: &mut File, file_len: u64) -> Result<(u64, Metadata), String> {
    let io = |e: std::io::Error| format!("cannot read: {e}");
    if file_len < 8 {
        return Err(format!(
            "truncated: {file_len} bytes, fewer than the 8 of the header length"
        ));
    }
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes).map_err(io)?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > HEADER_LIMIT {
        return Err(format!(
            "declares a header of {header_len} bytes, more than the {HEADER_LIMIT} this reader \
             accepts"
        ));
    }
    let after = file_len - 8;
    if header_len > after {
        return Err(format!(
            "truncated: declares a header of {header_len} bytes; {after} bytes follow the \
             header length"
        ));
    }
    // At most HEADER_LIMIT bytes, and no more than the file holds.
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let text = std::str::from_utf8(&header).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let meta: Metadata =
        serde_json::from_str(text).map_err(|e| format!("header is no safetensors header: {e}"))?;
    let data_len = meta.data_len() as u64;
    let held = after - header_len;
    if data_len > held {
        return Err(format!(
            "truncated: the header's tensors take {data_len} bytes; {held} bytes follow the \
             header"
        ));
    }
    if data_len < held {
        return Err(format!(
            "{} bytes after the last tensor (the header's tensors take {data_len} bytes)",
            held - data_len
        ));
    }
    Ok((header_len, meta))
}

/// Checks the dump's metadata keys; returns the layout and the step's metadata, if any.
fn check_metadata(
    meta: &HashMap<String, String>,
) -> Result<(KvCacheLayout, Option<StepMeta>), String> {
    let get = |key: &str| {
        meta.get(key)
            .ok_or_else(|| format!("the metadata has no {key:?}: not a kvlayout dump"))
    };
    let format = get("format")?;
    if format != FORMAT {
        return Err(format!("metadata format {format:?}, expected {FORMAT:?}"));
    }
    let version = get("format_version")?;
    if version != FORMAT_VERSION {
        return Err(format!(
            "metadata format_version {version:?}; this kvlayout reads version {FORMAT_VERSION:?}"
        ));
    }
    get("writer")?;
    let layout =
        KvCacheLayout::from_json(get("layout")?).map_err(|e| format!("metadata layout: {e}"))?;
    let step = match meta.get("decode") {
        None => None,
        Some(text) => {
            let step: StepMeta =
                serde_json::from_str(text).map_err(|e| format!("metadata decode: {e}"))?;
            let (qk, vw) = decode_widths(&layout).map_err(|e| format!("metadata decode: {e}"))?;
            for (what, stated, width) in [
                ("qk_width", step.qk_width, qk),
                ("v_width", step.v_width, vw),
            ] {
                if stated != width {
                    return Err(format!(
                        "metadata decode: {what} {stated}; the layout's rows give {width}"
                    ));
                }
            }
            Some(step)
        }
    };
    Ok((layout, step))
}

/// The tensors a dump of `layout` (and `step`) holds, in the order they are checked.
fn expected_tensors(layout: &KvCacheLayout, step: Option<&StepMeta>) -> Vec<Expected> {
    let mut out: Vec<Expected> = layout
        .extents()
        .iter()
        .enumerate()
        .map(|(i, x)| Expected {
            name: buffer_name(i),
            dtype: Dtype::U8,
            shape: vec![x.end],
            why: format!("buffer {i} of the layout ends at byte {}", x.end),
            optional: false,
        })
        .collect();
    if let Some(s) = step {
        let shapes: [(Dtype, Vec<u64>, &str); 4] = [
            (
                Dtype::I32,
                s.table_shape().to_vec(),
                "[seqs, blocks_per_seq]",
            ),
            (Dtype::I32, vec![s.seqs], "[seqs]"),
            (
                Dtype::F32,
                s.query_shape().to_vec(),
                "[seqs, q_heads, qk_width]",
            ),
            (
                Dtype::F32,
                s.output_shape().to_vec(),
                "[seqs, q_heads, v_width]",
            ),
        ];
        for (name, (dtype, shape, axes)) in STEP_TENSORS.iter().zip(shapes) {
            out.push(Expected {
                name: name.to_string(),
                dtype,
                shape,
                why: format!("the decode metadata states {axes}"),
                optional: *name == "output",
            });
        }
    }
    out
}

/// Compares the header's tensors with the expected ones: the first disagreement.
fn check_tensors(
    expected: &[Expected],
    infos: &HashMap<String, &TensorInfo>,
) -> Result<(), String> {
    for e in expected {
        let Some(info) = infos.get(&e.name) else {
            if e.optional {
                continue;
            }
            return Err(format!("no tensor {} ({})", e.name, e.why));
        };
        if info.dtype != e.dtype {
            return Err(format!(
                "tensor {} is {:?}, expected {:?}",
                e.name, info.dtype, e.dtype
            ));
        }
        let shape: Vec<u64> = info.shape.iter().map(|&x| x as u64).collect();
        if shape != e.shape {
            return Err(format!(
                "tensor {} has shape {shape:?}, expected {:?} ({})",
                e.name, e.shape, e.why
            ));
        }
        // The crate checked bytes = elements x dtype size; this states it against the layout.
        let bytes = (info.data_offsets.1 - info.data_offsets.0) as u64;
        let want = e
            .shape
            .iter()
            .try_fold((info.dtype.bitsize() / 8) as u64, |n, &x| n.checked_mul(x));
        if Some(bytes) != want {
            let want = want.map_or("more than 2^64".into(), |w| w.to_string());
            return Err(format!(
                "tensor {} holds {bytes} bytes, expected {want}",
                e.name
            ));
        }
    }
    let mut extra: Vec<&String> = infos
        .keys()
        .filter(|name| !expected.iter().any(|e| &e.name == *name))
        .collect();
    extra.sort();
    if let Some(name) = extra.first() {
        let buffers = expected.iter().filter(|e| e.dtype == Dtype::U8).count();
        return Err(format!(
            "unexpected tensor {name} (the layout has {buffers} buffers{})",
            if expected.len() > buffers {
                ", and the decode step its four tensors"
            } else {
                ""
            }
        ));
    }
    Ok(())
}
