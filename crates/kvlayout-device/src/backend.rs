//! [`DeviceBackend`]: the [`Backend`] every [`Device`] gets. Validation, the launches and
//! their argument blocks, the staging of index metadata and the choice between kernel movers
//! and byte copies are written once, here; each runtime crate holds only its runtime calls.
//!
//! - Caches live in device memory ([`Backend::alloc_cache`]) or in pinned host memory
//!   ([`DeviceBackend::alloc_host_cache`]); a move between the two is one copy per merged
//!   byte run ([`copy_runs`]) where the moves have that form, every other move a kernel.
//! - Slot mappings, block tables, sequence lengths and block pairs are validated on the host,
//!   then uploaded into temporaries that the op's [`DeviceCompletion`] keeps alive until it
//!   is waited for.
//! - A refused op enqueues nothing.

use kvlayout::ops::{
    check_buffers, check_decode, check_write, copy_runs, Backend, BlockMove, BufferShape,
    DecodeArgs, HostTensor, Kernels, Moves, OpError, TensorDesc, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};

use crate::device::{Device, Place};
use crate::kernels::{
    decode_calls, decode_plan, move_calls, move_pairs, write_kv_call, CacheAddrs, DecodeAddrs,
    DecodeSite, KernelCall, WriteAddrs,
};

/// A cache of a [`DeviceBackend`]: a layout and one allocation per buffer.
#[derive(Debug)]
pub struct DeviceCache<B> {
    layout: KvCacheLayout,
    buffers: Vec<B>,
    place: Place,
}

impl<B> DeviceCache<B> {
    /// The layout.
    pub fn layout(&self) -> &KvCacheLayout {
        &self.layout
    }

    /// Where its buffers live.
    pub fn place(&self) -> Place {
        self.place
    }

    /// The allocations, one per layout buffer.
    pub fn buffers(&self) -> &[B] {
        &self.buffers
    }
}

/// A dense activation tensor of a [`DeviceBackend`].
#[derive(Debug)]
pub struct DeviceTensor<B> {
    dtype: DType,
    len: usize,
    buf: B,
}

impl<B> TensorDesc for DeviceTensor<B> {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Enqueued work: an event, and the temporaries the work reads, freed once it is waited for.
#[derive(Debug)]
pub struct DeviceCompletion<B, E> {
    event: E,
    keep: Vec<B>,
}

/// Units past which `swap_blocks` between host and device moves with a kernel rather than
/// copies (each copy costs a few microseconds to enqueue).
pub const MAX_COPY_RUNS: usize = 4096;

/// The [`Backend`] of a [`Device`].
#[derive(Debug)]
pub struct DeviceBackend<D> {
    device: D,
}

fn host_bytes(t: &HostTensor) -> Vec<u8> {
    match t {
        HostTensor::F32(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostTensor::F16(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostTensor::Bf16(x) => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn host_tensor(dtype: DType, b: &[u8]) -> Result<HostTensor, String> {
    Ok(match dtype {
        DType::F32 => HostTensor::F32(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::F16 => HostTensor::F16(
            b.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        DType::Bf16 => HostTensor::Bf16(
            b.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        other => return Err(format!("no {other} activation tensors")),
    })
}

fn i64_bytes(x: &[i64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl<D: Device> DeviceBackend<D> {
    /// The backend of `device`.
    pub fn new(device: D) -> Self {
        DeviceBackend { device }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Each buffer of `cache` as `(address, bytes)`, in the device's address space: what a
    /// transfer engine registers to move the cache's bytes in place (NIXL with GPU support;
    /// `kvlayout_connector::Region::from_raw` with the device's ordinal). The addresses stay
    /// valid while `cache` lives.
    pub fn buffer_spans(&self, cache: &DeviceCache<D::Buffer>) -> Vec<(u64, u64)> {
        cache
            .buffers
            .iter()
            .map(|b| (self.device.address(b), self.device.len(b)))
            .collect()
    }

    /// A cache of `layout` in pinned host memory, each buffer its registered span, for
    /// `swap_blocks` to and from device caches.
    pub fn alloc_host_cache(
        &self,
        layout: &KvCacheLayout,
    ) -> Result<DeviceCache<D::Buffer>, String> {
        self.alloc(layout, &BufferShape::exact(layout), Place::PinnedHost)
    }

    fn alloc(
        &self,
        layout: &KvCacheLayout,
        shapes: &[BufferShape],
        place: Place,
    ) -> Result<DeviceCache<D::Buffer>, String> {
        let buffers = shapes
            .iter()
            .map(|s| self.device.alloc(s.len, s.misalign, place))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        Ok(DeviceCache {
            layout: layout.clone(),
            buffers,
            place,
        })
    }

    fn fail(&self, kernel: &'static str) -> impl Fn(D::Error) -> OpError {
        move |e| OpError::Kernel {
            kernel,
            detail: e.to_string(),
        }
    }

    /// The cache's buffer bases, after checking its buffers against its layout.
    fn addrs<'c>(&self, c: &'c DeviceCache<D::Buffer>) -> Result<CacheAddrs<'c>, OpError> {
        let lens_addrs: Vec<(u64, u64)> = c
            .buffers
            .iter()
            .map(|b| (self.device.len(b), self.device.address(b)))
            .collect();
        check_buffers(&c.layout, &lens_addrs)?;
        let mut bases = [0u64; 2];
        for (b, (_, a)) in bases.iter_mut().zip(&lens_addrs) {
            *b = *a;
        }
        Ok(CacheAddrs {
            layout: &c.layout,
            bases,
        })
    }

    /// A device temporary holding `bytes` (`None` when empty).
    fn temp(&self, what: &'static str, bytes: &[u8]) -> Result<Option<D::Buffer>, OpError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let fail = self.fail(what);
        let buf = self
            .device
            .alloc(bytes.len() as u64, 0, Place::Device)
            .map_err(&fail)?;
        self.device.upload(&buf, bytes).map_err(&fail)?;
        Ok(Some(buf))
    }

    /// Launches `calls`, built from arguments the op checked and addresses of this backend's
    /// live allocations (caches checked against their layouts by [`Self::addrs`], tensors
    /// of checked lengths, temporaries in `keep`, which the completion holds until waited for).
    #[allow(unsafe_code)]
    fn launch_all(
        &self,
        calls: &[KernelCall],
        keep: Vec<D::Buffer>,
    ) -> Result<DeviceCompletion<D::Buffer, D::Event>, OpError> {
        for call in calls {
            // SAFETY: every address in `call` is of a live allocation of this device, sized
            // by the op's checks for what the kernel addresses (see above); the caches written
            // are borrowed mutably by the op, the temporaries live until the completion is
            // waited for.
            unsafe { self.device.launch(call) }.map_err(self.fail(call.args.kernel().name()))?;
        }
        self.complete(keep, "launch")
    }

    fn complete(
        &self,
        keep: Vec<D::Buffer>,
        what: &'static str,
    ) -> Result<DeviceCompletion<D::Buffer, D::Event>, OpError> {
        let event = self.device.record().map_err(self.fail(what))?;
        Ok(DeviceCompletion { event, keep })
    }

    /// Validated moves `m` from `src` to `dst`: byte copies when either side is host memory
    /// and the moves have a byte-run form, else the mover kernel on each field.
    fn moves(
        &self,
        src: &DeviceCache<D::Buffer>,
        dst: &DeviceCache<D::Buffer>,
        m: &Moves,
    ) -> Result<DeviceCompletion<D::Buffer, D::Event>, OpError> {
        let (sa, da) = (self.addrs(src)?, self.addrs(dst)?);
        let host = src.place == Place::PinnedHost || dst.place == Place::PinnedHost;
        if host {
            if let Some(runs) = copy_runs(&src.layout, &dst.layout, m, MAX_COPY_RUNS) {
                let fail = self.fail("copy");
                for r in &runs {
                    self.device
                        .copy(
                            &src.buffers[r.src_buffer as usize],
                            r.src_offset,
                            &dst.buffers[r.dst_buffer as usize],
                            r.dst_offset,
                            r.len,
                        )
                        .map_err(&fail)?;
                }
                return self.complete(Vec::new(), "copy");
            }
        }
        let pairs = self.temp("block pairs", &i64_bytes(&move_pairs(m)))?;
        let at = pairs.as_ref().map_or(0, |b| self.device.address(b));
        let calls = move_calls(&self.device.target(), &sa, &da, m, at)?;
        self.launch_all(&calls, pairs.into_iter().collect())
    }
}

impl<D: Device> Backend for DeviceBackend<D> {
    type Cache = DeviceCache<D::Buffer>;
    type Tensor = DeviceTensor<D::Buffer>;
    type Completion = DeviceCompletion<D::Buffer, D::Event>;

    fn name(&self) -> &str {
        self.device.name()
    }

    fn available(&self) -> Result<(), String> {
        Ok(())
    }

    fn kernels(&self) -> Kernels {
        let t = self.device.target();
        Kernels {
            build: t.name.to_string(),
            why: format!(
                "{} runs the {} kernels, warps of {}",
                self.device.name(),
                t.name,
                t.warp
            ),
            threads: 0,
        }
    }

    fn alloc_cache(
        &self,
        layout: &KvCacheLayout,
        shapes: &[BufferShape],
    ) -> Result<Self::Cache, String> {
        self.alloc(layout, shapes, Place::Device)
    }

    fn upload_cache(&self, cache: &mut Self::Cache, bytes: &[Vec<u8>]) -> Result<(), String> {
        if bytes.len() != cache.buffers.len() {
            return Err(format!(
                "{} byte vectors for {} buffers",
                bytes.len(),
                cache.buffers.len()
            ));
        }
        for (i, (buf, b)) in cache.buffers.iter().zip(bytes).enumerate() {
            let len = self.device.len(buf);
            if b.len() as u64 != len {
                return Err(format!("buffer {i}: {} bytes uploaded into {len}", b.len()));
            }
            self.device.upload(buf, b).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn download_cache(&self, cache: &Self::Cache) -> Result<Vec<Vec<u8>>, String> {
        cache
            .buffers
            .iter()
            .map(|buf| {
                let mut out = vec![0u8; self.device.len(buf) as usize];
                self.device
                    .download(buf, &mut out)
                    .map_err(|e| e.to_string())?;
                Ok(out)
            })
            .collect()
    }

    fn upload_tensor(&self, t: &HostTensor) -> Result<Self::Tensor, String> {
        let bytes = host_bytes(t);
        let buf = self
            .device
            .alloc(bytes.len() as u64, 0, Place::Device)
            .map_err(|e| e.to_string())?;
        self.device
            .upload(&buf, &bytes)
            .map_err(|e| e.to_string())?;
        Ok(DeviceTensor {
            dtype: t.dtype(),
            len: t.len(),
            buf,
        })
    }

    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<Self::Tensor, String> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
            return Err(format!("no {dtype} activation tensors"));
        }
        let bytes = (len as u64)
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| format!("{len} elements of {dtype} overflow"))?;
        let buf = self
            .device
            .alloc(bytes, 0, Place::Device)
            .map_err(|e| e.to_string())?;
        Ok(DeviceTensor { dtype, len, buf })
    }

    fn download_tensor(&self, t: &Self::Tensor) -> Result<HostTensor, String> {
        let mut b = vec![0u8; t.len * t.dtype.size_bytes() as usize];
        self.device
            .download(&t.buf, &mut b)
            .map_err(|e| e.to_string())?;
        host_tensor(t.dtype, &b)
    }

    fn write_kv(
        &self,
        cache: &mut Self::Cache,
        w: &WriteArgs<'_, &Self::Tensor>,
    ) -> Result<Self::Completion, OpError> {
        let shape = check_write(&cache.layout, w)?;
        let ca = self.addrs(cache)?;
        let slots = self.temp("slot mapping", &i64_bytes(w.slot_mapping))?;
        let at = WriteAddrs {
            key: self.device.address(&w.key.buf),
            value: w.value.map_or(0, |v| self.device.address(&v.buf)),
            slot_mapping: slots.as_ref().map_or(0, |b| self.device.address(b)),
        };
        let target = self.device.target();
        let call = write_kv_call(
            &target,
            &ca,
            &shape,
            w.slot_mapping.len(),
            w.layer,
            w.key.dtype,
            &at,
        )?;
        self.launch_all(call.as_slice(), slots.into_iter().collect())
    }

    fn paged_decode(
        &self,
        cache: &Self::Cache,
        d: &DecodeArgs<'_, &Self::Tensor>,
        out: &mut Self::Tensor,
    ) -> Result<Self::Completion, OpError> {
        if out.dtype != DType::F32 {
            return Err(OpError::Shape {
                what: "output dtype".into(),
                expected: "f32".into(),
                got: out.dtype.to_string(),
            });
        }
        let shape = check_decode(&cache.layout, d, out.len)?;
        let ca = self.addrs(cache)?;
        let target = self.device.target();
        let Some(launch) = decode_plan(&target, &ca, &shape, d.seq_lens, &d.params)? else {
            return self.complete(Vec::new(), "paged_decode");
        };
        let table: Vec<u8> = d.block_table.iter().flat_map(|v| v.to_le_bytes()).collect();
        let lens: Vec<u8> = d.seq_lens.iter().flat_map(|v| v.to_le_bytes()).collect();
        let table = self.temp("block table", &table)?;
        let lens = self.temp("sequence lengths", &lens)?;
        let partials_len = launch.partials_len(&shape) as u64 * 4;
        let partials = if partials_len == 0 {
            None
        } else {
            let fail = self.fail("paged_decode partials");
            Some(
                self.device
                    .alloc(partials_len, 0, Place::Device)
                    .map_err(fail)?,
            )
        };
        let addr = |b: &Option<D::Buffer>| b.as_ref().map_or(0, |b| self.device.address(b));
        let at = DecodeAddrs {
            query: self.device.address(&d.query.buf),
            block_table: addr(&table),
            seq_lens: addr(&lens),
            out: self.device.address(&out.buf),
            partials: addr(&partials),
        };
        let site = DecodeSite {
            layer: d.layer,
            blocks_per_seq: d.blocks_per_seq,
            act_dtype: d.query.dtype,
            params: d.params,
        };
        let calls = decode_calls(&ca, &shape, &launch, &site, &at)?;
        let keep = [table, lens, partials].into_iter().flatten().collect();
        self.launch_all(&calls, keep)
    }

    fn move_blocks(
        &self,
        src: Option<&Self::Cache>,
        dst: &mut Self::Cache,
        op: &BlockMove<'_>,
    ) -> Result<Self::Completion, OpError> {
        let m = op.plan(src.map(|c| &c.layout), &dst.layout)?;
        // A move within `dst` (copy_blocks) reads and writes distinct blocks of its buffers.
        self.moves(src.unwrap_or(dst), dst, &m)
    }

    fn wait(&self, c: Self::Completion) -> Result<(), String> {
        let r = self.device.wait(&c.event).map_err(|e| e.to_string());
        drop(c.keep);
        r
    }

    fn synchronize(&self) -> Result<(), String> {
        self.device.synchronize().map_err(|e| e.to_string())
    }
}
