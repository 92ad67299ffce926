//! `kvlayout decode --from FILE` and `--out FILE`: a decode step whose inputs come from a
//! dump, or whose inputs and output go to one.
//!
//! `--from` reads a dump strictly ([`crate::dump::read`]): its layout is the step's layout,
//! its buffers the cache (no `write_kv`). Where it holds a decode step, the step's block
//! table and queries are used and its parameters (layer, sequences, context, query heads,
//! window, soft-cap) replace the command line's; the sequences must be of one length, in
//! `ceil(context / block_size)` blocks each, as `kvlayout decode` runs them. Otherwise the
//! table and queries are generated as without `--from`. `--out` writes the cache, the block
//! table, the lengths, the queries and the output, with the step's parameters in the
//! `decode` metadata. The step itself is [`crate::decode`]'s.

use kvlayout::ops::decode_widths;

use crate::decode::{self, Given, StepArgs, StepReport};
use crate::dump::{self, Dump, Step, StepMeta};
use crate::CliError;

fn usage(m: String) -> CliError {
    CliError::Usage(m)
}

/// The command line's step with the parameters a dump's step states.
fn with_step(a: &StepArgs, step: &Step, block_size: u64) -> Result<StepArgs, CliError> {
    let m = &step.meta;
    let context = match step.seq_lens.first() {
        Some(&first) if first > 0 => first,
        Some(&first) => return Err(usage(format!("the dump's seq_lens[0] is {first}"))),
        None => return Err(usage("the dump's decode step has no sequence".into())),
    };
    if let Some(i) = step.seq_lens.iter().position(|&n| n != context) {
        return Err(usage(format!(
            "the dump's seq_lens[{i}] is {}, seq_lens[0] {context}: kvlayout decode runs \
             sequences of one length",
            step.seq_lens[i]
        )));
    }
    let per_seq = (context as u64).div_ceil(block_size);
    if m.blocks_per_seq != per_seq {
        return Err(usage(format!(
            "the dump's block table has {} blocks per sequence; sequences of {context} tokens \
             in blocks of {block_size} use {per_seq}",
            m.blocks_per_seq
        )));
    }
    let mut args = a.clone();
    args.layer = m.layer;
    args.seqs = usize::try_from(m.seqs)
        .map_err(|_| usage(format!("the dump's seqs {} exceeds this machine", m.seqs)))?;
    args.context = context as u32;
    args.q_heads = Some(m.q_heads);
    args.window = m.window;
    args.soft_cap = m.soft_cap;
    Ok(args)
}

/// `decode` with SPEC or `--from`, and `--out`: runs the step and writes its dump.
pub(crate) fn run(spec: Option<&str>, a: &StepArgs) -> Result<StepReport, CliError> {
    let from = match &a.from {
        Some(path) => Some(dump::read::read(path)?),
        None => None,
    };
    let layout = match (spec, &from) {
        (Some(spec), None) => crate::load(spec)?,
        (None, Some(d)) => d.layout.clone(),
        (Some(_), Some(_)) => {
            return Err(usage(
                "give SPEC or --from FILE, not both: a dump states its own layout".into(),
            ))
        }
        (None, None) => return Err(usage("give SPEC or --from FILE".into())),
    };
    let mut args = a.clone();
    let mut pattern = None;
    let given = match from {
        None => None,
        Some(d) => {
            if let Some(step) = &d.step {
                args = with_step(a, step, layout.geometry().block_size)?;
            }
            pattern = d.pattern;
            Some(Given {
                path: a
                    .from
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                cache: d.buffers,
                table: d.step.as_ref().map(|s| s.block_table.clone()),
                query: d.step.map(|s| s.query),
            })
        }
    };
    let Some(out) = &a.out else {
        return decode::run_step(layout, &args, given, false).map(|(report, _)| report);
    };
    let (report, record) = decode::run_step(layout.clone(), &args, given, true)?;
    let Some(record) = record else {
        return Ok(report);
    };
    let (qk_width, v_width) = decode_widths(&layout)?;
    let seq_len = i32::try_from(args.context).map_err(|_| {
        usage(format!(
            "--context {} exceeds the i32 lengths of a dump",
            args.context
        ))
    })?;
    let meta = StepMeta {
        layer: args.layer,
        seqs: args.seqs as u64,
        blocks_per_seq: record.blocks_per_seq,
        q_heads: report.q_heads,
        qk_width,
        v_width,
        window: args.window,
        soft_cap: args.soft_cap,
        backend: Some(report.backend.clone()),
    };
    let dump = Dump {
        layout,
        buffers: record.cache,
        pattern: pattern.or_else(|| {
            a.from
                .is_none()
                .then(|| format!("write_kv seed={}", args.seed))
        }),
        step: Some(Step {
            meta,
            block_table: record.table,
            seq_lens: vec![seq_len; args.seqs],
            query: record.query,
            output: Some(record.output),
        }),
    };
    dump::write::write(&dump, out, "decode")?;
    Ok(report)
}
