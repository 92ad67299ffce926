//! `kvlayout convert`: re-lays a dump in another layout through a backend's `convert` op (the
//! movers), and writes the result as a dump.
//!
//! The op decides: layouts of other content or geometry are refused with its reason before
//! anything is allocated. The destination starts zeroed, so its padding holds zero; the
//! source's `pattern` and decode step (block table, queries, output) are carried over, since
//! a conversion moves elements without changing them. It owns none of the addresses.

use std::path::PathBuf;

use kvlayout::ops::{Backend, BlockMove, BufferShape};
use serde::Serialize;

use crate::dump::{self, Dump};
use crate::CliError;

/// What `kvlayout convert` was asked for (besides the input dump).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConvertArgs {
    /// The layout to convert to.
    #[arg(long = "to", value_name = "SPEC", help = crate::SPEC_HELP)]
    pub to: String,
    /// The dump to write (safetensors).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Backend whose movers run the conversion: cpu, reference, cuda-emu, hip-emu, cuda, hip.
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    pub backend: String,
    /// Largest cache to write, in GiB.
    #[arg(long, value_name = "GIB", default_value_t = 8.0)]
    pub max_cache_gib: f64,
    /// Print the record as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `convert` wrote.
#[derive(Debug, Serialize)]
struct ConvertRecord {
    input: String,
    out: String,
    from: String,
    to: String,
    backend: String,
    /// Bytes of each buffer written (tensor `buffer<i>`).
    buffer_bytes: Vec<u64>,
    pattern: Option<String>,
    /// Whether the input's decode step went along.
    step: bool,
}

fn failed(e: String) -> CliError {
    CliError::Failed(e)
}

/// `convert`: reads `input`, converts its cache to `a.to`, writes `a.out`.
pub(crate) fn run(input: &str, a: &ConvertArgs) -> Result<String, CliError> {
    let src = dump::read::read(input.as_ref())?;
    let to = crate::load(&a.to)?;
    // The op's own check, before any allocation.
    BlockMove::Convert.plan(Some(&src.layout), &to)?;
    let zeros = crate::fill::zeroed_buffers(&to, a.max_cache_gib)?;
    let be = crate::common::backend::open(&a.backend, None)?;
    let mut src_cache = be
        .alloc_cache(&src.layout, &BufferShape::exact(&src.layout))
        .map_err(failed)?;
    be.upload_cache(&mut src_cache, &src.buffers)
        .map_err(failed)?;
    let mut dst_cache = be
        .alloc_cache(&to, &BufferShape::exact(&to))
        .map_err(failed)?;
    be.upload_cache(&mut dst_cache, &zeros).map_err(failed)?;
    drop(zeros);
    let done = be.convert(&src_cache, &mut dst_cache)?;
    be.wait(done).map_err(failed)?;
    let buffers = be.download_cache(&dst_cache).map_err(failed)?;
    let record = ConvertRecord {
        input: input.to_string(),
        out: a.out.display().to_string(),
        from: src.layout.to_string(),
        to: to.to_string(),
        backend: be.name().to_string(),
        buffer_bytes: buffers.iter().map(|b| b.len() as u64).collect(),
        pattern: src.pattern.clone(),
        step: src.step.is_some(),
    };
    let out = Dump {
        layout: to,
        buffers,
        pattern: src.pattern,
        step: src.step,
    };
    dump::write::write(&out, &a.out, &format!("convert --backend {}", a.backend))?;
    if a.json {
        return crate::json(&record);
    }
    Ok(format!(
        "wrote {}: {} -> {} on {} ({} buffers: {:?} bytes), pattern {}{}\n",
        record.out,
        record.from,
        record.to,
        record.backend,
        record.buffer_bytes.len(),
        record.buffer_bytes,
        record.pattern.as_deref().unwrap_or("unknown"),
        if record.step {
            ", with the decode step"
        } else {
            ""
        }
    ))
}
