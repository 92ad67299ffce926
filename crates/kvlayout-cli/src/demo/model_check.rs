//! One side's rank layout against the model: the merge of the preset's and the modifiers'
//! `key=value` tokens into one spec, and the refusal of a prefill layout whose heads or head
//! sizes are not the model's (naming `--prefill` and both values).
//!
//! It owns these two checks on spec strings and layouts; it does not parse the layouts (the
//! scenario does, with `kvlayout`'s parser).

use kvlayout::ops::decode_widths;
use kvlayout::KvCacheLayout;

use super::DemoArgs;
use crate::CliError;

/// `tokens` with `key=value` tokens merged, later ones winning (a token without `=` is its
/// own key): the spec grammar takes each key once.
pub(crate) fn merge<'a>(tokens: impl Iterator<Item = &'a str>) -> String {
    let mut out: Vec<(&str, String)> = Vec::new();
    for t in tokens {
        let key = t.split_once('=').map_or(t, |(k, _)| k);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = t.to_string(),
            None => out.push((key, t.to_string())),
        }
    }
    out.into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Refuses a prefill rank layout whose heads or head sizes disagree with the model: the
/// prefill side writes the model's keys and values, so its layout must hold them.
pub(crate) fn check_against_model(
    layout: &KvCacheLayout,
    model: &KvCacheLayout,
    a: &DemoArgs,
    tp: u64,
    heads: u64,
) -> Result<(), CliError> {
    let model_heads = model.geometry().num_kv_heads;
    let h = layout.geometry().num_kv_heads;
    if h != heads {
        return Err(CliError::Usage(format!(
            "--prefill: its layout has H={h}, but one prefill rank of --prefill-tp {tp} holds \
             {heads} of the {model_heads} KV heads of --preset {:?}",
            a.preset
        )));
    }
    let want = decode_widths(model).ok();
    let got = decode_widths(layout).ok();
    if got != want {
        let widths = |w: Option<(u64, u64)>| {
            w.map_or("no keys and values".to_string(), |(k, v)| {
                format!("key width {k}, value width {v}")
            })
        };
        return Err(CliError::Usage(format!(
            "--prefill: its layout has {}, the model (--preset {:?}) has {}",
            widths(got),
            a.preset,
            widths(want)
        )));
    }
    Ok(())
}
