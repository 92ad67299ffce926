//! Host tensors handed to ops: dense, row-major activations in f32, f16 or bf16.

use half::{bf16, f16};
use kvlayout::ops::{HostTensor, TensorDesc};
use kvlayout::DType;

/// A dense row-major activation tensor (keys, values, queries).
#[derive(Debug, Clone, Copy)]
pub enum Activations<'a> {
    /// f32 data.
    F32(&'a [f32]),
    /// f16 data.
    F16(&'a [f16]),
    /// bf16 data.
    Bf16(&'a [bf16]),
}

impl Activations<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Activations::F32(x) => x.len(),
            Activations::F16(x) => x.len(),
            Activations::Bf16(x) => x.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Activations::F32(_) => DType::F32,
            Activations::F16(_) => DType::F16,
            Activations::Bf16(_) => DType::Bf16,
        }
    }

    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Activations::F32(x) => x[i],
            Activations::F16(x) => x[i].to_f32(),
            Activations::Bf16(x) => x[i].to_f32(),
        }
    }

    /// Converts `len` elements from `start` into `out` (f32).
    #[inline]
    pub fn read_into(&self, start: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        let n = out.len();
        match self {
            Activations::F32(x) => out.copy_from_slice(&x[start..start + n]),
            Activations::F16(x) => x[start..start + n].convert_to_f32_slice(out),
            Activations::Bf16(x) => x[start..start + n].convert_to_f32_slice(out),
        }
    }
}

impl TensorDesc for Activations<'_> {
    fn dtype(&self) -> DType {
        Activations::dtype(self)
    }
    fn len(&self) -> usize {
        Activations::len(self)
    }
}

impl<'a> From<&'a HostTensor> for Activations<'a> {
    fn from(t: &'a HostTensor) -> Self {
        match t {
            HostTensor::F32(x) => Activations::F32(x),
            HostTensor::F16(x) => Activations::F16(x),
            HostTensor::Bf16(x) => Activations::Bf16(x),
        }
    }
}

impl From<Activations<'_>> for HostTensor {
    fn from(a: Activations<'_>) -> Self {
        match a {
            Activations::F32(x) => HostTensor::F32(x.to_vec()),
            Activations::F16(x) => HostTensor::F16(x.to_vec()),
            Activations::Bf16(x) => HostTensor::Bf16(x.to_vec()),
        }
    }
}
