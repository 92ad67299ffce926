//! The handshake's errors as Python exceptions (`HandshakeError` and its subclasses in
//! `kvlayout/errors.py`).

use super::{Attr, PyErrorKind};

/// Four bytes as hex text (`kvlayout.errors` turns it back into `bytes`).
fn hex4(bytes: &[u8; 4]) -> Attr {
    Attr::Text(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl PyErrorKind for kvlayout_connector::handshake::HandshakeError {
    fn class_and_fields(&self) -> (&'static str, Vec<(&'static str, Attr)>) {
        use kvlayout_connector::handshake::HandshakeError as E;
        match self {
            E::TooShort { len, needed } => (
                "HandshakeTooShortError",
                vec![("len", (*len).into()), ("needed", (*needed).into())],
            ),
            E::BadMagic { got, expected } => (
                "HandshakeBadMagicError",
                vec![("got", hex4(got)), ("expected", hex4(expected))],
            ),
            E::UnsupportedVersion { got, supported } => (
                "HandshakeUnsupportedVersionError",
                vec![("got", (*got).into()), ("supported", (*supported).into())],
            ),
            E::ReservedNonZero { got } => (
                "HandshakeReservedNonZeroError",
                vec![("got", (*got).into())],
            ),
            E::BodyTooLarge { len, limit } => (
                "HandshakeBodyTooLargeError",
                vec![("len", (*len).into()), ("limit", (*limit).into())],
            ),
            E::LengthMismatch { declared, actual } => (
                "HandshakeLengthMismatchError",
                vec![
                    ("declared", (*declared).into()),
                    ("actual", (*actual).into()),
                ],
            ),
            E::Json { message } => ("HandshakeJsonError", vec![("message", message.into())]),
            E::NoGroups => ("HandshakeNoGroupsError", vec![]),
            E::TooManyGroups { count, limit } => (
                "HandshakeTooManyGroupsError",
                vec![("count", (*count).into()), ("limit", (*limit).into())],
            ),
            E::EmptyName { what } => ("HandshakeEmptyNameError", vec![("what", what.into())]),
            E::NameTooLong { what, len, limit } => (
                "HandshakeNameTooLongError",
                vec![
                    ("what", what.into()),
                    ("len", (*len).into()),
                    ("limit", (*limit).into()),
                ],
            ),
            E::DuplicateGroup {
                name,
                first,
                second,
            } => (
                "HandshakeDuplicateGroupError",
                vec![
                    ("name", name.into()),
                    ("first", (*first).into()),
                    ("second", (*second).into()),
                ],
            ),
            E::Layout { group, source } => (
                "HandshakeLayoutError",
                vec![
                    ("group", (*group).into()),
                    ("source", Attr::Text(source.to_string())),
                ],
            ),
            E::RegionCount {
                group,
                count,
                buffers,
            } => (
                "HandshakeRegionCountError",
                vec![
                    ("group", (*group).into()),
                    ("count", (*count).into()),
                    ("buffers", (*buffers).into()),
                ],
            ),
            E::TpSize {
                group,
                tp_size,
                limit,
            } => (
                "HandshakeTpSizeError",
                vec![
                    ("group", (*group).into()),
                    ("tp_size", (*tp_size).into()),
                    ("limit", (*limit).into()),
                ],
            ),
            E::TpRank {
                group,
                tp_rank,
                tp_size,
            } => (
                "HandshakeTpRankError",
                vec![
                    ("group", (*group).into()),
                    ("tp_rank", (*tp_rank).into()),
                    ("tp_size", (*tp_size).into()),
                ],
            ),
            E::ZeroTotalHeads { group } => (
                "HandshakeZeroTotalHeadsError",
                vec![("group", (*group).into())],
            ),
            E::TpSplitRefused {
                group,
                total_kv_heads,
                tp_size,
                reason,
            } => (
                "HandshakeTpSplitRefusedError",
                vec![
                    ("group", (*group).into()),
                    ("total_kv_heads", (*total_kv_heads).into()),
                    ("tp_size", (*tp_size).into()),
                    ("reason", reason.into()),
                ],
            ),
            E::HeadsMismatch {
                group,
                held,
                expected,
                total_kv_heads,
                tp_size,
                tp_rank,
            } => (
                "HandshakeHeadsMismatchError",
                vec![
                    ("group", (*group).into()),
                    ("held", (*held).into()),
                    ("expected", (*expected).into()),
                    ("total_kv_heads", (*total_kv_heads).into()),
                    ("tp_size", (*tp_size).into()),
                    ("tp_rank", (*tp_rank).into()),
                ],
            ),
            E::RegionOverflow {
                group,
                buffer,
                base,
                len,
            } => (
                "HandshakeRegionOverflowError",
                vec![
                    ("group", (*group).into()),
                    ("buffer", (*buffer).into()),
                    ("base", (*base).into()),
                    ("len", (*len).into()),
                ],
            ),
            E::RegionTooSmall {
                group,
                buffer,
                len,
                needed,
            } => (
                "HandshakeRegionTooSmallError",
                vec![
                    ("group", (*group).into()),
                    ("buffer", (*buffer).into()),
                    ("len", (*len).into()),
                    ("needed", (*needed).into()),
                ],
            ),
            E::RegionsOverlap {
                group,
                first,
                first_base,
                first_len,
                second,
                second_base,
                second_len,
            } => (
                "HandshakeRegionsOverlapError",
                vec![
                    ("group", (*group).into()),
                    ("first", (*first).into()),
                    ("first_base", (*first_base).into()),
                    ("first_len", (*first_len).into()),
                    ("second", (*second).into()),
                    ("second_base", (*second_base).into()),
                    ("second_len", (*second_len).into()),
                ],
            ),
            E::HashMismatch {
                group,
                carried,
                computed,
            } => (
                "HandshakeHashMismatchError",
                vec![
                    ("group", (*group).into()),
                    ("carried", carried.into()),
                    ("computed", computed.into()),
                ],
            ),
            E::Incompatible {
                field,
                local,
                remote,
            } => (
                "HandshakeIncompatibleError",
                vec![
                    ("field", (*field).into()),
                    ("local", local.into()),
                    ("remote", remote.into()),
                ],
            ),
            E::NoSuchBuffer { buffer, buffers } => (
                "HandshakeNoSuchBufferError",
                vec![("buffer", (*buffer).into()), ("buffers", (*buffers).into())],
            ),
            E::OutsideRegion {
                buffer,
                offset,
                len,
                region_len,
            } => (
                "HandshakeOutsideRegionError",
                vec![
                    ("buffer", (*buffer).into()),
                    ("offset", (*offset).into()),
                    ("len", (*len).into()),
                    ("region_len", (*region_len).into()),
                ],
            ),
            E::PeerChanged {
                peer,
                group,
                field,
                before,
                after,
            } => (
                "HandshakePeerChangedError",
                vec![
                    ("peer", peer.into()),
                    ("group", group.into()),
                    ("field", field.into()),
                    ("before", before.into()),
                    ("after", after.into()),
                ],
            ),
        }
    }
}
