//! Memory the caller owns, as Rust slices for the length of one call.
//!
//! What an object exposes about its memory is read by `kvlayout._arrays.describe` (its
//! `__array_interface__`, `__cuda_array_interface__` or `__dlpack__`); this module takes the
//! answer, checks that the memory is on the host, contiguous, writable where an op writes it,
//! aligned for its elements and disjoint from every other array of the call that is written,
//! and only then makes slices of it ([`Call::slices`]). Each [`HostArray`] holds a reference
//! to its object (and to the DLPack capsule that owns its memory, if any), so the memory
//! outlives the slices. The calls running now (the GIL released) list the bytes they read and
//! write, so that a second call on the same memory from another Python thread is refused
//! instead of racing. What the caller's own Python code does to the memory meanwhile is the
//! caller's affair, as with any extension that releases the GIL.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;

use crate::errors::{raise, ArrayError};

/// What `kvlayout._arrays.describe` says about one object, checked to be contiguous host
/// memory. `what` names it in errors (`key`, `cache buffer 0`).
#[derive(Debug, Clone)]
pub struct HostArray<'py> {
    /// The object, referenced so that its memory lives as long as this.
    _owner: Bound<'py, PyAny>,
    /// What else keeps the memory alive (a DLPack capsule), held as long as this.
    _keep: Option<Bound<'py, PyAny>>,
    /// The argument it is, for errors.
    pub what: String,
    /// Address of byte 0.
    pub address: usize,
    /// Bytes it spans.
    pub nbytes: usize,
    /// Whether it may not be written.
    pub readonly: bool,
    /// Element type (kvlayout's names: `f32`, `bf16`, `i64`, ...).
    pub dtype: String,
    /// Extents.
    pub shape: Vec<u64>,
}

fn array_error(reason: String) -> PyErr {
    raise(ArrayError(reason))
}

impl<'py> HostArray<'py> {
    /// Reads `obj`'s memory; refused unless it is one contiguous range of host memory.
    pub fn read(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<HostArray<'py>> {
        let d = crate::arrays::describe(obj)?;
        if d.device != "cpu" {
            return Err(array_error(format!(
                "{what} is in {} memory; this backend runs on host memory",
                d.device
            )));
        }
        if !d.c_contiguous {
            return Err(array_error(format!(
                "{what} is not contiguous (shape {:?}, strides {:?} in elements); pass a \
                 C-contiguous array",
                d.shape, d.strides
            )));
        }
        let nbytes = usize::try_from(d.nbytes).map_err(|_| {
            array_error(format!("{what}: {} bytes pass the address space", d.nbytes))
        })?;
        let address = usize::try_from(d.address).map_err(|_| {
            array_error(format!(
                "{what}: address {:#x} passes the address space",
                d.address
            ))
        })?;
        Ok(HostArray {
            _owner: obj.clone(),
            _keep: d.owner.map(|o| o.into_bound(obj.py())),
            what: what.to_string(),
            address,
            nbytes,
            readonly: d.readonly,
            dtype: d.dtype,
            shape: d.shape,
        })
    }

    /// The byte range it spans.
    fn range(&self) -> Range<usize> {
        self.address..self.address.saturating_add(self.nbytes)
    }

    /// Refused when read-only.
    pub fn writable(self) -> PyResult<HostArray<'py>> {
        if self.readonly {
            return Err(array_error(format!(
                "{} is read-only, and the op writes it",
                self.what
            )));
        }
        Ok(self)
    }
}

/// The arrays of one call: what it reads and what it writes, each written one writable and
/// overlapping no other, and none in use by another call running now.
pub struct Call<'py> {
    reads: Vec<HostArray<'py>>,
    writes: Vec<HostArray<'py>>,
    id: u64,
}

/// Bytes a call running now (the GIL released) reads or writes.
struct Claim {
    call: u64,
    bytes: Range<usize>,
    write: bool,
    what: String,
}

/// The claims of the calls running now: two Python threads calling ops on shared memory
/// must not race (a call that writes what another reads or writes, or reads what another
/// writes, is refused).
static IN_FLIGHT: Mutex<Vec<Claim>> = Mutex::new(Vec::new());
static NEXT_CALL: AtomicU64 = AtomicU64::new(0);

fn in_flight() -> std::sync::MutexGuard<'static, Vec<Claim>> {
    // A panic while holding the lock leaves a list a later call can still read.
    IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner())
}

fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        in_flight().retain(|c| c.call != self.id);
    }
}

impl<'py> Call<'py> {
    /// Refuses a written array that is read-only, or that shares bytes with another array of
    /// the call (the op would read what it writes, or write one byte twice), or an array that
    /// a call running now writes (or reads, where this one writes it). The claims last until
    /// the `Call` is dropped.
    pub fn new(reads: Vec<HostArray<'py>>, writes: Vec<HostArray<'py>>) -> PyResult<Self> {
        let writes = writes
            .into_iter()
            .map(HostArray::writable)
            .collect::<PyResult<Vec<_>>>()?;
        for (i, w) in writes.iter().enumerate() {
            for o in writes[i + 1..].iter().chain(&reads) {
                let (a, b) = (w.range(), o.range());
                if overlap(&a, &b) {
                    return Err(array_error(format!(
                        "{} (bytes {:#x}..{:#x}) overlaps {} (bytes {:#x}..{:#x}), and the op \
                         writes {}",
                        w.what, a.start, a.end, o.what, b.start, b.end, w.what
                    )));
                }
            }
        }
        let mut claims = in_flight();
        let mine = writes
            .iter()
            .map(|a| (a, true))
            .chain(reads.iter().map(|a| (a, false)));
        for (a, write) in mine.clone() {
            let busy = claims
                .iter()
                .find(|c| (write || c.write) && overlap(&a.range(), &c.bytes));
            if let Some(c) = busy {
                return Err(array_error(format!(
                    "{} shares bytes with {}, which another call running now {}; one op at a \
                     time on the same memory",
                    a.what,
                    c.what,
                    if c.write { "writes" } else { "reads" }
                )));
            }
        }
        let id = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
        claims.extend(mine.map(|(a, write)| Claim {
            call: id,
            bytes: a.range(),
            write,
            what: a.what.clone(),
        }));
        drop(claims);
        Ok(Call { reads, writes, id })
    }

    /// Each array with its bytes: those read, then those written, in the order given.
    #[allow(clippy::type_complexity)]
    pub fn slices(
        &mut self,
    ) -> (
        Vec<(&HostArray<'py>, &[u8])>,
        Vec<(&HostArray<'py>, &mut [u8])>,
    ) {
        let reads = self.reads.iter().map(|a| {
            if a.nbytes == 0 {
                return (a, &[][..]);
            }
            // SAFETY: the object's array interface says `nbytes` bytes from `address` are
            // its memory (contiguous, checked by `HostArray::read`); `a._owner` keeps the
            // object alive while `self` is borrowed; no array written by this call overlaps
            // it (`Call::new`).
            (a, unsafe {
                std::slice::from_raw_parts(a.address as *const u8, a.nbytes)
            })
        });
        let writes = self.writes.iter().map(|a| {
            if a.nbytes == 0 {
                return (a, &mut [][..]);
            }
            // SAFETY: as above; the array is writable and shares no byte with any other
            // array of the call (`Call::new`), and `&mut self` hands these slices out once
            // per borrow, so each is the only reference to its bytes.
            (a, unsafe {
                std::slice::from_raw_parts_mut(a.address as *mut u8, a.nbytes)
            })
        });
        (reads.collect(), writes.collect())
    }
}

/// `bytes` as elements of `T`, refused when misaligned.
pub fn typed<'a, T: bytemuck::Pod>(a: &HostArray, bytes: &'a [u8]) -> PyResult<&'a [T]> {
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| {
        array_error(format!(
            "{} at {:#x} cannot be read as {}-byte elements: {e}",
            a.what,
            a.address,
            std::mem::size_of::<T>()
        ))
    })
}

/// `bytes` as elements of `T` to write, refused when misaligned.
pub fn typed_mut<'a, T: bytemuck::Pod>(
    a: &HostArray,
    bytes: &'a mut [u8],
) -> PyResult<&'a mut [T]> {
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    let (what, address) = (a.what.clone(), a.address);
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| {
        array_error(format!(
            "{what} at {address:#x} cannot be written as {}-byte elements: {e}",
            std::mem::size_of::<T>()
        ))
    })
}
