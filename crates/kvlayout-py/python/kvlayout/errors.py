"""The exceptions kvlayout raises: one class per Rust error kind.

Every class derives from :class:`KvLayoutError` (a ``ValueError``). Its message is the Rust
error's, and the values it names (the value, the limit, the index, the reason, ...) are
attributes of the exception, listed in ``fields``::

    try:
        layout.offset("k", layer=40)
    except kvlayout.errors.OutOfRangeError as e:
        e.axis, e.value, e.limit   # "layer", 40, 32
"""

from __future__ import annotations

from typing import Any


class KvLayoutError(ValueError):
    """Base of every kvlayout exception; ``kind`` names the Rust error kind it came from."""

    #: The Rust error kind, e.g. ``"LayoutError::OutOfRange"``.
    kind: str = "KvLayoutError"

    def __init__(self, message: str, /, **fields: Any) -> None:
        super().__init__(message)
        #: The error's values by name (also set as attributes).
        self.fields = dict(fields)
        for name, value in fields.items():
            setattr(self, name, value)


def _kind(rust: str):
    def mark(cls):
        cls.kind = rust
        return cls

    return mark


class LayoutError(KvLayoutError):
    """Something is wrong with a layout, a coordinate, a spec or a claim about a tensor
    (``kvlayout::LayoutError``)."""


@_kind("LayoutError::ZeroSize")
class ZeroSizeError(LayoutError):
    """A size that must be positive is zero. Attributes: ``what``."""


@_kind("LayoutError::Overflow")
class OffsetOverflowError(LayoutError):
    """A size, stride or offset passes the 63-bit offset range. Attributes: ``what``, ``limit``."""


@_kind("LayoutError::XNotDividing")
class XNotDividingError(LayoutError):
    """The legacy vLLM key's ``x = 16 / element size`` does not divide the head size.
    Attributes: ``head_size``, ``x``, ``elem_bytes``."""


@_kind("LayoutError::MisalignedScale")
class MisalignedScaleError(LayoutError):
    """An inline f32 scale at an offset that is not 4-byte aligned. Attributes: ``field``,
    ``offset``, ``align``."""


@_kind("LayoutError::Misaligned")
class MisalignedError(LayoutError):
    """A field's elements or a page not aligned. Attributes: ``what``, ``value``, ``align``."""


@_kind("LayoutError::Aliasing")
class AliasingError(LayoutError):
    """Two addresses of the domain overlap. Attributes: ``detail``."""


@_kind("LayoutError::NotPowerOfTwo")
class NotPowerOfTwoError(LayoutError):
    """A quantity that must be a power of two. Attributes: ``what``, ``value``."""


@_kind("LayoutError::StrideTooSmall")
class StrideTooSmallError(LayoutError):
    """A stated stride smaller than what it must hold. Attributes: ``what``, ``value``,
    ``needed``."""


@_kind("LayoutError::Invalid")
class InvalidLayoutError(LayoutError):
    """The parts of a description do not go together. Attributes: ``reason``."""


@_kind("LayoutError::UnknownPreset")
class UnknownPresetError(LayoutError):
    """A preset name that does not exist. Attributes: ``name``, ``known``."""


@_kind("LayoutError::UnknownName")
class UnknownNameError(LayoutError):
    """A convention, field or dtype name that is not known. Attributes: ``what``, ``name``,
    ``known``."""


@_kind("LayoutError::Spec")
class SpecError(LayoutError):
    """A spec string that does not parse. Attributes: ``column`` (1-based), ``token``,
    ``reason``."""


@_kind("LayoutError::Json")
class LayoutJsonError(LayoutError):
    """A JSON document that does not describe a layout. Attributes: ``reason``."""


@_kind("LayoutError::OutOfRange")
class OutOfRangeError(LayoutError):
    """A coordinate outside the layout's domain. Attributes: ``axis``, ``value``, ``limit``."""


@_kind("LayoutError::NoSuchField")
class NoSuchFieldError(LayoutError):
    """A field the layout does not store. Attributes: ``field``, ``available``."""


@_kind("LayoutError::ViewRefused")
class ViewRefusedError(LayoutError):
    """No view of the field in that convention without a copy. Attributes: ``convention``,
    ``field``, ``reason``."""


@_kind("LayoutError::TransformRefused")
class TransformRefusedError(LayoutError):
    """A transformation whose pre-conditions do not hold. Attributes: ``transform``,
    ``reason``."""


@_kind("LayoutError::TensorMismatch")
class TensorMismatchError(LayoutError):
    """A framework's tensor does not match the layout. Attributes: ``reason`` (the first
    disagreement, in words)."""


@_kind("LayoutError::InvalidQuery")
class InvalidQueryError(LayoutError):
    """A query's own argument is wrong (an empty range, an index of the wrong length).
    Attributes: ``reason``."""


@_kind("LayoutError::TooManyRegions")
class TooManyRegionsError(LayoutError):
    """A region query that would enumerate too many byte ranges. Attributes: ``count``,
    ``limit``."""


@_kind("LayoutError::Mismatch")
class LayoutMismatchError(LayoutError):
    """Two layouts address memory differently. Attributes: ``reason``."""


class OpError(KvLayoutError):
    """An op refused its arguments, having written nothing (``kvlayout::ops::OpError``).
    A layout error met by an op is raised as its :class:`LayoutError` class."""


@_kind("OpError::SlotOutOfRange")
class SlotOutOfRangeError(OpError):
    """A slot mapping entry past the cache. Attributes: ``token``, ``slot``, ``limit``."""


@_kind("OpError::DuplicateSlot")
class DuplicateSlotError(OpError):
    """Two tokens mapped to one slot. Attributes: ``token``, ``slot``, ``first``."""


@_kind("OpError::BlockOutOfRange")
class BlockOutOfRangeError(OpError):
    """A block table entry past the cache. Attributes: ``seq``, ``position``, ``block``,
    ``limit``."""


@_kind("OpError::SequenceTooLong")
class SequenceTooLongError(OpError):
    """A sequence longer than its row of blocks holds. Attributes: ``seq``, ``len``,
    ``blocks``, ``capacity``."""


@_kind("OpError::Shape")
class ShapeError(OpError):
    """An argument of the wrong size or type. Attributes: ``what``, ``expected``, ``got``."""


@_kind("OpError::BufferTooShort")
class BufferTooShortError(OpError):
    """A cache buffer shorter than the layout needs. Attributes: ``buffer``, ``len``,
    ``needed``."""


@_kind("OpError::Misaligned")
class BufferMisalignedError(OpError):
    """A cache buffer misaligned for its elements. Attributes: ``buffer``, ``address``,
    ``align``."""


@_kind("OpError::Incompatible")
class IncompatibleError(OpError):
    """Two caches (or a cache and a backend) that do not go together. Attributes:
    ``reason``."""


@_kind("OpError::BadPair")
class BadPairError(OpError):
    """A bad block pair of a move. Attributes: ``index``, ``src``, ``dst``, ``reason``."""


@_kind("OpError::OutOfMemory")
class OutOfMemoryError(OpError):
    """A buffer the backend could not allocate. Attributes: ``buffer``, ``bytes``."""


@_kind("OpError::Unsupported")
class UnsupportedError(OpError):
    """An op that does not apply to this layout. Attributes: ``op``, ``reason``."""


@_kind("OpError::Kernel")
class KernelError(OpError):
    """A kernel that failed. Attributes: ``kernel``, ``detail``."""


class BackendError(KvLayoutError):
    """A backend that cannot be opened or whose memory call failed."""


@_kind("OpenError::Unknown")
class UnknownBackendError(BackendError):
    """A name that is no backend. Attributes: ``name``."""


@_kind("OpenError::Unavailable")
class BackendUnavailableError(BackendError):
    """A backend that cannot run here (no device, a kernel build this CPU lacks). Attributes:
    ``name``, ``reason``."""


@_kind("Backend memory")
class BackendFailure(BackendError):
    """A backend's memory call failed (no memory, no device). Attributes: ``reason``."""


class ArrayError(KvLayoutError):
    """An object handed over whose memory cannot be read: no array interface, an unsupported
    dtype or device, a read-only array where the op writes. Attributes: ``reason``."""

    kind = "kvlayout-py array"


# --- The connector's handshake (kvlayout_connector::handshake::HandshakeError) -------------


class HandshakeError(KvLayoutError):
    """A peer's handshake bytes or metadata refused, two cache groups that cannot exchange
    blocks, or a transfer's byte range outside a peer's regions
    (``kvlayout_connector::handshake::HandshakeError``). ``group`` is a group's index in
    its peer's list."""


@_kind("HandshakeError::TooShort")
class HandshakeTooShortError(HandshakeError):
    """The bytes are shorter than the 12-byte header. Attributes: ``len`` (bytes received),
    ``needed``."""


@_kind("HandshakeError::BadMagic")
class HandshakeBadMagicError(HandshakeError):
    """The first four bytes are not ``b"KVLH"``. Attributes: ``got``, ``expected`` (4 bytes
    each)."""

    def __init__(self, message: str, /, **fields: Any) -> None:
        # The native side passes the four bytes as hex text.
        for name in ("got", "expected"):
            if isinstance(fields.get(name), str):
                fields[name] = bytes.fromhex(fields[name])
        super().__init__(message, **fields)


@_kind("HandshakeError::UnsupportedVersion")
class HandshakeUnsupportedVersionError(HandshakeError):
    """A format version this build does not read. Attributes: ``got``, ``supported``."""


@_kind("HandshakeError::ReservedNonZero")
class HandshakeReservedNonZeroError(HandshakeError):
    """The reserved header field is not 0. Attributes: ``got``."""


@_kind("HandshakeError::BodyTooLarge")
class HandshakeBodyTooLargeError(HandshakeError):
    """The declared body length is over ``max_body_bytes``. Attributes: ``len`` (declared),
    ``limit``."""


@_kind("HandshakeError::LengthMismatch")
class HandshakeLengthMismatchError(HandshakeError):
    """The declared body length is not the bytes after the header. Attributes:
    ``declared``, ``actual``."""


@_kind("HandshakeError::Json")
class HandshakeJsonError(HandshakeError):
    """The body is not the expected JSON (bad syntax, a missing, unknown or mistyped key).
    Attributes: ``message`` (the parser's, with line and column)."""


@_kind("HandshakeError::NoGroups")
class HandshakeNoGroupsError(HandshakeError):
    """The peer lists no cache group. No attributes."""


@_kind("HandshakeError::TooManyGroups")
class HandshakeTooManyGroupsError(HandshakeError):
    """More cache groups than ``max_groups``. Attributes: ``count``, ``limit``."""


@_kind("HandshakeError::EmptyName")
class HandshakeEmptyNameError(HandshakeError):
    """An empty engine id or group name. Attributes: ``what`` (e.g. ``"group 0 name"``)."""


@_kind("HandshakeError::NameTooLong")
class HandshakeNameTooLongError(HandshakeError):
    """An engine id or group name over ``max_name_bytes``. Attributes: ``what``, ``len``
    (bytes of UTF-8), ``limit``."""


@_kind("HandshakeError::DuplicateGroup")
class HandshakeDuplicateGroupError(HandshakeError):
    """Two groups share a name. Attributes: ``name``, ``first``, ``second`` (indices)."""


@_kind("HandshakeError::Layout")
class HandshakeLayoutError(HandshakeError):
    """A group's layout fails to parse or validate. Attributes: ``group``, ``source`` (the
    layout error's message); ``__cause__`` is that error as its :class:`LayoutError`
    class."""


@_kind("HandshakeError::RegionCount")
class HandshakeRegionCountError(HandshakeError):
    """A group registers another number of regions than its layout has buffers. Attributes:
    ``group``, ``count``, ``buffers``."""


@_kind("HandshakeError::TpSize")
class HandshakeTpSizeError(HandshakeError):
    """A TP size of 0 or over ``max_tp``. Attributes: ``group``, ``tp_size``, ``limit``."""


@_kind("HandshakeError::TpRank")
class HandshakeTpRankError(HandshakeError):
    """A TP rank not below the TP size. Attributes: ``group``, ``tp_rank``, ``tp_size``."""


@_kind("HandshakeError::ZeroTotalHeads")
class HandshakeZeroTotalHeadsError(HandshakeError):
    """A model with zero KV heads. Attributes: ``group``."""


@_kind("HandshakeError::TpSplitRefused")
class HandshakeTpSplitRefusedError(HandshakeError):
    """The model's KV heads do not split over the TP size. Attributes: ``group``,
    ``total_kv_heads``, ``tp_size``, ``reason``."""


@_kind("HandshakeError::HeadsMismatch")
class HandshakeHeadsMismatchError(HandshakeError):
    """The rank's layout holds another number of heads than TP gives it. Attributes:
    ``group``, ``held``, ``expected``, ``total_kv_heads``, ``tp_size``, ``tp_rank``."""


@_kind("HandshakeError::RegionOverflow")
class HandshakeRegionOverflowError(HandshakeError):
    """A region whose end passes 2**64. Attributes: ``group``, ``buffer``, ``base``,
    ``len``."""


@_kind("HandshakeError::RegionTooSmall")
class HandshakeRegionTooSmallError(HandshakeError):
    """A region shorter than its buffer's registered span (padding included). Attributes:
    ``group``, ``buffer``, ``len``, ``needed``."""


@_kind("HandshakeError::RegionsOverlap")
class HandshakeRegionsOverlapError(HandshakeError):
    """Two regions of one group share bytes. Attributes: ``group``, ``first``,
    ``first_base``, ``first_len``, ``second``, ``second_base``, ``second_len``."""


@_kind("HandshakeError::HashMismatch")
class HandshakeHashMismatchError(HandshakeError):
    """A carried compatibility hash that is not the one its group computes to. Attributes:
    ``group``, ``carried`` (quoted, cut at 256 bytes), ``computed``."""


@_kind("HandshakeError::Incompatible")
class HandshakeIncompatibleError(HandshakeError):
    """Two groups differ in a field the compatibility hash covers. Attributes: ``field``
    (the first that differs, e.g. ``"dtype"``), ``local``, ``remote``."""


@_kind("HandshakeError::NoSuchBuffer")
class HandshakeNoSuchBufferError(HandshakeError):
    """A transfer names a buffer the group does not have. Attributes: ``buffer``,
    ``buffers`` (regions registered)."""


@_kind("HandshakeError::OutsideRegion")
class HandshakeOutsideRegionError(HandshakeError):
    """A transfer's byte range leaves its registered region. Attributes: ``buffer``,
    ``offset``, ``len``, ``region_len``."""


@_kind("HandshakeError::PeerChanged")
class HandshakePeerChangedError(HandshakeError):
    """A peer seen before connects again with a different layout, TP rank or size, model heads
    or set of groups. Attributes: ``peer``, ``group`` (``"*"`` for the set of groups),
    ``field`` (the first that differs, e.g. ``"layout.placement.order"``), ``before``,
    ``after``."""


__all__ = [name for name, value in globals().items() if isinstance(value, type) and issubclass(value, KvLayoutError)]
