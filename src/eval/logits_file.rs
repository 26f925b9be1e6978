//! Saved reference distributions for KL divergence, in two formats:
//!
//! - **tq** (`TQLOGITS`, written by `tq eval --save-logits`): the same 16-bit log-probability
//!   codes llama.cpp keeps ([`RefRow`]), but only the codes that matter — codes of 0 mean "more
//!   than 16 nats below the top" and are skipped by the KLD anyway — with their positions as a
//!   bitmap or as varint gaps, whichever is smaller. Typically 5–20× smaller than llama.cpp's.
//! - **llama** (`_logits_`, written by `llama-perplexity --kl-divergence-base`): read, and written
//!   with `--logits-format llama` so llama.cpp can use a base computed by tq.
//!
//! Layout of a tq file (little-endian): `"TQLOGITS"`, u32 version (1), u32 n_ctx, u32 n_vocab,
//! u32 n_chunk, u32 first (scored positions start here), u32 info length + that many bytes of
//! JSON (model, numerics), u32 × n_chunk·n_ctx tokens, then `n_chunk · (n_ctx − 1 − first)`
//! rows: f32 scale, f32 min_log_prob, u8 mode, u32 nnz, positions (mode 0: bitmap of
//! ⌈n_vocab/8⌉ bytes; mode 1: nnz LEB128 gaps), nnz × u16 codes.

use super::kld::RefRow;
use crate::error::{Error, Result};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const TQ_MAGIC: &[u8; 8] = b"TQLOGITS";
const LLAMA_MAGIC: &[u8; 8] = b"_logits_";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tq,
    Llama,
}

/// What a logits file starts with.
#[derive(Clone, Debug)]
pub struct Header {
    pub format: Format,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// First scored position of a window (`n_ctx / 2`).
    pub first: usize,
    pub info: String,
    /// `n_chunk * n_ctx` token ids (as in the text, before any BOS replacement).
    pub tokens: Vec<u32>,
}

impl Header {
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first
    }
}

pub struct Writer {
    out: BufWriter<std::fs::File>,
    /// Removes the temporary file unless `finish` renames it into place.
    target: crate::io::TempOutput,
    format: Format,
    n_vocab: usize,
    buf: Vec<u8>,
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(p, e)
}

impl Writer {
    /// Start a file at `path` (written to a temporary name, renamed by [`Writer::finish`]).
    pub fn create(path: &Path, format: Format, h: &Header) -> Result<Writer> {
        let (target, f) = crate::io::TempOutput::create(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        let mut b = Vec::new();
        match format {
            Format::Tq => {
                b.extend_from_slice(TQ_MAGIC);
                for v in [
                    1u32,
                    h.n_ctx as u32,
                    h.n_vocab as u32,
                    h.n_chunk as u32,
                    h.first as u32,
                ] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                b.extend_from_slice(&(h.info.len() as u32).to_le_bytes());
                b.extend_from_slice(h.info.as_bytes());
            }
            Format::Llama => {
                if h.first != h.n_ctx / 2 {
                    // Windows always score from n_ctx/2 (perplexity::Windows::first).
                    return Err(Error::internal(
                        "llama logits files always score from n_ctx/2",
                    ));
                }
                b.extend_from_slice(LLAMA_MAGIC);
                for v in [h.n_ctx as i32, h.n_vocab as i32, h.n_chunk as i32] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        for &t in &h.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&b).map_err(io(target.tmp_path()))?;
        Ok(Writer {
            out,
            target,
            format,
            n_vocab: h.n_vocab,
            buf: Vec::new(),
        })
    }

    pub fn write_row(&mut self, r: &RefRow) -> Result<()> {
        assert_eq!(r.q.len(), self.n_vocab);
        let b = &mut self.buf;
        b.clear();
        b.extend_from_slice(&r.scale.to_le_bytes());
        b.extend_from_slice(&r.min_log_prob.to_le_bytes());
        match self.format {
            Format::Llama => {
                for &q in &r.q {
                    b.extend_from_slice(&q.to_le_bytes());
                }
                if self.n_vocab % 2 == 1 {
                    b.extend_from_slice(&[0, 0]);
                }
            }
            Format::Tq => {
                let nnz = r.q.iter().filter(|&&q| q != 0).count();
                let mut gaps = Vec::new();
                let mut prev = 0usize;
                for (i, &q) in r.q.iter().enumerate() {
                    if q != 0 {
                        let mut g = (i - prev) as u64;
                        prev = i;
                        loop {
                            let byte = (g & 0x7f) as u8;
                            g >>= 7;
                            if g == 0 {
                                gaps.push(byte);
                                break;
                            }
                            gaps.push(byte | 0x80);
                        }
                    }
                }
                let bitmap_len = self.n_vocab.div_ceil(8);
                if gaps.len() < bitmap_len {
                    b.push(1);
                    b.extend_from_slice(&(nnz as u32).to_le_bytes());
                    b.extend_from_slice(&gaps);
                } else {
                    b.push(0);
                    b.extend_from_slice(&(nnz as u32).to_le_bytes());
                    let mut bm = vec![0u8; bitmap_len];
                    for (i, &q) in r.q.iter().enumerate() {
                        if q != 0 {
                            bm[i / 8] |= 1 << (i % 8);
                        }
                    }
                    b.extend_from_slice(&bm);
                }
                for &q in r.q.iter().filter(|&&q| q != 0) {
                    b.extend_from_slice(&q.to_le_bytes());
                }
            }
        }
        self.out.write_all(b).map_err(io(self.target.tmp_path()))
    }

    pub fn finish(self) -> Result<()> {
        let f = self
            .out
            .into_inner()
            .map_err(|e| Error::io(self.target.tmp_path(), e.into_error()))?;
        self.target.commit(f)
    }
}

pub struct Reader {
    inp: BufReader<std::fs::File>,
    path: PathBuf,
    pub header: Header,
}

fn rd<const N: usize>(r: &mut impl Read, p: &Path, what: &str) -> Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).map_err(|e| {
        Error::bad_input(
            p,
            format!("truncated logits file while reading {what} ({e})"),
        )
    })?;
    Ok(b)
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader> {
        let f = std::fs::File::open(path).map_err(io(path))?;
        let len = f.metadata().map_err(io(path))?.len();
        let mut inp = BufReader::with_capacity(1 << 20, f);
        let magic: [u8; 8] = rd(&mut inp, path, "magic")?;
        let u32v = |inp: &mut BufReader<std::fs::File>, what: &str| -> Result<u32> {
            Ok(u32::from_le_bytes(rd(inp, path, what)?))
        };
        let bad = |m: String| Error::bad_input(path, m);
        let (format, n_ctx, n_vocab, n_chunk, first, info) = if &magic == TQ_MAGIC {
            let v = u32v(&mut inp, "version")?;
            if v != 1 {
                return Err(bad(format!(
                    "tq logits file version {v} is not supported (1)"
                )));
            }
            let n_ctx = u32v(&mut inp, "n_ctx")? as usize;
            let n_vocab = u32v(&mut inp, "n_vocab")? as usize;
            let n_chunk = u32v(&mut inp, "n_chunk")? as usize;
            let first = u32v(&mut inp, "first")? as usize;
            let il = u32v(&mut inp, "info length")? as u64;
            if il > 1 << 20 || il > len {
                return Err(bad(format!("info length {il} is implausible")));
            }
            let mut s = vec![0u8; il as usize];
            inp.read_exact(&mut s)
                .map_err(|e| bad(format!("truncated info ({e})")))?;
            (
                Format::Tq,
                n_ctx,
                n_vocab,
                n_chunk,
                first,
                String::from_utf8_lossy(&s).into_owned(),
            )
        } else if &magic == LLAMA_MAGIC {
            let n_ctx = u32v(&mut inp, "n_ctx")? as usize;
            let n_vocab = i32::from_le_bytes(rd(&mut inp, path, "n_vocab")?);
            let n_chunk = i32::from_le_bytes(rd(&mut inp, path, "n_chunk")?);
            if n_vocab <= 0 || n_chunk <= 0 {
                return Err(bad(format!(
                    "n_vocab {n_vocab} / n_chunk {n_chunk} must be positive"
                )));
            }
            (
                Format::Llama,
                n_ctx,
                n_vocab as usize,
                n_chunk as usize,
                n_ctx / 2,
                String::new(),
            )
        } else {
            return Err(bad(
                "not a logits file (expected TQLOGITS or llama.cpp _logits_ magic)".into(),
            ));
        };
        if !(4..=1 << 22).contains(&n_ctx) || first >= n_ctx - 1 || n_vocab > 1 << 24 {
            return Err(bad(format!(
                "implausible header: n_ctx {n_ctx}, first {first}, n_vocab {n_vocab}"
            )));
        }
        let nt = (n_ctx as u64) * (n_chunk as u64);
        if nt * 4 > len {
            return Err(bad(format!(
                "file too short for {n_chunk} chunks of {n_ctx} tokens"
            )));
        }
        let mut tb = vec![0u8; nt as usize * 4];
        inp.read_exact(&mut tb)
            .map_err(|e| bad(format!("truncated tokens ({e})")))?;
        let tokens = tb
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Reader {
            inp,
            path: path.to_path_buf(),
            header: Header {
                format,
                n_ctx,
                n_vocab,
                n_chunk,
                first,
                info,
                tokens,
            },
        })
    }

    /// The next reference row (rows come chunk by chunk, positions `first..n_ctx-1`).
    pub fn next_row(&mut self) -> Result<RefRow> {
        let p = self.path.clone();
        let inp = &mut self.inp;
        let nv = self.header.n_vocab;
        let scale = f32::from_le_bytes(rd(inp, &p, "a row")?);
        let min_log_prob = f32::from_le_bytes(rd(inp, &p, "a row")?);
        let mut q = vec![0u16; nv];
        match self.header.format {
            Format::Llama => {
                let n = nv + nv % 2;
                let mut b = vec![0u8; n * 2];
                inp.read_exact(&mut b)
                    .map_err(|e| Error::bad_input(&p, format!("truncated logits row ({e})")))?;
                for (i, v) in q.iter_mut().enumerate() {
                    *v = u16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
                }
            }
            Format::Tq => {
                let [mode] = rd::<1>(inp, &p, "row mode")?;
                let nnz = u32::from_le_bytes(rd(inp, &p, "row nnz")?) as usize;
                if nnz > nv {
                    return Err(Error::bad_input(
                        &p,
                        format!("row has {nnz} entries for {nv} tokens"),
                    ));
                }
                let mut idx = Vec::with_capacity(nnz);
                match mode {
                    0 => {
                        let mut bm = vec![0u8; nv.div_ceil(8)];
                        inp.read_exact(&mut bm)
                            .map_err(|e| Error::bad_input(&p, format!("truncated bitmap ({e})")))?;
                        for i in 0..nv {
                            if bm[i / 8] >> (i % 8) & 1 == 1 {
                                idx.push(i);
                            }
                        }
                    }
                    1 => {
                        let mut pos = 0usize;
                        for _ in 0..nnz {
                            let mut g = 0u64;
                            let mut shift = 0;
                            loop {
                                let [byte] = rd::<1>(inp, &p, "row positions")?;
                                if shift > 35 {
                                    return Err(Error::bad_input(
                                        &p,
                                        "bad varint in row positions",
                                    ));
                                }
                                g |= ((byte & 0x7f) as u64) << shift;
                                shift += 7;
                                if byte & 0x80 == 0 {
                                    break;
                                }
                            }
                            pos += g as usize;
                            idx.push(pos);
                        }
                    }
                    m => return Err(Error::bad_input(&p, format!("unknown row mode {m}"))),
                }
                if idx.len() != nnz || idx.last().is_some_and(|&i| i >= nv) {
                    return Err(Error::bad_input(
                        &p,
                        "row positions disagree with its count",
                    ));
                }
                let mut b = vec![0u8; nnz * 2];
                inp.read_exact(&mut b)
                    .map_err(|e| Error::bad_input(&p, format!("truncated row codes ({e})")))?;
                for (k, &i) in idx.iter().enumerate() {
                    q[i] = u16::from_le_bytes([b[2 * k], b[2 * k + 1]]);
                }
            }
        }
        Ok(RefRow {
            scale,
            min_log_prob,
            q,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<RefRow> = (0..6)
            .map(|s| {
                let logits: Vec<f32> = (0..301)
                    .map(|i| {
                        if (i + s) % 5 == 0 {
                            ((i * 7 + s) % 23) as f32
                        } else {
                            -40.0
                        }
                    })
                    .collect();
                RefRow::from_logits(&logits)
            })
            .collect();
        for format in [Format::Tq, Format::Llama] {
            let h = Header {
                format,
                n_ctx: 8,
                n_vocab: 301,
                n_chunk: 2,
                first: 4,
                info: "{}".into(),
                tokens: (0..16).collect(),
            };
            let p = dir.path().join(format!("{format:?}.bin"));
            let mut w = Writer::create(&p, format, &h).unwrap();
            for r in &rows {
                w.write_row(r).unwrap();
            }
            w.finish().unwrap();
            let mut r = Reader::open(&p).unwrap();
            assert_eq!(r.header.tokens, h.tokens);
            assert_eq!(
                (
                    r.header.n_ctx,
                    r.header.n_vocab,
                    r.header.n_chunk,
                    r.header.first
                ),
                (8, 301, 2, 4)
            );
            for want in &rows {
                assert_eq!(&r.next_row().unwrap(), want);
            }
            assert!(r.next_row().is_err());
        }
    }
}
