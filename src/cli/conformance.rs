//! `tq conformance FILE...`: run conformance vector files (the fork's five and the seed design's
//! 2-bit file) through tq's CPU references and, with `--backend`, through the bundled GPU kernels
//! where there are kernels; pass counts per op, non-zero exit on any mismatch.
//! Guide: `docs/conformance.md`.
use std::path::PathBuf;
use tq::error::{Error, Result};
use tq::gpu::{self, BackendKind, OpenError};

#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// Vector files (`../shared/conformance/*.json`: tq4_1s, tq3_1s, turbo2_0/3_0/4_0, seed2bit).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where to run: cpu (the CPU references only), or a GPU backend (wgpu, cuda, metal) whose
    /// kernels also run on the vectors (ops named `op[backend]`; encoders stay on the CPU).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// How many failing cases to list per file.
    #[arg(long, default_value_t = 20)]
    pub show: usize,
}

pub fn run(a: ConformanceArgs) -> Result<()> {
    let kind = match a.backend.as_str() {
        "cpu" => None,
        "wgpu" => Some(BackendKind::Wgpu),
        "cuda" => Some(BackendKind::Cuda),
        "metal" => Some(BackendKind::Metal),
        other => {
            return Err(Error::Usage(format!(
                "--backend {other}: choose cpu (the references), wgpu, cuda or metal"
            )))
        }
    };
    let mut backend = match kind {
        None => None,
        Some(k) => match gpu::open_backend(k) {
            Ok(b) => Some(b),
            Err(OpenError::Absent(why)) => {
                return Err(Error::Unsupported(format!(
                    "--backend {}: {why}",
                    a.backend
                )))
            }
            Err(OpenError::Failed(e)) => return Err(e),
        },
    };
    if let Some(b) = &backend {
        println!("backend {} on {}", b.kind().name(), b.device_name());
    }
    let mut failed = Vec::new();
    for path in &a.files {
        let b: Option<&mut dyn gpu::Backend> = match &mut backend {
            Some(b) => Some(b.as_mut()),
            None => None,
        };
        let rep = tq::conformance::run_file_on(path, b)?;
        println!("{}: {}", path.display(), rep.schema);
        for o in &rep.ops {
            let mark = if o.pass == o.total { "ok" } else { "FAIL" };
            println!("  {:<24} {:>5}/{:<5} {mark}", o.op, o.pass, o.total);
        }
        for n in &rep.notes {
            println!("  note: {n}");
        }
        for f in rep.failures.iter().take(a.show) {
            println!("  mismatch: {f}");
        }
        if rep.failures.len() > a.show {
            println!("  ... {} more mismatches", rep.failures.len() - a.show);
        }
        if !rep.pass() {
            failed.push(format!("{} ({} cases)", path.display(), rep.failures.len()));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "conformance mismatches in {}; the implementation is not bit-exact with these vectors",
            failed.join(", ")
        )))
    }
}
