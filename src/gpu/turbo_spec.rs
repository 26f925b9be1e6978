//! [`TurboSpec`]: a turbo block layout with its codebook, what the turbo kernels are
//! parameterized by, and [`turbo_specs`], every one `tq` writes or simulates (the harness checks
//! each).

use crate::error::{Error, Result};
use crate::types::turbo;
use crate::types::turbo::{turbo_codebook, Turbo4Table};
use crate::types::TensorType;

/// Index bits of a turbo type.
pub(crate) fn turbo_bits(ty: TensorType) -> Result<u32> {
    match ty {
        TensorType::Turbo2 => Ok(2),
        TensorType::Turbo3 => Ok(3),
        TensorType::Turbo4 => Ok(4),
        _ => Err(Error::Unsupported(format!("{ty}: not a turbo type"))),
    }
}

/// A turbo block layout with its codebook: what the turbo kernels are parameterized by.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboSpec {
    pub ty: TensorType,
    pub layout: turbo::TurboLayout,
    /// Ascending, `2^bits` entries; passed to the kernels as a buffer.
    pub codebook: Vec<f32>,
    /// The `--turbo-codebook` choices that give this layout and codebook (`may`, `fork`, ...),
    /// or `registry` for the stock May-2026 types.
    pub tables: Vec<&'static str>,
}

impl TurboSpec {
    /// The registry's type: the May-2026 128-value layout and CB2/CB3/CB4.
    pub fn stock(ty: TensorType) -> Result<TurboSpec> {
        let (layout, cb): (_, &[f32]) = match ty {
            TensorType::Turbo2 => (turbo::TurboLayout::MAY[0], &turbo::CB2),
            TensorType::Turbo3 => (turbo::TurboLayout::MAY[1], &turbo::CB3),
            TensorType::Turbo4 => (turbo::TurboLayout::MAY[2], &turbo::CB4),
            _ => return Err(Error::Unsupported(format!("{ty}: not a turbo type"))),
        };
        Ok(TurboSpec {
            ty,
            layout,
            codebook: cb.to_vec(),
            tables: vec!["registry"],
        })
    }

    /// What `tq eval` / `tq kv` simulate for `ty` with `--turbo-codebook table` on `group`-value
    /// groups (64 for 64-wide heads): turbo4 has the 4-byte May header only with the May table
    /// (`model::kv::bits_per_value`), the codebook is `types::turbo::turbo_codebook`.
    pub fn simulated(ty: TensorType, table: Turbo4Table, group: usize) -> Result<TurboSpec> {
        let bits = turbo_bits(ty)?;
        let header = if bits == 4 && table == Turbo4Table::May {
            4
        } else {
            2
        };
        Ok(TurboSpec {
            ty,
            layout: turbo::TurboLayout::new(bits, group, header),
            codebook: turbo_codebook(ty, table, group).to_vec(),
            tables: vec![table.name()],
        })
    }

    pub fn is_stock(&self) -> bool {
        TurboSpec::stock(self.ty)
            .is_ok_and(|s| s.layout == self.layout && s.codebook == self.codebook)
    }

    /// `g64 66B? ...`: group, block bytes, codebook choices.
    pub fn label(&self) -> String {
        format!(
            "g{} {}B cb={}",
            self.layout.group,
            self.layout.block_bytes(),
            self.tables.join("=")
        )
    }

    /// Refuse what the kernels cannot decode (bad layout, codebook of the wrong size, a row
    /// that is not whole groups), so no kernel reads out of bounds.
    pub fn validate(&self, bytes: usize, rows_cols: Option<(usize, usize)>) -> Result<()> {
        let l = &self.layout;
        if !l.is_valid() || self.codebook.len() != 1 << l.bits {
            return Err(Error::Unsupported(format!(
                "{}: unsupported turbo layout {l:?} with {} centroids",
                self.ty,
                self.codebook.len()
            )));
        }
        if !bytes.is_multiple_of(l.block_bytes()) {
            return Err(Error::Unsupported(format!(
                "{}: {bytes} bytes is not a whole number of {}-byte blocks",
                self.ty,
                l.block_bytes()
            )));
        }
        if let Some((rows, cols)) = rows_cols {
            if cols % l.group != 0 || rows * cols / l.group * l.block_bytes() != bytes {
                return Err(Error::Unsupported(format!(
                    "{}: {rows}x{cols} keys do not match {bytes} bytes of {}-value groups",
                    self.ty, l.group
                )));
            }
        }
        Ok(())
    }

    /// CPU reference dequantize.
    pub fn reference(&self, blocks: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; blocks.len() / self.layout.block_bytes() * self.layout.group];
        turbo::dequantize_blocks(&self.layout, &self.codebook, blocks, &mut out);
        out
    }

    /// CPU reference quantize of whole groups.
    pub fn quantize(&self, src: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; src.len() / self.layout.group * self.layout.block_bytes()];
        turbo::quantize_blocks(&self.layout, &self.codebook, src, &mut out);
        out
    }
}

/// Every turbo layout and codebook `tq` writes or simulates for `ty`: the registry's (first),
/// then `--turbo-codebook may|fork|head-dim` on 128- and 64-value groups, duplicates merged.
pub fn turbo_specs(ty: TensorType) -> Result<Vec<TurboSpec>> {
    let mut out = vec![TurboSpec::stock(ty)?];
    for group in [128, 64] {
        for table in [
            Turbo4Table::May,
            Turbo4Table::LloydMax,
            Turbo4Table::HeadDim,
        ] {
            let s = TurboSpec::simulated(ty, table, group)?;
            match out
                .iter_mut()
                .find(|o| o.layout == s.layout && o.codebook == s.codebook)
            {
                Some(o) => o.tables.push(table.name()),
                None => out.push(s),
            }
        }
    }
    Ok(out)
}
