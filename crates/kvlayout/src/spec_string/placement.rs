//! The placement keys of a compact spec: `tensor=` (alias `legacy=`), `order=` and its byte
//! keys, or explicit `@FIELD=` strides with `@bufI=` extents. A spec gives exactly one.

use std::collections::BTreeMap;
use std::num::IntErrorKind;

use super::{bad, Keys, Token};
use crate::error::{Result, MAX_OFFSET};
use crate::spec::{
    AxisOrder, BufferExtent, EngineTensor, Field, FieldStrides, Paged, Placement, StridedField,
};

/// A buffer index in canonical decimal: digits only, no leading zero unless it is `0`.
fn buffer_index(text: &str) -> Option<u32> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    text.parse().ok()
}

/// One bound of `@bufI=start..end`: an integer up to [`MAX_OFFSET`].
fn extent_bound(tok: &Token, what: &str, text: &str) -> Result<u64> {
    let out_of_range = || {
        bad(
            tok,
            format!("buffer extent {what} {text} is out of range (limit {MAX_OFFSET})"),
        )
    };
    match text.parse::<u64>() {
        Ok(v) if v <= MAX_OFFSET => Ok(v),
        Ok(_) => Err(out_of_range()),
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => Err(out_of_range()),
        Err(_) => Err(bad(tok, "buffer extent is start..end (integers)")),
    }
}

/// The value of `@FIELD=buf:base:layer:block:head:slot:split:chunk:dim`.
fn parse_strides(tok: &Token, value: &str) -> Result<FieldStrides> {
    let parts: Vec<&str> = value.split(':').collect();
    let nums: Vec<u64> = parts
        .iter()
        .map(|p| p.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            bad(
                tok,
                "field strides are buf:base:layer:block:head:slot:split:chunk:dim (integers)",
            )
        })?;
    let [_, base, layer, block, head, slot, split, chunk, dim] = nums[..] else {
        return Err(bad(
            tok,
            format!("field strides need 9 numbers, got {}", nums.len()),
        ));
    };
    let buffer = buffer_index(parts[0]).ok_or_else(|| {
        bad(
            tok,
            format!(
                "buffer index '{}' is not a decimal index up to {} without sign or leading zeros",
                parts[0],
                u32::MAX
            ),
        )
    })?;
    Ok(FieldStrides {
        buffer,
        base_offset: base,
        layer,
        block,
        head,
        slot,
        dim_split: split,
        dim_chunk: chunk,
        dim,
    })
}

/// The spelling of each placement given (`order=..`, `tensor=..` or `legacy=..`, `@..=`
/// strides), in column order, with the token of the second one.
fn placements_given(keys: &Keys) -> Vec<(String, Token)> {
    let mut given: Vec<(String, Token)> = Vec::new();
    for (key, (tok, _)) in &keys.map {
        let spelled = tok.text.split('=').next().unwrap_or_default();
        if key == "order" || key == "tensor" {
            given.push((format!("{spelled}=.."), tok.clone()));
        }
    }
    if let Some((_, tok)) = keys
        .map
        .iter()
        .filter(|(k, _)| k.starts_with('@'))
        .map(|(_, (tok, _))| ("@", tok))
        .min_by_key(|(_, tok)| tok.column)
    {
        given.push(("@field=.. strides".into(), tok.clone()));
    }
    given.sort_by_key(|(_, tok)| tok.column);
    given
}

/// The placement named by the remaining keys: `tensor=`, else `order=`, else `@` keys; two of
/// them are refused.
pub(super) fn parse_placement(keys: &mut Keys) -> Result<Placement> {
    let given = placements_given(keys);
    if let [(a, _), (b, second), ..] = &given[..] {
        return Err(bad(
            second,
            format!("two placements: {a} and {b}; give one"),
        ));
    }
    let explicit: Vec<String> = keys
        .map
        .keys()
        .filter(|k| k.starts_with('@'))
        .cloned()
        .collect();
    let tensors: Vec<String> = EngineTensor::NAMES.iter().map(|s| s.to_string()).collect();
    if let Some(layout) = keys.take_one_of::<EngineTensor>("tensor", &tensors)? {
        return Ok(Placement::EngineTensor {
            layout,
            base_offset: keys.take("base")?.unwrap_or(0),
        });
    }
    let orders: Vec<String> = AxisOrder::NAMES.iter().map(|s| s.to_string()).collect();
    if let Some(order) = keys.take_one_of::<AxisOrder>("order", &orders)? {
        return Ok(Placement::Paged(Paged {
            order,
            base_offset: keys.take("base")?.unwrap_or(0),
            alignment: keys.take("align")?.unwrap_or(1),
            page_size_padded: keys.take("page")?,
            layer_stride_bytes: keys.take("layer_stride")?,
            block_stride_bytes: keys.take("block_stride")?,
        }));
    }
    if explicit.is_empty() {
        return Err(bad(
            &keys.head,
            "no placement: give order=.. (e.g. LBNHC, LBHNC), tensor=.. (e.g. flashinfer-hnd) \
             or @field=.. strides",
        ));
    }
    parse_strided(keys, explicit)
}

/// The strided placement of the `@` keys `explicit`, taken out of `keys`.
fn parse_strided(keys: &mut Keys, explicit: Vec<String>) -> Result<Placement> {
    // In column order, so that a key given twice is reported at its second spelling.
    let mut entries: Vec<(String, Token, String)> = explicit
        .into_iter()
        .map(|key| {
            let (tok, value) = keys.map.remove(&key).expect("key listed above");
            (key, tok, value)
        })
        .collect();
    entries.sort_by_key(|(_, tok, _)| tok.column);
    let mut fields: Vec<(Token, StridedField)> = Vec::new();
    let mut extents: BTreeMap<u32, BufferExtent> = BTreeMap::new();
    for (key, tok, value) in entries {
        let name = &key[1..];
        if let Some(digits) = name.strip_prefix("buf") {
            let (idx, extent) = parse_extent(&tok, digits, &value)?;
            extents.insert(idx, extent);
        } else {
            let field = parse_field_name(&tok, name, &fields)?;
            let strides = parse_strides(&tok, &value)?;
            fields.push((tok, StridedField { field, strides }));
        }
    }
    check_buffers(&keys.head, &fields, &extents)?;
    let mut fields: Vec<StridedField> = fields.into_iter().map(|(_, f)| f).collect();
    fields.sort_by_key(|f| f.field);
    Ok(Placement::Strided {
        fields,
        extents: extents.into_values().collect(),
    })
}

/// One `@bufI=start..end` token: the buffer index `digits` and its extent.
fn parse_extent(tok: &Token, digits: &str, value: &str) -> Result<(u32, BufferExtent)> {
    let idx = buffer_index(digits).ok_or_else(|| {
        bad(
            tok,
            format!(
                "buffer key is @bufN, N a decimal index up to {} without sign or \
                 leading zeros",
                u32::MAX
            ),
        )
    })?;
    let (a, b) = value
        .split_once("..")
        .ok_or_else(|| bad(tok, "buffer extent is start..end"))?;
    let start = extent_bound(tok, "start", a)?;
    let end = extent_bound(tok, "end", b)?;
    Ok((idx, BufferExtent { start, end }))
}

/// The field an `@FIELD=` key names, refused when one of `given` already names it.
fn parse_field_name(tok: &Token, name: &str, given: &[(Token, StridedField)]) -> Result<Field> {
    let field: Field = name
        .parse()
        .map_err(|_| bad(tok, format!("unknown field '{name}'")))?;
    if let Some((first, _)) = given.iter().find(|(_, f)| f.field == field) {
        return Err(bad(
            tok,
            format!(
                "field {field} given twice (first as {} at column {})",
                first.text.split('=').next().unwrap_or_default(),
                first.column
            ),
        ));
    }
    Ok(field)
}

/// The extents are `@buf0, @buf1, ..` without gaps, and every field's buffer has one.
fn check_buffers(
    head: &Token,
    fields: &[(Token, StridedField)],
    extents: &BTreeMap<u32, BufferExtent>,
) -> Result<()> {
    let n = extents.len();
    if extents.keys().map(|&i| i as usize).ne(0..n) {
        return Err(bad(
            head,
            "buffer extents must be @buf0, @buf1, .. without gaps",
        ));
    }
    if let Some((tok, f)) = fields.iter().find(|(_, f)| f.strides.buffer as usize >= n) {
        let b = f.strides.buffer;
        return Err(bad(
            tok,
            format!(
                "no @buf{b}= extent was given (field {} is in buffer {b})",
                f.field
            ),
        ));
    }
    Ok(())
}
