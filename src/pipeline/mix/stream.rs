//! `--calib TEXT` for the mix without whole-model Hessians: each pass that needs Hessian data
//! (sensitivity, the fit's probe encodings, the measured plans) runs the block-streaming
//! calibration of [`crate::calib::stream`] again and does its work on block `l`'s groups when
//! block `l` ends, after which they are dropped. At most one block's Hessians are alive (7B:
//! 1.37 GB f64; 70B: 8.2 GB), never the model's (44 GB, 655 GB); no temporary file. Each pass
//! costs one calibration forward pass and its `XᵀX` (≈ 11 CPU-s per 7B block at 1,024 tokens),
//! small beside the work it feeds. The Hessians are those of `calib::input::calibrate_text`, bit
//! for bit (`stream.rs`'s own test), so the plan, the measured KLDs and the written bytes are
//! those of the in-memory path (tested in `super::tests`).

use crate::calib::input::{text_windows, TextOptions};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::quant::Hessians;
use std::cell::Cell;
use std::path::{Path, PathBuf};

/// A calibration text ready to be streamed through the model, any number of times.
pub(crate) struct TextStream {
    model: PathBuf,
    file: GgufFile,
    windows: Vec<u32>,
    ctx: usize,
    batch: usize,
    quiet: bool,
    /// The groups a pass produces (shapes, no data): [`crate::plan::mix::Calibration::Stream`].
    pub(crate) index: Hessians,
    /// The most Hessian bytes (f64 matrices) alive at once over the passes so far.
    peak: Cell<u64>,
    /// Calibration passes run.
    pub(crate) passes: Cell<usize>,
}

/// After an encoding under Hessian group `g` (encodings in group order), the group's matrix is
/// dropped from `hs` when the next encoding (`next`) is of another group or there is none: the
/// probes and measured plans free a 70B block's Hessians (8.2 GB) as they go. True when dropped.
pub(crate) fn drop_finished(
    hs: &mut Hessians,
    g: &Option<String>,
    next: Option<&Option<String>>,
) -> bool {
    let Some(g) = g else {
        return false;
    };
    if next.is_some_and(|n| n.as_ref() == Some(g)) {
        return false;
    }
    hs.groups.remove(g);
    true
}

/// Bytes of the Hessian matrices `hs` holds.
pub(crate) fn held_bytes(hs: &Hessians) -> u64 {
    hs.groups.values().map(|g| g.h.len() as u64 * 8).sum()
}

impl TextStream {
    /// The windows of `text` for `model` (as `tq convert --calib TEXT` takes them) and the index.
    pub(crate) fn new(
        model: &Path,
        profile: &crate::types::profile::Profile,
        text: &Path,
        o: &TextOptions,
    ) -> Result<TextStream> {
        let (file, windows) = text_windows(model, profile, text, o)?;
        let index = crate::calib::stream::expected(&file, windows.len() as u64)?;
        Ok(TextStream {
            model: model.to_path_buf(),
            file,
            windows,
            ctx: o.ctx,
            batch: o.batch,
            quiet: o.quiet,
            index,
            peak: Cell::new(0),
            passes: Cell::new(0),
        })
    }

    /// The most Hessian bytes alive at once in any pass so far (one block's, by construction).
    pub(crate) fn peak_bytes(&self) -> u64 {
        self.peak.get()
    }

    /// The model's block count.
    pub(crate) fn n_layer(&self) -> usize {
        crate::model::Config::from_gguf(&self.file).map_or(0, |c| c.n_layer)
    }

    /// One calibration pass for `what`: `on_block(l, hs)` gets block `l`'s complete Hessians
    /// (only them), in block order; they are dropped when it returns (it may move them out for
    /// the time of the call).
    pub(crate) fn pass(
        &self,
        what: &str,
        on_block: &mut dyn FnMut(usize, &mut Hessians) -> Result<()>,
    ) -> Result<()> {
        if !self.quiet {
            eprintln!(
                "tq: mix: calibration pass for {what} ({} windows of {}, block by block; one block's Hessians held)",
                self.windows.len() / self.ctx.max(1),
                self.ctx
            );
        }
        self.passes.set(self.passes.get() + 1);
        // The calibration's own lines (its block bar, per-block ETA and GFLOP/s) would count
        // blocks while the phase's work runs inside them: the phase reports its progress, and
        // the pass one line per block.
        let run = crate::calib::stream::Run {
            model: &self.model,
            file: &self.file,
            windows: &self.windows,
            ctx: self.ctx,
            batch: self.batch,
            quiet: true,
        };
        let mut next = 0usize;
        let peak = &self.peak;
        let n_layer = self.n_layer();
        let t0 = std::time::Instant::now();
        let left = crate::calib::stream::run_blocks(&run, &|_| true, &mut |l, hs| {
            if l != next {
                return Err(Error::internal(format!(
                    "calibration pass: block {l} ended where block {next} was due"
                )));
            }
            next += 1;
            peak.set(peak.get().max(held_bytes(hs)));
            if !self.quiet {
                eprintln!(
                    "tq: mix: {what}: block {}/{n_layer} calibrated ({:.0} s into the pass)",
                    l + 1,
                    t0.elapsed().as_secs_f64()
                );
            }
            let r = on_block(l, hs);
            hs.groups.clear();
            r
        })?;
        if !left.groups.is_empty() {
            return Err(Error::internal(
                "calibration pass: Hessians left after the last block",
            ));
        }
        if !self.quiet {
            eprintln!(
                "tq: mix: calibration pass for {what} done; at most {:.2} GB of Hessians held at once",
                self.peak_bytes() as f64 / 1e9
            );
        }
        Ok(())
    }
}

/// The block every member of an item (plan entries `idx`) sits in: None for tensors outside the
/// blocks (token_embd, output); an item across blocks is an internal error (items group a
/// layer's tensors only).
pub(crate) fn block_of(
    plan: &crate::plan::Plan,
    idx: &[usize],
    n_layer: usize,
) -> Result<Option<usize>> {
    let of = |i: usize| {
        crate::arch::layer_of(&plan.entries[i].name)
            .map(|l| l as usize)
            .filter(|&l| l < n_layer)
    };
    let b = of(idx[0]);
    if idx.iter().any(|&i| of(i) != b) {
        return Err(Error::internal(format!(
            "{}: a mix item across blocks",
            plan.entries[idx[0]].name
        )));
    }
    Ok(b)
}

impl TextStream {
    /// The sensitivity table of `items` ([`crate::plan::mix::measure`]'s, value for value):
    /// the items outside the blocks first (no Hessian), then each block's items when its
    /// calibration ends, under that block's Hessians. `progress(done)` after each item.
    pub(crate) fn sensitivity(
        &self,
        src: &dyn crate::source::TensorSource,
        plan: &crate::plan::Plan,
        items: &[(Vec<usize>, Vec<crate::types::TensorType>)],
        sample: crate::quant::sensitivity::Sample,
        exact: crate::plan::mix::ExactBlocks,
        progress: &mut dyn FnMut(usize),
    ) -> Result<crate::plan::mix::Table> {
        use crate::plan::mix::{Calibration, Measurer};
        let n_layer = self.n_layer();
        let blocks: Vec<Option<usize>> = items
            .iter()
            .map(|(idx, _)| block_of(plan, idx, n_layer))
            .collect::<Result<_>>()?;
        let mut table: Vec<Option<Vec<Vec<crate::quant::sensitivity::Estimate>>>> =
            vec![None; items.len()];
        let mut m = Measurer::new(exact, plan);
        let mut done = 0;
        let empty = Hessians::default();
        for (it, (idx, tys)) in items.iter().enumerate() {
            if blocks[it].is_none() {
                table[it] = Some(m.item(
                    it,
                    src,
                    plan,
                    idx,
                    tys,
                    &Calibration::Memory(&empty),
                    sample,
                )?);
                done += 1;
                progress(done);
            }
        }
        if blocks.iter().any(Option::is_some) {
            self.pass("sensitivity", &mut |l, hs| {
                for (it, (idx, tys)) in items.iter().enumerate() {
                    if blocks[it] == Some(l) {
                        table[it] = Some(m.item(
                            it,
                            src,
                            plan,
                            idx,
                            tys,
                            &Calibration::Memory(hs),
                            sample,
                        )?);
                        done += 1;
                        progress(done);
                    }
                }
                Ok(())
            })?;
        }
        let mut table = table
            .into_iter()
            .map(|t| t.ok_or_else(|| Error::internal("a mix item was not measured in its block")))
            .collect::<Result<_>>()?;
        m.finish(&mut table);
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calib::input::calibrate_text;
    use crate::plan::mix::{self, Calibration};
    use crate::types::profile::Profile;

    /// The 3-block fixture model, its calibration text and its q4_K plan.
    struct Tiny {
        model: std::path::PathBuf,
        text: std::path::PathBuf,
        o: crate::calib::input::TextOptions,
        profile: Profile,
        src: Box<dyn crate::source::TensorSource>,
        plan: crate::plan::Plan,
    }

    fn tiny(dir: &Path) -> Tiny {
        tiny_ff(dir, None)
    }

    /// [`tiny`] with the FFN `n_ff` wide (the fixture's: 256, as its hidden size).
    fn tiny_ff(dir: &Path, n_ff: Option<u64>) -> Tiny {
        let (model, text, o) = crate::calib::input::tiny_model_and_text(dir);
        if let Some(ff) = n_ff {
            std::fs::write(&model, crate::gguf_gen::tiny_llama_tok(3, 256, ff).bytes).unwrap();
        }
        let profile = Profile::default();
        let src = crate::source::open(&model, &profile).unwrap();
        let req = crate::plan::Request::new(
            crate::types::TensorType::Q4K,
            &crate::plan::recipe::RECIPES[0],
        );
        let plan = crate::plan::plan(src.tensors(), &req, &profile).unwrap();
        Tiny {
            model,
            text,
            o,
            profile,
            src,
            plan,
        }
    }

    /// The streamed sensitivity pass holds one block's Hessians at a time (the most bytes alive
    /// is the largest block's, below the model's) and gives the table of the in-memory pass over
    /// all Hessians, bit for bit, in one calibration pass.
    #[test]
    fn sensitivity_holds_one_block_and_equals_the_in_memory_table() {
        let dir = tempfile::tempdir().unwrap();
        let Tiny {
            model,
            text,
            o,
            profile,
            src,
            plan,
        } = tiny(dir.path());
        use crate::types::TensorType::*;
        let items = mix::items(&plan, &[Q2K, Q4K, IQ4XS, Q8_0], &profile);
        let ts = TextStream::new(&model, &profile, &text, &o).unwrap();
        // 4 of the 32 rows with LDLQ: the ratio estimate, as the default.
        let sample = crate::quant::sensitivity::Sample { rows: 32, exact: 4 };
        let streamed = ts
            .sensitivity(
                src.as_ref(),
                &plan,
                &items,
                sample,
                mix::ExactBlocks::ALL,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(ts.passes.get(), 1);
        let hs = calibrate_text(&model, &profile, &text, &o).unwrap();
        let whole = mix::measure(
            src.as_ref(),
            &plan,
            &items,
            &Calibration::Memory(&hs),
            sample,
            mix::ExactBlocks::ALL,
            &|_, _| {},
        )
        .unwrap();
        assert_eq!(streamed.len(), whole.len());
        for (a, b) in streamed
            .iter()
            .flatten()
            .flatten()
            .zip(whole.iter().flatten().flatten())
        {
            assert_eq!(a.err.to_bits(), b.err.to_bits());
            assert_eq!(a.se.to_bits(), b.se.to_bits());
        }
        // The bound: the largest block's Hessians, not the model's.
        let mut per_block = [0u64; 3];
        for g in hs.groups.values() {
            let l = crate::arch::layer_of(&g.tensors[0]).unwrap() as usize;
            per_block[l] += g.h.len() as u64 * 8;
        }
        let total: u64 = per_block.iter().sum();
        assert_eq!(held_bytes(&hs), total);
        assert_eq!(ts.peak_bytes(), *per_block.iter().max().unwrap());
        assert!(
            ts.peak_bytes() * 3 <= total,
            "{} of {total}",
            ts.peak_bytes()
        );
    }

    /// The sensitivity table under `exact`, streamed and in memory (equal bit for bit, asserted),
    /// and the table with every block measured.
    fn estimated_and_all(
        t: &Tiny,
        items: &[(Vec<usize>, Vec<crate::types::TensorType>)],
        sample: crate::quant::sensitivity::Sample,
        exact: mix::ExactBlocks,
    ) -> (mix::Table, mix::Table) {
        let ts = TextStream::new(&t.model, &t.profile, &t.text, &t.o).unwrap();
        let src = t.src.as_ref();
        let streamed = ts
            .sensitivity(src, &t.plan, items, sample, exact, &mut |_| {})
            .unwrap();
        let hs = calibrate_text(&t.model, &t.profile, &t.text, &t.o).unwrap();
        let cal = Calibration::Memory(&hs);
        let measure = |e| mix::measure(src, &t.plan, items, &cal, sample, e, &|_, _| {});
        let (est, all) = (
            measure(exact).unwrap(),
            measure(mix::ExactBlocks::ALL).unwrap(),
        );
        let bits = |t: &mix::Table| -> Vec<u64> {
            t.iter()
                .flatten()
                .flatten()
                .map(|e| e.err.to_bits())
                .collect()
        };
        assert_eq!(bits(&streamed), bits(&est));
        (est, all)
    }

    /// Two of three blocks measured (`--mix-exact-blocks 2`: blocks 0 and 2): the streamed and
    /// the in-memory tables agree bit for bit (the estimate does not depend on the order the
    /// items are measured in), the measured blocks' entries and every type without a factor are
    /// the all-blocks table's, and block 1's factor types are estimated from 64-column diagonal
    /// blocks within 2× of their measurement, each tensor's types in the measured order (but near
    /// ties).
    #[test]
    fn two_of_three_blocks_measured_and_the_third_estimated() {
        let dir = tempfile::tempdir().unwrap();
        let t = tiny(dir.path());
        let (profile, plan) = (&t.profile, &t.plan);
        use crate::types::TensorType::*;
        let tys = [Q4_0, IQ4NL, Q5_0, Q8_0, F16];
        let items = mix::items(plan, &tys, profile);
        let sample = crate::quant::sensitivity::Sample { rows: 32, exact: 4 };
        let exact = mix::ExactBlocks {
            count: 2,
            chunk: 64,
            ..mix::ExactBlocks::of_plan(2, plan)
        };
        assert_eq!(exact.n_layer, 3);
        assert_eq!(
            (0..3).map(|l| exact.exact(l)).collect::<Vec<_>>(),
            [true, false, true]
        );
        let (est, all) = estimated_and_all(&t, &items, sample, exact);
        let mut estimated = 0;
        for ((idx, _), (pe, pa)) in items.iter().zip(est.iter().zip(&all)) {
            for (&i, (me, ma)) in idx.iter().zip(pe.iter().zip(pa)) {
                let name = &plan.entries[i].name;
                let in_1 = crate::arch::layer_of(name) == Some(1);
                for (k, (e, a)) in me.iter().zip(ma).enumerate() {
                    if !in_1 || tys[k] == F16 {
                        assert_eq!(e.err.to_bits(), a.err.to_bits(), "{name} {}", tys[k]);
                        continue;
                    }
                    estimated += 1;
                    let r = e.err / a.err;
                    assert!(
                        (0.5..2.0).contains(&r),
                        "{name} {}: {} vs {}",
                        tys[k],
                        e.err,
                        a.err
                    );
                }
                // Types 20 % apart or more keep their order (near ties, here q4_0 and
                // iq4_nl, may swap).
                for x in 0..ma.len() {
                    for y in 0..ma.len() {
                        if ma[x].err < 0.8 * ma[y].err {
                            assert!(me[x].err < me[y].err, "{name}: {} {}", tys[x], tys[y]);
                        }
                    }
                }
            }
        }
        assert!(estimated >= 7 * 4, "{estimated}");
    }

    /// Every block measured, but the widest tensors (as a 70B's `ffn_down` above
    /// [`mix::WIDE`]) wider than `wide`: those are estimated from their Hessian's diagonal
    /// blocks (as many as the other tensors are cut into) in every block, scaled by the other
    /// kinds' ratios, within 1.25× of their measurement (1.4–1.8× with the others' block size);
    /// every other entry is the all-blocks table's; streamed and in memory agree bit for bit.
    #[test]
    fn tensors_wider_than_wide_are_estimated_in_every_block() {
        let dir = tempfile::tempdir().unwrap();
        let t = tiny_ff(dir.path(), Some(512));
        let (profile, plan) = (&t.profile, &t.plan);
        use crate::types::TensorType::*;
        let tys = [Q4_0, IQ4NL, Q5_0, Q8_0, F16];
        let items = mix::items(plan, &tys, profile);
        let sample = crate::quant::sensitivity::Sample { rows: 32, exact: 4 };
        let width = |name: &str| -> Option<usize> {
            let e = plan.entries.iter().find(|e| e.name == name)?;
            crate::arch::layer_of(name)?;
            (e.dims.len() == 2).then_some(e.dims[0] as usize)
        };
        let widest = plan
            .entries
            .iter()
            .filter_map(|e| width(&e.name))
            .max()
            .unwrap();
        let exact = mix::ExactBlocks {
            chunk: 64,
            wide: widest - 1,
            ..mix::ExactBlocks::ALL
        };
        let (est, all) = estimated_and_all(&t, &items, sample, exact);
        let (mut estimated, mut kept) = (0, 0);
        for ((idx, _), (pe, pa)) in items.iter().zip(est.iter().zip(&all)) {
            for (&i, (me, ma)) in idx.iter().zip(pe.iter().zip(pa)) {
                let name = &plan.entries[i].name;
                let wide = width(name) == Some(widest);
                for (k, (e, a)) in me.iter().zip(ma).enumerate() {
                    if !wide || tys[k] == F16 {
                        assert_eq!(e.err.to_bits(), a.err.to_bits(), "{name} {}", tys[k]);
                        kept += 1;
                        continue;
                    }
                    estimated += 1;
                    let r = e.err / a.err;
                    assert!(
                        r != 1.0 && (0.8..1.25).contains(&r),
                        "{name} {}: {} vs {}",
                        tys[k],
                        e.err,
                        a.err
                    );
                }
            }
        }
        assert!(estimated >= 3 * 3 && kept > estimated, "{estimated} {kept}");
    }

    /// A group's matrix goes after its last encoding in group order, not before; encodings
    /// without a group drop nothing.
    #[test]
    fn a_group_is_dropped_after_its_last_encoding() {
        let mut hs = Hessians::default();
        for g in ["a", "b"] {
            let h = crate::quant::Hessian {
                tensors: vec![g.into()],
                n: 1,
                h: vec![1.0],
                tokens: 1,
            };
            hs.groups.insert(g.into(), h);
        }
        let order = [
            Some("a".to_string()),
            Some("a".into()),
            None,
            Some("b".into()),
        ];
        let mut dropped = vec![];
        for (at, g) in order.iter().enumerate() {
            dropped.push(drop_finished(&mut hs, g, order.get(at + 1)));
            let left: Vec<&str> = hs.groups.keys().map(|k| k.as_str()).collect();
            let want: &[&str] = match at {
                0 => &["a", "b"],
                1 | 2 => &["b"],
                _ => &[],
            };
            assert_eq!(left, want, "after {at}");
        }
        assert_eq!(dropped, [false, true, false, true]);
    }
}
