//! Weights resident on a device for repeated mat-muls: what the model runtime runs its quantized
//! linear layers through (`tq eval --backend`, `tq validate --backend`). Each weight is uploaded
//! once ([`Linear::upload_weight`]) and multiplied by a batch of activation rows per call
//! ([`Linear::matmul`]) with the mat-mul kernel of its type (`gpu/kernels.rs`); the launch
//! sequence is the shared one of `gpu/device.rs`.
//!
//! Device memory: the packed bytes of the uploaded weights (the same bytes as in the GGUF: 0.625
//! bytes per value for TQ4_1S, 0.5 for TQ3_1S), held until the [`Linear`] is dropped, plus the
//! scratch of one call: at most about 3 × 32 MiB (the activation chunk, its rotated copy and the
//! output chunk), freed when the call returns.

use super::device::{matmul_resident, matmul_weight_check, Device};
use super::kernels::Kernel;
use super::BackendKind;
use crate::error::{Error, Result};
use crate::types::TensorType;

/// A weight uploaded to a [`Linear`] backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(usize);

/// Mat-muls with device-resident weights (see the module note).
pub trait Linear {
    fn kind(&self) -> BackendKind;
    /// The device as the driver names it.
    fn device_name(&self) -> String;
    /// Upload a weight of `rows × cols` values of `ty` (rows back to back, whole blocks) once.
    /// Fails for a type without a mat-mul kernel ([`super::has_matmul`]).
    fn upload_weight(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<WeightId>;
    /// `Y = X·Wᵀ` for `tokens` activation rows `X` (`tokens × cols`, row-major): `Y` is
    /// `tokens × rows`, token-major.
    fn matmul(&mut self, w: WeightId, x: &[f32], tokens: usize) -> Result<Vec<f32>>;
    /// Bytes of the weights held on the device.
    fn resident_bytes(&self) -> u64;
}

struct Weight<B> {
    buf: B,
    kernel: &'static Kernel,
    rows: usize,
    cols: usize,
}

/// A [`Device`] and the weights uploaded to it.
pub(crate) struct Resident<D: Device> {
    d: D,
    weights: Vec<Weight<D::Buf>>,
    bytes: u64,
}

impl<D: Device> Resident<D> {
    pub fn new(d: D) -> Self {
        Resident {
            d,
            weights: vec![],
            bytes: 0,
        }
    }
}

impl<D: Device> Linear for Resident<D> {
    fn kind(&self) -> BackendKind {
        self.d.kind()
    }

    fn device_name(&self) -> String {
        self.d.device_name()
    }

    fn upload_weight(
        &mut self,
        ty: TensorType,
        w: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<WeightId> {
        let kernel = matmul_weight_check(ty, w.len(), rows, cols)?;
        let n = rows * (cols / 32) * ty.block_bytes();
        let buf = self.d.upload(&w[..n])?;
        self.weights.push(Weight {
            buf,
            kernel,
            rows,
            cols,
        });
        self.bytes += n as u64;
        Ok(WeightId(self.weights.len() - 1))
    }

    fn matmul(&mut self, w: WeightId, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
        let wt = self
            .weights
            .get(w.0)
            .ok_or_else(|| Error::Unsupported(format!("mat-mul: no weight {}", w.0)))?;
        matmul_resident(&mut self.d, wt.kernel, &wt.buf, wt.rows, wt.cols, x, tokens)
    }

    fn resident_bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{random_activation, random_weights, reference_dots, CpuEmulation, Rng};

    /// Uploaded once, multiplied twice; the result is the one-shot mat-mul's, within the dot
    /// bound of the f64 reference; a type without a mat-mul kernel is refused.
    #[test]
    fn resident_weight_matches_the_reference() {
        let mut rng = Rng::new(7);
        let (rows, cols, tokens) = (24, 96, 11);
        for ty in [TensorType::TQ4_1S, TensorType::TQ3_1S] {
            let w = random_weights(ty, rows, cols, &mut rng).unwrap();
            let x: Vec<f32> = (0..tokens)
                .flat_map(|_| random_activation(cols, &mut rng))
                .collect();
            let mut lin = Resident::new(CpuEmulation);
            let id = lin.upload_weight(ty, &w, rows, cols).unwrap();
            assert_eq!(lin.resident_bytes(), w.len() as u64);
            let y = lin.matmul(id, &x, tokens).unwrap();
            assert_eq!(y, lin.matmul(id, &x, tokens).unwrap());
            for t in 0..tokens {
                let (dots, sums) =
                    reference_dots(ty, &w, rows, cols, &x[t * cols..(t + 1) * cols]).unwrap();
                for r in 0..rows {
                    let e = (y[t * rows + r] as f64 - dots[r]).abs();
                    assert!(e <= crate::gpu::DOT_REL_BOUND * sums[r], "{ty} {t} {r}");
                }
            }
        }
        let mut lin = Resident::new(CpuEmulation);
        assert!(lin
            .upload_weight(TensorType::Q8_0, &[0; 34], 1, 32)
            .is_err());
        assert!(lin
            .upload_weight(TensorType::TQ4_1S, &[0; 19], 1, 32)
            .is_err());
    }
}
