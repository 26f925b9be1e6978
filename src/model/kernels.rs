//! The model's quantized linear layers through a GPU backend's mat-mul kernels (`tq eval
//! --backend`, `tq validate --backend`). Which weights go there is a lookup in the kernel table
//! ([`crate::gpu::has_matmul`]): every 2-D block weight and the output projection whose type has
//! a mat-mul kernel; everything else (other weight types, norms, attention, the KV cache) stays on
//! the CPU. Each routed weight is uploaded once, when the backend is attached, and stays resident
//! for the life of the [`crate::model::Model`]: device memory is the routed tensors' packed bytes
//! (their size in the GGUF) plus one call's scratch (`gpu/linear.rs`).

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::gpu::{has_matmul, BackendKind, Linear, WeightId};
use std::collections::HashMap;

/// Where one linear weight of the model runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub tensor: String,
    /// Its type's name (`tq4_1s`, `q8_0`, ...).
    pub ty: String,
    /// `true`: through the backend's mat-mul kernel; `false`: the CPU runtime.
    pub on_backend: bool,
}

/// The linear weights of `f` (2-D block weights and the output projection `output`) and where
/// each runs when a backend is attached.
pub(crate) fn placements(f: &GgufFile, output: &str) -> Vec<Placement> {
    let mut v: Vec<Placement> = f
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2 && (t.name.starts_with("blk.") || t.name == output))
        .map(|t| Placement {
            tensor: t.name.clone(),
            ty: t.ty.name().to_string(),
            on_backend: has_matmul(t.ty),
        })
        .collect();
    v.sort_by(|a, b| a.tensor.cmp(&b.tensor));
    v
}

/// A backend with the model's routed weights resident on it.
pub(crate) struct Kernels {
    lin: Box<dyn Linear>,
    ids: HashMap<String, (WeightId, usize)>,
}

impl Kernels {
    /// Upload every routed weight of `f` (see [`placements`]) to `lin`.
    pub fn attach(f: &GgufFile, output: &str, mut lin: Box<dyn Linear>) -> Result<Kernels> {
        let mut ids = HashMap::new();
        for p in placements(f, output).into_iter().filter(|p| p.on_backend) {
            let t = f.tensor(&p.tensor).expect("listed from the file");
            let (rows, cols) = (t.n_rows() as usize, t.row_len() as usize);
            let id = lin
                .upload_weight(t.ty, f.tensor_data(t), rows, cols)
                .map_err(|e| {
                    Error::Unsupported(format!(
                        "--backend {}: uploading {} of {}: {}",
                        lin.kind().name(),
                        crate::error::one_line(&t.name),
                        f.path.display(),
                        crate::error::one_line(&e.to_string())
                    ))
                })?;
            ids.insert(p.tensor, (id, rows));
        }
        Ok(Kernels { lin, ids })
    }

    pub fn kind(&self) -> BackendKind {
        self.lin.kind()
    }

    pub fn device_name(&self) -> String {
        self.lin.device_name()
    }

    pub fn resident_bytes(&self) -> u64 {
        self.lin.resident_bytes()
    }

    /// Whether `tensor` runs on the backend.
    pub fn has(&self, tensor: &str) -> bool {
        self.ids.contains_key(tensor)
    }

    /// `out[r * stride + c] = (x · Wᵀ)[r][c]` for the `rows × k` activation `x` and the routed
    /// weight `tensor` (`n × k`).
    pub fn matmul(
        &mut self,
        tensor: &str,
        x: &[f32],
        rows: usize,
        k: usize,
        out: &mut [f32],
        stride: usize,
    ) -> Result<()> {
        let &(id, n) = self
            .ids
            .get(tensor)
            .ok_or_else(|| Error::internal(format!("{tensor}: not on the backend")))?;
        let y = self.lin.matmul(id, &x[..rows * k], rows).map_err(|e| {
            Error::Unsupported(format!(
                "{} mat-mul of {}: {e}",
                self.lin.kind().name(),
                crate::error::one_line(tensor)
            ))
        })?;
        for (r, yr) in y.chunks_exact(n).enumerate().take(rows) {
            out[r * stride..r * stride + n].copy_from_slice(yr);
        }
        Ok(())
    }
}
