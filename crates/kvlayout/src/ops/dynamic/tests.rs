//! Tests of [`AnyBackend`](super::AnyBackend): forwarding and refusals, on two toy backends.

// Not `super::*`: the private `Erased` would make every call ambiguous.
use super::{AnyBackend, AnyCompletion, Backend, BlockMove, BufferShape, DType, HostTensor};
use super::{DecodeArgs, Kernels, KvCacheLayout, OpError, TensorDesc, WriteArgs};

/// A backend of caches `C` and tensors `T` (host bytes and host tensors under other
/// types) whose ops leave a trace of the arguments they received: `write_kv` in the
/// cache's first bytes, `paged_decode` in its output, `move_blocks` in its error.
struct Toy<C, T>(&'static str, std::marker::PhantomData<(C, T)>);

type Bytes = Vec<Vec<u8>>;

impl<C, T> Backend for Toy<C, T>
where
    C: From<Bytes> + AsRef<Bytes> + AsMut<Bytes>,
    T: From<HostTensor> + AsRef<HostTensor> + AsMut<HostTensor>,
{
    type Cache = C;
    type Tensor = T;
    type Completion = u32;

    fn name(&self) -> &str {
        self.0
    }
    fn available(&self) -> Result<(), String> {
        Err(format!("{} is a toy", self.0))
    }
    fn kernels(&self) -> Kernels {
        Kernels {
            build: self.0.to_string(),
            why: "a toy".into(),
            threads: 7,
        }
    }
    fn bf16_products(&self, dtype: DType) -> bool {
        dtype == DType::Bf16
    }
    fn alloc_cache(&self, _: &KvCacheLayout, s: &[BufferShape]) -> Result<C, String> {
        Ok(C::from(s.iter().map(|s| vec![0; s.len as usize]).collect()))
    }
    fn upload_cache(&self, c: &mut C, bytes: &[Vec<u8>]) -> Result<(), String> {
        *c.as_mut() = bytes.to_vec();
        Ok(())
    }
    fn download_cache(&self, c: &C) -> Result<Vec<Vec<u8>>, String> {
        Ok(c.as_ref().clone())
    }
    fn upload_tensor(&self, t: &HostTensor) -> Result<T, String> {
        Ok(T::from(t.clone()))
    }
    fn alloc_tensor(&self, dtype: DType, len: usize) -> Result<T, String> {
        HostTensor::zeros(dtype, len)
            .map(T::from)
            .map_err(|e| e.to_string())
    }
    fn download_tensor(&self, t: &T) -> Result<HostTensor, String> {
        Ok(t.as_ref().clone())
    }
    fn write_kv(&self, c: &mut C, w: &WriteArgs<'_, &T>) -> Result<u32, OpError> {
        let v = w.value.map_or(0xff, |v| v.as_ref().len() as u8);
        let trace = [
            w.layer as u8,
            w.key.as_ref().len() as u8,
            v,
            w.slot_mapping.len() as u8,
        ];
        c.as_mut()[0][..4].copy_from_slice(&trace);
        Ok(7)
    }
    fn paged_decode(&self, c: &C, d: &DecodeArgs<'_, &T>, out: &mut T) -> Result<u32, OpError> {
        let trace = [
            d.layer,
            d.query.as_ref().len() as u64,
            d.blocks_per_seq as u64,
            d.block_table.len() as u64,
            d.seq_lens.len() as u64,
            d.params.num_q_heads,
            u64::from(c.as_ref()[0][0]),
        ];
        *out.as_mut() = HostTensor::F32(trace.iter().map(|&x| x as f32).collect());
        Ok(7)
    }
    fn move_blocks(
        &self,
        src: Option<&C>,
        dst: &mut C,
        op: &BlockMove<'_>,
    ) -> Result<u32, OpError> {
        let first = |c: &C| c.as_ref()[0][0];
        Err(OpError::Incompatible(format!(
            "{} {:?} -> {}",
            op.name(),
            src.map(first),
            first(dst)
        )))
    }
    fn wait(&self, c: u32) -> Result<(), String> {
        (c == 7).then_some(()).ok_or(format!("completion {c}"))
    }
    fn synchronize(&self) -> Result<(), String> {
        Err(format!("{} synchronized", self.0))
    }
}

/// Newtypes, so the two toys' caches and tensors are of different types.
macro_rules! newtype {
    ($name:ident($inner:ty)) => {
        struct $name($inner);
        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                $name(v)
            }
        }
        impl AsRef<$inner> for $name {
            fn as_ref(&self) -> &$inner {
                &self.0
            }
        }
        impl AsMut<$inner> for $name {
            fn as_mut(&mut self) -> &mut $inner {
                &mut self.0
            }
        }
    };
}
newtype!(CacheA(Bytes));
newtype!(CacheB(Bytes));
newtype!(TensorA(HostTensor));
newtype!(TensorB(HostTensor));

fn f32s(be: &AnyBackend, x: &[f32]) -> super::AnyTensor {
    be.upload_tensor(&HostTensor::F32(x.to_vec())).unwrap()
}

fn refused(what: &str) -> OpError {
    OpError::Incompatible(format!("a: the {what} was made by another backend"))
}

/// Every call reaches the backend inside with its arguments; what a backend of another
/// type made is refused by name, and nothing is called.
#[test]
fn any_backend_forwards_and_refuses_what_another_backend_made() {
    let l: KvCacheLayout = "kv B=2 N=16 H=1 D=8 dtype=f16 order=NHD".parse().unwrap();
    let shapes = BufferShape::exact(&l);
    let a = AnyBackend::new(Toy::<CacheA, TensorA>("a", Default::default()));
    let b = AnyBackend::new(Toy::<CacheB, TensorB>("b", Default::default()));
    assert_eq!((a.name(), b.name()), ("a", "b"));
    assert_eq!(a.available(), Err("a is a toy".into()));
    assert_eq!((a.kernels().build.as_str(), a.kernels().threads), ("a", 7));
    assert!(a.bf16_products(DType::Bf16) && !a.bf16_products(DType::F16));
    assert_eq!(a.synchronize(), Err("a synchronized".into()));
    assert_eq!(format!("{a:?}"), "AnyBackend(a)");
    assert_eq!(a.named("cuda:1").name(), "cuda:1");
    let a = AnyBackend::new(Toy::<CacheA, TensorA>("a", Default::default()));

    // Memory.
    let mut ca = a.alloc_cache(&l, &shapes).unwrap();
    let mut cb = b.alloc_cache(&l, &shapes).unwrap();
    let bytes = vec![vec![9u8; 1024]];
    a.upload_cache(&mut ca, &bytes).unwrap();
    assert_eq!(a.download_cache(&ca).unwrap(), bytes);
    assert_eq!(
        a.download_cache(&cb).unwrap_err(),
        "a: the cache was made by another backend"
    );
    assert!(a.upload_cache(&mut cb, &bytes).is_err());
    let t = a.alloc_tensor(DType::F16, 3).unwrap();
    assert_eq!((t.dtype(), t.len()), (DType::F16, 3));
    assert_eq!(
        a.download_tensor(&t).unwrap(),
        HostTensor::F16(vec![Default::default(); 3])
    );
    let tb = f32s(&b, &[1.0; 8]);
    assert_eq!((tb.dtype(), tb.len()), (DType::F32, 8));
    assert!(a.download_tensor(&tb).is_err());

    // write_kv: its arguments reach the backend; another backend's cache or tensor is
    // refused before it is called.
    let (key, value) = (f32s(&a, &[0.5; 8]), f32s(&a, &[0.25; 4]));
    let slots = [0i64, 1, 2];
    let w = |key, value| WriteArgs {
        layer: 2,
        key,
        value,
        slot_mapping: &slots,
    };
    let done = a.write_kv(&mut ca, &w(&key, Some(&value))).unwrap();
    a.wait(done).unwrap();
    assert_eq!(a.download_cache(&ca).unwrap()[0][..5], [2, 8, 4, 3, 9]);
    a.write_kv(&mut ca, &w(&key, None)).unwrap();
    assert_eq!(a.download_cache(&ca).unwrap()[0][..4], [2, 8, 0xff, 3]);
    assert_eq!(
        a.write_kv(&mut cb, &w(&key, None)).unwrap_err(),
        refused("cache")
    );
    assert_eq!(
        a.write_kv(&mut ca, &w(&tb, None)).unwrap_err(),
        refused("key")
    );
    assert_eq!(
        a.write_kv(&mut ca, &w(&key, Some(&tb))).unwrap_err(),
        refused("value")
    );

    // paged_decode.
    let query = f32s(&a, &[1.0; 5]);
    let mut out = a.alloc_tensor(DType::F32, 7).unwrap();
    let params = crate::ops::DecodeParams {
        num_q_heads: 6,
        scale: 1.0,
        sliding_window: None,
        soft_cap: None,
    };
    let d = |query| DecodeArgs {
        layer: 1,
        query,
        block_table: &[0, 1, 1, 0],
        blocks_per_seq: 2,
        seq_lens: &[3, 4],
        params,
    };
    a.wait(a.paged_decode(&ca, &d(&query), &mut out).unwrap())
        .unwrap();
    let trace = a.download_tensor(&out).unwrap().to_f32();
    assert_eq!(trace, [1.0, 5.0, 2.0, 4.0, 2.0, 6.0, 2.0]);
    assert_eq!(
        a.paged_decode(&cb, &d(&query), &mut out).unwrap_err(),
        refused("cache")
    );
    assert_eq!(
        a.paged_decode(&ca, &d(&tb), &mut out).unwrap_err(),
        refused("query")
    );
    let mut out_b = f32s(&b, &[0.0; 7]);
    assert_eq!(
        a.paged_decode(&ca, &d(&query), &mut out_b).unwrap_err(),
        refused("output")
    );

    // move_blocks, through the provided movers.
    let other_a = a.alloc_cache(&l, &shapes).unwrap();
    let moved = |r: Result<super::AnyCompletion, OpError>| r.unwrap_err().to_string();
    assert_eq!(
        moved(a.convert(&other_a, &mut ca)),
        "caches are incompatible: convert Some(0) -> 2"
    );
    assert_eq!(
        moved(a.copy_blocks(&mut ca, &[(0, 1)])),
        "caches are incompatible: copy_blocks None -> 2"
    );
    assert_eq!(
        a.convert(&cb, &mut ca).unwrap_err(),
        refused("source cache")
    );
    assert_eq!(
        a.convert(&other_a, &mut cb).unwrap_err(),
        refused("destination cache")
    );

    // Completions.
    a.wait(AnyCompletion(Box::new(7u32))).unwrap();
    assert_eq!(
        a.wait(AnyCompletion(Box::new(8u32))),
        Err("completion 8".into())
    );
    assert!(a.wait(AnyCompletion(Box::new(7u8))).is_err());
}
