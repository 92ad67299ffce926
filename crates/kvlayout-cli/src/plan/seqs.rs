//! The sequences of `kvlayout plan`: the `--seq SRC_BLOCKS:DST_BLOCKS[:TOKENS]` syntax, its
//! limits; with no `--seq`, the one default sequence ([`default_seq()`]).
//!
//! It owns reading block ids and token counts from the command line, not their checks
//! against the layouts (block ids in range, enough blocks for the tokens, a block written
//! twice): the connector's planner makes those, and its refusal is what the user sees.

use kvlayout::KvCacheLayout;
use kvlayout_connector::plan::SeqBlocks;

use super::default_seq::default_seq;
use crate::CliError;

/// Most block ids one side may list over all sequences: a plan is read, not run, here, and
/// the planner holds every run of it in memory.
pub(crate) const MAX_BLOCK_IDS: usize = 1024;

/// The syntax, for error messages.
const SYNTAX: &str = "SRC_BLOCKS:DST_BLOCKS[:TOKENS], e.g. 3,7,1:5,2:40";

/// A comma-separated list of block ids (`what` names the side for errors).
fn block_ids(arg: &str, what: &str, text: &str) -> Result<Vec<u64>, CliError> {
    let usage = |m: String| CliError::Usage(format!("--seq '{arg}': {m}"));
    if text.trim().is_empty() {
        return Err(usage(format!("no {what} block ids (expected {SYNTAX})")));
    }
    text.split(',')
        .map(|id| {
            let id = id.trim();
            id.parse::<u64>().map_err(|e| {
                usage(format!(
                    "{what} block id '{id}' is not a whole number in 0..={}: {e}",
                    u64::MAX
                ))
            })
        })
        .collect()
}

/// One `--seq` value as written: SRC block ids, DST block ids, tokens if given.
type SeqArg = (Vec<u64>, Vec<u64>, Option<u64>);

/// One `--seq` value. Tokens default to what the shorter side's blocks hold (`None` here).
fn parse_seq(arg: &str) -> Result<SeqArg, CliError> {
    let parts: Vec<&str> = arg.split(':').collect();
    let (src, dst, tokens) = match parts.as_slice() {
        [src, dst] => (*src, *dst, None),
        [src, dst, tokens] => (*src, *dst, Some(*tokens)),
        _ => {
            return Err(CliError::Usage(format!(
                "--seq '{arg}' has {} ':'-separated parts, expected {SYNTAX}",
                parts.len()
            )))
        }
    };
    let tokens = tokens
        .map(|t| {
            t.trim().parse::<u64>().map_err(|e| {
                CliError::Usage(format!(
                    "--seq '{arg}': token count '{t}' is not a whole number in 0..={}: {e}",
                    u64::MAX
                ))
            })
        })
        .transpose()?;
    Ok((
        block_ids(arg, "SRC", src)?,
        block_ids(arg, "DST", dst)?,
        tokens,
    ))
}

/// The sequences of `--seq` values, their token counts defaulted to what the shorter side's
/// blocks hold (blocks times the side's `block_size`), or, with no `--seq`, the default
/// sequence ([`default_seq()`]: whole blocks on both sides, within both pools).
pub(crate) fn sequences(
    args: &[String],
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
) -> Result<Vec<SeqBlocks>, CliError> {
    if args.is_empty() {
        return Ok(vec![default_seq(src, dst).seq]);
    }
    let mut out = Vec::with_capacity(args.len());
    let (mut src_ids, mut dst_ids) = (0usize, 0usize);
    for arg in args {
        let (remote, local, tokens) = parse_seq(arg)?;
        src_ids = src_ids.saturating_add(remote.len());
        dst_ids = dst_ids.saturating_add(local.len());
        if src_ids.max(dst_ids) > MAX_BLOCK_IDS {
            return Err(CliError::Usage(format!(
                "the --seq values list {} SRC and {} DST block ids so far, over the limit of \
                 {MAX_BLOCK_IDS} per side",
                src_ids, dst_ids
            )));
        }
        let held = |blocks: &[u64], layout: &KvCacheLayout| {
            (blocks.len() as u64).saturating_mul(layout.geometry().block_size)
        };
        let tokens = tokens.unwrap_or_else(|| held(&remote, src).min(held(&local, dst)));
        out.push(SeqBlocks {
            remote,
            local,
            tokens,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(n: u64) -> KvCacheLayout {
        format!("kv L=1 B=8 N={n} H=4 D=8 dtype=f16 order=NHD")
            .parse()
            .unwrap()
    }

    #[test]
    fn a_seq_reads_both_block_lists_and_its_tokens() {
        let (s, d) = (layout(16), layout(32));
        let seqs = sequences(&["3,7,1:5,2:40".into(), "0, 9:6".into()], &s, &d).unwrap();
        assert_eq!(seqs[0].remote, vec![3, 7, 1]);
        assert_eq!(seqs[0].local, vec![5, 2]);
        assert_eq!(seqs[0].tokens, 40);
        // Two SRC blocks of 16 hold 32 tokens, one DST block of 32 holds 32.
        assert_eq!(seqs[1].remote, vec![0, 9]);
        assert_eq!(seqs[1].tokens, 32);
        let one = sequences(&["0,1,2:4".into()], &s, &d).unwrap();
        assert_eq!(one[0].tokens, 32, "the shorter side: one DST block");
    }

    #[test]
    fn malformed_seqs_name_the_bad_part() {
        let l = layout(16);
        for (arg, says) in [
            ("1,2", "1 ':'-separated parts"),
            ("1:2:3:4", "4 ':'-separated parts"),
            (":2", "no SRC block ids"),
            ("1:", "no DST block ids"),
            ("1,x:2", "SRC block id 'x'"),
            ("1:-2", "DST block id '-2'"),
            ("1:2:-5", "token count '-5'"),
            (
                "1:18446744073709551616",
                "DST block id '18446744073709551616'",
            ),
        ] {
            let Err(CliError::Usage(m)) = sequences(&[arg.into()], &l, &l) else {
                panic!("{arg} accepted");
            };
            assert!(m.contains(says), "{arg}: {m}");
        }
    }

    #[test]
    fn too_many_block_ids_are_refused_before_planning() {
        let l = layout(16);
        let ids = vec!["1"; MAX_BLOCK_IDS + 1].join(",");
        let Err(CliError::Usage(m)) = sequences(&[format!("{ids}:0")], &l, &l) else {
            panic!("accepted");
        };
        assert!(m.contains("over the limit of 1024"), "{m}");
    }
}
