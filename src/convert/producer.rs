//! The producer: the plan's tensors in order, read, checked and encoded (the one encoder path,
//! [`crate::quant::Encoder`]) into the writer's queue.

use super::{Msg, CHUNK_VALUES};
use crate::error::{Error, Result};
use crate::plan::{Action, Plan, PlanEntry};
use crate::quant::ldlq::Factor;
use crate::quant::Hessians;
use crate::source::TensorSource;
use rayon::prelude::*;
use std::sync::Arc;

/// The one rule for every tensor written: a non-finite value is an error naming the tensor, row and
/// column ([`crate::quant::check_finite`]), for copied bytes as for converted ones. Copies of a
/// type tq decodes are decoded chunk by chunk to check (integer and f64 tensors have nothing to
/// check, and types tq cannot decode are copied as they are).
fn check_copy_finite(
    src: &dyn TensorSource,
    i: usize,
    name: &str,
    dims: &[u64],
    ty: crate::types::TensorType,
) -> Result<()> {
    if ty.info().dequantize.is_none() || !(ty.is_float() || ty.is_quantized()) {
        return Ok(());
    }
    let row_len = dims.first().copied().unwrap_or(1).max(1) as usize;
    let n_rows: u64 = dims.iter().skip(1).product();
    let rows_per_chunk = (CHUNK_VALUES / row_len).max(1) as u64;
    let mut row0 = 0u64;
    while row0 < n_rows {
        let rows = rows_per_chunk.min(n_rows - row0) as usize;
        read_finite_rows(src, i, name, row0, rows, row_len)?;
        row0 += rows as u64;
    }
    Ok(())
}

/// Produces the plan's tensors in order, as far as their Hessians allow, into the writer's
/// queue. Resumable: [`Producer::produce`] stops at the first entry that is not ready and the
/// next call continues there.
pub(super) struct Producer<'a> {
    src: &'a dyn TensorSource,
    pub(super) plan: &'a Plan,
    tx: std::sync::mpsc::SyncSender<Msg>,
    /// The next plan entry to write.
    pub(super) next: usize,
    /// One past the last entry to write (the plan's length, or a shard's range end).
    pub(super) end: usize,
    /// Plan index of each LDLQ tensor, by name.
    ldlq_index: std::collections::HashMap<&'a str, usize>,
    /// LDLQ factors by (family, group), with the plan index of the last entry that uses each.
    factors: std::collections::HashMap<String, (Arc<Factor>, usize)>,
    /// Expert tensors encoded ahead with the factors of an earlier tensor that shares their
    /// per-expert Hessians (gate|up): plan index → (their bytes in order, the experts rounded to
    /// nearest). Sent when the entry's turn comes; it no longer needs its Hessians.
    early: std::collections::HashMap<usize, (Vec<Vec<u8>>, Vec<String>)>,
    pub(super) converted: usize,
    pub(super) copied: usize,
    /// Bytes made before for an entry (the mix's measured plans): written as they are.
    pub(super) prepared: Option<&'a Prepared<'a>>,
}

/// An entry's bytes made before, exactly as [`Producer`] would make them, or none.
pub type Prepared<'a> = dyn Fn(usize) -> Option<Vec<u8>> + Sync + 'a;

impl<'a> Producer<'a> {
    pub(super) fn new(
        src: &'a dyn TensorSource,
        plan: &'a Plan,
        tx: std::sync::mpsc::SyncSender<Msg>,
        next: usize,
    ) -> Self {
        Producer {
            src,
            plan,
            tx,
            next,
            end: plan.entries.len(),
            ldlq_index: plan
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.ldlq)
                .map(|(i, e)| (e.name.as_str(), i))
                .collect(),
            factors: Default::default(),
            early: Default::default(),
            converted: 0,
            copied: 0,
            prepared: None,
        }
    }

    /// `name` is an LDLQ tensor not written yet.
    pub(super) fn pending_ldlq(&self, name: &str) -> bool {
        let name = crate::quant::tensor_of(name);
        self.ldlq_index
            .get(name)
            .is_some_and(|&i| i >= self.next && !self.early.contains_key(&i))
    }

    /// Every entry was written; an LDLQ tensor whose Hessian never came is an error.
    pub(super) fn finish(&self) -> Result<()> {
        match self.plan.entries.get(self.next).filter(|_| self.next < self.end) {
            None => Ok(()),
            Some(e) => Err(Error::Unsupported(format!(
                "{}: the calibration pass produced no Hessian for this tensor (the runtime does not read it); convert with a Hessian file from tq calib, or without --calib",
                e.name
            ))),
        }
    }

    /// Write entries from `next` on (up to `end`) while `ready(entry, hs)` holds; LDLQ tensors
    /// take their Hessian from `hs` (a group's matrix is moved into its factor when no other type
    /// family still needs it).
    pub(super) fn produce(
        &mut self,
        hs: &mut Hessians,
        ready: &dyn Fn(&PlanEntry, &Hessians) -> bool,
    ) -> Result<()> {
        while let Some(e) = self
            .plan
            .entries
            .get(self.next)
            .filter(|_| self.next < self.end)
        {
            let early = self.early.contains_key(&self.next);
            let pre = match self.prepared {
                Some(f) if !early => f(self.next),
                _ => None,
            };
            if pre.is_none() && !early && !ready(e, hs) {
                break;
            }
            match pre {
                Some(b) => self.send_prepared(self.next, e, b)?,
                None => self.entry(self.next, e, hs)?,
            }
            self.next += 1;
            let done = self.next;
            self.factors.retain(|_, (_, last)| *last >= done);
            self.tx
                .send(Msg::Done(done))
                .map_err(|_| Error::internal("output writer stopped"))?;
        }
        Ok(())
    }

    /// Entry `i` from bytes made before (checked for the planned size).
    fn send_prepared(&mut self, i: usize, e: &PlanEntry, b: Vec<u8>) -> Result<()> {
        if b.len() as u64 != e.bytes {
            return Err(Error::internal(format!(
                "{}: {} prepared bytes for a {}-byte tensor",
                e.name,
                b.len(),
                e.bytes
            )));
        }
        for c in b.chunks(CHUNK_VALUES * 4) {
            self.tx
                .send(Msg::Data(c.to_vec()))
                .map_err(|_| Error::internal("output writer stopped"))?;
        }
        self.src.release(i);
        self.converted += 1;
        Ok(())
    }

    fn entry(&mut self, i: usize, e: &PlanEntry, hs: &mut Hessians) -> Result<()> {
        let band = self.plan.ldlq.band_for(e.dst);
        let src = self.src;
        // The writer thread hung up: its error is reported by the caller.
        let closed = || Error::internal("output writer stopped");
        if e.action == Action::Copy {
            if let Some(raw) = src.raw(i) {
                check_copy_finite(src, i, &e.name, &e.dims, e.src)?;
                for c in raw.chunks(CHUNK_VALUES * 4) {
                    self.tx.send(Msg::Data(c.to_vec())).map_err(|_| closed())?;
                }
                src.release(i);
                self.copied += 1;
                return Ok(());
            }
            // No stored bytes in this encoding (e.g. HF attn_q/attn_k rows permuted on the fly):
            // re-encode the rows below; float → f32 → same float type is exact.
        }
        let row_len = e.dims.first().copied().unwrap_or(1) as usize;
        let n_rows: u64 = e.dims.iter().skip(1).product();
        if row_len == 0 || n_rows == 0 {
            // A zero-element tensor (e.g. dims [0, 576]): valid GGUF (llama.cpp's gguf reader
            // and gguf-py accept it), written as an empty tensor of the planned type.
            src.release(i);
            self.converted += 1;
            return Ok(());
        }
        let row_bytes = e.dst.bytes_for(row_len as u64).expect("planned") as usize;
        let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1) as u64;
        if e.ldlq && e.dims.len() == 3 {
            self.experts(i, e, hs, rows_per_chunk as usize)?;
            src.release(i);
            self.converted += 1;
            return Ok(());
        }
        let factor = match e.ldlq {
            true => Some(self.factor(i, e, hs)?),
            false => None,
        };
        let enc = crate::quant::Encoder::choose(
            e.dst,
            factor.as_deref().map(|f| (f, band)),
            e.importance.as_deref(),
        );
        let mut row0 = 0u64;
        while row0 < n_rows {
            let rows = rows_per_chunk.min(n_rows - row0) as usize;
            let x = read_finite_rows(src, i, &e.name, row0, rows, row_len)?;
            let bytes = crate::quant::encode_rows(e.dst, &e.name, &x, row_len, &enc)?;
            debug_assert_eq!(bytes.len(), rows * row_bytes);
            self.tx.send(Msg::Data(bytes)).map_err(|_| closed())?;
            row0 += rows as u64;
        }
        src.release(i);
        self.converted += 1;
        Ok(())
    }

    /// A 3-D expert tensor with LDLQ: each expert's rows (`dims[1]` of them) with the factor of
    /// that expert's Hessian; experts that saw fewer than
    /// [`crate::quant::hessian::MIN_EXPERT_TOKENS`] tokens are rounded to nearest, and named.
    /// Later expert tensors of the range that read the same per-expert Hessians (gate|up) in the
    /// same type family are encoded here too, with the same factor (one factorization per expert,
    /// not one per tensor), and their bytes held until their turn (their output size, instead of
    /// `n_expert` factors).
    fn experts(
        &mut self,
        i: usize,
        e: &PlanEntry,
        hs: &Hessians,
        rows_per_chunk: usize,
    ) -> Result<()> {
        if let Some((chunks, rtn)) = self.early.remove(&i) {
            for c in chunks {
                self.tx
                    .send(Msg::Data(c))
                    .map_err(|_| Error::internal("output writer stopped"))?;
            }
            report_rtn_experts(e, &rtn);
            return Ok(());
        }
        let ldlq = self.plan.ldlq;
        let src = self.src;
        let (row_len, n_exp) = (e.dims[0] as usize, e.dims[2] as usize);
        let min_tok = crate::quant::hessian::MIN_EXPERT_TOKENS;
        let mates = self.expert_mates(i, e, hs);
        let mut held: Vec<Vec<Vec<u8>>> = vec![vec![]; mates.len()];
        let mut rtn = vec![];
        for x in 0..n_exp {
            let factor = match hs.for_expert(&e.name, x) {
                Some(h) if h.tokens >= min_tok && h.h.len() == h.n * h.n => {
                    Some(crate::quant::ldlq::factor_hessian_owned(
                        e.dst,
                        h.h.clone(),
                        h.n,
                        ldlq.damp_for(e.dst),
                        ldlq.shrink_for(e.dst),
                        ldlq.refit,
                        &e.name,
                    )?)
                }
                h => {
                    rtn.push(format!("{x} ({} tokens)", h.map_or(0, |h| h.tokens)));
                    None
                }
            };
            // This tensor's expert `x` goes out now, each mate's into its hold.
            for (k, &j) in std::iter::once(&i).chain(&mates).enumerate() {
                let t = &self.plan.entries[j];
                let per = t.dims[1] as usize;
                let enc = crate::quant::Encoder::choose(
                    t.dst,
                    factor.as_ref().map(|f| (f, ldlq.band_for(t.dst))),
                    t.importance.as_deref(),
                );
                let mut r = 0;
                while r < per {
                    let rows = rows_per_chunk.min(per - r);
                    let row0 = (x * per + r) as u64;
                    let xr = read_finite_rows(src, j, &t.name, row0, rows, row_len)?;
                    let bytes = crate::quant::encode_rows(t.dst, &t.name, &xr, row_len, &enc)?;
                    match k {
                        0 => self
                            .tx
                            .send(Msg::Data(bytes))
                            .map_err(|_| Error::internal("output writer stopped"))?,
                        _ => held[k - 1].push(bytes),
                    }
                    r += rows;
                }
            }
        }
        report_rtn_experts(e, &rtn);
        for (j, chunks) in mates.into_iter().zip(held) {
            src.release(j);
            self.early.insert(j, (chunks, rtn.clone()));
        }
        Ok(())
    }

    /// The later LDLQ expert tensors in this producer's range whose every expert reads the same
    /// Hessian as entry `i`'s (both none, or one group: gate|up) and whose factor is the same
    /// (type family and LDLQ kind, as [`Self::factor`] keys it; same input width and experts).
    fn expert_mates(&self, i: usize, e: &PlanEntry, hs: &Hessians) -> Vec<usize> {
        let n_exp = e.dims[2] as usize;
        let same = |x: &PlanEntry| {
            x.ldlq
                && x.dims.len() == 3
                && x.dims[0] == e.dims[0]
                && x.dims[2] == e.dims[2]
                && x.dst.family() == e.dst.family()
                && x.dst.ldlq() == e.dst.ldlq()
                && (0..n_exp).all(|k| {
                    match (hs.for_expert(&e.name, k), hs.for_expert(&x.name, k)) {
                        (None, None) => true,
                        (Some(a), Some(b)) => std::ptr::eq(a, b),
                        _ => false,
                    }
                })
                && (0..n_exp).any(|k| hs.for_expert(&e.name, k).is_some())
        };
        (i + 1..self.end)
            .filter(|&j| !self.early.contains_key(&j) && same(&self.plan.entries[j]))
            .collect()
    }

    /// The LDLQ factor for entry `i`, computed once per Hessian group and type family (q/k/v
    /// and gate/up share theirs) and kept until the group's last tensor is written.
    fn factor(&mut self, i: usize, e: &PlanEntry, hs: &mut Hessians) -> Result<Arc<Factor>> {
        let h = hs
            .for_tensor_mut(&e.name)
            .expect("planner checked the Hessian");
        // The factor is of the Hessian rotated (or permuted) for the type's family and LDLQ
        // kind: key on all three (iq4_xs and iq2_xs are one family but factor differently).
        let fam = |x: &PlanEntry| {
            format!(
                "{:?}:{:?}:{}",
                x.dst.family(),
                x.dst.ldlq(),
                h.tensors.join(",")
            )
        };
        let key = fam(e);
        if let Some((f, _)) = self.factors.get(&key) {
            return Ok(f.clone());
        }
        // The matrix moves into the factor (13 GB for a 70B FFN input is then held once, not
        // twice) unless a later tensor of the group needs a factor of another type family.
        let shared = self.plan.entries[i + 1..]
            .iter()
            .any(|x| x.ldlq && h.tensors.contains(&x.name) && fam(x) != key);
        if h.h.len() != h.n * h.n {
            return Err(Error::internal(format!(
                "{}: its Hessian was already used",
                e.name
            )));
        }
        let m = if shared {
            h.h.clone()
        } else {
            std::mem::take(&mut h.h)
        };
        let f = Arc::new(crate::quant::ldlq::factor_hessian_owned(
            e.dst,
            m,
            h.n,
            self.plan.ldlq.damp_for(e.dst),
            self.plan.ldlq.shrink_for(e.dst),
            self.plan.ldlq.refit,
            &e.name,
        )?);
        let last = self
            .plan
            .entries
            .iter()
            .enumerate()
            .skip(i)
            .rev()
            .find(|(_, x)| x.ldlq && h.tensors.contains(&x.name) && fam(x) == key)
            .map_or(i, |(j, _)| j);
        self.factors.insert(key, (f.clone(), last));
        Ok(f)
    }
}

/// The one-line note naming the experts of `e` that were rounded to nearest (too few tokens).
fn report_rtn_experts(e: &PlanEntry, rtn: &[String]) {
    if !rtn.is_empty() {
        eprintln!(
            "tq convert: {}: {} of {} experts saw fewer than {} calibration tokens and are rounded to nearest: experts {}",
            e.name,
            rtn.len(),
            e.dims[2],
            crate::quant::hessian::MIN_EXPERT_TOKENS,
            rtn.join(", ")
        );
    }
}

/// Rows `[row0, row0 + rows)` of tensor `i` as f32, read in parallel; a NaN/Inf is an error
/// naming the tensor, row and column.
fn read_finite_rows(
    src: &dyn TensorSource,
    i: usize,
    name: &str,
    row0: u64,
    rows: usize,
    row_len: usize,
) -> Result<Vec<f32>> {
    let mut x = vec![0f32; rows * row_len];
    x.par_chunks_mut(row_len)
        .enumerate()
        .try_for_each(|(r, row)| -> Result<()> {
            let abs = row0 + r as u64;
            src.read_rows_f32(i, abs, row)?;
            crate::quant::check_finite(name, abs, row)
        })?;
    Ok(x)
}
